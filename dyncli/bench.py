"""`dyncli bench`: how fast a shape sequence runs, and what a changed shape costs.

Procedure (one Network, trace off unless --trace):
1. first pass over the sequence: the latency of the first inference of each distinct shape
   (it builds kernels: "first seen"), and the compile time; what the model's first inference
   built is frozen for Python's collector from then on, as `dyncli run` does
   (dyncli/gc_policy.py), and what the first pass and warm-up add, before the timed passes;
2. --warmup more passes, untimed;
3. --repeat timed passes over the sequence: per inference wall latency, time blocked on the
   device (reads, finish), kernels enqueued, whether the fast path replayed it;
4. each distinct shape run warm on its own (--same-runs times in a row, in --repeat rounds,
   one after each timed pass: a host whose speed drifts between the sequence and the shapes
   alone moved the ratio by 0.1-0.2 on an H200 host): the denominator of the dynamic overhead
   = mean latency over the sequence / mean of each inference's shape run warm on its own (1.0
   means a changed shape costs nothing);
   then the launch floor: one small kernel launched again and again on the same queue (the
   host us per launch that the host time per kernel above is compared with);
5. --profile: one more pass on a profiling queue (profiling doubles the launch cost, so it is
   never the timed pass) for the summed kernel time per inference;
6. --compare onnxruntime: the same inputs through onnxruntime in the same process.

Kernel micro-benchmarks (--kernel gemm:MxNxK, eltwise:N) time one node's dynamic and static
impls from profiling events (median over --repeat) and give TFLOP/s or GB/s (a GEMV, at most
GEMV_MAX_ROWS rows: both, GB/s of its weight).
Kept free of Typer/Rich: the CLI renders the returned dict.
"""
from __future__ import annotations

import importlib
import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dyncli import shapes as shape_spec
from dyncli.defaults import CLI_COMPILE_PLANS, CLI_DEFAULT_POLICY
from dyncli.gc_policy import freeze_long_lived, long_lived_frozen
from dyncli.inputs import random_inputs
from dyncli.runner import RunOptions, UsageError, read_model, resolve_sequence
from engine import Network, build_program, select_device
from engine.device import describe
from engine.launcher import launch_floor
from engine.ops.matmul import GEMV_MAX_ROWS
from engine.program import ModelError


@dataclass
class BenchOptions:
    model: str | None = None
    shapes: list = field(default_factory=list)
    shapes_file: str | None = None
    grid: bool = False
    model_shape: list = field(default_factory=list)
    input_range: list = field(default_factory=list)
    seed: int = 0
    warmup: int = 1
    repeat: int = 3
    same_runs: int = 10
    device: str | None = None
    impls: str = "auto"
    predictor: str = CLI_DEFAULT_POLICY
    fast_path: bool = True
    compiled_plans: str = CLI_COMPILE_PLANS
    trace: str | None = None
    profile: bool = False
    compare: list = field(default_factory=list)
    kernels: list = field(default_factory=list)


def compiled_summary(net, mode: str) -> dict | None:
    """What compiled plans did (engine/fast_path: compiled_steps.py, compiled.py), by kind."""
    fast = net.fast
    if fast is None:
        return None
    return {"mode": mode, "partial": fast.steps.summary() if fast.steps is not None else None,
            "whole": fast.compiled.summary() if fast.compiled is not None else None}


def pct(values, q) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _key(feeds: dict) -> str:
    """The shapes of one inference, in input order (names in the result's `inputs`); one
    shape when every input has it."""
    shapes = [shape_spec.format_shape(np.shape(v)) for v in feeds.values()]
    return shapes[0] if len(set(shapes)) == 1 else ",".join(shapes)


def load_sequence(opts: BenchOptions) -> tuple:
    """(model, program, shape sequence, random feeds) of a benchmark; the user's mistakes as
    UsageError."""
    from engine.fast_path import COMPILE_MODES
    from engine.predictors import ENGINE_POLICIES
    if opts.predictor not in ENGINE_POLICIES:
        raise UsageError(f"--predictor: unknown policy {opts.predictor!r}: choose from "
                         f"{', '.join(ENGINE_POLICIES)}")
    if opts.compiled_plans not in COMPILE_MODES:
        raise UsageError(f"--compiled-plans must be one of {', '.join(COMPILE_MODES)}, not {opts.compiled_plans!r}")
    check_peers(opts.compare)
    model = read_model(opts.model)
    try:
        prog = build_program(model, opts.model)
    except ModelError as e:
        raise UsageError(str(e)) from None
    seq, _ = resolve_sequence(RunOptions(model=opts.model, shapes=opts.shapes, shapes_file=opts.shapes_file,
                                         grid=opts.grid, model_shape=opts.model_shape), prog, model)
    try:
        ranges = shape_spec.parse_input_ranges(opts.input_range, list(prog.inputs)) if opts.input_range else {}
    except shape_spec.ShapeSpecError as e:
        raise UsageError(str(e)) from None
    rng = np.random.default_rng(opts.seed)
    dtypes = {n: l.dtype for n, l in prog.inputs.items()}
    return model, prog, seq, [random_inputs(rng, inf, dtypes, ranges) for inf in seq]


def bench_model(opts: BenchOptions, progress=None) -> dict:
    """Run the procedure of the module docstring; `progress(done, total, what)` after each
    inference."""
    model, prog, seq, feeds = load_sequence(opts)
    names = list(prog.inputs)
    keys = [_key(f) for f in feeds]
    distinct = list(dict.fromkeys(keys))
    device = select_device(opts.device)
    trace = None
    if opts.trace:
        from traces import TraceWriter
        trace = TraceWriter(opts.trace, {"model": opts.model, "device": describe(device),
                                         "options": {"bench": True, "fast_path": opts.fast_path}})
    t0 = time.perf_counter()
    net = Network(prog, device, trace=trace, impls=opts.impls, fast_path=opts.fast_path,
                  predictor=opts.predictor, compile_plans=opts.compiled_plans)
    load_ms = (time.perf_counter() - t0) * 1e3
    rounds = max(opts.repeat, 1)
    per_round = -(-max(opts.same_runs - 1, 1) // rounds)    # (the warm runs of each round)
    n_total = len(seq) * (1 + opts.warmup + opts.repeat) + len(distinct) * rounds * (per_round + 1)
    done = [0]

    def infer(f, what):
        t = time.perf_counter()
        net.infer(f)
        ms = (time.perf_counter() - t) * 1e3
        done[0] += 1
        if progress:
            progress(done[0], n_total, what)
        return ms, net.blocked_s * 1e3, net.counters

    # the network and what its first inference builds are long-lived from then on, as in
    # `dyncli run` (dyncli/gc_policy.py); what the first pass and warm-up add, from the timed
    # passes on
    with long_lived_frozen():
        # 1. first pass: first-seen latency per shape (and where it went), compile time
        first_seen, first_parts, first_host, compile_ms = {}, {}, {}, 0.0
        for n, (f, k) in enumerate(zip(feeds, keys)):
            ms, blocked, c = infer(f, "first pass")
            if n == 0:
                freeze_long_lived()
            compile_ms += c.get("compile_ms", 0.0)
            if k not in first_seen:
                first_seen[k], first_parts[k] = ms, dict(net.time_ms)
                # the host's part of a new signature's inference, per kernel (issue target: next
                # to the launch floor)
                first_host[k] = (ms - blocked) * 1e3 / c["kernels"] if c.get("kernels") else None
        # 2. warm-up
        for _ in range(opts.warmup):
            for f in feeds:
                infer(f, "warm-up")
        freeze_long_lived()
        # 3. timed passes over the sequence, 4. after each, a round of each distinct shape warm
        # on its own
        rows, alone = [], {k: [] for k in distinct}
        for r in range(rounds):
            for f, k in zip(feeds, keys) if r < opts.repeat else ():
                ms, blocked, c = infer(f, "sequence")
                rows.append((k, ms, blocked, c.get("kernels", 0), bool(c.get("plan.replay")),
                             bool(c.get("plan.partial")), dict(net.time_ms)))
            for k in distinct:
                f = feeds[keys.index(k)]
                infer(f, "same shape")          # the change into this shape is not part of its warm time
                alone[k] += [infer(f, "same shape") for _ in range(per_round)]
        same = {k: {"median_ms": statistics.median(r[0] for r in runs),
                    "host_ms": statistics.median(r[0] - r[1] for r in runs),
                    "kernels": runs[-1][2].get("kernels", 0)} for k, runs in alone.items()}
    # the launch floor on the same queue: the host's part of one small kernel's launch
    floor = launch_floor(net.queue.cl_queue)
    # 5. kernel time on a profiling queue (separate network: its launches cost more)
    device_ms = {}
    if opts.profile:
        pnet = Network(prog, device, impls=opts.impls, fast_path=opts.fast_path, profile=True,
                       predictor=opts.predictor)
        for _ in range(2):
            for f, k in zip(feeds, keys):
                pnet.infer(f)
                device_ms.setdefault(k, []).append(pnet.device_ms())
        device_ms = {k: statistics.median(v[len(v) // 2:]) for k, v in device_ms.items()}

    lat = [r[1] for r in rows]
    per_shape = {}
    for k in distinct:
        mine = [r for r in rows if r[0] == k]
        per_shape[k] = {
            "inferences": len(mine), "first_seen_ms": first_seen[k],
            "median_ms": statistics.median(r[1] for r in mine), "p90_ms": pct([r[1] for r in mine], 90),
            "host_ms": statistics.median(r[1] - r[2] for r in mine),
            "kernels": mine[-1][3], "replayed": sum(r[4] for r in mine),
            "partial": sum(r[5] for r in mine), "time_ms": _mean_parts(r[6] for r in mine),
            "first_seen_time_ms": first_parts[k], "first_seen_host_us_per_kernel": first_host[k],
            "same_shape_ms": same[k]["median_ms"],
            "first_seen_over_warm": first_seen[k] / same[k]["median_ms"],
            # the model's first inference (cold: every kernel built) is no first-seen length
            "model_first": k == keys[0],
        }
        if k in device_ms:
            per_shape[k]["device_ms"] = device_ms[k]
    denom = statistics.mean(same[r[0]]["median_ms"] for r in rows)
    steady = _median_or_none(same[k]["host_ms"] * 1e3 / same[k]["kernels"] for k in distinct if same[k]["kernels"])
    # the host's part per kernel of the first-seen shapes after the model's first inference
    first_us = _median_or_none(first_host[k] for k in distinct if k != keys[0] and first_host[k] is not None)
    out = {
        "model": opts.model, "inputs": names, "device": describe(device), "fast_path": opts.fast_path,
        "impls": opts.impls, "predictor": opts.predictor, "sequence_length": len(seq), "timed_inferences": len(rows),
        "load_ms": load_ms, "compile_ms": compile_ms,
        "sequence": {"mean_ms": statistics.mean(lat), "median_ms": statistics.median(lat),
                     "p90_ms": pct(lat, 90), "host_ms_mean": statistics.mean(r[1] - r[2] for r in rows),
                     "kernels_mean": statistics.mean(r[3] for r in rows),
                     "replayed": sum(r[4] for r in rows), "partial": sum(r[5] for r in rows),
                     "time_ms": _mean_parts(r[6] for r in rows)},
        "dynamic_overhead": statistics.mean(lat) / denom,
        "steady_host_us_per_kernel": steady,
        # the same for the first-seen shapes after the model's first inference (their median)
        "first_seen_host_us_per_kernel": first_us,
        # the host us per launch of one small kernel on the same queue (engine/launcher.py),
        # and the two figures above over it
        "launch_floor_us": floor,
        "steady_host_over_floor": _over(steady, floor),
        "first_seen_host_over_floor": _over(first_us, floor),
        # the worst first-seen shape after the model's first inference, over its warm time
        "first_seen_over_warm_max": max((v["first_seen_over_warm"] for k, v in per_shape.items()
                                         if not v["model_first"]), default=None),
        "shapes": per_shape,
    }
    if net.fast is not None:      # the steady steps' compiled shape functions (their coverage)
        out["shape_functions"] = net.fast.shape_fns.summary()
        out["compiled_plans"] = compiled_summary(net, opts.compiled_plans)
    if opts.profile and device_ms:
        out["sequence"]["device_ms_mean"] = statistics.mean(device_ms[k] for k in keys)
    for peer in opts.compare:
        out.setdefault("peers", {})[peer] = _peer(peer, model, feeds, keys, opts, per_shape)
    return out


def _over(x, floor):
    return x / floor if x is not None and floor else None


def _median_or_none(values):
    values = list(values)
    return statistics.median(values) if values else None


def _mean_parts(parts) -> dict:
    """The mean of infer_end time_ms dicts (engine/accounting.py), part by part."""
    parts = list(parts)
    return {k: statistics.mean(p.get(k, 0.0) for p in parts) for k in parts[0]} if parts else {}


# --compare PEER -> how to install it
PEERS = {"onnxruntime": "pip install 'dyncli[check]'", "torch": "pip install torch"}


def check_peers(names: list) -> None:
    """Before anything runs: each --compare names a peer that is installed."""
    for name in names:
        if name not in PEERS:
            raise UsageError(f"--compare: unknown peer {name!r} ({', '.join(PEERS)})")
        try:
            importlib.import_module(name)
        except ImportError:
            raise UsageError(f"--compare {name} needs {name}: {PEERS[name]}") from None


def _peer(name: str, model, feeds, keys, opts, per_shape) -> dict:
    """The same inputs through a peer runtime: per shape median latency and our ratio."""
    if name == "torch":
        return {"skipped": "torch cannot run an ONNX file (run the model's torch source for that peer)"}
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 4   # fatal only: its errors come back as exceptions, said once
    from dyncli.check import ort_reason, relaxed_model
    relax = {i.name: tuple(None for _ in i.type.tensor_type.shape.dim) for i in model.graph.input
             if i.type.tensor_type.HasField("shape")}   # one without a shape takes any already
    try:
        sess = ort.InferenceSession(relaxed_model(model, relax).SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        for f in feeds * max(opts.warmup, 1):
            sess.run(None, f)
    except Exception as e:  # noqa: BLE001 - onnxruntime's errors share no public base class
        raise UsageError(f"--compare onnxruntime: onnxruntime refused the model: {ort_reason(e)}") from None
    times = {}
    for _ in range(opts.repeat):
        for f, k in zip(feeds, keys):
            t = time.perf_counter()
            sess.run(None, f)
            times.setdefault(k, []).append((time.perf_counter() - t) * 1e3)
    lat = [t for k in keys for t in times[k]]
    shapes = {k: {"median_ms": statistics.median(v),
                  "ratio": per_shape[k]["median_ms"] / statistics.median(v)} for k, v in times.items()}
    return {"provider": "CPUExecutionProvider", "mean_ms": statistics.mean(lat), "shapes": shapes}


# ---- kernel micro-benchmarks -----------------------------------------------------------------
def _one_node_model(kind: str, dims: list[int]) -> tuple[onnx.ModelProto, dict, float, str]:
    """(model, feeds, work per run, unit): gemm:MxNxK -> MatMul of x[M,K] by a constant [K,N]
    (2MNK flops); eltwise:N -> Add of two [N] inputs (12N bytes moved)."""
    rng = np.random.default_rng(0)
    f32 = TensorProto.FLOAT
    if kind == "gemm":
        m, n, k = dims
        # raw bytes: a float list of a GEMV's weight (an LM head: 38-131 M values) takes minutes
        w = numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "w")
        g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="gemm")], "gemm",
                              [helper.make_tensor_value_info("x", f32, ["m", k])],
                              [helper.make_tensor_value_info("y", f32, ["m", n])], [w])
        feeds = {"x": rng.standard_normal((m, k)).astype(np.float32)}
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), feeds, 2.0 * m * n * k, "TFLOP/s"
    (n,) = dims
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"], name="add")], "eltwise",
                          [helper.make_tensor_value_info(x, f32, ["n"]) for x in "ab"],
                          [helper.make_tensor_value_info("y", f32, ["n"])])
    feeds = {x: rng.standard_normal(n).astype(np.float32) for x in "ab"}
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), feeds, 12.0 * n, "GB/s"


KERNEL_KINDS = {"gemm": 3, "eltwise": 1}


def parse_kernel(spec: str) -> tuple[str, list[int]]:
    kind, _, dims = spec.partition(":")
    if kind not in KERNEL_KINDS:
        raise UsageError(f"--kernel {spec!r}: expected one of {', '.join(KERNEL_KINDS)} "
                         "(gemm:MxNxK, eltwise:N)")
    try:
        vals = [int(x) for x in dims.lower().split("x")]
    except ValueError:
        vals = []
    if len(vals) != KERNEL_KINDS[kind] or min(vals) < 1:
        raise UsageError(f"--kernel {spec!r}: {kind} takes {KERNEL_KINDS[kind]} positive dims "
                         f"separated by x")
    return kind, vals


def bench_kernel(spec: str, device, repeat: int = 20) -> dict:
    """Median kernel time (profiling events) of the node's dynamic and static impls."""
    kind, dims = parse_kernel(spec)
    model, feeds, work, unit = _one_node_model(kind, dims)
    out = {"kernel": spec, "unit": unit}
    for impls in ("dynamic", "static"):
        net = Network(build_program(model), device, impls=impls, async_compile=False,
                      profile=True, fast_path=False)
        times = []
        for i in range(repeat + 2):
            net.infer(feeds)
            if i >= 2:
                times.append(net.device_ms())
        us = statistics.median(times) * 1e3
        scale = 1e-12 if unit == "TFLOP/s" else 1e-9
        out[impls] = {"us": us, unit: work / (us * 1e-6) * scale, "kernels": net.counters["kernels"]}
        if kind == "gemm" and dims[0] <= GEMV_MAX_ROWS:
            # a GEMV is bandwidth-bound: its weight bytes (4 K N) over the kernel time
            out[impls]["GB/s"] = 4.0 * dims[1] * dims[2] / (us * 1e-6) * 1e-9
    return out


def bench_kernels(specs: list, device_spec: str | None, repeat: int) -> dict:
    for s in specs:
        parse_kernel(s)      # every spec checked before anything runs
    device = select_device(device_spec)
    return {"device": describe(device), "kernels": [bench_kernel(s, device, repeat) for s in specs]}
