#!/usr/bin/env python3
"""GEMV kernel time and weight bandwidth: our MatMul / Gemm(transB) of 1..4 rows times
a weight, beside cuBLAS (torch, TF32 off) in the same run.

    python scripts/bench_gemv.py [MxNxK | tMxNxK ...] [--repeat 30] [--sweep] [--peers]
                                 [--set NAME=VALUE ...] [--device P:D] [--json FILE]

`MxNxK`: x[M, K] @ W[K, N] (MatMul, cl/gemm.cl gemv); `tMxNxK`: Gemm with transB, W [N, K]
(gemv_t). W is a graph input here (the same kernel as a constant weight; a big model proto
costs seconds to build). Time: the node's bound kernels re-enqueued on a profiling queue, the
median of the summed OpenCL event times (end - start; a split GEMV is the GEMV plus
gemm_splitk_reduce, its kernels also given one by one), three ways: "warm", each run waited
for (the GPU idles between runs; a weight under the 50 MB of an H100's L2 stays there: what
`dyncli bench --kernel` and scripts/bench_gemm.py measure), "cold", the L2 flushed before each run
by a 256 MiB fill or, with --flush read, a 256 MiB read (a decode step reads each weight once,
from HBM), and "queued", runs back to back behind one flush (launches overlap: what cuBLAS's loop below measures; "span" is
the wall time per run between the first start and the last end). GB/s: weight bytes (4 K N)
over the time. Checked against numpy (--ln: onnxruntime). --floor: the same for an empty kernel first.
--peers: cuBLAS through torch.matmul on CUDA events, kernels queued behind a torch.cuda._sleep so
that launches do not show: warm = a loop of back-to-back calls, cold = each call after the same
flush of 256 MiB. --sweep: every GEMV configuration of SWEEP / SWEEP_T (engine/ops/matmul.py's
constants) per shape; what its table is chosen from.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys

import numpy as np
import pyopencl as cl
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import engine.ops.matmul as mm  # noqa: E402
from engine import Network, build_program, select_device  # noqa: E402
from engine.device import describe  # noqa: E402
from scripts.bench_gemm import set_constants  # noqa: E402

# The decode GEMVs of GPT-2 small (768: QKV 2304, proj, MLP 3072 both ways, LM head 50257) and
# LLaMA-7B (4096: q/k/v/o, MLP 11008 both ways, LM head 32000), 4 rows, transB.
SHAPES = ["1x2304x768", "1x768x768", "1x3072x768", "1x768x3072", "1x50257x768", "1x4096x4096",
          "1x11008x4096", "1x4096x11008", "1x32000x4096", "4x3072x768", "4x4096x4096",
          "t1x3072x768", "t1x768x3072", "t1x4096x4096"]
# the GEMVs that take a LayerNormalization in GPT-2 small's decode (QKV, MLP up, LM head)
LN_SHAPES = ["1x2304x768", "1x3072x768", "1x50257x768"]
# configurations: gemv's tile (WX, KY, U, G) forced over engine/ops/matmul.py's table, gemv_t's
# GEMV_T_TILE (WK, NC, U, G); G: split K towards G work-groups (0: one kernel)
SWEEP = [{"tile": t} for t in ((8, 32, 4, 0), (8, 32, 1, 0), (16, 16, 4, 0), (16, 16, 1, 0), (32, 8, 1, 0),
                               (32, 8, 1, 264), (4, 64, 4, 0), (8, 64, 4, 0), (8, 64, 2, 0), (16, 32, 2, 0),
                               (16, 32, 4, 0), (32, 16, 1, 0), (32, 16, 2, 0), (4, 128, 4, 0), (4, 64, 2, 0),
                               (8, 64, 4, 264), (4, 64, 4, 264), (8, 32, 2, 0), (16, 16, 2, 0))]
SWEEP_T = [{"GEMV_T_TILE": t} for t in ((32, 8, 2, 264), (32, 8, 1, 264), (32, 4, 2, 264), (32, 8, 2, 0))]
FLUSH_BYTES = 256 << 20
# "fill" writes FLUSH_BYTES: the L2 is left full of dirty lines, which the GEMV's reads then
# write back to HBM. "read" sums them instead, leaving clean lines, as a decode step's previous
# GEMV leaves the L2 (its weight read once): evicting them costs nothing.
FLUSHES = ("fill", "read")
_READ_SRC = """__kernel void rd(__global const float4* p, __global float* o, int n) {
    float4 s = (float4)(0.0f);
    for (int i = get_global_id(0); i < n; i += get_global_size(0)) s += p[i];
    if (s.x == 1234.5f) o[0] = s.y; }"""


class Flush:
    """A callable that enqueues the L2's eviction of kind `how` (FLUSHES) on `queue`."""

    def __init__(self, ctx, queue, how: str):
        self.queue, self.how = queue, how
        self.buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, FLUSH_BYTES)
        cl.enqueue_fill_buffer(queue, self.buf, np.uint32(0), 0, FLUSH_BYTES)
        self.kernel = cl.Program(ctx, _READ_SRC).build().rd
        self.kernel.set_args(self.buf, self.buf, np.int32(FLUSH_BYTES // 16))

    def __call__(self):
        if self.how == "fill":
            return cl.enqueue_fill_buffer(self.queue, self.buf, np.uint32(0), 0, FLUSH_BYTES)
        return cl.enqueue_nd_range_kernel(self.queue, self.kernel, (132 * 2048,), (256,))


def parse(s: str) -> tuple:
    tb = s.startswith("t")
    m, n, k = (int(v) for v in s.lstrip("t").lower().split("x"))
    return tb, m, n, k


def model(tb: bool, K: int, N: int, ln=None):
    """The GEMV alone, W an input; with `ln` ((w, gamma, beta) arrays): LayerNormalization(x)
    then MatMul by the constant w, which the program fuses into one ln_gemv on a GPU kind."""
    if ln is not None:
        w, gamma, beta = ln
        nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["xn"], axis=-1, epsilon=1e-5),
                 helper.make_node("MatMul", ["xn", "w"], ["y"])]
        inits = [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (gamma, "g"), (beta, "b"))]
        g = helper.make_graph(nodes, "ln_gemv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", N])], inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    node = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1) if tb else helper.make_node("MatMul", ["x", "w"], ["y"])
    g = helper.make_graph([node], "gemv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", K]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [N, K] if tb else [K, N])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", N])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@contextlib.contextmanager
def config(cfg):
    """Override engine/ops/matmul.py constants (a dict) for the block."""
    cfg = {("gemv_tile" if n == "tile" else n): ((lambda N, K, t=v: t) if n == "tile" else v)
           for n, v in (cfg or {}).items()}
    old = {n: getattr(mm, n) for n in cfg}
    for n, v in cfg.items():
        setattr(mm, n, v)
    try:
        yield
    finally:
        for n, v in old.items():
            setattr(mm, n, v)


def run_times(queue, kernels, repeat: int, flush=None, queued=False) -> list[list[float]]:
    """us of each of `kernels` ((kernel, gws, lws) enqueued in order) per run, from profiling
    events. Default: each run waited for (the GPU idles between runs). flush: enqueues what
    evicts the weight from the L2 (Flush) before each run. queued: the runs enqueued back to
    back behind one flush and waited for at the end (launches overlap the previous run)."""
    runs = []
    if queued:
        flush()
    for _ in range(repeat):
        if flush is not None and not queued:
            flush()
        runs.append([cl.enqueue_nd_range_kernel(queue, k, g, l) for k, g, l in kernels])
        if not queued:
            runs[-1][-1].wait()
    runs[-1][-1].wait()
    return [[(e.profile.end - e.profile.start) / 1e3 for e in evs] for evs in runs], \
        (runs[-1][-1].profile.end - runs[0][0].profile.start) / 1e3 / repeat


def summary(times) -> tuple[float, list[float]]:
    """Median of the per-run sums, and each kernel's median."""
    return statistics.median(sum(t) for t in times), [statistics.median(c) for c in zip(*times)]


def bench(device, tb, M, N, K, x, w, repeat, cfg=None, how="fill", ln=None) -> dict:
    m = model(tb, K, N, None if ln is None else (w,) + ln)
    with config(cfg):
        net = Network(build_program(m), device, impls="dynamic", profile=True)
        y = net.infer({"x": x} if ln is not None else {"x": x, "w": w})["y"]
    inst = next((i for i in net.insts if i.node.op in ("MatMul", "Gemm", "ln_gemv") and i.bound), None)
    if inst is None:     # (a CPU kind runs the LayerNormalization and the MatMul apart)
        raise RuntimeError("no GEMV node ran on this device")
    if ln is None:
        ref = x @ (w.T if tb else w)
    else:                # the LayerNormalization's reference: onnxruntime on the same model
        import onnxruntime as ort
        ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    err = float(np.abs(y - ref).max() / max(1e-30, float(np.abs(ref).max())))
    flush = Flush(net.ctx, net.queue.cl_queue, how)
    ks = [(b.kernel, b.gws, b.lws) for b in inst.bound]
    warm, _ = summary(run_times(net.queue.cl_queue, ks, repeat)[0])
    cold, cold_k = summary(run_times(net.queue.cl_queue, ks, repeat, flush)[0])
    qt, span = run_times(net.queue.cl_queue, ks, repeat, flush, queued=True)
    queued, _ = summary(qt)
    wbytes = 4.0 * K * N
    b0 = inst.bound[0].call
    return {"warm_us": warm, "cold_us": cold, "queued_us": queued, "queued_span_us": span,
            "cold_kernels_us": cold_k, "warm_gbps": wbytes / warm / 1e3, "cold_gbps": wbytes / cold / 1e3,
            "queued_gbps": wbytes / queued / 1e3,
            "kernels": [inst.node.op + ":" + b.call.kernel for b in inst.bound], "splits": b0.params[4] if len(b0.params) > 4 else 1,
            "gws": b0.gws, "lws": b0.lws, "rel_err": err}


def floor(device, repeat, how="fill") -> dict:
    """Event times of a kernel that does nothing (one work-group of 256), the same three ways."""
    ctx = cl.Context([device])
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    prg = cl.Program(ctx, "__kernel void nop(__global float* p, int n) { if (get_global_id(0) == n) p[0] = 1.0f; }").build()
    flush = Flush(ctx, q, how)
    k = prg.nop
    k.set_args(flush.buf, np.int32(-1))
    ks = [(k, (256,), (256,))]
    out = {}
    for mode, kw in (("idle", {}), ("after_flush", {"flush": flush}), ("queued", {"flush": flush, "queued": True})):
        t, span = run_times(q, ks, repeat, **kw)
        out[mode] = summary(t)[0]
        if mode == "queued":
            out["queued_span"] = span
    return out


def cublas(tb, M, N, K, repeat, how="fill") -> dict:
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.rand(M, K, device="cuda")
    w = torch.rand(N, K, device="cuda") if tb else torch.rand(K, N, device="cuda")
    f = (lambda: x @ w.t()) if tb else (lambda: x @ w)
    flush = torch.empty(FLUSH_BYTES // 4, device="cuda")
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeat)]
    torch.cuda._sleep(20_000_000)          # ~10 ms: the calls below queue up behind it
    e0, e1 = ev[0]
    e0.record()
    for _ in range(repeat):
        f()
    e1.record()
    torch.cuda.synchronize()
    warm = e0.elapsed_time(e1) * 1e3 / repeat
    torch.cuda._sleep(20_000_000)
    for a, b in ev:
        if how == "fill":
            flush.zero_()
        else:
            flush.sum()
        a.record()
        f()
        b.record()
    torch.cuda.synchronize()
    cold = statistics.median(a.elapsed_time(b) * 1e3 for a, b in ev)
    wbytes = 4.0 * K * N
    return {"cublas_warm_us": warm, "cublas_cold_us": cold, "cublas_cold_gbps": wbytes / cold / 1e3}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shapes", nargs="*")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--device")
    ap.add_argument("--peers", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--floor", action="store_true", help="event times of an empty kernel first")
    ap.add_argument("--flush", choices=FLUSHES, default="fill",
                    help="how cold runs evict the weight from the L2: write 256 MiB (fill, dirty "
                         "lines written back during the GEMV) or read them (clean lines, as a "
                         "decode step's previous GEMV leaves the L2)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="override a constant of engine/ops/matmul.py (e.g. GEMV_MIN_CHUNK=128)")
    ap.add_argument("--ln", action="store_true",
                    help="LayerNormalization then MatMul by a constant weight (MxNxK shapes): the "
                         "fused ln_gemv kernel, the normalisation inside the GEMV")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.ln and any(s.startswith("t") for s in a.shapes):
        ap.error("--ln takes MatMul shapes (MxNxK), not transB ones")
    set_constants(ap, a.set)
    dev = select_device(a.device)
    print(f"device: {describe(dev)}; median of {a.repeat} runs (OpenCL profiling events); "
          f"cold = after a {FLUSH_BYTES >> 20} MiB {a.flush}" + (f"; {', '.join(a.set)}" if a.set else ""), flush=True)
    rows = []
    if a.floor:
        f = floor(dev, a.repeat, a.flush)
        print("empty kernel: " + ", ".join(f"{k} {v:.1f} us" for k, v in f.items()), flush=True)
        rows.append({"floor": f})
    rng = np.random.default_rng(0)
    for s in a.shapes or (LN_SHAPES if a.ln else SHAPES):
        tb, M, N, K = parse(s)
        x = rng.standard_normal((M, K), dtype=np.float32)
        w = (rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32) / np.sqrt(K)).astype(np.float32)
        ln = (rng.standard_normal(K, dtype=np.float32), rng.standard_normal(K, dtype=np.float32)) if a.ln else None
        peers = cublas(tb, M, N, K, a.repeat, a.flush) if a.peers else {}
        if peers:
            print(f"{s:>14} cuBLAS          warm {peers['cublas_warm_us']:8.1f} us  cold "
                  f"{peers['cublas_cold_us']:8.1f} us {peers['cublas_cold_gbps']:6.0f} GB/s", flush=True)
        for cfg in ((SWEEP_T if tb else SWEEP) if a.sweep else [None]):
            try:
                r = bench(dev, tb, M, N, K, x, w, a.repeat, cfg, a.flush, ln)
            except Exception as e:  # a configuration the device cannot run: report it, go on
                print(f"{s:>14} {cfg}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                continue
            r.update(shape=s, cfg=cfg, tile=(r["lws"], r["gws"]), **peers)
            rows.append(r)
            tag = " ".join(f"{k.replace('GEMV_', '')}={v}" for k, v in (cfg or {}).items()) or "default"
            print(f"{s:>14} {tag:54} warm {r['warm_us']:7.1f} us {r['warm_gbps']:5.0f} GB/s | cold "
                  f"{r['cold_us']:7.1f} us {r['cold_gbps']:5.0f} GB/s ("
                  + "+".join(f"{t:.1f}" for t in r["cold_kernels_us"]) + f") | queued {r['queued_us']:7.1f} us "
                  f"{r['queued_gbps']:5.0f} GB/s span {r['queued_span_us']:7.1f} | S={r['splits']} "
                  f"{'+'.join(r['kernels'])} err {r['rel_err']:.1e}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": describe(dev), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
