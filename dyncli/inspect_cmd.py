"""`dyncli inspect MODEL`: what a model takes and gives, without running it (as polygraphy's
`inspect model`): inputs and outputs with element type and dims (dim_param names kept), opsets,
node count by op, and the ops the engine does not run."""
from __future__ import annotations

import json
from collections import Counter

import typer
from onnx import TensorProto

from dyncli.console import console, fail, state
from dyncli.shapes import format_dims

HELP = ("Show MODEL's inputs and outputs (element type, dims with their names), opsets, node "
        "count by op and the ops dyncli does not run, without running it: what to write in "
        "--shapes.\n\n"
        "Examples:\n\n"
        "  dyncli inspect model.onnx\n\n"
        "  dyncli inspect model.onnx --json")


def _dims(vi) -> list | None:
    """Declared dims: int, dim_param name, or None (unknown); None without a shape (any rank)."""
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]


def _dtype(vi) -> str:
    if not vi.type.HasField("tensor_type"):
        return vi.type.WhichOneof("value") or "unknown"
    return TensorProto.DataType.Name(vi.type.tensor_type.elem_type).lower()


def _unsupported(graph) -> list[dict]:
    """Ops the engine does not run (build_program's rule: the registry's ops, keyed by domain
    and type), with the nodes that use them."""
    from engine.ops import supported_ops
    from engine.ops.registry import op_key
    from engine.subgraphs import subgraphs_of
    known = set(supported_ops())
    bad: dict[str, list] = {}
    todo = [graph]      # control-flow subgraphs' nodes too: the model's as much as the graph's
    while todo:
        g = todo.pop(0)
        for k, n in enumerate(g.node):
            op = op_key(n.domain, n.op_type)
            if op not in known:
                bad.setdefault(op, []).append(n.name or f"{n.op_type}_{k}")
            todo += subgraphs_of(n)
    return [{"op": op, "nodes": nodes} for op, nodes in sorted(bad.items())]


def describe(path: str, model) -> dict:
    g = model.graph
    consts = {t.name for t in g.initializer}
    return {
        "model": path,
        "ir_version": model.ir_version,
        "producer": " ".join(filter(None, (model.producer_name, model.producer_version))),
        "opsets": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        "inputs": [{"name": vi.name, "dtype": _dtype(vi), "dims": _dims(vi)}
                   for vi in g.input if vi.name not in consts],
        "outputs": [{"name": vi.name, "dtype": _dtype(vi), "dims": _dims(vi)} for vi in g.output],
        "initializers": len(g.initializer),
        "nodes": len(g.node),
        "ops": dict(Counter(n.op_type for n in g.node).most_common()),
        "unsupported": _unsupported(g),
    }


def _tensor_lines(title: str, rows: list[dict]) -> list[str]:
    width = max((len(r["name"]) for r in rows), default=0)
    kind = max((len(r["dtype"]) for r in rows), default=0)
    return [f"{title} ({len(rows)})"] + [f"  {r['name']:<{width}}  {r['dtype']:<{kind}}  "
                                         f"{format_dims(r['dims'])}" for r in rows]


def command(
    model: str = typer.Argument(..., metavar="MODEL", help="ONNX model file."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    from dyncli.runner import UsageError, read_model
    try:
        m = read_model(model)
    except UsageError as e:
        if state["debug"]:
            raise
        fail(str(e))
    d = describe(model, m)
    if as_json:
        print(json.dumps(d, indent=1))
        return
    opsets = ", ".join(f"{k} {v}" for k, v in d["opsets"].items()) or "none"
    lines = [f"model    {model}",
             f"opsets   {opsets} (IR version {d['ir_version']}"
             + (f", producer {d['producer']})" if d["producer"] else ")")]
    lines += _tensor_lines("inputs", d["inputs"]) + _tensor_lines("outputs", d["outputs"])
    for line in lines:   # whole lines: names and dims are never cut (a terminal wraps them)
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    console.print(f"nodes ({d['nodes']}, {d['initializers']} initializers): "
                  + ", ".join(f"{op} {n}" for op, n in d["ops"].items()), highlight=False, markup=False)
    if d["unsupported"]:
        console.print("unsupported ops (dyncli run refuses the model): " + "; ".join(
            f"{u['op']} ({len(u['nodes'])} node{'s' if len(u['nodes']) > 1 else ''}: "
            f"{', '.join(u['nodes'][:4])}{', ...' if len(u['nodes']) > 4 else ''})"
            for u in d["unsupported"]), highlight=False, markup=False)
    else:
        console.print("unsupported ops: none", highlight=False)
