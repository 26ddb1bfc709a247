#!/usr/bin/env python3
"""Conv kernel time and GFLOP/s per geometry, dynamic (shape-agnostic) vs static impl.

    python scripts/bench_conv.py [--model resnet50] [--repeat 20] [--device P:D] [--modes dynamic,static]

Each geometry (by default every distinct Conv of the onnx wheel's light resnet50 at
1x3x224x224) runs as a one-node model through the engine (Network, --impls dynamic or static, a
profiling queue); its bound kernels are then re-enqueued `repeat` times and the median of the
OpenCL event times (end - start, summed over the node's kernels) is taken. `conv_times()` is the
importable entry point (for `dyncli bench --kernel`). Timings only mean something on the device
they were taken on.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import numpy as np
import onnx
import pyopencl as cl
from onnx import TensorProto, helper, numpy_helper, shape_inference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine import Network, build_program, select_device  # noqa: E402
from engine.device import describe  # noqa: E402
from scripts.bench_impls import kernel_us  # noqa: E402


@dataclass(frozen=True)
class ConvGeom:
    N: int
    C: int
    H: int
    W: int
    OC: int
    KH: int
    KW: int
    stride: tuple = (1, 1)
    pads: tuple = (0, 0, 0, 0)   # top, left, bottom, right
    dil: tuple = (1, 1)
    group: int = 1
    bias: bool = True

    @property
    def out_hw(self):
        oh = (self.H + self.pads[0] + self.pads[2] - (self.KH - 1) * self.dil[0] - 1) // self.stride[0] + 1
        ow = (self.W + self.pads[1] + self.pads[3] - (self.KW - 1) * self.dil[1] - 1) // self.stride[1] + 1
        return oh, ow

    @property
    def flops(self) -> int:
        oh, ow = self.out_hw
        return 2 * self.N * self.OC * oh * ow * (self.C // self.group) * self.KH * self.KW

    def label(self) -> str:
        s = f"{self.C}->{self.OC} {self.H}x{self.W} k{self.KH}x{self.KW}"
        if self.stride != (1, 1):
            s += f" s{self.stride[0]}"
        if any(self.pads):
            s += f" p{self.pads[0]}"
        if self.dil != (1, 1):
            s += f" d{self.dil[0]}"
        if self.group > 1:
            s += f" g{self.group}"
        return s


def model_geometries(path: str, shape=(1, 3, 224, 224)) -> list[tuple[ConvGeom, int]]:
    """Distinct Conv geometries of an ONNX model at input `shape`, with how often each occurs."""
    m = onnx.load(path)
    inits = {i.name for i in m.graph.initializer}
    inp = next(i for i in m.graph.input if i.name not in inits)
    for d, v in zip(inp.type.tensor_type.shape.dim, shape):
        d.dim_value = v
    m = shape_inference.infer_shapes(m)
    dims = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in list(m.graph.value_info) + list(m.graph.input)}
    dims.update({i.name: list(i.dims) for i in m.graph.initializer})
    out: dict = {}
    for n in m.graph.node:
        if n.op_type != "Conv":
            continue
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        N, C, H, W = dims[n.input[0]]
        OC, _, KH, KW = dims[n.input[1]]
        g = ConvGeom(N, C, H, W, OC, KH, KW, tuple(a.get("strides", (1, 1))),
                     tuple(a.get("pads", (0, 0, 0, 0))), tuple(a.get("dilations", (1, 1))),
                     int(a.get("group", 1)), len(n.input) > 2 and bool(n.input[2]))
        out[g] = out.get(g, 0) + 1
    return list(out.items())


def conv_model(g: ConvGeom, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((g.OC, g.C // g.group, g.KH, g.KW))
         / np.sqrt(g.C // g.group * g.KH * g.KW)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if g.bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(g.OC).astype(np.float32), "b"))
        ins.append("b")
    node = helper.make_node("Conv", ins, ["y"], kernel_shape=[g.KH, g.KW], strides=list(g.stride),
                            pads=list(g.pads), dilations=list(g.dil), group=g.group)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             ["n", g.C, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def conv_times(geoms, modes=("dynamic", "static"), repeat: int = 20, device=None) -> list[dict]:
    """Per geometry and mode: {"geom", "mode", "impl", "us", "gflops"} (median kernel time of
    `repeat` runs from OpenCL profiling events)."""
    dev = device if isinstance(device, cl.Device) else select_device(device)
    rng = np.random.default_rng(1)
    res = []
    for g in geoms:
        prog = build_program(conv_model(g))
        x = {"x": rng.standard_normal((g.N, g.C, g.H, g.W)).astype(np.float32)}
        for mode in modes:
            net = Network(prog, dev, impls=mode, profile=True)
            net.infer(x)
            inst = next(i for i in net.insts if i.node.op == "Conv")
            us = kernel_us(net, inst, repeat)
            res.append(dict(geom=g, mode=mode, impl=inst.bound[0].impl.name, us=us,
                            gflops=g.flops / us / 1e3))
    return res


def main():
    from tests.models import light_model_paths
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet50", help="a light model of the onnx wheel")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--device")
    ap.add_argument("--modes", default="dynamic,static")
    ap.add_argument("--only", help="substring of geometry labels")
    a = ap.parse_args()
    dev = select_device(a.device)
    modes = tuple(a.modes.split(","))
    geoms = model_geometries(light_model_paths()[a.model])
    if a.only:
        geoms = [(g, c) for g, c in geoms if a.only in g.label()]
    print(f"device: {describe(dev)}; median of {a.repeat} kernel runs (OpenCL profiling events)")
    print(f"{'geometry':34} {'x':>3} " + " ".join(f"{m + ' us':>11} {'GFLOP/s':>8}" for m in modes))
    total = dict.fromkeys(modes, 0.0)
    flops = 0
    for g, count in geoms:
        r = {t["mode"]: t for t in conv_times([g], modes, a.repeat, dev)}
        flops += g.flops * count
        for m in modes:
            total[m] += r[m]["us"] * count
        print(f"{g.label():34} {count:3d} " + " ".join(f"{r[m]['us']:11.1f} {r[m]['gflops']:8.1f}"
                                                   for m in modes), flush=True)
    print(f"{'all convs of ' + a.model:34} {'':3} " + " ".join(
        f"{total[m]:11.1f} {flops / total[m] / 1e3:8.1f}" for m in modes))


if __name__ == "__main__":
    main()
