"""`dyncli bench --feedback OUT:IN,...`: a decode loop timed as one, the way it runs.

The sequence of --shapes is one decode: its first inference takes every input from the shapes
(a prompt, an empty past), each later one takes the fed-back inputs from the previous
inference's outputs on the device (the KV cache) and the others from the shapes (the new
token). The first pass builds kernels and buffers (cold); --warmup more passes are untimed;
--repeat timed passes give the per-step latency (mean, median, p90), kernels per step, how the
fast path served the steps (partial replays: only the nodes the KV length reaches run the flow;
compiled: those nodes as one function of the KV length, engine/fast_path/compiled_steps.py)
and where a step's time went (infer_end's time_ms), with the host time per kernel next to it.
The last step is then run again on its own --same-runs times, its fed-back inputs as host
values (`repeated`): a step that repeats a shape, next to the decode's steps that each bring a
new KV length.
--compare onnxruntime runs the same decode in onnxruntime, the presents fed back on the host.
Kept free of Typer/Rich: the CLI renders the returned dict.
"""
from __future__ import annotations

import statistics
import time

from dyncli.bench import BenchOptions, _mean_parts, compiled_summary, load_sequence, pct
from dyncli.gc_policy import long_lived_frozen
from dyncli.runner import UsageError, parse_feedback
from engine import Network, select_device
from engine.device import describe
from engine.launcher import launch_floor


def bench_decode(opts: BenchOptions, feedback_specs: list, progress=None) -> dict:
    model, prog, seq, feeds = load_sequence(opts)
    if len(seq) < 2:
        raise UsageError("--feedback: a decode needs at least two inferences in --shapes")
    feedback = parse_feedback(feedback_specs, prog, model)
    device = select_device(opts.device)
    net = Network(prog, device, impls=opts.impls, fast_path=opts.fast_path, predictor=opts.predictor,
                  feedback=feedback, compile_plans=opts.compiled_plans)
    read = [o for o in prog.outputs if o not in feedback]
    back = {inp: out for out, inp in feedback.items()}
    total = len(seq) * (1 + opts.warmup + opts.repeat)
    done = [0]

    last: dict = {}      # the last step's inputs, its fed-back ones read to the host (once:
    # the first pass, untimed by the decode's figure, waits for that read)

    def one_pass(what: str) -> list:
        steps = []
        for i, f in enumerate(feeds):
            f = f if i == 0 else {k: v for k, v in f.items() if k not in back}
            if i == len(feeds) - 1 and not last:
                last.update(f, **{inp: net.queue.read_to_host(net.tensors[out]) for inp, out in back.items()})
            t0 = time.perf_counter()
            net.infer(f, fed_back=back if i else None, outputs=read)
            ms = (time.perf_counter() - t0) * 1e3
            c = net.counters
            steps.append({"ms": ms, "kernels": c.get("kernels", 0), "partial": bool(c.get("plan.partial")),
                          "compiled": bool(c.get("plan.compiled")),
                          "kv_copies": c.get("kv_cache.copy", 0), "time_ms": dict(net.time_ms)})
            done[0] += 1
            if progress:
                progress(done[0], total, what)
        return steps

    cold = one_pass("first pass")
    for _ in range(opts.warmup):
        one_pass("warm-up")
    with long_lived_frozen():      # dyncli/gc_policy.py
        timed = [s for _ in range(max(opts.repeat, 1)) for s in one_pass("decode")[1:]]
    out = {"model": opts.model, "mode": "decode", "device": describe(device), "feedback": feedback,
           "steps": len(seq), "impls": opts.impls, "predictor": opts.predictor,
           "fast_path": opts.fast_path, "first_inference_ms": cold[0]["ms"],
           "cold": _summary(cold[1:]), "decode": _summary(timed),
           "repeated": _repeated(prog, device, opts, last),
           "compiled_plans": compiled_summary(net, opts.compiled_plans),
           # every step is a new signature: its host us per kernel beside one small kernel's launch
           "launch_floor_us": launch_floor(net.queue.cl_queue)}
    if "onnxruntime" in opts.compare:
        out["peers"] = {"onnxruntime": _ort_decode(model, feeds, feedback, opts.repeat)}
    return out


def _repeated(prog, device, opts: BenchOptions, step: dict) -> dict:
    """The last step alone, repeated (no feedback): warm runs of one shape, after 5 untimed ones
    (a CPU device's cores run slow for a while after the decode's end)."""
    net = Network(prog, device, impls=opts.impls, fast_path=opts.fast_path, predictor=opts.predictor)
    lat = []
    for k in range(5 + max(opts.same_runs, 2)):
        t0 = time.perf_counter()
        net.infer(step)
        if k >= 5:
            lat.append((time.perf_counter() - t0) * 1e3)
    return {"mean_ms": statistics.mean(lat), "median_ms": statistics.median(lat), "runs": len(lat)}


def _summary(steps: list) -> dict:
    lat = [s["ms"] for s in steps]
    parts = _mean_parts(s["time_ms"] for s in steps)
    kernels = statistics.mean(s["kernels"] for s in steps)
    host = statistics.mean(s["ms"] - s["time_ms"].get("device_wait", 0.0) for s in steps)
    return {"mean_ms": statistics.mean(lat), "median_ms": statistics.median(lat), "p90_ms": pct(lat, 90),
            "kernels_mean": kernels, "partial": sum(s["partial"] for s in steps),
            "compiled": sum(s["compiled"] for s in steps), "steps": len(steps),
            "kv_copies": sum(s["kv_copies"] for s in steps), "time_ms": parts,
            "host_us_per_kernel": host * 1e3 / kernels if kernels else None}


def _ort_decode(model, feeds: list, feedback: dict, repeat: int) -> dict:
    """The same decode in onnxruntime (CPU), the fed-back outputs passed back on the host."""
    from dyncli.check import Reference
    ref = Reference(model)
    lat = []
    for p in range(1 + max(repeat, 1)):
        outs = None
        for i, f in enumerate(feeds):
            f = dict(f)
            if i:
                f.update({inp: outs[out] for out, inp in feedback.items()})
            t0 = time.perf_counter()
            outs = ref.run(f)
            if p and i:
                lat.append((time.perf_counter() - t0) * 1e3)
    return {"mean_ms": statistics.mean(lat), "median_ms": statistics.median(lat)}
