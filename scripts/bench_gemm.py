#!/usr/bin/env python3
"""GEMM kernel time and TFLOP/s of our MatMul (shape-agnostic or static impl), optionally beside
cuBLAS and CLBlast in the same run.

    python scripts/bench_gemm.py [MxNxK ...] [--impl dynamic|static|both] [--repeat 20]
                                 [--device P:D] [--peers] [--sweep] [--json FILE]

Each shape is one MatMul x[M, K] @ W[K, N] (W a constant, as in a transformer's linear layers;
`BxMxNxK` makes x [B, M, K] and W [B, K, N], batched) run through a Network like `dyncli run`
does; the node's bound kernels are then re-enqueued `repeat` times on a profiling queue and the
median of the summed OpenCL event times (end - start) is taken. The output is checked against
numpy (float64). --peers (GPU machine): cuBLAS through torch.matmul (TF32 off, CUDA events over
a loop) and CLBlast through .device/gemm_peers.py (host time over a loop: it includes the ~8 us
launch, so small shapes favour us). --sweep times every GPU tile of SWEEP_GPU (or CPU tile of
SWEEP_CPU) at each shape: what engine/ops/matmul.py's tables are chosen from.

`bench_gemm()` returns the figures and prints nothing (`dyncli bench --kernel gemm:MxNxK`).
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import statistics
import sys
import time

import numpy as np
import pyopencl as cl
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import engine.ops.matmul as mm  # noqa: E402
from engine import Network, build_program, select_device  # noqa: E402
from engine.device import describe  # noqa: E402

# The shapes: square, transformer linear layers (M = batch x seq; N, K in hidden and
# FFN sizes), BERT at seq 32, decode GEMVs, a tall-skinny one.
SHAPES = ["4096x4096x4096", "2048x1536x384", "2048x384x1536", "2048x768x3072", "2048x3072x768",
          "512x768x768", "128x1536x384", "128x384x1536", "32x1536x384", "32x384x1536",
          "32x384x384", "8x1536x384", "8x768x3072", "1x768x768", "1x3072x768", "4x4096x4096",
          "4096x64x4096", "12x128x128x32"]
CPU_SHAPES = ["128x384x384", "128x1536x384", "128x384x1536", "32x384x384", "32x1536x384",
              "32x384x1536", "12x128x128x32", "12x128x32x128", "1x384x1536"]
# (WGX, WGY, RM, RN, BK) of gemm_lm
SWEEP_GPU = [(16, 16, 8, 8, 8), (16, 16, 8, 8, 16), (16, 16, 8, 8, 32), (32, 8, 8, 8, 16),
             (32, 8, 4, 8, 16), (16, 16, 4, 8, 16), (16, 16, 8, 4, 16), (16, 8, 8, 8, 16),
             (8, 16, 8, 8, 16), (16, 16, 4, 4, 16), (16, 16, 4, 4, 32), (16, 8, 4, 4, 16),
             (32, 4, 4, 4, 16), (16, 4, 4, 4, 32), (8, 8, 4, 4, 16), (8, 8, 4, 4, 32),
             (16, 4, 4, 8, 32), (8, 4, 4, 4, 32)]
# (TM, TN) of gemm_rb
SWEEP_CPU = [(4, 8), (8, 8), (4, 16), (8, 16), (12, 16), (8, 32), (12, 32), (14, 32), (6, 48), (4, 64)]


def parse_shape(s: str) -> tuple:
    """'MxNxK' -> (1, M, N, K); 'BxMxNxK' -> (B, M, N, K)."""
    v = [int(x) for x in s.lower().split("x")]
    if len(v) not in (3, 4):
        raise ValueError(f"shape {s!r}: want MxNxK or BxMxNxK")
    return tuple(v) if len(v) == 4 else (1, *v)


def gemm_model(b: int, M: int, N: int, K: int, w: np.ndarray):
    lead = [b] if b > 1 else []
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="MatMul")], "gemm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, lead + [M, K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, lead + [M, N])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@contextlib.contextmanager
def tile(t):
    """Force one kernel tile: a 5-tuple is gemm_lm's (GPU), a 2-tuple gemm_rb's (CPU)."""
    if t is None:
        yield
        return
    old = mm.gpu_tile, mm.cpu_tile
    if len(t) == 5:
        mm.gpu_tile = lambda M, N, nb, K=0: tuple(t)
    else:
        mm.cpu_tile = lambda M, static=False: tuple(t)
    try:
        yield
    finally:
        mm.gpu_tile, mm.cpu_tile = old


def kernel_times(net, inst, repeat: int) -> list[float]:
    """us per run of the node's bound kernels (summed), from profiling events."""
    times = []
    for _ in range(repeat):
        evs = [cl.enqueue_nd_range_kernel(net.queue.cl_queue, b.kernel, b.gws, b.lws) for b in inst.bound]
        evs[-1].wait()
        times.append(sum(e.profile.end - e.profile.start for e in evs) / 1e3)
    return times


def bench_gemm(device, M: int, N: int, K: int, impl: str = "dynamic", repeat: int = 20,
               batch: int = 1, tile_params=None, seed: int = 0) -> dict:
    """Median kernel time of our GEMM [batch,] M x K @ K x N on `device` (a pyopencl Device):
    {'us', 'tflops', 'gbps', 'impl', 'kernels', 'rel_err'}. impl: "dynamic" (shape-agnostic) or
    "static"; tile_params forces a tile (see `tile`)."""
    rng = np.random.default_rng(seed)
    wshape = (batch, K, N) if batch > 1 else (K, N)
    xshape = (batch, M, K) if batch > 1 else (M, K)
    w = rng.standard_normal(wshape, dtype=np.float32)
    x = rng.standard_normal(xshape, dtype=np.float32)
    with tile(tile_params):
        net = Network(build_program(gemm_model(batch, M, N, K, w)), device, impls=impl, profile=True)
        y = net.infer({"x": x})["y"]
    inst = net.insts[0]
    t = statistics.median(kernel_times(net, inst, repeat))
    # the error is checked on a slice of rows (a float64 product of 4096^3 takes seconds)
    r = slice(0, min(M, 64))
    ref = np.matmul(x[..., r, :].astype(np.float64), w.astype(np.float64))
    err = float(np.abs(y[..., r, :] - ref).max() / max(1e-30, float(np.abs(ref).max())))
    flop = 2.0 * batch * M * N * K
    return {"us": t, "tflops": flop / t / 1e6, "gbps": 4.0 * batch * (M * K + K * N + M * N) / t / 1e3,
            "impl": inst.bound[0].impl.name, "kernels": len(inst.bound), "rel_err": err}


def bench_peers(M: int, N: int, K: int, batch: int = 1, device=None) -> dict:
    """cuBLAS (torch, TF32 off, CUDA events) and CLBlast (.device/gemm_peers.py) us and TFLOP/s."""
    import ctypes

    sys.path.insert(0, os.path.join(ROOT, ".device"))
    sys.path.insert(0, os.path.join(ROOT, "..", "..", ".device"))
    import gemm_peers
    out = {}
    flop = 2.0 * batch * M * N * K
    reps = max(5, min(2000, int(2e11 / flop)))
    try:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False
        if torch.cuda.is_available():
            a = torch.rand(batch, M, K, device="cuda")
            b = torch.rand(batch, K, N, device="cuda")
            for _ in range(3):
                torch.matmul(a, b)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(reps):
                torch.matmul(a, b)
            e1.record()
            torch.cuda.synchronize()
            us = e0.elapsed_time(e1) * 1e3 / reps
            out.update(cublas_us=us, cublas_tflops=flop / us / 1e6)
    except ImportError:
        pass
    if batch == 1:
        sgemm = gemm_peers.load_clblast()
        ctx = cl.Context([device or select_device()])
        q = cl.CommandQueue(ctx)
        mf = cl.mem_flags
        A = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.random.rand(M, K).astype(np.float32))
        B = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.random.rand(K, N).astype(np.float32))
        C = cl.Buffer(ctx, mf.READ_WRITE, M * N * 4)
        qp = ctypes.c_void_p(q.int_ptr)

        def call():
            ev = ctypes.c_void_p()
            if sgemm(101, 111, 111, M, N, K, 1.0, A.int_ptr, 0, K, B.int_ptr, 0, N, 0.0,
                     C.int_ptr, 0, N, ctypes.byref(qp), ctypes.byref(ev)):
                raise RuntimeError("CLBlastSgemm failed")
        us = gemm_peers.timed(call, q.finish, reps) * 1e6
        out.update(clblast_us=us, clblast_tflops=flop / us / 1e6)
    return out


def set_constants(ap, pairs):
    """--set NAME=VALUE: override constants of engine/ops/matmul.py (a Python literal each)."""
    for kv in pairs:
        name, val = kv.split("=", 1)
        if not hasattr(mm, name):
            ap.error(f"engine/ops/matmul.py has no {name}")
        setattr(mm, name, ast.literal_eval(val))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shapes", nargs="*")
    ap.add_argument("--impl", default="dynamic", choices=("dynamic", "static", "both"))
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--device")
    ap.add_argument("--peers", action="store_true", help="cuBLAS and CLBlast too (GPU machine)")
    ap.add_argument("--sweep", action="store_true", help="every tile of SWEEP_GPU / SWEEP_CPU")
    ap.add_argument("--json")
    ap.add_argument("--budget", type=float, default=0, help="stop after this many seconds")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="override a constant of engine/ops/matmul.py (e.g. SPLITK_CHUNK=64)")
    a = ap.parse_args()
    set_constants(ap, a.set)
    t_start = time.perf_counter()
    dev = select_device(a.device)
    cpu = bool(dev.type & cl.device_type.CPU)
    shapes = a.shapes or (CPU_SHAPES if cpu else SHAPES)
    impls = ("dynamic", "static") if a.impl == "both" else (a.impl,)
    tiles = (SWEEP_CPU if cpu else SWEEP_GPU) if a.sweep else [None]
    print(f"device: {describe(dev)}; median of {a.repeat} kernel runs (OpenCL profiling events)"
          + (f"; {', '.join(a.set)}" if a.set else ""))
    rows = []
    for s in shapes:
        if a.budget and time.perf_counter() - t_start > a.budget:
            print(f"budget of {a.budget:.0f} s spent: stopping before {s}", flush=True)
            break
        b, M, N, K = parse_shape(s)
        peers = bench_peers(M, N, K, b, dev) if a.peers else {}
        for t in tiles:
            if a.budget and time.perf_counter() - t_start > a.budget:
                break
            for impl in impls:
                try:
                    r = bench_gemm(dev, M, N, K, impl, a.repeat, b, t)
                except Exception as e:  # a tile the device cannot run: report it, go on
                    print(f"{s:>16} {impl:8} tile {t}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                    continue
                r.update(shape=s, tile=t, **peers)
                rows.append(r)
                line = (f"{s:>16} {impl:8} {r['us']:10.1f} us {r['tflops']:7.2f} TF {r['gbps']:7.0f} GB/s"
                        f" err {r['rel_err']:.1e} {r['impl'].split('/')[-1][:34]:34}"
                        + (f" tile {t}" if t else ""))
                if "cublas_us" in peers:
                    line += f" | cuBLAS {peers['cublas_us']:8.1f} us {peers['cublas_tflops']:6.2f} TF " \
                            f"({peers['cublas_us'] / r['us']:4.0%})"
                if "clblast_us" in peers:
                    line += f" | CLBlast {peers['clblast_us']:8.1f} us {peers['clblast_tflops']:6.2f} TF"
                print(line, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": describe(dev), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
