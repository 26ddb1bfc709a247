#!/usr/bin/env python3
"""Softmax prologue fusion vs the unfused chain: kernel time and peak device bytes of the masked
attention core softmax(q @ k^T * scale + mask) @ v (tests/models.py masked_attention).

    python scripts/bench_prologue.py [--repeat 20] [--device P:D] [--large]

Two Networks run the same inference: the default program (Mul and Add run inside the Softmax's
input reads: one kernel) and one built with fusion off (Mul, Add, Softmax: three kernels and two
materialised [b, h, s, l] tensors). The chain's kernels are then re-enqueued --repeat times on a
profiling queue; the median of the summed OpenCL event times is printed with each network's
peak device bytes of activations (with the memory pool, an unfused intermediate may reuse a
dead tensor's buffer, so bytes allocated alone would hide its cost). Timings only mean something on the device they were taken on.
"""
import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine import Network, build_program, select_device  # noqa: E402
from engine.device import describe  # noqa: E402
from scripts.bench_impls import kernel_us  # noqa: E402
from tests.models import masked_attention  # noqa: E402

CHAIN = ("Mul_scale", "Add_mask", "Softmax")


def chain_us(net, repeat: int) -> float:
    return sum(kernel_us(net, i, repeat) for i in net.insts if i.node.name in CHAIN and i.bound)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--device", default=None)
    ap.add_argument("--large", action="store_true", help="add bigger shapes (GPU)")
    a = ap.parse_args()
    dev = select_device(a.device)
    heads, d_head = 8, 64
    model = masked_attention(heads=heads, d_head=d_head)
    shapes = [(1, 128), (4, 128), (1, 512)] + ([(8, 512), (4, 2048)] if a.large else [])
    print(f"device: {describe(dev)}; heads {heads}, d_head {d_head}, mask [b, 1, 1, s]; "
          f"median of {a.repeat} runs of the chain's kernels (OpenCL profiling events)")
    print(f"{'b x s':>10} {'fused us':>10} {'unfused us':>11} {'speedup':>8} "
          f"{'fused peak KiB':>15} {'unfused peak KiB':>17}")
    rng = np.random.default_rng(0)
    for b, s in shapes:
        feeds = {n: rng.standard_normal((b, heads, s, d_head)).astype(np.float32) for n in "qkv"}
        feeds["mask"] = np.where(rng.random((b, 1, 1, s)) > 0.2, 0.0, -1e4).astype(np.float32)
        row = []
        for fusion in (True, False):
            net = Network(build_program(model, fusion=fusion), dev, impls="dynamic", profile=True)
            net.infer(feeds)
            row.append((chain_us(net, a.repeat), net.counters["peak_bytes"] / 1024))
        (fu, fk), (uu, uk) = row
        print(f"{f'{b} x {s}':>10} {fu:10.1f} {uu:11.1f} {uu / fu:8.2f} {fk:15.0f} {uk:17.0f}")


if __name__ == "__main__":
    main()
