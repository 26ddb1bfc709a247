#!/usr/bin/env python3
"""Dynamic (shape-agnostic) vs static impl kernel time, per node, for the GEMM, Conv and Softmax
nodes of examples/encoder.onnx and examples/cnn.onnx.

    python scripts/bench_impls.py [--repeat 30] [--device P:D] [--large] [--bert]

Two Networks run the same inference, one with --impls dynamic and one with --impls static
(every static impl built before timing); then each node's bound kernels are re-enqueued
--repeat times on a profiling queue and the median of the OpenCL event times (end - start) is
taken. ratio = dynamic / static (> 1: the static impl is faster). The per-op geometric means are
what each op's `static_on` (its register() in engine/ops/) is decided from. Timings only mean something on the device
they were taken on.
"""
import argparse
import math
import os
import statistics
import sys
from collections import defaultdict

import numpy as np
import onnx
import pyopencl as cl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dyncli.inputs import random_inputs  # noqa: E402
from engine import Network, build_program, select_device  # noqa: E402
from engine.device import describe  # noqa: E402

OPS = ("MatMul", "Gemm", "Conv", "Softmax")


BERT = os.path.join(ROOT, "examples", "bench", "bert_minilm.onnx")


def cases(large: bool, bert: bool = False):
    if bert:      # examples/make_models.py --bench
        for s in (8, 32, 96, 128):
            yield BERT, {"input_ids": (1, s), "attention_mask": (1, s)}
    enc = [(1, 16), (1, 128)] + ([(8, 128)] if large else [])
    for b, s in enc:
        yield "encoder.onnx", {"input_ids": (b, s), "attention_mask": (b, s)}
    cnn = [(1, 64, 64)] + ([(8, 224, 224)] if large else [(1, 128, 128)])
    for b, h, w in cnn:
        yield "cnn.onnx", {"x": (b, 3, h, w)}


def kernel_us(net, inst, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        evs = [cl.enqueue_nd_range_kernel(net.queue.cl_queue, b.kernel, b.gws, b.lws) for b in inst.bound]
        evs[-1].wait()
        times.append(sum(e.profile.end - e.profile.start for e in evs) / 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--device", default=None)
    ap.add_argument("--large", action="store_true", help="add bigger shapes (GPU)")
    ap.add_argument("--bert", action="store_true",
                    help="add the MiniLM BERT (examples/bench, make_models.py --bench) at 8, 32, 96, 128")
    a = ap.parse_args()
    dev = select_device(a.device)
    print(f"device: {describe(dev)}; median of {a.repeat} kernel runs (OpenCL profiling events)")
    ratios = defaultdict(list)
    seen = set()
    print(f"{'model':13} {'node':28} {'op':8} {'static impl':44} {'dyn us':>9} {'static us':>9} {'ratio':>6}")
    for model, shapes in cases(a.large, a.bert):
        path = model if os.path.isabs(model) else os.path.join(ROOT, "examples", model)
        model = os.path.basename(model)
        prog = build_program(onnx.load(path))
        dtypes = {n: l.dtype for n, l in prog.inputs.items()}
        feeds = random_inputs(np.random.default_rng(0), shapes, dtypes, {})
        nets = {m: Network(prog, dev, impls=m, profile=True) for m in ("dynamic", "static")}
        for net in nets.values():
            net.infer(feeds)
        for di, si in zip(nets["dynamic"].insts, nets["static"].insts):
            if di.node.op not in OPS or not di.bound or not si.bound:
                continue
            if si.bound[0].impl.kind != "static":
                continue
            key = (di.node.op, tuple(l.shape for l in di.in_layouts if l is not None))
            if key in seen:
                continue
            seen.add(key)
            td = kernel_us(nets["dynamic"], di, a.repeat)
            ts = kernel_us(nets["static"], si, a.repeat)
            r = td / ts
            ratios[di.node.op].append(r)
            name = si.bound[0].impl.name.split("/", 1)[1]
            print(f"{model:13} {di.node.name[:28]:28} {di.node.op:8} {name[:44]:44} {td:9.1f} {ts:9.1f} {r:6.2f}")
    print("\nper op: geometric mean of dynamic/static (> 1: static faster), min, max, shapes")
    for op, rs in ratios.items():
        g = math.exp(sum(math.log(r) for r in rs) / len(rs))
        print(f"  {op:8} {g:5.2f}  min {min(rs):5.2f}  max {max(rs):5.2f}  n={len(rs)}")


if __name__ == "__main__":
    main()
