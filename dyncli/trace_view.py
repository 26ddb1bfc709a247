"""Rich rendering of a trace summary (traces.summary) for `dyncli trace`: header panel, one row
per inference, counters, costliest nodes, decisions that changed something, group-by and diff."""
from __future__ import annotations

import json

from rich import box
from rich.console import Group
from rich.panel import Panel
from rich.table import Table

from dyncli.render import _bytes, _shapes
from traces.schema import KINDS


def header_panel(s: dict) -> Panel:
    h = s["header"]
    opts = h.get("options") or {}
    lines = [f"[bold]model[/]   {h.get('model', '?')}", f"[bold]device[/]  {h.get('device', '?')}",
             f"[bold]nodes[/]   {h.get('nodes', '?')}   [bold]inputs[/] "
             + ", ".join(f"{k}:{'x'.join(str(d) for d in v)}" for k, v in (h.get("inputs") or {}).items())]
    if h.get("float16"):   # how half tensors ran (engine/f16.py)
        f16 = h["float16"]
        wrapped = (f"; {f16['casts']} Casts around {', '.join(f16['f32_ops'])}"
                   if f16.get("casts") else "")
        lines.insert(2, f"[bold]float16[/] stored half, computed {f16['compute']} "
                        f"(cl_khr_fp16: {'yes' if f16['cl_khr_fp16'] else 'no'}){wrapped}")
    shown = {k: v for k, v in opts.items() if v not in (None, [], False, "")}
    if shown:
        lines.append("[bold]options[/] " + "  ".join(f"{k}={json.dumps(v)}" for k, v in shown.items()))
    status = s["status"] if s["status"] != "incomplete" else "[yellow]no run_end (killed?)[/]"
    lines.append(f"[bold]status[/]  {status}   [bold]events[/] {s['events']}"
                 + (f"   [bold]filters[/] {s['filters']}" if s["filters"] else ""))
    return Panel("\n".join(lines), title=s["trace"], title_align="left", highlight=False)


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
    return f"{v:.2f}" if isinstance(v, float) and not v.is_integer() else f"{v:g}"


def counters_table(s: dict) -> Table:
    t = Table(title="totals", title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("counter")
    t.add_column("total", justify="right")
    lat = s["latency_ms"]
    t.add_row("inferences", str(s["inferences"]))
    t.add_row("latency ms: first / median / mean / max",
              f"{lat['first']:.2f} / {lat['median']:.2f} / {lat['mean']:.2f} / {lat['max']:.2f}")
    for k, v in s["counters"].items():
        t.add_row(k, _bytes(v) if "bytes" in k else _num(v))
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


def changes_table(s: dict, wide: bool = False) -> Table:
    """Narrow: the op goes (node names usually say it) and every cell folds instead of cutting."""
    shown, total = len(s["changes"]), s["changes_total"]
    title = "decisions that changed something" + (f" (first {shown} of {total}; --limit)" if total > shown else "")
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("#", "node") + (("op",) if wide else ()) + ("decision", "detail"):
        t.add_column(col, justify="right" if col == "#" else "left", overflow="fold",
                     ratio=3 if col == "detail" else None if col == "#" else 2)
    for c in s["changes"]:
        detail = {k: v for k, v in c.items() if k not in ("iter", "node", "op", "kind", "action", "reason")}
        dec = f"{c['kind']}.{c['action']}" + (f" ({c['reason']})" if c["reason"] else "")
        t.add_row(str(c["iter"]), c["node"], *([c["op"]] if wide else []), dec,
                  " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in detail.items()))
    return t


def trace_view(s: dict, wide: bool = False) -> Group:
    parts = [header_panel(s), inference_table(s, wide), counters_table(s),
             cost_table(s["top_nodes"], "node", "nodes that cost most (time between events, ms)", wide),
             changes_table(s, wide)]
    if "groups" in s:
        parts.append(cost_table(s["groups"], s["group_by"], f"grouped by {s['group_by']}", wide))
    return Group(*parts)


def diff_rows(a: dict, b: dict) -> list[tuple[str, float, float]]:
    """(metric, A, B) for the latency figures, inferences, every counter of either, changes."""
    rows = [("inferences", a["inferences"], b["inferences"])]
    rows += [(f"latency_ms.{k}", a["latency_ms"][k], b["latency_ms"][k]) for k in ("first", "median", "mean", "max", "total")]
    for k in sorted(set(a["counters"]) | set(b["counters"])):
        rows.append((k, a["counters"].get(k, 0), b["counters"].get(k, 0)))
    rows.append(("changed decisions", a["changes_total"], b["changes_total"]))
    return rows


def diff_table(a: dict, b: dict) -> Table:
    t = Table(title=f"A: {a['trace']}\nB: {b['trace']}", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("metric", "A", "B", "B - A", "B / A"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for name, va, vb in diff_rows(a, b):
        d = vb - va
        style = "" if d == 0 else ("green" if d < 0 else "red")
        ratio = f"{vb / va:.2f}x" if va else "-"
        t.add_row(name, _num(va), _num(vb), f"[{style}]{d:+g}[/]" if style and not isinstance(d, float)
                  else (f"[{style}]{d:+.2f}[/]" if style else "0"), ratio)
    return t
