"""One `dyncli run`: resolve the inference sequence, drive the Network, compare, trace.

The CLI (cli.py) parses options into `RunOptions` and renders the `RunResult`; the engine does
the work. Kept free of Typer/Rich so tests and scripts can call `execute_run` directly.
"""
from __future__ import annotations

import gc
import os
import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dyncli import shapes as shape_spec
from dyncli.check import CheckUnavailable, OnnxRuntimeRefused, Reference, compare, relaxed_model
from dyncli.gc_policy import freeze_long_lived
from dyncli.os_errors import os_error
from dyncli.inputs import load_inputs, random_inputs, save_tensors
from engine import Network, PreallocSettings, build_program, select_device
from engine.device import describe
from engine.f16 import cast_summary, half_support
from engine.diagnose import InferenceError, nbytes_text, too_large
from engine.layout import np_dtype
from engine.model_file import load_model
from engine.fusion import fusion_map
from engine.predictors import ENGINE_POLICIES
from dyncli.defaults import CLI_COMPILE_PLANS, CLI_DEFAULT_POLICY
from engine.fast_path import COMPILE_MODES
from engine.impl_cache import IMPL_MODES
from engine.program import ModelError
from traces import TraceWriter
from traces.sinks import TRACE_LEVELS, DecisionsOnly, NoTrace, TraceBusy, TraceLock
from traces.summary import Totals

# The per-inference rows a run keeps for its table and --json (the last ROW_WINDOW); totals
# and check figures are aggregates, and the trace holds every row.
ROW_WINDOW = 1000


class UsageError(ValueError):
    """Bad input from the user: one line, exit status 2."""


@dataclass
class RunOptions:
    model: str
    shapes: list = field(default_factory=list)
    shapes_file: str | None = None
    grid: bool = False             # --grid: ranges within an input form every combination
    model_shape: list = field(default_factory=list)
    seed: int = 0
    input_range: list = field(default_factory=list)
    load_inputs: str | None = None
    save_inputs: str | None = None
    save_outputs: str | None = None
    check: bool = False
    rtol: float | None = None      # None: by output type (dyncli/check.py TOLERANCE)
    atol: float | None = None
    trace: str | None = None
    device: str | None = None
    prealloc: str = "10 16384 2 1.1"
    feedback: list = field(default_factory=list)
    predictor: str = CLI_DEFAULT_POLICY
    impls: str = "auto"
    async_compile: bool = True
    impl_cache_capacity: int = 300
    memory_pool: bool = True
    fast_path: bool = True
    compiled_plans: str = CLI_COMPILE_PLANS
    trace_level: str = "all"


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


class CheckStats:
    """--check over the whole run: inferences passed/failed, the worst errors per output, the
    first failures (for the message)."""

    def __init__(self):
        self.passed = self.failed = self.failed_outputs = 0
        self.per_output: dict[str, dict] = {}
        self.first_failures: list[str] = []

    def add(self, rec: InferRecord) -> None:
        if not rec.checks:
            return
        self.passed += rec.ok
        self.failed += not rec.ok
        for c in rec.checks:
            e = self.per_output.setdefault(c.output, {"max_abs": 0.0, "max_rel": 0.0})
            e["max_abs"], e["max_rel"] = max(e["max_abs"], c.max_abs), max(e["max_rel"], c.max_rel)
            if not c.ok:
                self.failed_outputs += 1
                if len(self.first_failures) < 5:
                    self.first_failures.append(f"#{rec.iter} {c.output} (max abs {c.max_abs:.2e})")

    def as_dict(self) -> dict | None:
        if not self.passed + self.failed:
            return None
        return {"passed": self.passed, "failed": self.failed,
                "max_abs": max(e["max_abs"] for e in self.per_output.values()),
                "max_rel": max(e["max_rel"] for e in self.per_output.values()),
                "per_output": self.per_output}


@dataclass
class RunResult:
    model: str
    device: str
    trace_path: str
    records: deque = field(default_factory=lambda: deque(maxlen=ROW_WINDOW))  # the last rows
    planned: int = 0
    status: str = "ok"          # ok | interrupted | error
    error: str = ""
    nodes: int = 0
    folded: int = 0
    fused: int = 0
    inferences: int = 0         # inferences done (records keeps the last ROW_WINDOW)
    totals: Totals = field(default_factory=Totals)
    checks: CheckStats = field(default_factory=CheckStats)
    device_bytes: int = 0       # device memory held when the run ended
    impl_cache: int = 0         # impls in the impl cache when the run ended
    activation_bytes: int = 0   # of device_bytes, the buffers of non-constant tensors
    first: InferRecord | None = None   # inference 0 (records keeps only the last rows)

    @property
    def check_failed(self) -> bool:
        return self.checks.failed > 0

    def add(self, rec: InferRecord) -> None:
        if self.first is None:
            self.first = rec
        self.records.append(rec)
        self.inferences += 1
        self.totals.add(rec.counters, rec.latency_ms)
        self.checks.add(rec)


def default_trace_path(model: str) -> str:
    return str(Path.cwd() / (Path(model).stem + ".trace.jsonl"))


def read_model(path: str, max_bytes: int | None = None):
    """The ONNX model at `path`, checked as untrusted input (engine/model_file.py), with the
    file's own faults named: an empty file, a file that parses as a model with no graph."""
    try:
        if os.path.getsize(path) == 0:
            raise UsageError(f"{path} is empty (0 bytes): not an ONNX model")
    except OSError:
        pass   # load_model names a missing or unreadable file
    try:
        model = load_model(path, max_bytes=max_bytes)
    except ModelError as e:
        raise UsageError(str(e)) from None
    if not model.graph.node and not model.graph.input and not model.opset_import:
        raise UsageError(f"{path} is not an ONNX model: it has no graph and no opset")
    return model


def declared_dims(prog, model) -> dict:
    """Graph input -> its declared dims (int, dim_param name or None), or None for an input
    declared without a shape: ONNX allows that, and it takes any rank."""
    shapeless = {vi.name for vi in model.graph.input if not vi.type.tensor_type.HasField("shape")}
    return {n: None if n in shapeless else d for n, d in prog.input_dim_names.items()}


def resolve_sequence(opts: RunOptions, prog, model) -> tuple[list[dict], list[dict] | None]:
    """The sequence of input shapes (and loaded tensors, with --load-inputs)."""
    names = list(prog.inputs)
    dtypes = {n: l.dtype for n, l in prog.inputs.items()}
    loaded = None
    try:
        if opts.load_inputs:
            loaded = load_inputs(opts.load_inputs, names, dtypes)
            seq = [{n: tuple(v.shape) for n, v in feeds.items()} for feeds in loaded]
        else:
            seq = shape_spec.parse_shapes(opts.shapes, names, opts.grid) if opts.shapes else []
            if opts.shapes_file:
                seq += shape_spec.parse_shapes_file(opts.shapes_file, names, opts.grid)
                shape_spec.check_run_length(len(seq))
        if not seq:
            raise UsageError("no inferences to run: give --shapes, --shapes-file or --load-inputs "
                             f"(model inputs: {describe_inputs(prog, model)})")
        declared = {n: d for n, d in declared_dims(prog, model).items() if d is not None}
        declared.update(shape_spec.parse_model_shape(opts.model_shape, names) if opts.model_shape else {})
        for inf in seq:
            shape_spec.check_against_declared(inf, declared)
    except (shape_spec.ShapeSpecError, ValueError) as e:
        raise UsageError(str(e)) from None
    return seq, loaded


def check_input_sizes(seq: list[dict], dtypes: dict, device) -> None:
    """Refuse, before anything is allocated, an input the device cannot hold."""
    limits = (device.global_mem_size, device.max_mem_alloc_size)
    seen = set()
    for i, inf in enumerate(seq):
        for name, shape in inf.items():
            if (name, shape) in seen:
                continue
            seen.add((name, shape))
            need = int(np.prod(shape, dtype=object)) * np.dtype(np_dtype(dtypes[name])).itemsize
            why = too_large(need, 0, *limits)
            if why:
                raise UsageError(f"input {name} of inference {i} ({shape_spec.format_shape(shape)} "
                                 f"{dtypes[name]}) needs {nbytes_text(need)}: {why}")


def _declared_dims(vi) -> tuple | None:
    """Declared dims of a graph output (int, or None when unknown); None without a shape."""
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)


def _shape_clash(a: tuple, b: tuple) -> bool:
    return len(a) != len(b) or any(x is not None and y is not None and x != y for x, y in zip(a, b))


def parse_feedback(specs: list, prog, model=None) -> dict:
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
            declared_out = next((_declared_dims(o) for o in model.graph.output if o.name == out),
                                None) if model is not None else None
            dims_in = declared_dims(prog, model)[inp] if model is not None else prog.input_dim_names[inp]
            declared_in = None if dims_in is None else tuple(d if isinstance(d, int) else None for d in dims_in)
            if None not in (declared_out, declared_in) and _shape_clash(declared_out, declared_in):
                fmt = lambda d: shape_spec.format_shape(tuple("?" if x is None else x for x in d))  # noqa: E731
                raise UsageError(f"--feedback {item!r}: output {out!r} is declared {fmt(declared_out)} "
                                 f"but input {inp!r} {fmt(declared_in)}; their shapes cannot match")
            pairs[out] = inp
    return pairs


def describe_inputs(prog, model) -> str:
    return ", ".join(f"{n}:any rank (no declared shape)" if dims is None else
                     f"{n}:{shape_spec.format_shape(tuple('?' if d is None else d for d in dims))}"
                     for n, dims in declared_dims(prog, model).items())


def open_trace(path: str, level: str, header: dict):
    """(writer, lock) for --trace PATH|none and --trace-level; UsageError when PATH cannot be
    written or another run writes it."""
    if level not in TRACE_LEVELS:
        raise UsageError(f"--trace-level must be one of {', '.join(TRACE_LEVELS)}, not {level!r}")
    if path == "none":
        return NoTrace(), None
    lock = TraceLock(path)
    try:
        lock.acquire()
        writer = TraceWriter(path, header)
    except TraceBusy as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        lock.release()
        raise UsageError(os_error("write the trace", path, e)) from None
    return (DecisionsOnly(writer) if level == "decisions" else writer), lock


def error_text(e: Exception) -> str:
    """One line for an engine error; no class names (--debug shows the traceback)."""
    if isinstance(e, (InferenceError, ModelError, UsageError, OnnxRuntimeRefused)):
        return str(e)
    first = (str(e).splitlines() or [""])[0]
    return f"internal error: {first or 'no message'} (`dyncli --debug run ...` shows where)"


def execute_run(opts: RunOptions, progress=None) -> RunResult:
    """Run the whole sequence. `progress(i, n, shapes)` is called after each inference."""
    device = select_device(opts.device)
    model = read_model(opts.model, device.max_mem_alloc_size)
    try:
        prog = build_program(model, opts.model)
    except ModelError as e:
        raise UsageError(str(e)) from None
    seq, loaded = resolve_sequence(opts, prog, model)
    check_input_sizes(seq, {n: l.dtype for n, l in prog.inputs.items()}, device)
    if opts.impls not in IMPL_MODES:
        raise UsageError(f"--impls must be one of {', '.join(IMPL_MODES)}, not {opts.impls!r}")
    if opts.impl_cache_capacity < 0:
        raise UsageError(f"--impl-cache-capacity must be >= 0 (0 = unbounded), not {opts.impl_cache_capacity}")
    if opts.compiled_plans not in COMPILE_MODES:
        raise UsageError(f"--compiled-plans must be one of {', '.join(COMPILE_MODES)}, not {opts.compiled_plans!r}")
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
        # relax every input so the reference accepts whatever --shapes asked for (an input
        # without a declared shape takes any already)
        dims = declared_dims(prog, model)
        relax = {n: overrides.get(n, None if dims[n] is None else tuple(None for _ in dims[n]))
                 for n in names}
        try:
            ref = Reference(relaxed_model(model, relax))
        except (CheckUnavailable, OnnxRuntimeRefused) as e:
            raise UsageError(str(e)) from None
        if ref.ir_declared is not None:
            warnings.warn(f"--check: the installed onnxruntime reads IR versions up to {ref.ir_declared}; "
                          f"the model (IR {model.ir_version}) is checked declared at {ref.ir_declared}")

    trace_path = opts.trace or default_trace_path(opts.model)
    header = {"model": os.path.abspath(opts.model), "device": describe(device),
              "float16": {**half_support(device), **cast_summary(prog)},
              "options": {k: v for k, v in vars(opts).items() if k not in ("model",)},
              "inputs": {n: None if d is None else list(d) for n, d in declared_dims(prog, model).items()},
              "outputs": prog.outputs, "nodes": prog.node_count(), "fusions": fusion_map(prog)}
    feedback = parse_feedback(opts.feedback, prog, model)
    declared = {n: d for n, d in declared_dims(prog, model).items() if d is not None}
    writer, lock = open_trace(trace_path, opts.trace_level, header)
    result = RunResult(opts.model, describe(device), writer.path, planned=len(seq),
                       nodes=prog.node_count(), folded=prog.folded, fused=prog.fused)
    try:
        net = Network(prog, device, trace=writer, prealloc=prealloc, predictor=opts.predictor,
                      feedback=feedback, impl_cache_capacity=opts.impl_cache_capacity,
                      impls=opts.impls, async_compile=opts.async_compile, memory_pool=opts.memory_pool,
                      fast_path=opts.fast_path, compile_plans=opts.compiled_plans)
    except BaseException:
        writer.close()
        if lock is not None:
            lock.release()
        raise
    rng = np.random.default_rng(opts.seed)
    dtypes = {n: l.dtype for n, l in prog.inputs.items()}
    saved_in, saved_out = [], []
    # outputs fed back stay on the device unless their host copies are needed
    host_all = bool(ref is not None or opts.save_inputs or opts.save_outputs)
    read = None if host_all else [o for o in prog.outputs if o not in feedback]
    frozen = False
    try:
        for i, inf in enumerate(seq):
            feeds = loaded[i] if loaded else random_inputs(rng, inf, dtypes, ranges)
            fed = {inp: out for out, inp in feedback.items()} if i else {}
            for inp, out in fed.items():  # host copies, for --check and --save-inputs
                try:
                    shape_spec.check_against_declared({inp: tuple(net.tensors[out].layout.shape)},
                                                      declared)
                except shape_spec.ShapeSpecError as e:
                    raise UsageError(f"--feedback {out}:{inp} after inference {i - 1}: {e}") from None
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
            result.add(rec)
            if opts.save_inputs:
                saved_in.append(feeds)
            if opts.save_outputs:
                saved_out.append(outs)
            if not frozen:           # the network's first inference built what it keeps
                freeze_long_lived()
                frozen = True
            if progress:
                progress(i + 1, len(seq), rec.in_shapes)
    except KeyboardInterrupt:
        result.status = "interrupted"
    except Exception as e:  # engine errors: keep the trace readable, report one line
        result.status, result.error = "error", error_text(e)
        result.exception = e
    finally:
        if frozen:
            gc.unfreeze()
        result.device_bytes, result.impl_cache = net.buffers.used_bytes, len(net.impls)
        result.activation_bytes = net.memory.act_bytes
        writer.iter = -1
        writer.event("run_end", action=result.status, reason=result.error[:500],
                     inferences=result.inferences)
        writer.close()
        if lock is not None:
            lock.release()
        for path, tensors in ((opts.save_inputs, saved_in), (opts.save_outputs, saved_out)):
            if tensors:
                try:
                    save_tensors(path, tensors)
                except OSError as e:
                    raise UsageError(os_error("write", path, e)) from None
    return result
