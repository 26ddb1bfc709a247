"""One `dyncli run`: resolve the inference sequence, drive the Network, compare, trace.

The CLI (cli.py) parses options into `RunOptions` and renders the `RunResult`; the engine does
the work. Kept free of Typer/Rich so tests and scripts can call `execute_run` directly.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from dyncli import shapes as shape_spec
from dyncli.check import Reference, compare, relaxed_model
from dyncli.inputs import load_inputs, random_inputs, save_tensors
from engine import Network, PreallocSettings, build_program, select_device
from engine.device import describe
from engine.f16 import cast_summary, half_support
from engine.fusion import fusion_map
from engine.predictors import ENGINE_POLICIES
from engine.impls import IMPL_MODES
from engine.program import ModelError
from traces import TraceWriter


class UsageError(ValueError):
    """Bad input from the user: one line, exit status 2."""


@dataclass
class RunOptions:
    model: str
    shapes: list = field(default_factory=list)
    shapes_file: str | None = None
    model_shape: list = field(default_factory=list)
    seed: int = 0
    input_range: list = field(default_factory=list)
    load_inputs: str | None = None
    save_inputs: str | None = None
    save_outputs: str | None = None
    check: bool = False
    rtol: float = 1e-3
    atol: float = 1e-4
    trace: str | None = None
    device: str | None = None
    prealloc: str = "10 16384 2 1.1"
    feedback: list = field(default_factory=list)
    predictor: str = "openvino"
    impls: str = "auto"
    async_compile: bool = True
    impl_cache_capacity: int = 300
    memory_pool: bool = True
    fast_path: bool = True


@dataclass
class InferRecord:
    iter: int
    in_shapes: dict
    out_shapes: dict
    latency_ms: float
    counters: dict
    checks: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


@dataclass
class RunResult:
    model: str
    device: str
    trace_path: str
    records: list = field(default_factory=list)
    planned: int = 0
    status: str = "ok"          # ok | interrupted | error
    error: str = ""
    nodes: int = 0
    folded: int = 0
    fused: int = 0

    @property
    def check_failed(self) -> bool:
        return any(not r.ok for r in self.records)


def default_trace_path(model: str) -> str:
    return str(Path.cwd() / (Path(model).stem + ".trace.jsonl"))


def plan(opts: RunOptions, prog) -> tuple[list[dict], list[dict] | None]:
    """The sequence of input shapes (and loaded tensors, with --load-inputs)."""
    names = list(prog.inputs)
    dtypes = {n: l.dtype for n, l in prog.inputs.items()}
    loaded = None
    try:
        if opts.load_inputs:
            loaded = load_inputs(opts.load_inputs, names, dtypes)
            seq = [{n: tuple(v.shape) for n, v in feeds.items()} for feeds in loaded]
        else:
            seq = shape_spec.parse_shapes(opts.shapes, names) if opts.shapes else []
            if opts.shapes_file:
                seq += shape_spec.parse_shapes_file(opts.shapes_file, names)
        if not seq:
            raise UsageError("no inferences to run: give --shapes, --shapes-file or --load-inputs "
                             f"(model inputs: {describe_inputs(prog)})")
        declared = dict(prog.input_dim_names)
        declared.update(shape_spec.parse_model_shape(opts.model_shape, names) if opts.model_shape else {})
        for inf in seq:
            shape_spec.check_against_declared(inf, declared)
    except (shape_spec.ShapeSpecError, ValueError) as e:
        raise UsageError(str(e)) from None
    return seq, loaded


def parse_feedback(specs: list, prog) -> dict:
    """--feedback 'OUT:IN[,OUT:IN]' -> {OUT: IN}, checked against the model's outputs/inputs."""
    pairs = {}
    for spec in specs:
        for item in filter(None, (x.strip() for x in spec.split(","))):
            out, sep, inp = item.rpartition(":")
            if not sep or not out or not inp:
                raise UsageError(f"--feedback {item!r}: expected OUT:IN")
            if out not in prog.outputs:
                raise UsageError(f"--feedback {item!r}: {out!r} is not a model output "
                                 f"(outputs: {', '.join(prog.outputs)})")
            if inp not in prog.inputs:
                raise UsageError(f"--feedback {item!r}: {inp!r} is not a model input "
                                 f"(inputs: {', '.join(prog.inputs)})")
            if inp in pairs.values():
                raise UsageError(f"--feedback: input {inp!r} is fed twice")
            pairs[out] = inp
    return pairs


def describe_inputs(prog) -> str:
    return ", ".join(f"{n}:{shape_spec.format_shape(tuple('?' if d is None else d for d in dims))}"
                     for n, dims in prog.input_dim_names.items())


def load_model(path: str) -> onnx.ModelProto:
    try:
        return onnx.load(path)
    except FileNotFoundError:
        raise UsageError(f"model file not found: {path}") from None
    except Exception as e:
        raise UsageError(f"cannot parse {path} as ONNX: {e}") from None


def execute_run(opts: RunOptions, progress=None) -> RunResult:
    """Run the whole sequence. `progress(i, n)` is called after each inference."""
    model = load_model(opts.model)
    try:
        prog = build_program(model, opts.model)
    except ModelError as e:
        raise UsageError(str(e)) from None
    seq, loaded = plan(opts, prog)
    if opts.impls not in IMPL_MODES:
        raise UsageError(f"--impls must be one of {', '.join(IMPL_MODES)}, not {opts.impls!r}")
    if opts.impl_cache_capacity < 0:
        raise UsageError(f"--impl-cache-capacity must be >= 0 (0 = unbounded), not {opts.impl_cache_capacity}")
    try:
        prealloc = PreallocSettings.parse(opts.prealloc)
    except ValueError as e:
        raise UsageError(f"--prealloc: {e}") from None
    if opts.predictor not in ENGINE_POLICIES:
        raise UsageError(f"--predictor: unknown policy {opts.predictor!r}: choose from "
                         f"{', '.join(ENGINE_POLICIES)}")
    names = list(prog.inputs)
    try:
        ranges = shape_spec.parse_input_ranges(opts.input_range, names) if opts.input_range else {}
    except shape_spec.ShapeSpecError as e:
        raise UsageError(str(e)) from None
    ref = None
    if opts.check:
        overrides = shape_spec.parse_model_shape(opts.model_shape, names) if opts.model_shape else {}
        # relax every input so the reference accepts whatever --shapes asked for
        relax = {n: overrides.get(n, tuple(None for _ in prog.inputs[n].shape)) for n in names}
        ref = Reference(relaxed_model(model, relax))

    device = select_device(opts.device)
    trace_path = opts.trace or default_trace_path(opts.model)
    header = {"model": os.path.abspath(opts.model), "device": describe(device),
              "float16": {**half_support(device), **cast_summary(prog)},
              "options": {k: v for k, v in vars(opts).items() if k not in ("model",)},
              "inputs": {n: list(d) for n, d in prog.input_dim_names.items()},
              "outputs": prog.outputs, "nodes": prog.node_count(), "fusions": fusion_map(prog)}
    writer = TraceWriter(trace_path, header)
    result = RunResult(opts.model, describe(device), trace_path, planned=len(seq),
                       nodes=prog.node_count(), folded=prog.folded, fused=prog.fused)
    feedback = parse_feedback(opts.feedback, prog)
    net = Network(prog, device, trace=writer, prealloc=prealloc, predictor=opts.predictor,
                  feedback=feedback, impl_cache_capacity=opts.impl_cache_capacity,
                  impls=opts.impls, async_compile=opts.async_compile, memory_pool=opts.memory_pool,
                  fast_path=opts.fast_path)
    rng = np.random.default_rng(opts.seed)
    dtypes = {n: l.dtype for n, l in prog.inputs.items()}
    saved_in, saved_out = [], []
    # outputs fed back stay on the device unless their host copies are needed
    host_all = bool(ref is not None or opts.save_inputs or opts.save_outputs)
    read = None if host_all else [o for o in prog.outputs if o not in feedback]
    try:
        for i, inf in enumerate(seq):
            feeds = loaded[i] if loaded else random_inputs(rng, inf, dtypes, ranges)
            fed = {inp: out for out, inp in feedback.items()} if i else {}
            for inp, out in fed.items():  # host copies, for --check and --save-inputs
                if host_all:
                    feeds[inp] = outs[out]
                else:
                    feeds.pop(inp, None)
            outs = net.infer(feeds, fed_back=fed, outputs=read)
            rec = InferRecord(i, {n: tuple(net.tensors[n].layout.shape) for n in prog.inputs},
                              {n: tuple(v) for n, v in net.output_shapes().items()},
                              net.counters["latency_ms"], dict(net.counters))
            if ref is not None:
                want = ref.run(feeds)
                for name in prog.outputs:
                    c = compare(name, outs[name], want[name], opts.rtol, opts.atol)
                    rec.checks.append(c)
                    writer.event("check", "", "", "pass" if c.ok else "fail", c.detail,
                                 output=name, max_abs=c.max_abs, max_rel=c.max_rel)
                writer.flush()
            result.records.append(rec)
            if opts.save_inputs:
                saved_in.append(feeds)
            if opts.save_outputs:
                saved_out.append(outs)
            if progress:
                progress(i + 1, len(seq))
    except KeyboardInterrupt:
        result.status = "interrupted"
    except Exception as e:  # engine errors: keep the trace readable, report one line
        result.status, result.error = "error", f"{type(e).__name__}: {e}"
        result.exception = e
    finally:
        writer.iter = -1
        writer.event("run_end", action=result.status, reason=result.error[:200],
                     inferences=len(result.records))
        writer.close()
        if saved_in:
            save_tensors(opts.save_inputs, saved_in)
        if saved_out:
            save_tensors(opts.save_outputs, saved_out)
    return result
