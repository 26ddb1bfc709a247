"""`dyncli predictor-sim`: replay output-buffer preallocation policies on shape sequences.

Sources: one buffer's shapes (--shapes, same grammar as `run`), a built-in pattern
(--pattern, dyncli/sim_patterns.py) or every node output buffer of a recorded `dyncli run`
trace (--from-trace). Policies come from engine/predictors.py, the same objects the engine
uses, stepped through the engine's BufferState.realloc_if_needed.
"""
from __future__ import annotations

import json
import re
import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import List, Optional

import typer

from dyncli import shapes as shape_spec
from dyncli.console import console, err_console, fail, state
from dyncli.os_errors import os_error
from dyncli.sim_patterns import PatternError, describe_patterns, parse_pattern
from engine.layout import DTYPES
from engine.predictors import POLICIES, AdaptiveSettings, make_predictor
from engine.shape_predictor import PreallocSettings, SimResult, simulate

MIB = 2 ** 20
DEFAULT_PREALLOC = "10 16384 2 1.1"

# element sizes in bits for --dtype (sub-byte types round up to whole bytes per buffer)
DTYPE_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64, "i4": 4, "u4": 4, "i8": 8, "u8": 8,
              "i16": 16, "u16": 16, "i32": 32, "u32": 32, "i64": 64, "u64": 64, "bool": 8}
_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(|b|kib|mib|gib|tib|kb|mb|gb|tb)", re.I)
_UNITS = {"": 1, "b": 1, "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40,
          "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12}


class SimUsageError(ValueError):
    """Bad predictor-sim input: one line, exit status 2."""


@dataclass
class Buffer:
    """One output buffer's requirement sequence."""
    name: str
    shapes: list
    dtype: str
    run_allocations: int | None = None   # --from-trace: what the recorded run allocated


@dataclass
class Source:
    kind: str                    # shapes | pattern | trace
    spec: str
    buffers: list = field(default_factory=list)
    run_predictor: str | None = None
    prealloc: str = DEFAULT_PREALLOC


def parse_size(text: str) -> int:
    m = _SIZE_RE.fullmatch(text.strip())
    if not m:
        raise SimUsageError(f"--device-memory: expected a size such as 16GiB or 17179869184, got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def dtype_bits(dtype: str) -> int:
    if dtype not in DTYPE_BITS:
        raise SimUsageError(f"--dtype: unknown element type {dtype!r}: choose from {', '.join(DTYPE_BITS)}")
    return DTYPE_BITS[dtype]


def shapes_source(specs: list, dtype: str) -> Source:
    try:
        seq = shape_spec.parse_shapes(specs, ["buffer"])
    except shape_spec.ShapeSpecError as e:
        raise SimUsageError(f"--shapes: {e}") from None
    return Source("shapes", " ".join(specs), [Buffer("buffer", [inf["buffer"] for inf in seq], dtype)])


def pattern_source(text: str, dtype: str) -> Source:
    try:
        name, params, shapes = parse_pattern(text)
    except PatternError as e:
        raise SimUsageError(str(e)) from None
    spec = name + ":" + ",".join(f"{k}={'/'.join(map(str, v)) if isinstance(v, tuple) else v}"
                                 for k, v in params.items())
    return Source("pattern", spec, [Buffer(name, shapes, dtype)])


def trace_source(path: str) -> Source:
    """Every node output's buffer in iteration order: each realloc `alloc`/`from_pool`/`reuse`
    event is one requirement step of its node's output (`output`: its index, absent for the
    first; a node's other outputs are buffers `node:K`); `run_allocations` counts the steps that
    needed another buffer (new or pooled)."""
    from traces import read_trace
    from traces.reader import TraceError
    try:
        header, events = read_trace(path)
        bufs: dict[str, Buffer] = {}
        for e in events:
            if e["kind"] != "realloc" or e["action"] not in ("alloc", "from_pool", "reuse") \
                    or "buffer" in e:   # an internal buffer, not the node's output
                continue
            if "shape" not in e or "dtype" not in e:
                raise SimUsageError(f"--from-trace {path}: realloc events carry no shape/dtype "
                                    "(recorded by an older dyncli): record the run again")
            name = f"{e['node']}:{e['output']}" if "output" in e else e["node"]
            b = bufs.setdefault(name, Buffer(name, [], e["dtype"], 0))
            b.shapes.append(tuple(e["shape"]))
            b.run_allocations += e["action"] != "reuse"
    except FileNotFoundError:
        raise SimUsageError(f"--from-trace: no such file: {path}") from None
    except TraceError as e:
        raise SimUsageError(f"--from-trace: {e}") from None
    except OSError as e:
        raise SimUsageError("--from-trace: " + os_error("read", path, e)) from None
    if not bufs:
        raise SimUsageError(f"--from-trace {path}: no node output buffers (no realloc alloc/reuse events)")
    opts = header.get("options") or {}
    return Source("trace", path, list(bufs.values()), opts.get("predictor", "openvino"),
                  opts.get("prealloc") or DEFAULT_PREALLOC)


@dataclass
class PolicyRun:
    name: str
    per_buffer: dict            # buffer name -> SimResult

    def figures(self) -> dict:
        """Totals over buffers: sums of per-buffer figures; peak ratios are maxima; the mean
        slack ratio is over every step of every buffer. Byte counts are ints."""
        rs = list(self.per_buffer.values())
        steps = sum(len(r.steps) for r in rs)
        return {
            "reallocations": sum(r.reallocations for r in rs),
            "bytes_allocated": sum(r.total_allocated_bytes for r in rs),
            "peak_capacity_bytes": sum(r.peak_capacity_bytes for r in rs),
            "peak_required_bytes": sum(r.peak_required_bytes for r in rs),
            "peak_slack_bytes": sum(r.peak_slack_bytes for r in rs),
            "peak_slack_ratio": max(r.peak_slack_ratio for r in rs),
            "peak_capacity_over_required": max(r.peak_capacity_bytes / r.peak_required_bytes
                                               if r.peak_required_bytes else 1.0 for r in rs),
            "mean_slack_ratio": sum(r.mean_slack_ratio * len(r.steps) for r in rs) / steps if steps else 0.0,
        }


def run_policies(src: Source, policies: list, prealloc: PreallocSettings, slack_cap: float,
                 device_mem: int | None = None) -> list[PolicyRun]:
    adaptive = AdaptiveSettings(slack_cap=slack_cap)
    future = {b.name: b.shapes for b in src.buffers}
    out = []
    for name in policies:
        pol = make_predictor(name, prealloc, device_mem, adaptive=adaptive, future=future)
        res = {}
        for b in src.buffers:
            try:
                res[b.name] = simulate(b.shapes, DTYPE_BITS.get(b.dtype) or _engine_bits(b.dtype), pol, b.name)
            except ValueError as e:  # e.g. the plugin's rank-mismatch error
                raise SimUsageError(f"{name} on {b.name}: {e}") from None
        out.append(PolicyRun(name, res))
    return out


def _engine_bits(dtype: str) -> int:
    if dtype not in DTYPES:
        raise SimUsageError(f"unknown element type {dtype!r} in the trace")
    return DTYPES[dtype][0].itemsize * 8


def validate_policies(names: list) -> list:
    names = names or list(POLICIES)
    bad = [n for n in names if n not in POLICIES]
    if bad:
        raise SimUsageError(f"--policy: unknown policy {bad[0]!r}: choose from {', '.join(POLICIES)}")
    return list(dict.fromkeys(names))


def to_json(src: Source, runs: list[PolicyRun], every: int = 0) -> dict:
    doc = {"source": {"kind": src.kind, "spec": src.spec, "buffers": len(src.buffers),
                      "steps": sum(len(b.shapes) for b in src.buffers)},
           "policies": {}}
    if src.kind == "trace":
        doc["source"]["run_predictor"] = src.run_predictor
        doc["source"]["run_allocations"] = sum(b.run_allocations for b in src.buffers)
        doc["nodes"] = {b.name: {"steps": len(b.shapes), "dtype": b.dtype,
                                 "run_allocations": b.run_allocations,
                                 "reallocations": {r.name: r.per_buffer[b.name].reallocations for r in runs}}
                        for b in src.buffers}
    else:
        b = src.buffers[0]
        doc["source"].update(dtype=b.dtype, first_shape=list(b.shapes[0]), last_shape=list(b.shapes[-1]))
    for r in runs:
        fig = r.figures()
        if src.kind != "trace":
            fig["steps"] = [{"iter": s.iter, "shape": list(s.shape), "action": s.action, "mode": s.mode,
                             "required_bytes": s.required_bytes, "capacity_bytes": s.capacity_bytes}
                            for s in _shown_steps(r.per_buffer[src.buffers[0].name], every)]
        doc["policies"][r.name] = fig
    return doc


def _shown_steps(res: SimResult, every: int):
    """Iterations where something happened (an allocation), plus every N-th with --every N."""
    return [s for s in res.steps if s.action == "alloc" or (every and s.iter % every == 0)]


# ---- rendering --------------------------------------------------------------------------------

def fmt_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < MIB:
        return f"{n / 1024:.1f} KiB"
    return f"{n / MIB:.1f} MiB" if n < 10 * 2 ** 30 else f"{n / 2 ** 30:.2f} GiB"


def step_table(r: PolicyRun, buf: Buffer, every: int, max_rows: int):
    from rich.table import Table
    res = r.per_buffer[buf.name]
    rows = _shown_steps(res, every)
    t = Table(title=f"{r.name}: {res.reallocations} reallocation(s) over {len(res.steps)} steps of {buf.name}",
              title_justify="left")
    for col in ("iter", "shape", "required", "capacity", "slack", "action", "mode"):
        t.add_column(col, justify="right" if col in ("iter", "required", "capacity", "slack") else "left")
    shown = rows if not max_rows or len(rows) <= max_rows else rows[:max_rows]
    for s in shown:
        action = "alloc (reclaim)" if s.reclaimed else s.action
        t.add_row(str(s.iter), shape_spec.format_shape(s.shape), fmt_bytes(s.required_bytes),
                  fmt_bytes(s.capacity_bytes), fmt_bytes(s.capacity_bytes - s.required_bytes),
                  action, s.mode)
    if len(shown) < len(rows):
        t.caption = f"... {len(rows) - len(shown)} more row(s): --max-rows 0 shows all, --json lists them"
    return t


def node_table(src: Source, runs: list[PolicyRun]):
    """Reallocations per node buffer: the counts first, the node name last and whole (names of
    exported models share long prefixes: cut, the rows would look identical)."""
    from rich.console import Group
    from rich.text import Text
    heads = ["steps", "run"] + [r.name for r in runs]
    rows = [[str(len(b.shapes)), str(b.run_allocations)] + [str(r.per_buffer[b.name].reallocations) for r in runs]
            for b in src.buffers]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    out = [Text(f"reallocations per node output buffer ({len(src.buffers)} nodes; the run used "
                f"--predictor {src.run_predictor})", style="italic"),
           Text(line(heads) + "  node", style="bold")]
    out += [Text(line(r) + "  " + b.name, no_wrap=True, overflow="ignore") for r, b in zip(rows, src.buffers)]
    return Group(*out)


def summary_table(src: Source, runs: list[PolicyRun]):
    from rich.table import Table
    figs = {r.name: r.figures() for r in runs}
    t = Table(title="policies side by side" + (" (sums over node buffers)" if src.kind == "trace" else ""),
              title_justify="left")
    t.add_column("")
    for name in figs:
        t.add_column(name, justify="right")
    if src.kind == "trace":
        t.add_row("run's own allocations", *(str(sum(b.run_allocations for b in src.buffers))
                                             if n == src.run_predictor else "" for n in figs))
    rows = [("reallocations", lambda f: str(f["reallocations"])),
            ("bytes allocated (total)", lambda f: fmt_bytes(f["bytes_allocated"])),
            ("peak capacity", lambda f: fmt_bytes(f["peak_capacity_bytes"])),
            ("peak capacity / peak required", lambda f: f"{f['peak_capacity_over_required']:.2f}x"),
            ("peak slack", lambda f: fmt_bytes(f["peak_slack_bytes"])),
            ("peak slack / live size", lambda f: f"{f['peak_slack_ratio']:.0%}"),
            ("mean slack ratio", lambda f: f"{f['mean_slack_ratio']:.1%}")]
    for label, fn in rows:
        t.add_row(label, *(fn(f) for f in figs.values()))
    return t


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list, top: float, width: int) -> str:
    """Max of each of ``width`` buckets, as eighth blocks scaled to ``top``."""
    n = len(values)
    width = min(width, n)
    out = []
    for i in range(width):
        v = max(values[i * n // width:max((i + 1) * n // width, i * n // width + 1)])
        out.append(SPARK[min(len(SPARK) - 1, int(v / top * len(SPARK))) if top else 0])
    return "".join(out)


def chart_lines(buf: Buffer, runs: list[PolicyRun], width: int = 60) -> list[str]:
    req = [s.required_bytes for s in runs[0].per_buffer[buf.name].steps]
    caps = {r.name: [s.capacity_bytes for s in r.per_buffer[buf.name].steps] for r in runs}
    top = max([max(req)] + [max(c) for c in caps.values()])
    label = max(len("required"), *(len(n) for n in caps))
    lines = [f"capacity vs required of {buf.name} over {len(req)} steps (full height = {fmt_bytes(top)})",
             f"{'required':>{label}} {sparkline(req, top, width)}"]
    lines += [f"{n:>{label}} {sparkline(c, top, width)}" for n, c in caps.items()]
    return lines


def plot(path: str, buf: Buffer, runs: list[PolicyRun]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 5))
    steps = runs[0].per_buffer[buf.name].steps
    ax.plot([s.iter for s in steps], [s.required_bytes / MIB for s in steps], color="black",
            linewidth=2.5, label="required")
    for r in runs:
        st = r.per_buffer[buf.name].steps
        ax.step([s.iter for s in st], [s.capacity_bytes / MIB for s in st], where="post",
                label=f"{r.name} ({r.per_buffer[buf.name].reallocations} reallocs)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("MiB")
    ax.set_title(f"capacity vs required: {buf.name}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---- the command ------------------------------------------------------------------------------

HELP = ("Replay output-buffer preallocation policies on a shape sequence without running a model, "
        "and compare them side by side: reallocations, bytes allocated in total (the copy traffic "
        "a runtime pays), peak capacity, peak slack, mean slack ratio.\n\n"
        "Policies: " + "; ".join(f"{k}: {v}" for k, v in POLICIES.items()) + ".\n\n"
        "Examples:\n\n"
        "  dyncli predictor-sim --shapes '1x32x{128..2048}x128' --dtype f16\n\n"
        "  dyncli predictor-sim --pattern shrink-regrow:prompts=128/64,decode=512 --policy openvino --policy adaptive\n\n"
        "  dyncli predictor-sim --from-trace encoder.trace.jsonl --json")
EPILOG = "\b\nPatterns (--pattern NAME[:KEY=VALUE,...]):\n\n\b\n" + describe_patterns().replace("\n\n", "\n\n\b\n")


def command(
    shapes: List[str] = typer.Option([], "--shapes", "-s", metavar="SPEC", help="One buffer's shape sequence, same "
                                      "grammar as `run` without input names: '1x32x{128..2048}x128', "
                                      "'[1,8][1,16]', '1x16*3' (repeatable; concatenated)."),
    pattern: Optional[str] = typer.Option(None, "--pattern", "-p", metavar="NAME[:K=V,...]", help="A built-in sequence "
                                          "NAME[:KEY=VALUE,...] (lists with '/'), see below."),
    from_trace: Optional[str] = typer.Option(None, "--from-trace", metavar="FILE", help="Replay every node output "
                                             "buffer of a `dyncli run` trace (JSON Lines). Record it with "
                                             "--no-memory-pool for an exact replay: a pooled "
                                             "buffer may be larger than the request."),
    dtype: str = typer.Option("f16", "--dtype", metavar="DTYPE", help="Element type of --shapes/--pattern: "
                              + "|".join(DTYPE_BITS) + "."),
    policy: List[str] = typer.Option([], "--policy", metavar="NAME", help="Policy to run (repeatable; default all): "
                                     + ", ".join(POLICIES) + "."),
    prealloc: Optional[str] = typer.Option(None, "--prealloc", metavar="'ITERS BYTES DIFF RATIO'", help="openvino's settings "
                                           "'ITERS MAX_BYTES_PER_ITER MAX_DIM_DIFF RATIO' (default "
                                           "'10 16384 2 1.1', or the traced run's)."),
    slack_cap: float = typer.Option(0.5, "--slack-cap", metavar="X", help="adaptive and oracle: most slack "
                                    "preallocated, as a fraction of the live size."),
    device_memory: Optional[str] = typer.Option(None, "--device-memory", metavar="BYTES", help="Device memory for "
                                                "the 90% rule, e.g. 16GiB (default: unlimited)."),
    every: int = typer.Option(0, "--every", metavar="N", help="Also list every N-th iteration in the step tables (1: all)."),
    max_rows: int = typer.Option(30, "--max-rows", metavar="N", help="Rows per step table (0: no limit)."),
    node: Optional[str] = typer.Option(None, "--node", metavar="NAME", help="--from-trace: the node buffer to list, "
                                       "chart and plot (default: the largest)."),
    plot_path: Optional[str] = typer.Option(None, "--plot", metavar="FILE.png", help="Draw capacity vs required per "
                                            "policy to FILE.png (needs matplotlib: dyncli[plot])."),
    as_json: bool = typer.Option(False, "--json", help="Print per-policy figures as JSON (bytes as integers)."),
):
    try:
        if sum(bool(x) for x in (shapes, pattern, from_trace)) != 1:
            raise SimUsageError("give exactly one of --shapes, --pattern or --from-trace")
        if every < 0 or max_rows < 0:
            raise SimUsageError("--every and --max-rows take a count >= 0")
        if plot_path:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise SimUsageError("--plot needs matplotlib: pip install 'dyncli[plot]'") from None
        policies = validate_policies(policy)
        try:
            AdaptiveSettings(slack_cap=slack_cap)
        except ValueError as e:
            raise SimUsageError(f"--slack-cap: {e}") from None
        mem = parse_size(device_memory) if device_memory else None
        if from_trace:
            busy = sys.stderr.isatty() and not as_json
            with err_console.status(f"reading {from_trace}") if busy else nullcontext():
                src = trace_source(from_trace)
        else:
            dtype_bits(dtype)  # validates --dtype before the sequence is built
            src = shapes_source(shapes, dtype) if shapes else pattern_source(pattern, dtype)
        try:
            settings = PreallocSettings.parse(prealloc or src.prealloc)
        except ValueError as e:
            raise SimUsageError(f"--prealloc: {e}") from None
        names = [b.name for b in src.buffers]
        if node is not None and node not in names:
            raise SimUsageError(f"--node: no buffer {node!r} in the source (e.g. {', '.join(names[:5])})")
        runs = run_policies(src, policies, settings, slack_cap, mem)
    except SimUsageError as e:
        if state["debug"]:
            raise
        fail(str(e))

    # the buffer the step tables, the chart and the plot show
    buf = next((b for b in src.buffers if b.name == node), None) or \
        max(src.buffers, key=lambda b: runs[0].per_buffer[b.name].peak_required_bytes)
    if plot_path:
        try:
            plot(plot_path, buf, runs)
        except OSError as e:  # bad directory
            fail("--plot: " + os_error("write", plot_path, e))
        except ValueError as e:  # unknown image extension
            fail(f"--plot {plot_path}: {e}")
    if as_json:
        print(json.dumps(to_json(src, runs, every), indent=1))
        return
    if src.kind != "trace" or node:
        for r in runs:
            console.print(step_table(r, buf, every, max_rows))
    if src.kind == "trace":
        console.print(node_table(src, runs), crop=False)
    console.print(summary_table(src, runs))
    for line in chart_lines(buf, runs):
        console.print(line, highlight=False)
    if plot_path:
        console.print(f"plot written to {plot_path}")
