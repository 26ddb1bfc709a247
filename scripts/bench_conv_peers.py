#!/usr/bin/env python3
"""GPU convs beside their peer in the same run: per geometry, dyncli's conv kernels (OpenCL
profiling events) against torch's F.conv2d (cuDNN, TF32 off); per model, a warm inference
against torchvision's eager model, with dyncli's kernel time per op type.

    python scripts/bench_conv_peers.py [--models resnet50,densenet121,squeezenet] [--sweep]
        [--every 1] [--batch 1] [--repeat 20] [--no-geoms] [--no-models] [--device P:D] [--kind gpu]

Geometries come from the onnx wheel's light models at Bx3x224x224 (scripts/bench_conv.py).
Per geometry: the engine's choice (shape-agnostic and static impl), the register-tiled kernel
(cl/conv_tiled.cl) and, with --sweep, conv_lm with every tile of engine/ops/conv_gemm.py (K split
as chosen) and the chosen tile unsplit; torch per call: eager back to back (launch-bound when
small) and replayed from a CUDA graph (kernel time). --every N: every Nth geometry of a model.
Models: median of --repeat warm inferences once the static impls are in, torchvision's
resnet50 / densenet121 / squeezenet1_1 (random weights, eval, fp32) median per call. Needs
torch with CUDA; timings only mean something on the machine they were taken on.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

import numpy as np
import onnx
import pyopencl as cl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

try:
    import torch
    import torch.nn.functional as F
except ImportError:   # dyncli's columns only (a smoke run on a machine without torch)
    torch = None

from engine import Network, build_program, select_device  # noqa: E402
from engine import device as device_mod  # noqa: E402
from engine.device import describe  # noqa: E402
from engine.ops import conv as conv_mod, conv_gemm  # noqa: E402
from scripts.bench_conv import conv_model, model_geometries  # noqa: E402
from scripts.bench_impls import kernel_us  # noqa: E402
from tests.conftest import ort_session  # noqa: E402
from tests.models import light_model_paths, make_input_dynamic, randomize_weights, real_inputs  # noqa: E402

if torch is not None:
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
TORCH_MODELS = {"resnet50": "resnet50", "densenet121": "densenet121", "squeezenet": "squeezenet1_1"}


def torch_conv_us(g, repeat: int) -> tuple[float, float]:
    """(eager us per call, CUDA-graph us per call) of F.conv2d for geometry g."""
    x = torch.randn(g.N, g.C, g.H, g.W, device="cuda")
    w = torch.randn(g.OC, g.C // g.group, g.KH, g.KW, device="cuda")
    b = torch.randn(g.OC, device="cuda") if g.bias else None
    t, l, bo, r = g.pads
    if (t, l) != (bo, r):
        x = F.pad(x, (l, r, t, bo))
        t = l = 0

    def f():
        return F.conv2d(x, w, b, g.stride, (t, l), g.dil, g.group)
    with torch.no_grad():
        for _ in range(3):
            f()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(repeat):
            f()
        e.record()
        e.synchronize()
        eager = s.elapsed_time(e) * 1e3 / repeat
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            f()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(repeat):
                f()
        graph.replay()
        torch.cuda.synchronize()
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
    return eager, s.elapsed_time(e) * 1e3 / repeat


def dyncli_us(g, dev, mode: str, repeat: int) -> tuple[float, str]:
    net = Network(build_program(conv_model(g)), dev, impls=mode, profile=True)
    net.infer({"x": np.random.default_rng(1).standard_normal((g.N, g.C, g.H, g.W)).astype(np.float32)})
    inst = next(i for i in net.insts if i.node.op == "Conv")
    tag = inst.bound[0].impl.name.split("[")[-1].rstrip("]") if mode == "static" else \
        "+".join(b.call.kernel for b in inst.bound)
    return kernel_us(net, inst, repeat), tag


def variants(sweep: bool):
    """(name, settings to patch) per dyncli variant of a geometry."""
    out = [("chosen", {}), ("tiled", {(conv_mod, "LM_MIN_OCG"): 1 << 30})]
    if sweep:
        for t, _ in conv_gemm.TILES:
            out.append((f"{t[1] * t[2]}x{t[0] * t[3]}", {(conv_gemm, "TILES"): [(t, 0)]}))
        out.append(("nosplit", {(conv_gemm, "SPLIT_BLOCKS"): 0}))
    return out


def bench_geoms(names, dev, a) -> None:
    print(f"\n== conv geometries: kernel us (dyncli: median of {a.repeat} OpenCL profiling events; "
          "torch: cuDNN TF32 off, eager per call / CUDA graph per call)")
    for name in names:
        geoms = model_geometries(light_model_paths()[name], (a.batch, 3, 224, 224))[::a.every]
        totals = defaultdict(float)
        for g, count in geoms:
            cols = []
            if torch is not None:
                eager, graph = torch_conv_us(g, a.repeat)
                cols = [f"torch {eager:7.1f}/{graph:7.1f}"]
                totals["torch_eager"] += eager * count
                totals["torch_graph"] += graph * count
            for vname, patch in variants(a.sweep):
                saved = {k: getattr(*k) for k in patch}
                for (mod, attr), v in patch.items():
                    setattr(mod, attr, v)
                try:
                    modes = ("dynamic", "static") if vname == "chosen" else ("dynamic",)
                    for mode in modes:
                        us, tag = dyncli_us(g, dev, mode, a.repeat)
                        totals[f"{vname}/{mode}"] += us * count
                        cols.append(f"{vname}/{mode[0]} {us:7.1f} [{tag}]")
                finally:
                    for (mod, attr), v in saved.items():
                        setattr(mod, attr, v)
            print(f"{name:11} {g.label():30} x{count} {g.flops / 1e6:8.1f} MF | " + " | ".join(cols),
                  flush=True)
        print(f"{name} TOTAL (x count, every {a.every}): " +
              ", ".join(f"{k} {v:.0f}" for k, v in totals.items()), flush=True)


def op_times(net, repeat: int = 5) -> dict:
    """Kernel us per op type (fused names joined), each node's bound kernels re-enqueued."""
    per = defaultdict(float)
    for inst in net.insts:
        if not inst.bound:
            continue
        op = inst.node.op + ("+f" if inst.node.fusion is not None else "")
        per[op] += kernel_us(net, inst, repeat)
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


def torch_model_ms(name: str, x: np.ndarray, repeat: int) -> float | None:
    """torchvision's eager model per call (median), None without torch or torchvision."""
    try:
        import torchvision
    except ImportError:
        return None
    tm = getattr(torchvision.models, TORCH_MODELS[name])(weights=None).eval().cuda()
    xt = torch.from_numpy(x).cuda()
    times = []
    with torch.no_grad():
        for _ in range(5):
            tm(xt)
        torch.cuda.synchronize()
        for _ in range(repeat):
            t0 = time.perf_counter()
            tm(xt)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench_models(names, dev, a) -> None:
    print(f"\n== models 1x3x224x224: warm ms per inference (median of {a.repeat})")
    rng = np.random.default_rng(0)
    for name in names:
        m = make_input_dynamic(randomize_weights(onnx.load(light_model_paths()[name]), seed=1))
        (inp,) = real_inputs(m)
        feeds = {inp: rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
        net = Network(build_program(m), dev)
        for _ in range(3):
            net.infer(feeds)
        if net.impls._compile_queue is not None:
            net.impls._compile_queue.wait_idle(120)
        for _ in range(5):
            out = net.infer(feeds)
        ours = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            out = net.infer(feeds)
            ours.append((time.perf_counter() - t0) * 1e3)
        ref = ort_session(m).run(None, feeds)
        err = max(float(np.abs(o - r).max() / (np.abs(r).max() + 1e-30)) for o, r in zip(out.values(), ref))
        o = statistics.median(ours)
        t = torch_model_ms(name, feeds[inp], a.repeat) if torch is not None else None
        peer = f"torch eager {t:7.2f} ms  ratio {o / t:5.2f}" if t else "torch eager: n/a (no torchvision)"
        print(f"{name:12} dyncli {o:7.2f} ms  {peer}  "
              f"max err / max |ref| vs onnxruntime {err:.1e}", flush=True)
        pnet = Network(build_program(m), dev, profile=True)
        for _ in range(3):
            pnet.infer(feeds)
        if pnet.impls._compile_queue is not None:
            pnet.impls._compile_queue.wait_idle(120)
        for _ in range(3):
            pnet.infer(feeds)
        per = op_times(pnet)
        print(f"  kernel us per op, sum {sum(per.values()):.0f}: " +
              ", ".join(f"{k} {v:.0f}" for k, v in per.items()), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,densenet121,squeezenet")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1, help="the geometries' batch (models: 1)")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-geoms", action="store_true")
    ap.add_argument("--no-models", action="store_true")
    ap.add_argument("--device")
    ap.add_argument("--kind", help="cpu or gpu: that kind's kernels whatever the device")
    a = ap.parse_args()
    dev = select_device(a.device)
    if a.kind:   # the kernels of another device kind (a smoke run of GPU kernels on a CPU)
        device_mod._kind["last"] = a.kind
    peer = f"torch {torch.__version__}, {torch.cuda.get_device_name()}, cuDNN " \
        f"{torch.backends.cudnn.version()}" if torch is not None else "no torch"
    print(f"device: {describe(dev)}; {peer}")
    names = a.models.split(",")
    if not a.no_geoms:
        bench_geoms(names, dev, a)
    if not a.no_models:
        bench_models(names, dev, a)


if __name__ == "__main__":
    main()
