"""Rich rendering of run results (tables, summary) and their JSON form.

At 80 columns nothing is cut: numbers and headers never wrap (tables that do not fit are
split into several, each repeating the key column), paths and device names are printed on
lines of their own that a terminal wraps, and shape cells wrap at spaces only."""
from __future__ import annotations

import io
import statistics
from collections import Counter

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from dyncli.shapes import format_shape
from engine.diagnose import nbytes_text

# Inputs written name:shape up to this many characters; past it, the distinct shapes alone.
NAMED_SHAPES_WITHIN = 40
INPUTS_WIDTH = 28
COMPACT_LEGEND = "inputs of several shapes: the distinct shapes in input order, (xN): N inputs"


def _shapes(d: dict, named_within: int = NAMED_SHAPES_WITHIN) -> str:
    """One shape when every tensor has it (the usual ids/mask pair), name:shape pairs when they
    are short, else the distinct shapes in input order with their counts: a decode step's KV
    inputs take one line, not one each ('1x1, 1x6, 1x2x5x16 (x4)')."""
    vals = [tuple(v) for v in d.values()]
    if len(set(vals)) == 1:
        return format_shape(vals[0]) + (f" (x{len(d)})" if len(d) > 1 else "")
    named = " ".join(f"{k}:{format_shape(v)}" for k, v in d.items())
    if len(named) <= named_within:
        return named
    return ", ".join(format_shape(v) + (f" (x{n})" if n > 1 else "") for v, n in Counter(vals).items())


def _longest_word(cells) -> int:
    return max((len(w) for c in cells for w in c.split()), default=1)


_MEASURE = Console(width=100_000, file=io.StringIO())


def natural_width(renderable) -> int:
    """The width `renderable` takes when nothing is wrapped."""
    return Measurement.get(_MEASURE, _MEASURE.options, renderable).maximum


def fitted_tables(title: str, columns: list[tuple[str, str]], rows: list[list[str]], width: int,
                  keys: int = 1) -> list[Table]:
    """`columns` ((header, justify)) in as few tables as fit `width`, each repeating the first
    `keys` columns: a narrow terminal gets more tables, never a cut number or header."""
    def make(idx: list[int], head: str | None) -> Table:
        t = Table(title=head, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for i in idx:
            name, just = columns[i]
            t.add_column(name, justify=just, no_wrap=i >= keys, overflow="fold",
                         min_width=_longest_word([name] + [r[i] for r in rows]))
        for r in rows:
            t.add_row(*(r[i] for i in idx))
        return t

    groups, cur = [], list(range(keys))
    for i in range(keys, len(columns)):
        if len(cur) > keys and natural_width(make(cur + [i], None)) > width:
            groups.append(cur)
            cur = list(range(keys))
        cur.append(i)
    groups.append(cur)
    return [make(g, title if k == 0 else None) for k, g in enumerate(groups)]


_bytes = nbytes_text


def _by_reason(c: dict, prefix: str) -> str:
    """'reason n, ...' of the counters `prefix.reason`, largest first ('-' when none)."""
    got = sorted(((v, k[len(prefix) + 1:]) for k, v in c.items() if k.startswith(prefix + ".")),
                 reverse=True)
    return ", ".join(f"{r} {v}" for v, r in got) or "-"


# The per-inference table's columns: (header, wide header, justify, only with --wide). The
# default set fits 80 columns; a legend line under the table spells the short headers out.
INFERENCE_COLUMNS = [
    ("#", "#", "right", False), ("inputs", "inputs", "left", False),
    ("outputs", "outputs", "left", True), ("ms", "ms", "right", False),
    ("kern", "kernels", "right", False), ("shape", "shape\ninfer/skip", "right", False),
    ("buffers", "buffers\nreuse/pool/new", "right", False),
    ("alloc", "allocated", "right", False), ("peak", "peak", "right", True),
]
INFERENCE_LEGEND = ("kern: kernels enqueued; shape: shape inference run/skipped; buffers: "
                    "reused/pooled/new; alloc: bytes allocated; --wide adds outputs and peak bytes")


def inference_table(result, wide: bool = False, width: int = 80) -> Table:
    """Narrow (the default) fits `width`; `wide` has every column at its natural width (print
    it with console.print_wide: wider than the terminal, nothing dropped)."""
    shown, total = len(result.records), result.inferences
    title = "one row per inference" + (
        f" (the last {shown} of {total}; the trace has them all)" if total > shown else "")
    within = 10 ** 9 if wide else NAMED_SHAPES_WITHIN
    shapes = {r.iter: (_shapes(r.in_shapes, within), _shapes(r.out_shapes, within)) for r in result.records}
    compact = not wide and any(", " in i for i, _ in shapes.values())
    legend = INFERENCE_LEGEND + ("; " + COMPACT_LEGEND if compact else "")

    def build(inputs_width: int | None) -> Table:
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
                  caption=None if wide else legend, caption_justify="left")
        for short, long, just, _ in cols:
            shape_col = short in ("inputs", "outputs")
            cells = [v[short == "outputs"] for v in shapes.values()]
            t.add_column(long if wide else short, justify=just, no_wrap=not shape_col, overflow="fold",
                         min_width=max(_longest_word(cells), inputs_width or 1) if shape_col else None)
        return t

    cols = [c for c in INFERENCE_COLUMNS if wide or not c[3]]
    t = build(None)
    _inference_rows(result, cols, shapes, t, wide)
    if not wide:   # the inputs column takes what the figures leave: one line per inference if it can
        longest = max((len(v[0]) for v in shapes.values()), default=1)
        others = natural_width(t) - longest
        t = build(min(longest, width - others))
        _inference_rows(result, cols, shapes, t, wide)
    return t


def _inference_rows(result, cols, shapes, t: Table, wide: bool) -> Table:
    has_check = any(r.checks for r in result.records)
    if has_check:
        t.add_column("check\nmax abs" if wide else "check", justify="right", no_wrap=True)
    for r in result.records:
        c = r.counters
        cells = {"#": str(r.iter), "inputs": shapes[r.iter][0], "outputs": shapes[r.iter][1],
                 "ms": f"{r.latency_ms:.2f}", "kern": str(c.get("kernels", 0)),
                 "shape": f"{c.get('update_shape.infer', 0)}/{c.get('update_shape.skip', 0)}",
                 "buffers": f"{c.get('realloc.reuse', 0)}/{c.get('realloc.from_pool', 0)}/{c.get('realloc.alloc', 0)}",
                 "alloc": _bytes(c.get("bytes_allocated", 0)), "peak": _bytes(c.get("peak_bytes", 0))}
        row = [cells[short] for short, *_ in cols]
        if has_check:
            worst = max((x.max_abs for x in r.checks), default=0.0)
            row.append(f"[green]ok[/] {worst:.0e}" if r.ok else f"[red]FAIL[/] {worst:.0e}")
        t.add_row(*row)
    return t


def first_inference(result) -> dict | None:
    """Where the first inference's time went, from its counters (the trace's infer_end has the
    same); `slow` when it took over twice the median of the later ones, or ran alone and built
    kernels (the summary then prints it as a line). None without inferences."""
    rec = result.first
    if rec is None:
        return None
    later = [r.latency_ms for r in result.records if r.iter > 0]
    median = statistics.median(later) if later else None
    c = rec.counters
    slow = rec.latency_ms > 2 * median if median is not None else bool(c.get("compiles"))
    return {"latency_ms": rec.latency_ms, "later_median_ms": median, "slow": slow,
            "compiles": c.get("compiles", 0), "compile_ms": c.get("compile_ms", 0.0),
            "compile_ms_critical": c.get("compile_ms_critical", 0.0),
            "allocations": c.get("realloc.alloc", 0), "bytes_allocated": c.get("bytes_allocated", 0)}


def first_inference_line(f: dict) -> str:
    """'inference 0: 9703 ms (later: median 22.8 ms); kernel builds: 24 programs, 1921 ms in the
    flow + 26081 ms on build threads (it waits for those it needs); 17 new buffers (1.9 KiB)'."""
    later = f" (later: median {f['later_median_ms']:.1f} ms)" if f["later_median_ms"] is not None else ""
    off = f["compile_ms"] - f["compile_ms_critical"]
    builds = (f"kernel builds: {f['compiles']} program{'s' if f['compiles'] != 1 else ''}, "
              f"{f['compile_ms_critical']:.0f} ms in the flow"
              + (f" + {off:.0f} ms on build threads (it waits for those it needs)" if off >= 1 else "")
              if f["compiles"] else "no kernel builds")
    return (f"inference 0: {f['latency_ms']:.0f} ms{later}; {builds}; {f['allocations']} new "
            f"buffer{'s' if f['allocations'] != 1 else ''} ({_bytes(f['bytes_allocated'])})")


def summary(result) -> dict:
    totals = result.totals  # the same sums `dyncli trace` makes from the trace's infer_end events
    return {
        "model": result.model, "device": result.device, "status": result.status,
        "error": result.error, "inferences": result.inferences, "planned": result.planned,
        "nodes": result.nodes, "folded_nodes": result.folded,
        "fused_nodes": result.fused,
        "latency_ms": totals.latency(),
        "counters": totals.counters_dict(),
        "check": result.checks.as_dict(),
        "first_inference": first_inference(result),
        "trace": result.trace_path,
    }


def summary_lines(s: dict) -> list[str]:
    """What follows the summary table on lines of its own (never cut: a terminal wraps them):
    the device, where a slow first inference's time went, the trace path to copy."""
    lines = [f"model: {s['model']}", f"device: {s['device']}"]
    if s.get("first_inference") and s["first_inference"]["slow"]:
        lines.append(first_inference_line(s["first_inference"]))
    lines.append(f"trace: {s['trace']}")
    return lines


def summary_table(s: dict) -> Table:
    """The counters; the device and trace path are in summary_lines."""
    t = Table(title="summary", title_justify="left", show_header=False)
    t.add_column(justify="left", no_wrap=True)
    t.add_column(justify="right", overflow="fold")   # wraps at spaces: '3 / 4', 'reason n, ...'
    c = s["counters"]
    lat = s["latency_ms"]
    rows = [
        ("inferences", f"{s['inferences']}/{s['planned']}"),
        ("nodes (after folding)", f"{s['nodes']} ({s['folded_nodes']} folded, {s['fused_nodes']} fused)"),
        ("latency ms: first / median / max", f"{lat['first']:.2f} / {lat['median']:.2f} / {lat['max']:.2f}"),
        ("kernels enqueued", str(c.get("kernels", 0))),
        ("shape inference run / skipped", f"{c.get('update_shape.infer', 0)} / {c.get('update_shape.skip', 0)}"),
        ("  run, by reason", _by_reason(c, "update_shape.infer")),
        ("  skipped, by reason", _by_reason(c, "update_shape.skip")),
        ("device reads for shape inference", str(c.get("device_reads", 0))),
        ("kernel builds: all / static", f"{c.get('compiles', 0)} / {c.get('static_compiles', 0)}"),
        ("compile ms: total / in critical path", f"{c.get('compile_ms', 0):.0f} / {c.get('compile_ms_critical', 0):.0f}"),
        ("impl cache hits / evictions", f"{c.get('update_impl.cache_hit', 0)} / {c.get('update_impl.evict', 0)}"),
        ("static builds queued / switches", f"{c.get('update_impl.queue', 0)} / {c.get('update_impl.switch', 0)}"),
        ("weights reorder / cache hit / reset",
         f"{c.get('update_weights.reorder', 0)} / {c.get('update_weights.cache_hit', 0)} / "
         f"{c.get('update_weights.reset', 0)}"),
        ("buffers reused / pooled / new", f"{c.get('realloc.reuse', 0)} / "
         f"{c.get('realloc.from_pool', 0)} / {c.get('realloc.alloc', 0)}"),
        ("  views / in-place concat slices", f"{c.get('realloc.view', 0)} / {c.get('realloc.by_other', 0)}"),
        ("bytes allocated", _bytes(c.get("bytes_allocated", 0))),
        ("peak device bytes / lower bound",
         f"{_bytes(c.get('peak_bytes', 0))} / {_bytes(c.get('live_bytes_lower_bound', 0))}"),
        ("set_args done / skipped", f"{c.get('set_args.set', 0)} / {c.get('set_args.skip', 0)}"),
        ("executions skipped (empty output)", str(c.get("execute.skip.empty_output", 0))),
        ("runtime skips (op ran as a view)", str(c.get("execute.skip.runtime_skip", 0))),
        ("in-place concats: applied / fell back",
         f"{c.get('in_place_concat.apply', 0)} / {c.get('in_place_concat.fallback', 0)}"),
        ("unfusions (fusion invalid for shapes)", str(c.get("fusion.unfuse", 0))),
        ("fast path: whole / partial replays", f"{c.get('plan.replay', 0)} / {c.get('plan.partial', 0)}"),
    ]
    if c.get("kv_cache.append", 0) or c.get("kv_cache.copy", 0):
        rows.append(("KV cache appends / full copies (bytes copied)",
                     f"{c.get('kv_cache.append', 0)} / {c.get('kv_cache.copy', 0)} "
                     f"({_bytes(c.get('kv_bytes_copied', 0))})"))
    if s["check"]:
        ch = s["check"]
        rows.append(("check vs onnxruntime", f"{ch['passed']} passed, {ch['failed']} failed"))
        for name, e in ch["per_output"].items():
            rows.append((f"  {name}: max abs / rel err", f"{e['max_abs']:.2e} / {e['max_rel']:.2e}"))
    for k, v in rows:
        t.add_row(k, v)
    return t


def bench_tables(r: dict, width: int = 80) -> list:
    """`dyncli bench MODEL`: the model and device, one row per distinct shape (in several tables
    when the columns do not fit `width`), then the summary."""
    peers = r.get("peers", {})
    ort = peers.get("onnxruntime", {}).get("shapes", {})
    cols = [("shape", "left"), ("first ms", "right"), ("median", "right"), ("p90", "right"),
            ("alone", "right"), ("host", "right"), ("kernels", "right"), ("replayed", "right")]
    has_device = any("device_ms" in v for v in r["shapes"].values())
    if has_device:
        cols.append(("device", "right"))
    if ort:
        cols += [("ort ms", "right"), ("x ort", "right")]
    rows = []
    for k, v in r["shapes"].items():
        row = [k, f"{v['first_seen_ms']:.2f}", f"{v['median_ms']:.3f}", f"{v['p90_ms']:.3f}",
               f"{v['same_shape_ms']:.3f}", f"{v['host_ms']:.3f}", str(v["kernels"]),
               f"{v['replayed']}/{v['inferences']}"]
        if has_device:
            row.append(f"{v.get('device_ms', float('nan')):.3f}")
        if ort:
            row += [f"{ort[k]['median_ms']:.3f}", f"{ort[k]['ratio']:.2f}"]
        rows.append(row)
    head = f"{r['model']} ({', '.join(r['inputs'])}) on {r['device']}"
    tables = fitted_tables("per shape (ms)", cols, rows, width)
    sq = r["sequence"]
    s = Table(title="summary (ms)", show_header=False, title_justify="left")
    s.add_column("what")
    s.add_column("value", justify="right", no_wrap=True)
    s.add_row("sequence mean / median / p90", f"{sq['mean_ms']:.3f} / {sq['median_ms']:.3f} / {sq['p90_ms']:.3f}")
    s.add_row("dynamic overhead (mean / alone)", f"{r['dynamic_overhead']:.2f}")
    first = next((k for k, v in r["shapes"].items() if v.get("model_first")), None)
    if first is not None:     # its "first ms" is the model's first inference, builds and all
        s.add_row("the model's first inference (shape)", first)
    if r.get("first_seen_over_warm_max") is not None:
        s.add_row("worst first-seen shape / alone, after it", f"{r['first_seen_over_warm_max']:.1f}x")
    host_rows(s, r.get("launch_floor_us"), [("same shape", r["steady_host_us_per_kernel"]),
                                            ("first-seen shapes (median)", r.get("first_seen_host_us_per_kernel"))])
    s.add_row("kernels per inference (mean)", f"{sq['kernels_mean']:.1f}")
    s.add_row("replayed by the fast path: whole / partial",
              f"{sq['replayed']} / {sq.get('partial', 0)} of {r['timed_inferences']}")
    sf = r.get("shape_functions")
    if sf is not None:
        esc = ", ".join(sf["escapes"]) or "none"
        s.add_row("compiled shape functions: traced / answers", f"{sf['traced']} / {sf['answers']} "
                  f"(ops left to their Python: {escape(esc)})")
    compiled_rows(s, r.get("compiled_plans"))
    s.add_row("load / compile (first pass)", f"{r['load_ms']:.1f} / {r['compile_ms']:.1f}")
    if "device_ms_mean" in sq:
        s.add_row("kernel time per inference (mean)", f"{sq['device_ms_mean']:.3f}")
    for name, p in peers.items():
        s.add_row(f"{name}", p["skipped"] if "skipped" in p else
                  f"mean {p['mean_ms']:.3f} (x{sq['mean_ms'] / p['mean_ms']:.2f})")
    return [head, *tables, s, *bench_time_table(r)]


def compiled_rows(s: Table, cp: dict | None) -> None:
    """The summary's rows on compiled plans (--compiled-plans), each kind that ran."""
    for kind, what in (("partial", "compiled steps (partial plans)"), ("whole", "compiled whole plans")):
        c = (cp or {}).get(kind)
        if c is not None:
            s.add_row(f"{what}: traced / inferences served", f"{c['built']} / {c['runs']}")


def decode_tables(r: dict, width: int = 80) -> list:
    """`dyncli bench --feedback`: the decode steps of the first pass and of the timed ones."""
    head = f"{r['model']}: a decode of {r['steps']} inferences on {r['device']}"
    t = Table(title="decode steps (ms)", title_justify="left")
    for name, just in (("pass", "left"), ("mean", "right"), ("median", "right"), ("p90", "right"),
                       ("kernels", "right"), ("partial", "right"), ("compiled", "right"), ("KV copies", "right")):
        t.add_column(name, justify=just, no_wrap=True)
    for label, key in (("first", "cold"), ("timed", "decode")):
        d = r[key]
        t.add_row(label, f"{d['mean_ms']:.3f}", f"{d['median_ms']:.3f}", f"{d['p90_ms']:.3f}",
                  f"{d['kernels_mean']:.1f}", f"{d['partial']}/{d['steps']}", f"{d['compiled']}/{d['steps']}",
                  str(d["kv_copies"]))
    d = r["decode"]
    s = Table(title="summary", show_header=False, title_justify="left")
    s.add_column("what")
    s.add_column("value", justify="right", no_wrap=True)
    s.add_row("first inference (prompt, builds)", f"{r['first_inference_ms']:.1f} ms")
    rep = r.get("repeated")
    if rep:
        s.add_row("last step repeated alone (no feedback)",
                  f"median {rep['median_ms']:.3f} ms (decode step x{d['median_ms'] / rep['median_ms']:.2f})")
    host_rows(s, r.get("launch_floor_us"), [("timed steps", d["host_us_per_kernel"])])
    compiled_rows(s, r.get("compiled_plans"))
    for name, p in r.get("peers", {}).items():
        s.add_row(f"{name} per step", f"mean {p['mean_ms']:.3f} ms (x{d['mean_ms'] / p['mean_ms']:.2f})")
    parts = Table(title="time by part (ms)", title_justify="left")
    parts.add_column("part", no_wrap=True)
    parts.add_column("mean", justify="right", no_wrap=True)
    for part, v in d["time_ms"].items():
        parts.add_row(part, f"{v:.3f}")
    return [head, t, s, parts]


def bench_time_table(r: dict) -> list:
    """Where the time went, part by part (engine/accounting.py): the timed sequence's mean, and
    the first inference of the shape whose first time was slowest."""
    sq = r["sequence"]
    if not sq.get("time_ms"):
        return []
    later = [k for k, v in r["shapes"].items() if not v.get("model_first")] or list(r["shapes"])
    worst = max(later, key=lambda k: r["shapes"][k]["first_seen_ms"])
    first = r["shapes"][worst]["first_seen_time_ms"]
    t = Table(title="time by part (ms)", title_justify="left", caption=f"first: shape {worst}'s "
              "first inference (the slowest first one after the model's first inference)",
              caption_justify="left")
    t.add_column("part", no_wrap=True)
    t.add_column("sequence mean", justify="right", no_wrap=True)
    t.add_column("first", justify="right", no_wrap=True)
    for part, v in sq["time_ms"].items():
        t.add_row(part, f"{v:.3f}", f"{first.get(part, 0.0):.3f}")
    return [t]


def kernel_table(r: dict, width: int = 80) -> list:
    cols = [("kernel", "left"), ("dynamic us", "right"), ("dynamic", "right"), ("static us", "right"),
            ("static", "right")]
    rows = []
    for k in r["kernels"]:
        u = k["unit"]
        cells = []
        for impl in ("dynamic", "static"):
            m = k[impl]
            # GEMV shapes are memory-bound: their bandwidth next to the FLOP rate
            gbs = f", {m['GB/s']:.0f} GB/s" if u != "GB/s" and "GB/s" in m else ""
            cells += [f"{m['us']:.1f}", f"{m[u]:.2f} {u}{gbs}"]
        rows.append([k["kernel"], *cells])
    return [f"kernels on {r['device']} (median of profiling events)", *fitted_tables("", cols, rows, width)]


def host_rows(table, floor: float | None, rows: list) -> None:
    """The launch floor where one was measured, then each (label, host us per kernel) with its
    multiple of the floor."""
    if floor:
        table.add_row("launch floor: host us per launch", f"{floor:.1f}")
    for label, us in rows:
        if us is not None:
            over = f" ({us / floor:.1f}x the floor)" if floor else ""
            table.add_row(f"host us per kernel, {label}", f"{us:.1f}{over}")
