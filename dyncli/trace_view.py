"""Rich rendering of a trace summary (traces.summary) for `dyncli trace`: header panel, one row
per inference, counters, costliest nodes, decisions that changed something, group-by and diff."""
from __future__ import annotations

import json

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from dyncli.render import _bytes, _shapes
from dyncli.shapes import format_dims
from traces.schema import KINDS


def header_lines(s: dict) -> list[str]:
    """The run header as plain lines (printed whole: paths and device names are never cut)."""
    h = s["header"]
    opts = h.get("options") or {}
    inputs = ", ".join(f"{k}: {format_dims(v)}" for k, v in (h.get("inputs") or {}).items())
    lines = [f"trace   {s['trace']}", f"model   {h.get('model', '?')}", f"device  {h.get('device', '?')}"]
    if h.get("float16"):   # how half tensors ran (engine/f16.py)
        f16 = h["float16"]
        wrapped = (f"; {f16['casts']} Casts around {', '.join(f16['f32_ops'])}"
                   if f16.get("casts") else "")
        lines.append(f"float16 stored half, computed {f16['compute']} "
                     f"(cl_khr_fp16: {'yes' if f16['cl_khr_fp16'] else 'no'}){wrapped}")
    lines.append(f"nodes   {h.get('nodes', '?')}   inputs {inputs}")
    shown = {k: v for k, v in opts.items() if v not in (None, [], False, "")}
    if shown:
        lines.append("options " + "  ".join(f"{k}={json.dumps(v)}" for k, v in shown.items()))
    status = s["status"] if s["status"] != "incomplete" else "no run_end (killed?)"
    filters = "  ".join(f"--{k} {v}" for k, v in s["filters"].items())
    lines.append(f"status  {status}   events {s['events']}" + (f"   filters {filters}" if filters else ""))
    return lines


def _kind_actions(rows: list[dict]) -> dict[str, list[str]]:
    """kind -> its actions seen in the rows, kinds in pipeline (schema) order."""
    seen: dict[str, set] = {}
    for r in rows:
        for key in r["decisions"]:
            parts = key.split(".")
            if len(parts) == 2:
                seen.setdefault(parts[0], set()).add(parts[1])
    order = list(KINDS)
    return {k: sorted(seen[k]) for k in sorted(seen, key=lambda k: (order.index(k) if k in order else len(order), k))}


# Narrow view (the default; fits 80 columns): the decisions that cost, per inference; a legend
# line spells the headers out. --wide shows every kind with all its actions.
NARROW_COLUMNS = [("shape", ("update_shape.infer", "update_shape.skip")),
                  ("impl", ("update_impl.build", "update_impl.switch")),
                  ("weights", ("update_weights.reorder",)),
                  ("buffers", ("realloc.reuse", "realloc.from_pool", "realloc.alloc"))]
NARROW_LEGEND = ("shape: inferred/skipped; impl: kernel builds/switches to static; weights: "
                 "reorders; buffers: reused/pooled/new; alloc: bytes allocated; --wide: every "
                 "kind and action")


def inference_table(s: dict, wide: bool = False) -> Table:
    t = Table(title="one row per inference" + (" (decision counts: kind, actions)" if wide else ""),
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
              caption=None if wide else NARROW_LEGEND, caption_justify="left")
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("inputs", overflow="fold")
    t.add_column("ms", justify="right", no_wrap=True)
    if wide:
        kinds = _kind_actions(s["rows"])
        cols = [(f"{k.removeprefix('update_')}\n{'/'.join(acts)}", tuple(f"{k}.{a}" for a in acts))
                for k, acts in kinds.items()]
    else:
        cols = NARROW_COLUMNS
    for head, _ in cols:
        t.add_column(head, justify="right", no_wrap=not wide, overflow="fold")
    t.add_column("alloc" if not wide else "allocated", justify="right", no_wrap=True)
    for r in s["rows"]:
        d = r["decisions"]
        t.add_row(str(r["iter"]), _shapes(r["inputs"]) if r["inputs"] else "-", f"{r['latency_ms']:.2f}",
                  *("/".join(str(d.get(k, 0)) for k in keys) for _, keys in cols),
                  _bytes(r["counters"].get("bytes_allocated", 0)))
    return t


def _num(v) -> str:
    """2 decimals for a fraction, whole numbers in full (never 1.52094e+06)."""
    return f"{v:.2f}" if isinstance(v, float) and not v.is_integer() else str(int(v))


def indented_names(names: list[str]) -> list[str]:
    """Counter names as rows: a 'kind.action.reason' right under its 'kind.action' shows as its
    indented reason, so long names need no folding at 80 columns."""
    out, prev = [], None
    for n in names:
        parts = n.split(".")
        out.append("    " + parts[2] if len(parts) == 3 and prev == ".".join(parts[:2]) else n)
        if len(parts) == 2:
            prev = n
    return out


def counters_table(s: dict) -> Table:
    t = Table(title="totals", title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("counter")
    t.add_column("total", justify="right")
    lat = s["latency_ms"]
    t.add_row("inferences", str(s["inferences"]))
    t.add_row("latency ms: first / median / mean / max",
              f"{lat['first']:.2f} / {lat['median']:.2f} / {lat['mean']:.2f} / {lat['max']:.2f}")
    for (k, v), shown in zip(s["counters"].items(), indented_names(list(s["counters"]))):
        t.add_row(shown, _bytes(v) if "bytes" in k else _num(v))
    if s["check"]:
        c = s["check"]
        t.add_row("check vs onnxruntime", f"{c['passed']} passed, {c['failed']} failed (max abs {c['max_abs']:.1e})")
    return t


def _decisions(d: dict, n: int = 4) -> str:
    return ", ".join(f"{k} {v}" for k, v in list(d.items())[:n])


def cost_table(rows: list[dict], key: str, title: str, wide: bool = False) -> Table:
    """Narrow: the key, op and times; --wide adds the decisions each made."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column(key, overflow="fold")
    if key == "node":
        t.add_column("op", overflow="fold")
    for col in ("events", "ms", "compile ms") + (("decisions",) if wide else ()):
        t.add_column(col, justify="left" if col == "decisions" else "right", overflow="fold",
                     no_wrap=col != "decisions")
    for r in rows:
        t.add_row(str(r[key]) if r[key] != "" else "(run)", *([r["op"]] if key == "node" else []),
                  str(r["events"]), f"{r['ms']:.2f}", f"{r['compile_ms']:.1f}",
                  *([_decisions(r["decisions"])] if wide else []))
    return t


def changes_table(s: dict, wide: bool = False) -> Group:
    """One change a paragraph: '#iter node [op] kind.action (reason): key=value ...', wrapped
    at spaces (a table would fold the long impl names inside their words at 80 columns)."""
    shown, total = len(s["changes"]), s["changes_total"]
    title = "decisions that changed something" + (f" (first {shown} of {total}; --limit)" if total > shown else "")
    lines = [Text(title, style="italic")]
    for c in s["changes"]:
        detail = {k: v for k, v in c.items() if k not in ("iter", "node", "op", "kind", "action", "reason")}
        dec = f"{c['kind']}.{c['action']}" + (f" ({c['reason']})" if c["reason"] else "")
        head = f"#{c['iter']} {c['node'] or '(run)'}" + (f" [{c['op']}]" if wide and c["op"] else "")
        body = " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in detail.items())
        lines.append(Text(f"  {head} {dec}" + (f": {body}" if body else "")))
    return Group(*lines)


def time_table(s: dict) -> Table | None:
    """Where the inferences' time went (infer_end's time_ms, engine/accounting.py): each part's
    mean and max over the inferences, and the slowest inference's own split."""
    rows = [r for r in s["rows"] if r.get("time_ms")]
    if not rows:
        return None
    slow = max(rows, key=lambda r: r["latency_ms"])
    t = Table(title="time by part, ms", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              padding=(0, 1), caption=f"#{slow['iter']}: the slowest inference ({slow['latency_ms']:.2f} ms)",
              caption_justify="left")
    t.add_column("part", no_wrap=True)
    for head in ("mean", "max", f"#{slow['iter']}"):
        t.add_column(head, justify="right", no_wrap=True)
    for part in rows[-1]["time_ms"]:
        vals = [r["time_ms"].get(part, 0.0) for r in rows]
        t.add_row(part, f"{sum(vals) / len(vals):.3f}", f"{max(vals):.3f}",
                  f"{slow['time_ms'].get(part, 0.0):.3f}")
    return t


def view_tables(s: dict, wide: bool = False) -> list:
    """The tables that answer the question asked: with --group-by the grouped table alone; with
    an event filter (--node, --op, --kind, --action) the matching decisions per inference, the
    matching nodes and their changes; else the whole report (--iter narrows every table)."""
    if "groups" in s:
        return [cost_table(s["groups"], s["group_by"], f"grouped by {s['group_by']}", wide)]
    nodes = cost_table(s["top_nodes"], "node", "nodes that cost most (time between events, ms)", wide)
    if set(s["filters"]) - {"iter"}:
        return [inference_table(s, wide), nodes, changes_table(s, wide)]
    timing = time_table(s)
    return [inference_table(s, wide), counters_table(s), *([timing] if timing else []), nodes,
            changes_table(s, wide)]


def trace_view(s: dict, wide: bool = False) -> Group:
    return Group(*(Text(line) for line in header_lines(s)), *view_tables(s, wide))


def diff_rows(a: dict, b: dict) -> list[tuple[str, float, float]]:
    """(metric, A, B) for the latency figures, inferences, every counter of either, changes."""
    rows = [("inferences", a["inferences"], b["inferences"])]
    rows += [(f"latency_ms.{k}", a["latency_ms"][k], b["latency_ms"][k]) for k in ("first", "median", "mean", "max", "total")]
    for k in sorted(set(a["counters"]) | set(b["counters"])):
        rows.append((k, a["counters"].get(k, 0), b["counters"].get(k, 0)))
    rows.append(("changed decisions", a["changes_total"], b["changes_total"]))
    return rows


def _value(name: str, v) -> str:
    return _bytes(v) if "bytes" in name else _num(v)


def _delta(name: str, d) -> str:
    if d == 0:
        return "0"
    sign = "+" if d > 0 else "-"
    return sign + (_bytes(abs(d)) if "bytes" in name else _num(abs(d)))


def diff_header(a: dict, b: dict) -> list[str]:
    """The two traces and what differed in how they were run: model, device, each option."""
    lines = [f"A: {a['trace']}", f"B: {b['trace']}"]
    ha, hb = a["header"], b["header"]
    differ = [f"{k}: {ha.get(k)} -> {hb.get(k)}" for k in ("model", "device") if ha.get(k) != hb.get(k)]
    oa, ob = ha.get("options") or {}, hb.get("options") or {}
    differ += [f"{k}: {json.dumps(oa.get(k))} -> {json.dumps(ob.get(k))}"
               for k in sorted(set(oa) | set(ob)) if k != "trace" and oa.get(k) != ob.get(k)]
    lines.append("differ: " + ("; ".join(differ) if differ else "nothing (same model, device and options)"))
    return lines


def diff_table(a: dict, b: dict) -> Table:
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("metric", justify="left", no_wrap=True)
    for col in ("A", "B", "B - A", "B / A"):
        t.add_column(col, justify="right", no_wrap=True)
    rows = diff_rows(a, b)
    for (name, va, vb), shown in zip(rows, indented_names([r[0] for r in rows])):
        d = vb - va
        style = "" if d == 0 else ("green" if d < 0 else "red")
        ratio = f"{vb / va:.2f}x" if va else "-"
        delta = _delta(name, d)
        t.add_row(shown, _value(name, va), _value(name, vb), f"[{style}]{delta}[/]" if style else delta, ratio)
    return t
