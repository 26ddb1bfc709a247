#!/usr/bin/env python3
"""Where a compiled inference's host time goes, part by part, on the MiniLM-architecture BERT
(`Network` API, the command line's defaults: adaptive policy, whole compiled plans):

    python scripts/bench_growth.py [--networks 5] [--tree DIR]

- growth: the benchmark's first-pass order (96, 64, 48, 24, 8, 16, 96, 64), then 128, past
  every buffer: that inference's host part (`CompiledPlans._apply`), the growth itself
  (`growth.grow_counted`, or `growth.grow` where the state is put back first), the nodes' state
  put back (`Pending.put_back`: none in an untraced growth), the arguments set node by node
  (`growth._set_arguments`: `grow` only), the decisions carried out (`Buffers.take_for`); the
  least over --networks fresh networks (one growth each);
- transition: then 59 random lengths in 8..128 (almost all new, all compiled), the median
  host part of `CompiledPlans.run` less its launches.
Each part is timed by a wrapper around the engine's function (a microsecond or so each).
`--tree DIR` imports the engine from another checkout (its parts that do not exist there
read 0): run both trees in turn, in one session, to compare. On a CPU device the plans are
the GPU kind's (the device's own would build static impls) and its launches wait for the cores.
"""
from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "examples", "bench", "bert_minilm.onnx")


def time_calls(spent: dict, owner, name: str, label, scale: float = 1e3) -> None:
    """Wrap `owner.name` (absent: nothing) so that each call adds its time, x `scale` (ms by
    default), to `spent[label]`; `label` may be a function of the call's arguments."""
    f = getattr(owner, name, None)
    if f is None:
        return

    @functools.wraps(f)
    def wrapper(*args, **kw):
        t = time.perf_counter()
        try:
            return f(*args, **kw)
        finally:
            spent[label(*args, **kw) if callable(label) else label] += (time.perf_counter() - t) * scale
    setattr(owner, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--networks", type=int, default=5)
    ap.add_argument("--tree", default=ROOT, help="the checkout whose engine to time")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.tree))
    import onnx
    from engine import Network, build_program, buffers, launcher, select_device
    from engine.fast_path import compiled, growth

    spent = collections.defaultdict(float)
    for owner, name, label in ((compiled.CompiledPlans, "_apply", "inference"), (compiled.CompiledPlans, "run", "run"),
                               (growth, "grow", "growth"), (growth, "grow_counted", "growth"),
                               (compiled.Pending, "put_back", "put_back"),
                               (growth, "_set_arguments", "arguments"),
                               (buffers.Buffers, "take_for", "carried_out"),
                               (launcher.Launcher, "launch_all", "launches")):
        time_calls(spent, owner, name, label)
    if not os.path.exists(MODEL):
        sys.exit(f"{MODEL} is missing: python examples/make_models.py --bench")
    prog = build_program(onnx.load(MODEL), MODEL)
    device = select_device(None)
    rng = np.random.default_rng(0)

    def feeds(s):
        return {"input_ids": rng.integers(0, 30000, (1, s)), "attention_mask": np.ones((1, s), np.int64)}

    grown, runs = [], []
    for _ in range(a.networks):
        net = Network(prog, device, predictor="adaptive", compile_plans="all", impls="dynamic")
        net.impls.device_type = "gpu"       # (a CPU device's own plans build static impls)
        net.impls.optimized = True          # (its launches wait for the kernels: as a GPU's build)
        for s in (96, 64, 48, 24, 8, 16, 96, 64):
            net.infer(feeds(s))
        spent.clear()
        net.infer(feeds(128))
        grown.append(dict(spent))
        for s in rng.integers(8, 128, 60):
            spent.clear()
            net.infer(feeds(int(s)))
            if net.counters.get("plan.compiled"):
                runs.append(spent["run"] - spent["launches"])
    parts = ("inference", "growth", "put_back", "arguments", "carried_out")
    print(f"{a.tree}: growth 96 -> 128, least of {a.networks} networks, ms: " +
          ", ".join(f"{p} {min(g.get(p, 0.0) for g in grown):.2f}" for p in parts))
    print(f"{a.tree}: compiled transition, host part less its launches, median of {len(runs)}: "
          f"{statistics.median(runs):.3f} ms")


if __name__ == "__main__":
    main()
