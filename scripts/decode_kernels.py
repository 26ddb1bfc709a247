#!/usr/bin/env python3
"""Summed kernel time per GPT-2-small decode step, by kernel, from a profiling queue (an untimed
pass: profiling doubles the launch cost):

    python examples/make_models.py --bench && python scripts/decode_kernels.py [--tokens N] [--by-size]

H200, session 9: 0.95 ms a step over 62 kernels (gemv 0.67, attention_wg 0.25); session 10:
0.73-0.75 (gemv 0.58, attention_dec 0.14).
"""
import argparse
import collections
import os
import statistics
import sys

import numpy as np
import onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from bench_e2e import GPT2, gpt2_feeds  # noqa: E402
from engine import Network, build_program  # noqa: E402
from engine.device_queue import DeviceQueue  # noqa: E402


BY_SIZE = False
SIZES: dict = {}      # id(cl.Kernel) -> its call's (M, N, K) (GEMMs) or params' head


class NamedQueue(DeviceQueue):
    """The device queue, keeping the kernel names of what it enqueues (its events are in order)."""
    names: list = []

    def enqueue(self, launches) -> None:
        self.names.extend((k.function_name, SIZES.get(id(k), g)) if BY_SIZE else k.function_name
                          for k, g, _ in launches)
        super().enqueue(launches)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--by-size", action="store_true", help="by kernel and global work size")
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args()
    global BY_SIZE
    BY_SIZE = a.by_size
    prog = build_program(onnx.load(GPT2), GPT2)
    fb = {n.replace("past_", "present_"): n for n in prog.inputs if n.startswith("past_")}
    back = {v: k for k, v in fb.items()}
    net = Network(prog, None, feedback=fb, profile=True)
    net.queue.__class__ = NamedQueue
    net.infer(gpt2_feeds(prog), outputs=["logits"])
    per, by = [], collections.Counter()
    for t in range(a.tokens):
        if t == 8:
            SIZES.update({id(b.kernel): tuple(b.call.params[:3]) for i in net.insts for b in i.bound})
        NamedQueue.names = []
        net.infer({"input_ids": np.array([[t]], np.int64)}, fed_back=back, outputs=["logits"])
        if t >= 8:                    # past the first KV growths
            per.append(net.device_ms())
            for name, e in zip(NamedQueue.names, net.queue.events):
                by[name] += (e.profile.end - e.profile.start) * 1e-6
    n = len(per)
    print(f"decode summed kernel time per step: mean {statistics.mean(per):.3f} ms, median "
          f"{statistics.median(per):.3f}, kernels {net.counters['kernels']}")
    print("by kernel (ms/step):", {k: round(v / n, 3) for k, v in by.most_common(a.top)})


if __name__ == "__main__":
    main()
