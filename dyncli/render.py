"""Rich rendering of run results (tables, summary) and their JSON form."""
from __future__ import annotations

from rich import box
from rich.table import Table

from dyncli.shapes import format_shape
from engine.diagnose import nbytes_text


def _shapes(d: dict) -> str:
    """One shape when every tensor has it (the usual ids/mask pair), else name:shape pairs."""
    vals = {tuple(v) for v in d.values()}
    if len(vals) == 1:
        return format_shape(vals.pop()) + (f" (x{len(d)})" if len(d) > 1 else "")
    return " ".join(f"{k}:{format_shape(v)}" for k, v in d.items())


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


def inference_table(result, wide: bool = False) -> Table:
    shown, total = len(result.records), result.inferences
    title = f"{result.model}: one row per inference" + (
        f" (the last {shown} of {total}; the trace has them all)" if total > shown else "")
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
              caption=None if wide else INFERENCE_LEGEND, caption_justify="left")
    cols = [c for c in INFERENCE_COLUMNS if wide or not c[3]]
    for short, long, just, _ in cols:
        t.add_column(long if wide else short, justify=just,
                     no_wrap=short not in ("inputs", "outputs"), overflow="fold")
    has_check = any(r.checks for r in result.records)
    if has_check:
        t.add_column("check\nmax abs" if wide else "check", justify="right", no_wrap=True)
    for r in result.records:
        c = r.counters
        cells = {"#": str(r.iter), "inputs": _shapes(r.in_shapes), "outputs": _shapes(r.out_shapes),
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
        "trace": result.trace_path,
    }


def summary_table(s: dict) -> Table:
    t = Table(title="summary", title_justify="left", show_header=False)
    t.add_column(justify="left")
    t.add_column(justify="right")
    c = s["counters"]
    lat = s["latency_ms"]
    rows = [
        ("device", s["device"]),
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
        ("fast path: plan replays", str(c.get("plan.replay", 0))),
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
    rows.append(("trace", s["trace"]))
    for k, v in rows:
        t.add_row(k, v)
    return t


def bench_tables(r: dict) -> list:
    """`dyncli bench MODEL`: one row per distinct shape, then the summary."""
    peers = r.get("peers", {})
    ort = peers.get("onnxruntime", {}).get("shapes", {})
    t = Table(title=f"{r['model']} ({', '.join(r['inputs'])}) on {r['device']}",
              title_justify="left")
    cols = ["shape", "first ms", "median", "p90", "alone", "host", "kernels", "replayed"]
    if any("device_ms" in v for v in r["shapes"].values()):
        cols.append("device")
    if ort:
        cols += ["ort ms", "x ort"]
    for c in cols:
        t.add_column(c, justify="left" if c == "shape" else "right")
    for k, v in r["shapes"].items():
        row = [k, f"{v['first_seen_ms']:.2f}", f"{v['median_ms']:.3f}", f"{v['p90_ms']:.3f}",
               f"{v['same_shape_ms']:.3f}", f"{v['host_ms']:.3f}", str(v["kernels"]),
               f"{v['replayed']}/{v['inferences']}"]
        if "device" in cols:
            row.append(f"{v.get('device_ms', float('nan')):.3f}")
        if ort:
            row += [f"{ort[k]['median_ms']:.3f}", f"{ort[k]['ratio']:.2f}"]
        t.add_row(*row)
    sq = r["sequence"]
    s = Table(title="summary (ms)", show_header=False, title_justify="left")
    s.add_column("what")
    s.add_column("value", justify="right")
    s.add_row("sequence mean / median / p90", f"{sq['mean_ms']:.3f} / {sq['median_ms']:.3f} / {sq['p90_ms']:.3f}")
    s.add_row("dynamic overhead (mean / alone)", f"{r['dynamic_overhead']:.2f}")
    if r["steady_host_us_per_kernel"] is not None:
        s.add_row("host us per kernel, same shape", f"{r['steady_host_us_per_kernel']:.1f}")
    s.add_row("kernels per inference (mean)", f"{sq['kernels_mean']:.1f}")
    s.add_row("replayed by the fast path", f"{sq['replayed']}/{r['timed_inferences']}")
    s.add_row("load / compile (first pass)", f"{r['load_ms']:.1f} / {r['compile_ms']:.1f}")
    if "device_ms_mean" in sq:
        s.add_row("kernel time per inference (mean)", f"{sq['device_ms_mean']:.3f}")
    for name, p in peers.items():
        s.add_row(f"{name}", p["skipped"] if "skipped" in p else
                  f"mean {p['mean_ms']:.3f} (x{sq['mean_ms'] / p['mean_ms']:.2f})")
    return [t, s]


def kernel_table(r: dict) -> Table:
    t = Table(title=f"kernels on {r['device']} (median of profiling events)", title_justify="left")
    for c in ("kernel", "dynamic us", "dynamic", "static us", "static"):
        t.add_column(c, justify="left" if c == "kernel" else "right")
    for k in r["kernels"]:
        u = k["unit"]
        cells = []
        for impl in ("dynamic", "static"):
            r = k[impl]
            gbs = f", {r['GB/s']:.0f} GB/s" if u != "GB/s" and "GB/s" in r else ""
            cells += [f"{r['us']:.1f}", f"{r[u]:.2f} {u}{gbs}"]
        t.add_row(k["kernel"], *cells)
    return t
