#!/usr/bin/env python3
"""Where a BERT inference's host time goes, per kernel, next to what our own launches cost
alone (the command line's defaults: adaptive policy, whole compiled plans):

    python scripts/bench_host.py [--same 40] [--new 60]

- same length: a repeated length (a whole plan replayed), 64 and 128;
- known lengths: the benchmark's eight lengths in random order (each transition a plan
  replayed: its shape_info image, arguments and host values put back);
- new lengths: random lengths in 8..128 after the benchmark's eight (almost all new to the
  plans, each a compiled inference);
each: the median latency, its host part (latency less device_wait) per kernel, and the parts
timed by wrappers around the engine's functions (us): the launches (`Launcher.launch_all`),
the compiled inference (`CompiledPlans.run`, its launches included), the predictor's calls
replayed, the writes, the status read and the output reads (both wait for the device).
Then the launches of one same-length inference replayed alone in a loop (ctypes, no event,
the arguments as bound): what the host cannot go below for these kernels, next to
`.device/launch_floor.py`'s one small kernel launched again and again.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
MODEL = os.path.join(ROOT, "examples", "bench", "bert_minilm.onnx")
US = 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--same", type=int, default=40, help="inferences of each repeated length")
    ap.add_argument("--new", type=int, default=60, help="random new lengths")
    a = ap.parse_args()
    import onnx
    from dyncli.defaults import CLI_COMPILE_PLANS, CLI_DEFAULT_POLICY
    from engine import Network, build_program, launcher, select_device
    from engine.device import describe
    from engine.fast_path import compiled, plans, replay
    from scripts.bench_growth import time_calls
    if not os.path.exists(MODEL):
        sys.exit(f"{MODEL} is missing: python examples/make_models.py --bench")
    prog = build_program(onnx.load(MODEL), MODEL)
    device = select_device(None)
    net = Network(prog, device, predictor=CLI_DEFAULT_POLICY, compile_plans=CLI_COMPILE_PLANS)
    spent, launched = collections.defaultdict(float), []
    launch_all = launcher.Launcher.launch_all      # (its launches alone, below)
    time_calls(spent, launcher.Launcher, "launch_all", "launches", US)
    timed_launches = launcher.Launcher.launch_all

    def launches(self, ls):
        launched.append(list(ls))
        return timed_launches(self, ls)
    launcher.Launcher.launch_all = launches
    q = net.queue
    for owner, name, label in ((plans, "repeat_predictor_calls", "predictor"), (q, "read_status", "read_status"),
                               (q, "read_to_host", "read_to_host"), (compiled.CompiledPlans, "run", "compiled"),
                               (replay, "put_back_args", "put_back_args"), (q.arena, "write_image", "image"),
                               # the big writes (host values of a length) apart
                               (q, "write", lambda buf, arr, *a, **k:
                                "write" if np.asarray(arr).nbytes < 16384 else "write >16K")):
        time_calls(spent, owner, name, label, US)
    rng = np.random.default_rng(0)

    def feeds(s):
        return {"input_ids": rng.integers(0, 30000, (1, s)), "attention_mask": np.ones((1, s), np.int64)}
    for s in [96, 64, 48, 24, 8, 16, 96, 64, 128] * 3:
        net.infer(feeds(s))
    print(f"device: {describe(device)}")

    def measure(lengths, tag):
        rows = []
        for s in lengths:
            spent.clear()
            launched.clear()
            t = time.perf_counter()
            net.infer(feeds(s))
            lat = (time.perf_counter() - t) * 1e6
            rows.append((lat, net.time_ms.get("device_wait", 0.0) * 1e3, sum(map(len, launched)), dict(spent)))
        med = lambda v: statistics.median(v)  # noqa: E731
        k = med(r[2] for r in rows)
        host = med(r[0] - r[1] for r in rows)
        parts = sorted({p for r in rows for p in r[3]})
        print(f"{tag}: latency {med(r[0] for r in rows):.0f} us, host {host:.0f} us, {k:.0f} kernels, host per "
              f"kernel {host / k:.1f} us; " + ", ".join(f"{p} {med(r[3].get(p, 0.0) for r in rows):.0f}" for p in parts))
    measure([64] * a.same, "same length 64")
    measure([128] * a.same, "same length 128")
    measure([int(s) for s in rng.choice([8, 16, 24, 32, 48, 64, 96, 128], a.same)], "known lengths")
    measure([int(s) for s in rng.integers(8, 129, a.new)], "new lengths")
    launched.clear()
    net.infer(feeds(128))
    ls = [x for batch in launched for x in batch]
    own = launcher.Launcher.for_queue(q.cl_queue)
    if own is None:
        return
    ts = []
    for _ in range(200):
        t = time.perf_counter()
        launch_all(own, ls)
        ts.append((time.perf_counter() - t) * 1e6)
        q.cl_queue.finish()
    print(f"the {len(ls)} launches of a same-length inference replayed alone: "
          f"{statistics.median(ts) / len(ls):.2f} us a launch (least {min(ts) / len(ls):.2f})")


if __name__ == "__main__":
    main()
