#!/usr/bin/env python3
"""`dyncli run` over many random lengths, traced (the default) and `--trace none`, alternating:
what a run that meets a new length at almost every inference costs from the command line.

    python examples/make_models.py --bench          # once: examples/bench/bert_minilm.onnx
    python scripts/bench_run_lengths.py [--rounds 2] [--count 200] [--low 8] [--high 128]
                                        [--set 8,16,24,32,48,64,96,128] [--model FILE] [TREE ...]

Each round runs, for each source TREE (default: this one; e.g. a `git worktree` of an older
commit beside it), `dyncli run MODEL --shapes-file` over the same `--count` lengths drawn from
LOW..HIGH, or from the lengths of `--set` as `dyncli bench`'s sequence in docs/performance.md
draws them (numpy, seed 0: a few lengths that come back), batch 1, inputs input_ids and
attention_mask, traced then untraced; odd
rounds reverse both orders, so a drift in the host's speed lands on every side. Per run: the
mean, median and p90 latency with the first inference left out, the inferences served by a
compiled plan, those over 5 ms, and the five slowest (docs/performance.md, session 17).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_run(tree: str, model: str, seq: str, traced: bool) -> dict:
    trace = os.path.join(tempfile.gettempdir(), "bench_run_lengths.trace.jsonl") if traced else "none"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath(tree)] + sys.path[1:]))
    out = subprocess.run([sys.executable, "-m", "dyncli", "run", model, "--shapes-file", seq, "--trace", trace,
                          "--json", "-q"], capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    if out.returncode:
        raise SystemExit(f"{tree}: dyncli run failed: {out.stderr.strip().splitlines()[-1:]}")
    later = json.loads(out.stdout)["inferences_detail"][1:]
    lat = sorted(x["latency_ms"] for x in later)
    return {"mean": statistics.mean(lat), "median": statistics.median(lat), "p90": lat[int(0.9 * len(lat))],
            "compiled": sum(1 for x in later if x["counters"].get("plan.compiled")),
            "over_5ms": sum(1 for x in lat if x > 5), "slowest": [round(x, 1) for x in lat[-5:]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="*", default=[ROOT], help="source trees to compare (default: this one)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--low", type=int, default=8)
    ap.add_argument("--high", type=int, default=128)
    ap.add_argument("--set", default="", help="draw the lengths from these (comma-separated) instead")
    ap.add_argument("--model", default=os.path.join(ROOT, "examples", "bench", "bert_minilm.onnx"))
    a = ap.parse_args()
    if not os.path.exists(a.model):
        raise SystemExit(f"{a.model} not found: run `python examples/make_models.py --bench` first")
    if a.set:
        import numpy as np
        lengths = [int(x) for x in np.random.default_rng(0).choice([int(v) for v in a.set.split(",")], a.count)]
    else:
        r = random.Random(0)
        lengths = [r.randint(a.low, a.high) for _ in range(a.count)]
    seq = os.path.join(tempfile.gettempdir(), "bench_run_lengths.json")
    with open(seq, "w") as f:
        json.dump([{"input_ids": [1, n], "attention_mask": [1, n]} for n in lengths], f)
    model = os.path.abspath(a.model)
    ratios: dict = {}               # tree -> traced mean / untraced mean, per round
    for rnd in range(a.rounds):
        trees = a.trees if rnd % 2 == 0 else a.trees[::-1]
        for tree in trees:
            means = {}
            for traced in ((True, False) if rnd % 2 == 0 else (False, True)):
                s = one_run(tree, model, seq, traced)
                means[traced] = s["mean"]
                print(f"round {rnd} {os.path.basename(os.path.abspath(tree)):12s} "
                      f"{'traced' if traced else 'untraced':8s} mean {s['mean']:.3f} median {s['median']:.3f} "
                      f"p90 {s['p90']:.3f} compiled {s['compiled']} over 5 ms {s['over_5ms']} "
                      f"slowest {s['slowest']}", flush=True)
            ratios.setdefault(tree, []).append(means[True] / means[False])
    # each run is a process of its own, and a process's host speed varies by tens of percent
    # from one to the next (docs/performance.md, session 26): a single round's ratio is noise
    for tree, r in ratios.items():
        print(f"{os.path.basename(os.path.abspath(tree)):12s} traced/untraced mean, median of {len(r)} rounds: "
              f"x{statistics.median(r):.2f} (rounds x{min(r):.2f}-x{max(r):.2f})")


if __name__ == "__main__":
    main()
