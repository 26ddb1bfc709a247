"""Soak test of `dyncli run`: many inferences of varying shapes on the example encoder
through the CLI's own path (dyncli.runner.execute_run), checking that nothing grows without
bound. A benchmark script, not a timed test.

    python scripts/soak.py                      # 20,000 inferences, trace in /tmp
    python scripts/soak.py -n 2000 --trace-level decisions
    python scripts/soak.py --trace none --static-mib 19   # PoCL holding Intel's count of static impls

Reports: host RSS at inference 1,000 and at the end (must stay within 10%), device bytes held
(activations within the predictor's bound of the largest need: 1.1x plus 10 x 16 KiB per
buffer), impl cache size against its capacity, the rows the run keeps for its table, and the
trace's bytes per node per inference. Exit 1 when a bound does not hold.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dyncli.runner import ROW_WINDOW, RunOptions, execute_run  # noqa: E402
from engine import impl_cache  # noqa: E402
from engine.diagnose import nbytes_text  # noqa: E402

ENCODER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "encoder.onnx")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--inferences", type=int, default=20000)
    ap.add_argument("--max-seq", type=int, default=128, help="sequence lengths 1..MAX, batch 1 or 2")
    ap.add_argument("--trace", default="/tmp/dyncli-soak.trace.jsonl")
    ap.add_argument("--trace-level", default="all", choices=("all", "decisions"))
    ap.add_argument("--impls", default="auto")
    ap.add_argument("--impl-cache-capacity", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--static-mib", type=int, default=0,
                    help="bytes of static impls the impl cache keeps (default: engine/impl_cache.py "
                         "STATIC_BYTES); PoCL's programs are a third of Intel's CPU runtime's, so 19 "
                         "holds as many as Intel's 64 and evicts as often")
    a = ap.parse_args()
    if a.static_mib:
        impl_cache.STATIC_BYTES = a.static_mib << 20

    rng = np.random.default_rng(a.seed)
    shapes, b, s = [], 1, 8
    while len(shapes) < a.inferences:   # a random walk: growth, jumps (shrinks), repeats
        move = rng.random()
        if move < 0.5:
            s += int(rng.integers(1, 9))
            if s > a.max_seq:
                s = int(rng.integers(1, 9))
        elif move < 0.8:
            s = int(rng.integers(1, a.max_seq + 1))
        if rng.random() < 0.1:
            b = 3 - b
        # each shape held 1 to 3 inferences, as a server sees bursts of one length
        shapes += [f"input_ids:{b}x{s},attention_mask:{b}x{s}"] * int(rng.integers(1, 4))
    shapes = shapes[:a.inferences]
    marks = {}
    t0 = time.perf_counter()

    def progress(i, n, _shapes):
        if i in (1, 1000) or i == n:
            marks[i] = (rss_bytes(), time.perf_counter() - t0)
        if i % 1000 == 0:
            print(f"{i}/{n} rss {rss_bytes() / 2**20:.1f} MiB, {time.perf_counter() - t0:.0f} s", flush=True)

    opts = RunOptions(model=ENCODER, shapes=shapes, trace=a.trace, trace_level=a.trace_level,
                      impls=a.impls, impl_cache_capacity=a.impl_cache_capacity, seed=a.seed)
    r = execute_run(opts, progress)
    if r.status != "ok":
        print(f"run {r.status}: {r.error}")
        return 1
    n = r.inferences
    base = marks.get(1000, marks[1])[0]
    end = marks[n][0]
    c = r.totals.counters
    need = c.get("live_bytes_lower_bound", 0)
    bound = 1.1 * need + r.nodes * 10 * 16384
    trace_bytes = os.path.getsize(a.trace) if a.trace != "none" else 0
    cap = a.impl_cache_capacity
    checks = [
        ("host RSS at the end within 10% of inference 1,000", end <= 1.10 * base,
         f"{base / 2**20:.1f} -> {end / 2**20:.1f} MiB ({(end / base - 1) * 100:+.1f}%)"),
        ("activation bytes held within the predictor's bound of the largest need",
         r.activation_bytes <= bound,
         f"held {nbytes_text(r.activation_bytes)} (all buffers {nbytes_text(r.device_bytes)}), "
         f"largest need {nbytes_text(need)}, bound {nbytes_text(bound)}"),
        ("impl cache within capacity", not cap or r.impl_cache <= cap, f"{r.impl_cache} / {cap or 'unbounded'}"),
        ("rows kept for the table bounded", len(r.records) <= ROW_WINDOW, f"{len(r.records)} (window {ROW_WINDOW})"),
    ]
    print(f"{n} inferences in {marks[n][1]:.0f} s ({marks[n][1] / n * 1e3:.1f} ms each), "
          f"{r.nodes} nodes, trace {a.trace_level}: {nbytes_text(trace_bytes)} = "
          f"{trace_bytes / max(1, n * r.nodes):.0f} bytes per node per inference")
    ok = True
    for what, held, detail in checks:
        print(f"{'ok  ' if held else 'FAIL'} {what}: {detail}")
        ok &= held
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
