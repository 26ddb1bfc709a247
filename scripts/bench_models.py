#!/usr/bin/env python3
"""Latency of dyncli's engine vs onnxruntime (CPU) on the same inputs, same machine, same run.

    python scripts/bench_models.py [--repeat 20] [--device P:D]

For each model and shape: one cold inference (includes kernel builds unless cached), then
--repeat warm inferences of the same shape; medians are reported, with the ratio to
onnxruntime's median. Timings only mean something on the machine they were taken on.
"""
import argparse
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
from tests.conftest import ort_session  # noqa: E402
from tests.models import light_model_paths, make_input_dynamic, randomize_weights, real_inputs  # noqa: E402


def cases():
    enc = onnx.load(os.path.join(ROOT, "examples", "encoder.onnx"))
    for b, s in [(1, 16), (1, 128), (8, 128)]:
        yield f"encoder {b}x{s}", enc, lambda rng, b=b, s=s: {
            "input_ids": rng.integers(0, 1000, (b, s)).astype(np.int64),
            "attention_mask": np.ones((b, s), np.int64)}
    cnn = onnx.load(os.path.join(ROOT, "examples", "cnn.onnx"))
    for b, hw in [(1, 64), (8, 128)]:
        yield f"cnn {b}x3x{hw}x{hw}", cnn, lambda rng, b=b, hw=hw: {
            "x": rng.standard_normal((b, 3, hw, hw)).astype(np.float32)}
    for name in ("resnet50", "densenet121", "vgg19", "squeezenet"):
        m = make_input_dynamic(randomize_weights(onnx.load(light_model_paths()[name]), seed=1))
        (inp,) = real_inputs(m)
        yield f"{name} 1x3x224x224", m, lambda rng, inp=inp: {
            inp: rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--device")
    ap.add_argument("--only", help="substring of case names to run")
    args = ap.parse_args()
    dev = select_device(args.device)
    print(f"device: {describe(dev)}")
    print(f"{'case':28s} {'cold ms':>9s} {'dyncli ms':>10s} {'ort-cpu ms':>10s} {'ratio':>7s} {'max abs err':>12s}")
    rng = np.random.default_rng(0)
    for name, model, make in cases():
        if args.only and args.only not in name:
            continue
        net = Network(build_program(model), dev)
        sess = ort_session(model)
        feeds = make(rng)
        t0 = time.perf_counter()
        out = net.infer(feeds)
        cold = (time.perf_counter() - t0) * 1e3
        ours, theirs = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            out = net.infer(feeds)
            ours.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            ref = sess.run(None, feeds)
            theirs.append((time.perf_counter() - t0) * 1e3)
        err = max(float(np.abs(o - r).max()) for o, r in zip(out.values(), ref))
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"{name:28s} {cold:9.1f} {a:10.2f} {b:10.2f} {a / b:7.2f} {err:12.2e}", flush=True)


if __name__ == "__main__":
    main()
