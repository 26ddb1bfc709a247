#!/usr/bin/env python3
"""Device memory of activations with and without the memory pool, next to the lower bound.

    python scripts/bench_memory.py [--device P:D] [--only NAME] [--repeat 5]

For each model of scripts/bench_models.py: one network with the memory pool and one without,
the same inputs. Reported per network after the inferences: peak device bytes of activation
buffers, the live-tensor lower bound (the largest sum of tensors live at one step), buffers
taken from the pool, in-place concats, the warm median latency, and the largest difference
from onnxruntime. Byte figures do not depend on the device; latencies only mean something on
the machine they were taken on.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from scripts.bench_models import cases  # noqa: E402
from engine import Network, build_program, select_device  # noqa: E402
from engine.device import describe  # noqa: E402
from tests.conftest import ort_session  # noqa: E402


def mib(n: int) -> str:
    return f"{n / 2**20:8.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device")
    ap.add_argument("--only", help="substring of case names to run")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    dev = select_device(args.device)
    print(f"device: {describe(dev)}")
    print(f"{'case':24s} {'pool':>5s} {'peak MiB':>9s} {'bound MiB':>9s} {'peak/bound':>10s} "
          f"{'from_pool':>9s} {'in-place':>8s} {'warm ms':>8s} {'max abs err':>11s}")
    rng = np.random.default_rng(0)
    for name, model, make in cases():
        if args.only and args.only not in name:
            continue
        feeds = make(rng)
        ref = ort_session(model).run(None, feeds)
        for pool in (True, False):
            net = Network(build_program(model), dev, memory_pool=pool)
            out = net.infer(feeds)
            c = dict(net.counters)
            lat = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                out = net.infer(feeds)
                lat.append((time.perf_counter() - t0) * 1e3)
            err = max(float(np.abs(o - r).max()) for o, r in zip(out.values(), ref))
            peak, bound = net.counters["peak_bytes"], net.counters["live_bytes_lower_bound"]
            print(f"{name:24s} {'on' if pool else 'off':>5s} {mib(peak):>9s} {mib(bound):>9s} "
                  f"{peak / bound:10.2f} {c.get('realloc.from_pool', 0):9d} "
                  f"{c.get('in_place_concat.apply', 0):8d} {statistics.median(lat):8.2f} {err:11.2e}",
                  flush=True)


if __name__ == "__main__":
    main()
