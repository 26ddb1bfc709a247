#!/usr/bin/env python3
"""Cold start: load time and first inference of a model, as a new process sees them.

    PYOPENCL_NO_CACHE=1 CUDA_CACHE_DISABLE=1 POCL_KERNEL_CACHE=0 python scripts/bench_cold.py resnet50
    python scripts/bench_cold.py resnet50        # again: pyopencl's binary cache is warm

MODEL: a light model of the onnx wheel (resnet50, densenet121, squeezenet, ...) or an .onnx
path; input 1x3x224x224 for the light models. --no-prebuild builds each impl when its node
first asks (the flow's critical path) instead of in parallel before the first inference.
"""
import argparse
import os
import sys
import time

import numpy as np
import onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine import Network, build_program, select_device  # noqa: E402
from tests.models import light_model_paths, make_input_dynamic, randomize_weights, real_inputs  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--no-prebuild", action="store_true")
    ap.add_argument("--device")
    a = ap.parse_args()
    t0 = time.perf_counter()
    path = light_model_paths().get(a.model, a.model)
    m = onnx.load(path)
    if a.model in light_model_paths():
        m = make_input_dynamic(randomize_weights(m, seed=1))
    prog = build_program(m, path)
    dev = select_device(a.device)
    net = Network(prog, dev, prebuild_workers=1 if a.no_prebuild else 8)
    load = time.perf_counter() - t0
    (inp,) = real_inputs(m)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    t1 = time.perf_counter()
    net.infer({inp: x})
    first = time.perf_counter() - t1
    t2 = time.perf_counter()
    net.infer({inp: x})
    second = time.perf_counter() - t2
    c = net.counters
    print(f"{a.model}: load {load * 1e3:.0f} ms, first inference {first * 1e3:.0f} ms, "
          f"second {second * 1e3:.1f} ms, cold total {(load + first):.2f} s "
          f"(prebuild {'off' if a.no_prebuild else 'on'}, cache "
          f"{'off' if os.environ.get('PYOPENCL_NO_CACHE') else 'on'})", flush=True)


if __name__ == "__main__":
    main()
