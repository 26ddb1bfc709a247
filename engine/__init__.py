"""The dyncli runtime: ONNX import, shape inference, impls, memory, execution."""
from engine.program import ModelError, Program, load_program, build_program
from engine.network import Network
from engine.device import DeviceError, list_devices, select_device
from engine.shape_predictor import PreallocSettings, ShapePredictor

__all__ = ["ModelError", "Program", "load_program", "build_program", "Network", "DeviceError",
           "list_devices", "select_device", "PreallocSettings", "ShapePredictor"]
