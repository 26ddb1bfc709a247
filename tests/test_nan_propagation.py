"""NaN and infinities through every elementwise op and activation, alone and fused into a
producer's epilogue, against onnxruntime: NaN in gives NaN out wherever onnxruntime gives it
(OpenCL's fmax/fmin return the other operand for a NaN, so a kernel written with them drops it)."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine import Network, build_program
from tests.conftest import assert_close, ort_session

F = TensorProto.FLOAT
X = np.array([np.nan, np.inf, -np.inf, -1.5, -0.0, 0.0, 0.7, 3.0, 7.0, -7.0, np.nan, 1e30],
             np.float32)


def _model(nodes, inputs, inits=(), opset=22):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)   # onnxruntime 1.30 (the GPU machine) reads IR <= 13


def _unary(op, opset=22, inits=(), **attrs):
    return _model([helper.make_node(op, ["x"] + [k for k, _ in inits], ["y"], name="n", **attrs)],
                  [("x", ["n"])], inits, opset)


UNARY = ["Relu", "LeakyRelu", "HardSigmoid", "HardSwish", "Elu", "Selu", "Celu", "Softplus",
         "ThresholdedRelu", "Sign", "Abs", "Sigmoid", "Tanh", "Softsign", "Mish", "Gelu", "Sqrt",
         "Neg", "Exp", "Log", "Floor", "Ceil", "Round", "Erf", "Reciprocal"]
OTHERS = {
    "Clip_inputs": lambda: _unary("Clip", 13, [("lo", 0.0), ("hi", 6.0)]),
    "Clip_attrs": lambda: _unary("Clip", 6, min=0.0, max=6.0),
    "Max": lambda: _unary("Max", 13, [("b", [0.0, np.nan] * 6)]),
    "Min": lambda: _unary("Min", 13, [("b", [0.0, np.nan] * 6)]),
    "PRelu": lambda: _unary("PRelu", 16, [("b", [0.25])]),
}


def _check(model, feeds, device):
    net = Network(build_program(model), device)
    want = ort_session(model).run(None, feeds)[0]
    got = net.infer(feeds)["y"]
    assert np.isnan(got).sum() == np.isnan(want).sum(), (got, want)
    assert_close(got, want, 1e-5, 1e-6)   # NaN where onnxruntime has NaN, values elsewhere


@pytest.mark.parametrize("op", UNARY + list(OTHERS))
def test_nan_and_inf_as_onnxruntime(op, device):
    _check(OTHERS[op]() if op in OTHERS else _unary(op), {"x": X}, device)


def test_nan_through_fused_epilogues(device):
    """MatMul + Relu and Add + Relu run as one kernel (the Relu in the producer's epilogue)."""
    w = np.array([[1.0, -2.0, 0.5], [0.25, 1.0, -1.0]], np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Relu", ["m"], ["r"], name="relu1"),
             helper.make_node("Add", ["r", "x2"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu2")]
    model = _model(nodes, [("x", ["n", 2]), ("x2", ["n", 3])], [("w", w)], opset=17)
    assert build_program(model).fused == 3, "relu1, add, relu2 are not in mm's epilogue"
    x = np.array([[np.nan, 1.0], [1.0, -1.0], [np.inf, 0.0], [2.0, 3.0]], np.float32)
    x2 = np.array([[0.0] * 3, [np.nan, -9.0, 1.0], [0.0] * 3, [-np.inf, 1.0, np.nan]], np.float32)
    _check(model, {"x": x, "x2": x2}, device)
