"""Benchmark: summarise a synthetic 1,000,000-event trace with `dyncli trace` and report the wall
time and the peak memory (max RSS) of that process. Target: < 20 s and < 300 MB.

The trace is written through traces.writer like a real run: per inference an infer_start, then
for every node the pipeline stages (update_shape, update_impl, realloc, set_args, execute) with
the fields the engine writes, and an infer_end with the inference's counters.

    python scripts/bench_trace.py [--events 1000000] [--nodes 80] [--keep FILE] [--chrome]
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from traces import TraceWriter  # noqa: E402

OPS = ["MatMul", "Add", "LayerNormalization", "Softmax", "Transpose", "Reshape", "Gather", "Mul"]


def write_trace(path: str, n_events: int, n_nodes: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    nodes = [(f"{OPS[i % len(OPS)]}_{i}", OPS[i % len(OPS)]) for i in range(n_nodes)]
    w = TraceWriter(path, {"model": "synthetic.onnx", "device": "bench", "options": {"shapes": ["1x{8..512}"]},
                           "inputs": {"x": ["batch", "seq"]}, "outputs": ["y"], "nodes": n_nodes})
    written, it, seq = 0, 0, 8
    while written < n_events:
        w.iter = it
        changed = rng.random() < 0.3
        if changed:
            seq = rng.randrange(8, 512)
        c: Counter = Counter()
        w.event("infer_start", shapes={"x": [1, seq]})
        for name, op in nodes:
            shape = [1, seq, 64]
            if changed:
                w.event("update_shape", name, op, "infer", "shape_changed", device_reads=0,
                        in_shapes=[shape], out_shapes=[shape])
                c["update_shape.infer"] += 1
                hit = rng.random() < 0.95
                w.event("update_impl", name, op, "cache_hit" if hit else "build", "",
                        impl=f"{op.lower()}:{op}", **({} if hit else {"compile_ms": 20.0}))
                c["update_impl.cache_hit" if hit else "update_impl.build"] += 1
                alloc = rng.random() < 0.2
                nbytes = 4 * seq * 64
                w.event("realloc", name, op, "alloc" if alloc else "reuse", "", bytes=nbytes if alloc else 0,
                        capacity=nbytes, predicted=alloc, mode="iters", shape=shape, dtype="f32")
                c["realloc.alloc" if alloc else "realloc.reuse"] += 1
                c["bytes_allocated"] += nbytes if alloc else 0
                w.event("set_args", name, op, "set")
                c["set_args.set"] += 1
            else:
                w.event("update_shape", name, op, "skip", "shape_unchanged")
                c["update_shape.skip"] += 1
                c["update_shape.skip.shape_unchanged"] += 1
                w.event("realloc", name, op, "reuse", "", capacity=4 * seq * 64, shape=[1, seq, 64], dtype="f32")
                c["realloc.reuse"] += 1
                w.event("set_args", name, op, "skip")
                c["set_args.skip"] += 1
            w.event("execute", name, op, "enqueue", "", kernels=1, gws=[seq, 64, 1])
            c["execute.enqueue"] += 1
            c["kernels"] += 1
        c["latency_ms"] = 1.0 + rng.random()
        w.event("infer_end", latency_ms=round(c["latency_ms"], 3), out_shapes={"y": [1, seq, 64]},
                counters=dict(c))
        w.flush()
        written += 2 + sum(v for k, v in c.items() if k.count(".") == 1)
        it += 1
    w.iter = -1
    w.event("run_end", action="ok", inferences=it)
    w.close()
    return written + 1


def measure(args: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of `python -m dyncli ARGS` (its output discarded)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "dyncli", *args], cwd=ROOT, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.exit(f"dyncli {' '.join(args)} exited {proc.returncode}")
    return wall, usage.ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--nodes", type=int, default=80)
    ap.add_argument("--keep", help="write the trace here and keep it")
    ap.add_argument("--chrome", action="store_true", help="also time --format chrome")
    a = ap.parse_args()
    path = a.keep or os.path.join(tempfile.mkdtemp(), "bench.trace.jsonl")
    t0 = time.perf_counter()
    n = write_trace(path, a.events, a.nodes)
    print(f"wrote {n} events ({os.path.getsize(path) / 2**20:.0f} MiB) in {time.perf_counter() - t0:.1f} s: {path}")
    wall, mb = measure(["trace", path, "--json"])
    print(f"dyncli trace --json: {wall:.1f} s, peak RSS {mb:.0f} MB (target < 20 s, < 300 MB)")
    wall, mb = measure(["trace", path, "--group-by", "node", "--expect", "inferences>=1"])
    print(f"dyncli trace --group-by node (tables): {wall:.1f} s, peak RSS {mb:.0f} MB")
    if a.chrome:
        out = path + ".chrome.json"
        wall, mb = measure(["trace", path, "--format", "chrome", "-o", out])
        print(f"dyncli trace --format chrome: {wall:.1f} s, peak RSS {mb:.0f} MB, {os.path.getsize(out) / 2**20:.0f} MiB")
        if not a.keep:
            os.remove(out)
    if not a.keep:
        os.remove(path)


if __name__ == "__main__":
    main()
