"""`dyncli ops`: the supported ops, the opsets each runs at, the element types its node tests
passed with and its ONNX node-test conformance (dyncli/conformance.py)."""
from __future__ import annotations

import json
from typing import Optional

import typer
from rich import box
from rich.table import Table

from dyncli.console import console, fail

HELP = ("List the supported ONNX ops: opset range, the schema version each was checked against, "
        "the element types its ONNX node tests pass with, and passed/total node tests. The "
        "figures come from dyncli/node_tests.json, written by `python -m dyncli.conformance`; "
        "--run recomputes them (a few minutes on a cold kernel cache).")


def op_rows(doc: dict | None) -> list[dict]:
    from dyncli import conformance
    from engine.ops import OPS, supported_ops
    from engine.opsets import CHECKED, DEFAULT_CHECKED, MAX_OPSET, OLDEST_OPSET, op_versions
    stats = conformance.per_op(doc) if doc else {}
    rows = []
    for op in supported_ops():
        d = OPS[op]
        # an onnxruntime op expanded at load (com.microsoft's, and those it keeps in the ONNX
        # domain) runs at its domain's version; an ONNX op expanded at load at ONNX's opsets
        ort = d.expand is not None and (d.domain not in ("", "ai.onnx") or not op_versions(op))
        versions = [d.checked] if ort else op_versions(op)
        runs = [v for v in versions if v >= (max((x for x in versions if x <= OLDEST_OPSET), default=0))]
        s = stats.get(op, {"passed": 0, "total": 0, "excluded": 0, "dtypes": []})
        fn = d.expand or getattr(d.infer, "__wrapped__", d.infer)
        rows.append({
            "op": op, "family": fn.__module__.rsplit(".", 1)[-1],
            "opsets": [runs[0] if runs else None, d.checked if ort else MAX_OPSET],
            "checked": CHECKED.get(op, DEFAULT_CHECKED), "newest": versions[-1] if versions else None,
            "dtypes": s["dtypes"], "passed": s["passed"], "total": s["total"], "excluded": s["excluded"],
            "expanded": d.expand is not None, "onnxruntime": ort,
        })
    return rows


def command(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    run: bool = typer.Option(False, "--run", help="Run the node tests now instead of reading the results file."),
    op: Optional[str] = typer.Option(None, "--op", help="Only this op (and its node tests' failures)."),
):
    from dyncli import conformance
    doc = conformance.run_all() if run else conformance.load_results()
    rows = op_rows(doc)
    if op:
        rows = [r for r in rows if r["op"] == op]
        if not rows:
            fail(f"{op} is not a supported op (`dyncli ops` lists them)")
    summary = conformance.summary(doc) if doc else None
    if as_json:
        print(json.dumps({"ops": rows, "node_tests": summary,
                          "onnx": doc.get("onnx") if doc else None,
                          "source": "run now" if run else conformance.NODE_RESULTS}, indent=1))
        return
    # onnxruntime's ops (long domain::type names, no node tests) get a table of their own
    expanded = [r for r in rows if r["onnxruntime"]]
    rows = [r for r in rows if not r["onnxruntime"]]
    # op names, families and figures never wrap; the dtype list and the test count wrap at spaces
    t = Table(title=f"{len(rows)} supported ops", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col, just in (("op", "left"), ("family", "left"), ("opsets", "right"), ("checked", "right"),
                      ("dtypes (node tests)", "left"), ("node tests", "right")):
        t.add_column(col, justify=just, no_wrap=col not in ("dtypes (node tests)", "node tests"))
    for r in rows:
        lo, hi = r["opsets"]
        stale = "" if r["newest"] is None or r["checked"] >= r["newest"] else " !"
        tests = f"{r['passed']}/{r['total']}" if r["total"] else "-"
        if r["excluded"]:
            tests += f" (+{r['excluded']} excl.)"
        t.add_row(r["op"], r["family"], f"{lo}-{hi}", f"v{r['checked']}{stale}",
                  " ".join(r["dtypes"]), tests)
    console.print(t)
    if expanded:
        t = Table(title=f"{len(expanded)} onnxruntime ops, rewritten into ONNX ops at load", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
        for col in ("op", "family", "version"):
            t.add_column(col, no_wrap=True)
        for r in expanded:
            t.add_row(r["op"], r["family"], f"v{r['checked']}")
        console.print(t)
    if summary is None:
        console.print("no node-test results: run `python -m dyncli.conformance` or `dyncli ops --run`")
        return
    console.print(f"ONNX node tests (onnx {doc.get('onnx')}): {summary['passed']}/{summary['run']} passed "
                  f"({100 * summary['rate']:.1f}%), {summary['excluded']} excluded "
                  f"(dyncli/conformance.py EXCLUDED says why); "
                  f"{'run now' if run else 'from dyncli/node_tests.json (python -m dyncli.conformance)'}",
                  highlight=False)
    if op and doc:
        for name, v in sorted(doc["cases"].items()):
            if op in v["ops"] and v["status"] != "passed":
                console.print(f"  {name}: {v['status']} {v.get('reason') or v.get('error', '')}",
                              highlight=False)
