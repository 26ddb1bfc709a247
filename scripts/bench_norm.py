#!/usr/bin/env python3
"""Kernel time and bandwidth of LayerNorm, LayerNorm with its residual Add, Softmax, fused
attention (and the same chain unfused) and eltwise Add, from OpenCL profiling events.

    python scripts/bench_norm.py [--repeat 20] [--device P:D] [--kind cpu|gpu] [--no-huge]

`bench(case, shape, ...)` is the importable part: it builds a one-op model, runs one inference on
a profiling queue, re-enqueues every bound kernel `repeat` times and returns the median kernel
time in us (summed over the model's kernels) and the bytes the op must move divided by that time
(GB/s). The CLI prints the transformer shapes: rows 32/128/2048 x 384, 2^26 eltwise elements,
attention at sequence 8..128 with 12 heads x 32 dims. Timings only mean something on the
device they were taken on.
"""
import argparse
import math
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine import Network, build_program, select_device  # noqa: E402
from engine.device import describe  # noqa: E402
from scripts.bench_impls import kernel_us  # noqa: E402
from tests.models import masked_attention  # noqa: E402

CASES = ("layernorm", "add_layernorm", "softmax", "eltwise", "attention", "attention_unfused")
F = TensorProto.FLOAT


def _model(nodes, inputs, inits=()):
    g = helper.make_graph(nodes, "bench", [helper.make_tensor_value_info(n, F, d) for n, d in inputs],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(v, n) for n, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _case(case: str, shape: tuple, rng):
    """(model, feeds, bytes the op must read and write, build_program kwargs)."""
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    if case in ("layernorm", "add_layernorm"):
        rows, d = shape
        inits = [("s", np.ones(d, np.float32)), ("b", np.zeros(d, np.float32))]
        nodes = [helper.make_node("LayerNormalization", ["x" if case == "layernorm" else "xr", "s", "b"],
                                  ["y"], axis=-1)]
        feeds = {"x": f32(rows, d)}
        if case == "add_layernorm":
            nodes.insert(0, helper.make_node("Add", ["x", "r"], ["xr"]))
            feeds["r"] = f32(rows, d)
        m = _model(nodes, [(n, ["rows", d]) for n in feeds], inits)
        return m, feeds, (len(feeds) + 1) * rows * d * 4, {}
    if case == "softmax":
        rows, d = shape
        m = _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", ["rows", d])])
        return m, {"x": f32(rows, d)}, 2 * rows * d * 4, {}
    if case == "eltwise":
        n = math.prod(shape)
        m = _model([helper.make_node("Add", ["x", "z"], ["y"])], [("x", ["n"]), ("z", ["n"])])
        return m, {"x": f32(n), "z": f32(n)}, 3 * n * 4, {}
    if case in ("attention", "attention_unfused"):
        b, heads, s, dh = shape
        m = masked_attention(heads=heads, d_head=dh)
        feeds = {n: f32(b, heads, s, dh) for n in "qkv"}
        feeds["mask"] = np.where(rng.random((b, 1, 1, s)) > 0.2, 0.0, -1e4).astype(np.float32)
        nbytes = 4 * (4 * b * heads * s * dh + b * s)      # q, k, v read, y written, mask
        return m, feeds, nbytes, {"attention": case == "attention"}
    raise ValueError(f"unknown case {case!r} (one of {', '.join(CASES)})")


def bench(case: str, shape: tuple, device=None, repeat: int = 20, kind: str | None = None) -> dict:
    """{"us": median kernel time (all the model's kernels), "gbps": bytes / time, "kernels":
    kernels per inference}. `kind` forces the cpu or gpu kernel variants (default: the device's)."""
    dev = device or select_device()
    model, feeds, nbytes, kw = _case(case, tuple(shape), np.random.default_rng(0))
    net = Network(build_program(model, **kw), dev, impls="dynamic", profile=True)
    if kind:
        net.impls.device_type = kind
        net.impls.optimized = True      # timed: built as on a device of that kind
    net.infer(feeds)
    insts = [i for i in net.insts if i.bound and not i.node.host]
    us = sum(kernel_us(net, i, repeat) for i in insts)
    return {"us": us, "gbps": nbytes / us / 1e3, "kernels": sum(len(i.bound) for i in insts)}


def issue_shapes(huge: bool = True) -> list:
    rows = [(32, 384), (128, 384), (2048, 384)]
    out = [(c, r) for c in ("layernorm", "add_layernorm", "softmax") for r in rows]
    out += [("eltwise", (1 << 20,))] + ([("eltwise", (1 << 26,))] if huge else [])
    out += [(c, (1, 12, s, 32)) for c in ("attention", "attention_unfused") for s in (8, 32, 64, 128)]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--device", default=None)
    ap.add_argument("--kind", choices=("cpu", "gpu"), default=None,
                    help="kernel variants to run (default: the device's kind)")
    ap.add_argument("--no-huge", action="store_true", help="leave out the 2^26-element eltwise")
    a = ap.parse_args()
    dev = select_device(a.device)
    print(f"device: {describe(dev)}; kernels: {a.kind or 'the device kind'}; "
          f"median of {a.repeat} runs (OpenCL profiling events)")
    print(f"{'case':18} {'shape':>16} {'kernels':>8} {'us':>10} {'GB/s':>8}")
    for case, shape in issue_shapes(not a.no_huge):
        r = bench(case, shape, dev, a.repeat, a.kind)
        print(f"{case:18} {'x'.join(map(str, shape)):>16} {r['kernels']:8d} {r['us']:10.1f} "
              f"{r['gbps']:8.1f}")


if __name__ == "__main__":
    main()
