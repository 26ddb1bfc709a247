#!/usr/bin/env python3
"""Split-K vs the tiled GEMM for few rows and a long K (decode-step GEMVs), kernel time.

    python scripts/bench_split_k.py [--repeat 50] [--device P:D]

For each [m, K] x [K, N] MatMul: one network with split-K enabled (engine/ops/matmul.py's
rule) and one with it disabled (the tiled kernel), shape-agnostic impls both; the node's bound
kernels are re-enqueued --repeat times on a profiling queue and the median of the OpenCL
event times is taken (split-K: partial + reduce). ratio = tiled / split-K (> 1: split-K is
faster). Outputs are checked against numpy. Timings only mean something on that device.
"""
import argparse
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import engine.ops.matmul as mm  # noqa: E402
from scripts.bench_impls import kernel_us  # noqa: E402
from engine import Network, build_program, select_device  # noqa: E402
from engine.device import describe  # noqa: E402

SHAPES = [(1, 768, 768), (1, 768, 3072), (1, 4096, 4096), (1, 4096, 11008), (1, 11008, 4096),
          (4, 4096, 4096), (1, 4096, 32000)]


def model(K: int, N: int, w: np.ndarray):
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="MatMul")], "gemv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", N])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--device")
    a = ap.parse_args()
    dev = select_device(a.device)
    print(f"device: {describe(dev)}; median of {a.repeat} kernel runs (OpenCL profiling events)")
    print(f"{'m x K x N':>20s} {'tiled us':>10s} {'split-K us':>10s} {'splits':>6s} {'ratio':>6s} {'max err':>9s}")
    rng = np.random.default_rng(0)
    min_k = mm.SPLITK_MIN_K
    for m, K, N in SHAPES:
        w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
        x = rng.standard_normal((m, K)).astype(np.float32)
        ref = x.astype(np.float64) @ w.astype(np.float64)
        res = {}
        for name, k in (("tiled", 1 << 30), ("split", min_k)):
            mm.SPLITK_MIN_K = k
            net = Network(build_program(model(K, N, w)), dev, impls="dynamic", profile=True)
            y = net.infer({"x": x})["y"]
            res[name] = (kernel_us(net, net.insts[0], a.repeat), float(np.abs(y - ref).max()), len(net.insts[0].bound))
        mm.SPLITK_MIN_K = min_k
        s = min(mm.SPLITK_MAX, K // mm.SPLITK_CHUNK) if res["split"][2] == 2 else 1
        print(f"{f'{m}x{K}x{N}':>20s} {res['tiled'][0]:10.1f} {res['split'][0]:10.1f} {s:6d} "
              f"{res['tiled'][0] / res['split'][0]:6.2f} {max(res['tiled'][1], res['split'][1]):9.1e}",
              flush=True)


if __name__ == "__main__":
    main()
