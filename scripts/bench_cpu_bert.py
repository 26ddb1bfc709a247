#!/usr/bin/env python3
"""The BERT against onnxruntime on a CPU device: the MiniLM-architecture BERT (tests/models.py bert_encoder, what
`examples/make_models.py --bench` writes to examples/bench/bert_minilm.onnx), batch 1, against
onnxruntime's CPU EP in the same process, alternating.

    python scripts/bench_cpu_bert.py [--seq 128 32] [--rounds 7] [--runs 5] [--device P:D]
                                     [--layers 6] [--model FILE] [--profile] [--ort-no-spin]

Each round runs dyncli `--runs` times, then onnxruntime `--runs` times (warm, same inputs),
and keeps each one's median; the rounds' medians give the figure (median, min..max) and the
ratio per round. The load average before and after is printed: CPU ratios only count on an
idle machine (nothing else running: no tests, builds or helpers). Each side's timed runs follow WARM_MS of untimed
ones: after the other side's turn (onnxruntime's threads spin a while after each run, its
default, on the cores PoCL's threads need) or any idle spell the cores run slow for a while
(dyncli seq 32 after a 0.2 s pause: 11.8, 9.9, 8.8, 8.1, 8.0, 8.0, 6.8, then 5.0-5.4 ms a run;
onnxruntime keeps them busy itself by spinning). --ort-no-spin turns its spinning off (its own
seq 32 then took 5.4 ms instead of 3.7).
--profile adds dyncli's kernel time per kernel name and work size (OpenCL profiling events,
one inference) and its time by part (Network.time_ms).
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

import numpy as np
import onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine import Network, build_program, select_device  # noqa: E402
from engine.device import describe  # noqa: E402
from dyncli.check import ort_session  # noqa: E402
from tests.models import bert_encoder  # noqa: E402


WARM_MS = 150      # untimed runs before each side's timed ones (see above)


def _timed_ms(fn, runs: int) -> float:
    t_end = time.perf_counter() + WARM_MS / 1e3
    while time.perf_counter() < t_end:
        fn()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def _spread(xs) -> str:
    return f"{statistics.median(xs):8.2f} ({min(xs):.2f}..{max(xs):.2f})"


def kernel_profile(model, dev, feeds) -> list:
    """[(ms, count, kernel, gws)] of one warm inference, largest first."""
    net = Network(build_program(model), dev, profile=True, async_compile=False)
    for _ in range(3):
        net.infer(feeds)
    names = {}
    enqueue = net.queue.enqueue

    def named(launches):
        n0 = len(net.queue.events)
        enqueue(launches)
        for (k, g, _), e in zip(launches, net.queue.events[n0:]):
            names[e] = (k.function_name, tuple(g))
    net.queue.enqueue = named
    net.infer(feeds)
    agg = collections.defaultdict(lambda: [0.0, 0])
    for e in net.queue.events:
        a = agg[names[e]]
        a[0] += (e.profile.end - e.profile.start) * 1e-6
        a[1] += 1
    return sorted(((ms, n, k, g) for (k, g), (ms, n) in agg.items()), reverse=True), dict(net.time_ms)


def ort_cpu_session(model, spin: bool):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort_session(model, opts)[0]


def bench_seq(model, dev, seq: int, rounds: int, runs: int, spin: bool = True) -> dict:
    rng = np.random.default_rng(seq)
    feeds = {"input_ids": rng.integers(0, 30000, (1, seq)).astype(np.int64),
             "attention_mask": np.ones((1, seq), np.int64)}
    # static impls built before timing (async builds would land inside the first rounds)
    net = Network(build_program(model), dev, async_compile=False)
    sess = ort_cpu_session(model, spin)
    for _ in range(3):
        out = net.infer(feeds)
        ref = sess.run(None, feeds)
    err = max(float(np.abs(o - r).max()) for o, r in zip(out.values(), ref))
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(_timed_ms(lambda: net.infer(feeds), runs))
        theirs.append(_timed_ms(lambda: sess.run(None, feeds), runs))
    return {"seq": seq, "dyncli": ours, "ort": theirs, "err": err, "time_ms": dict(net.time_ms),
            "feeds": feeds}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[128, 32])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--model", help="an ONNX file with BERT's inputs (default: bert_encoder())")
    ap.add_argument("--device")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--ort-no-spin", action="store_true", help="onnxruntime's threads do not spin")
    a = ap.parse_args()
    dev = select_device(a.device)
    model = onnx.load(a.model) if a.model else bert_encoder(layers=a.layers)
    print(f"device: {describe(dev)}; load average before: {os.getloadavg()}")
    print(f"{a.rounds} rounds of {a.runs} runs each, alternating; ms: median of the rounds (min..max); "
          f"onnxruntime's threads {'do not spin' if a.ort_no_spin else 'spin'}")
    for seq in a.seq:
        r = bench_seq(model, dev, seq, a.rounds, a.runs, not a.ort_no_spin)
        ratios = [x / y for x, y in zip(r["dyncli"], r["ort"])]
        print(f"seq {seq:4d}: dyncli {_spread(r['dyncli'])}  onnxruntime {_spread(r['ort'])}  "
              f"ratio {_spread(ratios)}  max abs diff {r['err']:.1e}", flush=True)
        print(f"          dyncli's last inference by part (ms): {r['time_ms']}")
        if a.profile:
            rows, parts = kernel_profile(model, dev, r["feeds"])
            total = sum(ms for ms, *_ in rows)
            print(f"          kernel time {total:.2f} ms in {sum(n for _, n, _, _ in rows)} kernels:")
            for ms, n, k, g in rows[:10]:
                print(f"            {ms:8.2f} ms  x{n:3d}  {k} {g}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
