"""An `onnx.backend.base.Backend` over the engine, so ONNX's own backend tests
(`onnx.backend.test.BackendTest`) run against dyncli:

    from dyncli.backend import DynCliBackend
    rep = DynCliBackend.prepare(model, "CPU", impls="dynamic")
    outputs = rep.run([x, y])          # a tuple in graph-output order

`device` is ONNX's name ("CPU": the OpenCL device dyncli picks by default, see
`dyncli devices`) or an OpenCL index "P:D". Other keyword arguments are `Network` options
(`impls`, `prealloc`, `predictor`, `memory_pool`, ...). Every network of one device shares one
OpenCL context and one unbounded impl cache: the node tests build ~1000 small networks, and a
kernel (source, jit) built for one serves the rest.
"""
from __future__ import annotations

import numpy as np
import onnx
import pyopencl as cl
from onnx.backend.base import Backend, BackendRep

from engine import ModelError, Network, build_program, select_device
from engine.impl_cache import ImplCache

_SHARED: dict = {}   # device spec -> (cl.Device, cl.Context, ImplCache)


def shared_device(device: str = "CPU"):
    spec = None if device.upper() in ("CPU", "") else device
    if spec not in _SHARED:
        dev = select_device(spec)
        _SHARED[spec] = (dev, cl.Context([dev]), ImplCache(0))
    return _SHARED[spec]


class DynCliRep(BackendRep):
    def __init__(self, net: Network):
        self.net = net
        self.inputs = list(net.program.inputs)

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if len(inputs) != len(self.inputs):
                raise ModelError(f"the model takes {len(self.inputs)} inputs "
                                 f"({', '.join(self.inputs)}), got {len(inputs)}")
            feeds = dict(zip(self.inputs, inputs))
        outs = self.net.infer({k: np.asarray(v) for k, v in feeds.items()})
        return tuple(outs[o] for o in self.net.program.outputs)


class DynCliBackend(Backend):
    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs) -> DynCliRep:
        dev, ctx, cache = shared_device(device)
        for k in ("rtol", "atol"):   # the test runner's comparison options, not ours
            kwargs.pop(k, None)
        net = Network(build_program(model, "<backend>"), dev, context=ctx, impl_cache=cache,
                      **kwargs)
        return DynCliRep(net)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    # the brief's name: `run` takes the device and engine options as kwargs
    run = run_model

    @classmethod
    def supports_model(cls, model: onnx.ModelProto) -> bool:
        try:
            build_program(model, "<backend>", fusion=False)
        except (ModelError, ValueError):
            return False
        return True

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        return cls.supports_model(model)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        # one OpenCL device, named "CPU" in ONNX's terms (whatever its kind); "CUDA" would
        # run every case twice on the same device
        return device.upper() == "CPU" or ":" in device


prepare = DynCliBackend.prepare
run_model = DynCliBackend.run_model
run = DynCliBackend.run
supports_device = DynCliBackend.supports_device
