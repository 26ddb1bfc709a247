"""`dyncli trace`: ask a trace questions (summary, filters, group-by, raw events, Chrome export,
diff of two traces) and assert on it (`--expect`). The work is in traces/; this is the command."""
from __future__ import annotations

import json
import os
import sys
import warnings
from typing import List, Optional

import typer

from dyncli.console import EXIT_CHECK, console, err_console, fail, state, warn
from traces import expect as expectations

HELP = ("Summarise a trace written by `dyncli run`: the run header, one row per inference, counter "
        "totals, the nodes that cost most and the decisions that changed something.\n\n"
        "Examples:\n\n"
        "  dyncli trace enc.trace.jsonl --iter 2..5 --op MatMul\n\n"
        "  dyncli trace enc.trace.jsonl --group-by op --json\n\n"
        "  dyncli trace enc.trace.jsonl --kind realloc --action alloc --events\n\n"
        "  dyncli trace enc.trace.jsonl --format chrome -o enc.chrome.json   (open in ui.perfetto.dev)\n\n"
        "  dyncli trace before.jsonl after.jsonl --diff\n\n"
        "  dyncli trace enc.trace.jsonl --expect 'reallocs<=10' --expect 'update_shape.skipped>=100'\n\n"
        "Exit statuses: 0 ok, 1 an --expect failed, 2 usage error or unreadable/corrupt trace.")


def parse_expectations(exprs: list[str]) -> list:
    try:
        return [expectations.parse(e) for e in exprs]
    except expectations.ExpectError as e:
        fail(str(e))


def judge(exprs: list, summary: dict) -> list[dict]:
    """Outcomes of the expectations (exit 2 on an unknown name)."""
    try:
        return expectations.evaluate_all(exprs, summary)
    except expectations.ExpectError as e:
        fail(str(e))


def report(outcomes: list[dict], quiet: bool) -> bool:
    """Print each outcome (failures on stderr); True when all hold."""
    for o in outcomes:
        if not o["ok"]:
            err_console.print(f"[bold red]{expectations.failure_line(o)}[/]", highlight=False)
        elif not quiet:
            console.print(f"expectation holds: {o['expect']} (seen {o['seen']:g})", highlight=False)
    return all(o["ok"] for o in outcomes)


def trace(
    files: List[str] = typer.Argument(..., metavar="TRACE", help="Trace file (two with --diff)."),
    diff: bool = typer.Option(False, "--diff", help="Compare two traces: the same summary side by side with deltas."),
    iters: Optional[str] = typer.Option(None, "--iter", metavar="N|A..B", help="Only inference N or FIRST..LAST (both included)."),
    node: Optional[str] = typer.Option(None, "--node", metavar="GLOB", help="Only nodes whose name matches this glob ('MatMul_*')."),
    op: Optional[str] = typer.Option(None, "--op", metavar="OP", help="Only nodes of this ONNX op (graph inputs: Parameter)."),
    kind: Optional[str] = typer.Option(None, "--kind", metavar="KIND", help="Only events of this kind (update_shape, update_impl, "
                                       "realloc, set_args, execute, ...; see docs/trace-schema.md)."),
    action: Optional[str] = typer.Option(None, "--action", metavar="ACTION", help="Only events with this action (alloc, skip, build, ...)."),
    group_by: Optional[str] = typer.Option(None, "--group-by", metavar="KEY", help="Counts and times per node|op|kind|action|iter."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    events: bool = typer.Option(False, "--events", help="Print the matching raw events (JSON Lines) instead of the summary."),
    fmt: str = typer.Option("summary", "--format", metavar="FORMAT", help="summary, or chrome: Chrome Trace Event Format "
                            "(Perfetto UI, chrome://tracing) written to -o."),
    output: Optional[str] = typer.Option(None, "--output", "-o", metavar="FILE", help="Output file of --format chrome ('-': stdout)."),
    expect: List[str] = typer.Option([], "--expect", metavar="EXPR", help="Assert on the summary, e.g. 'reallocs<=10' (repeatable; "
                                     "names in docs/expect.md); exit 1 when one fails."),
    top: int = typer.Option(10, "--top", metavar="N", help="How many costliest nodes to show."),
    wide: bool = typer.Option(False, "--wide", help="Every decision kind and action in the per-inference "
                              "table (by default it fits the terminal, 80 columns included)."),
    limit: int = typer.Option(30, "--limit", metavar="N", help="How many changed decisions to list."),
):
    from dyncli.os_errors import os_error
    from dyncli.trace_view import diff_header, diff_rows, diff_table, header_lines, view_tables
    from traces.chrome import export_chrome
    from traces.query import EventFilter, parse_iters
    from traces.reader import TraceError, read_trace
    from traces.summary import GROUP_KEYS, TraceSummary

    if len(files) != (2 if diff else 1):
        fail("--diff takes two trace files" if diff else "one trace file expected (two need --diff)")
    if fmt not in ("summary", "chrome"):
        fail(f"--format {fmt!r}: expected summary or chrome")
    if fmt == "chrome" and not output:
        fail("--format chrome needs -o FILE ('-' for stdout)")
    if diff and (expect or events or fmt == "chrome"):
        fail("--diff compares summaries; --expect, --events and --format chrome take one trace")
    if group_by is not None and group_by not in GROUP_KEYS:
        fail(f"--group-by {group_by!r}: expected one of {', '.join(GROUP_KEYS)}")
    exprs = parse_expectations(expect)
    try:
        flt = EventFilter(parse_iters(iters) if iters else None, node, op, kind, action)
    except ValueError as e:
        fail(str(e))

    def summarise(path: str, sink=None) -> dict:
        """One pass over the trace: summary, and each matching event to `sink` when given."""
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                header, evs = read_trace(path)
                s = TraceSummary({**header, "_path": path}, flt, group_by, top, limit)

                def tee():
                    for ev in evs:
                        s.add(ev)
                        yield ev
                if sink is None:
                    for _ in tee():
                        pass
                else:
                    sink(header, tee())
        except FileNotFoundError:
            fail(f"trace file not found: {path}")
        except OSError as e:
            if state["debug"]:
                raise
            fail(os_error("read the trace", path, e))
        except TraceError as e:
            if state["debug"]:
                raise
            fail(str(e))
        result = s.result()
        for w in caught:
            warn(str(w.message))
        if result["status"] == "error":
            at = result["incomplete_inference"]
            warn(f"{path}: run ended with an error at inference "
                 f"{result['inferences'] if at is None else at}: {result['error']}; showing the "
                 f"{result['inferences']} complete inferences")
        elif result["incomplete_inference"] is not None:
            warn(f"{path}: inference {result['incomplete_inference']} never ended (run killed?); "
                 f"showing the {result['inferences']} complete inferences")
        elif result["status"] == "incomplete":
            warn(f"{path}: no run_end event (run killed or still running)")
        return result

    if diff:
        a, b = summarise(files[0]), summarise(files[1])
        if as_json:
            print(json.dumps({"a": a, "b": b, "delta": {k: vb - va for k, va, vb in diff_rows(a, b)}},
                             indent=1, default=str))
        else:
            for line in diff_header(a, b):
                console.print(line, highlight=False, markup=False, soft_wrap=True)
            console.print(diff_table(a, b))
        return

    if fmt == "chrome":
        def write_chrome(header, evs):
            try:
                out = sys.stdout if output == "-" else open(output, "w", encoding="utf-8")
            except OSError as e:
                fail(os_error("write", output, e))
            try:
                n = export_chrome(header, evs, out, flt)
            finally:
                if out is not sys.stdout:
                    out.close()
            if output != "-":
                err_console.print(f"wrote {n} trace events to {output} (open in ui.perfetto.dev)", highlight=False)
        s = summarise(files[0], write_chrome)
    elif events:
        def print_events(header, evs):
            w = sys.stdout.write
            try:
                for ev in evs:
                    if flt(ev):
                        w(json.dumps(ev, separators=(",", ":")) + "\n")
                sys.stdout.flush()
            except BrokenPipeError:  # `| head`: the reader has seen enough
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise typer.Exit(0)
        s = summarise(files[0], print_events)
    else:
        s = summarise(files[0])
    outcomes = judge(exprs, s)
    if fmt == "summary" and not events:
        if as_json:
            print(json.dumps({**s, "expect": outcomes} if exprs else s, indent=1, default=str))
        else:
            for line in header_lines(s):   # whole lines: the paths stay copyable
                console.print(line, highlight=False, markup=False, soft_wrap=True)
            for table in view_tables(s, wide):
                console.print(table)
    if not report(outcomes, quiet=as_json or events or output == "-"):
        raise typer.Exit(EXIT_CHECK)
