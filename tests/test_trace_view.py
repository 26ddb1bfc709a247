"""`dyncli trace` on traces recorded from examples/encoder.onnx: the default view, filters,
group-by, --json, --events, the Chrome export, --diff, --expect (on run and trace), a run killed
with SIGKILL and a trace corrupted in the middle."""
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from typer.testing import CliRunner

from dyncli.cli import app
from traces import read_trace
from traces.summary import RECORD_KINDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENCODER = os.path.join(ROOT, "examples", "encoder.onnx")
SHAPES = ["input_ids:1x{8..16..8},attention_mask:1x{8..16..8}", "input_ids:1x16,attention_mask:1x16",
          "input_ids:2x8,attention_mask:2x8"]
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def record(path, *extra, prealloc="10 16384 2 1.1"):
    args = ["run", ENCODER, "--trace", path, "--json", "--prealloc", prealloc, *extra]
    for s in SHAPES:
        args += ["--shapes", s]
    r = invoke(*args)
    return r


@pytest.fixture(scope="module")
def enc(tmp_path_factory):
    """One recorded run: (trace path, the run's --json summary, the raw events)."""
    path = tmp_path_factory.mktemp("traces") / "enc.trace.jsonl"
    # shape-agnostic impls only: background static builds would land at compiler-dependent times
    r = record(path, "--check", "--impls", "dynamic")
    assert r.exit_code == 0, r.output
    run_summary = json.loads(r.stdout)
    _, events = read_trace(str(path))
    return str(path), run_summary, list(events)


def trace_json(*args):
    r = invoke("trace", *args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def in_inference(events):
    """Events between an infer_start and its infer_end (those the summary times and counts)."""
    out, inside = [], False
    for e in events:
        if e["kind"] == "infer_start":
            inside = True
        if inside:
            out.append(e)
        if e["kind"] == "infer_end":
            inside = False
    return out


def test_default_view_shows_header_rows_costs_and_changes(enc):
    path, _, events = enc
    r = invoke("trace", path)
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "encoder.onnx" in out and "status  ok" in out
    assert "one row per inference" in out and "nodes that cost most" in out
    assert "decisions that changed something" in out and "update_impl.build" in out
    costliest = max(Counter(e["node"] for e in events if e["kind"] == "update_impl" and e["action"] == "build"))
    assert costliest in out


def test_json_summary_matches_the_run_and_the_events(enc):
    path, run_s, events = enc
    s = trace_json(path)
    # same totals as `dyncli run` computed from the counters it held in memory
    assert s["counters"] == run_s["counters"] and s["latency_ms"] == run_s["latency_ms"]
    assert s["inferences"] == run_s["inferences"] == 4 and s["status"] == "ok"
    assert s["check"] == {k: run_s["check"][k] for k in s["check"]}
    assert [r["inputs"]["input_ids"] for r in s["rows"]] == [[1, 8], [1, 16], [1, 16], [2, 8]]
    # per-inference decision counts are the events' own kind.action counts
    for row in s["rows"]:
        got = Counter(f"{e['kind']}.{e['action']}" for e in events
                      if e["iter"] == row["iter"] and e["kind"] not in RECORD_KINDS)
        assert {k: v for k, v in row["decisions"].items() if k.count(".") == 1} == dict(got)
    # repeated shapes: inference 2 infers no shape and allocates nothing
    assert s["rows"][2]["decisions"].get("update_shape.infer", 0) == 0
    assert s["rows"][2]["decisions"].get("realloc.alloc", 0) == 0
    changes = [e for e in events if e["kind"] not in RECORD_KINDS and e["action"] in ("build", "alloc", "evict")]
    assert s["changes_total"] == len(changes)
    assert [(c["iter"], c["node"], c["action"]) for c in s["changes"]] == \
        [(e["iter"], e["node"], e["action"]) for e in changes][:30]
    top = s["top_nodes"]
    assert len(top) == 10 and all(top[i]["ms"] >= top[i + 1]["ms"] for i in range(9))


@pytest.mark.parametrize("args,pred", [
    (["--iter", "1"], lambda e: e["iter"] == 1),
    (["--iter", "1..2"], lambda e: 1 <= e["iter"] <= 2),
    (["--node", "MatMul_*"], lambda e: e["node"].startswith("MatMul_")),
    (["--op", "attention"], lambda e: e["op"] == "attention"),   # QK^T, Softmax, x V: one node
    (["--kind", "realloc"], lambda e: e["kind"] == "realloc"),
    (["--action", "alloc"], lambda e: e["action"] == "alloc"),
    (["--iter", "0..1", "--kind", "update_impl", "--action", "build"],
     lambda e: e["iter"] <= 1 and e["kind"] == "update_impl" and e["action"] == "build"),
])
def test_filters_events_and_counts(enc, args, pred):
    path, _, events = enc
    want = [e for e in events if e["iter"] >= 0 and pred(e)]
    assert want, "the filter must select something"
    r = invoke("trace", path, *args, "--events")
    assert r.exit_code == 0, r.output
    got = [json.loads(line) for line in r.stdout.splitlines()]
    assert got == want
    s = trace_json(path, *args)
    decisions = Counter(f"{e['kind']}.{e['action']}" for e in in_inference(want) if e["kind"] not in RECORD_KINDS)
    assert {k: v for k, v in s["counters"].items() if k.count(".") == 1 and k in decisions} == dict(decisions)
    lo, hi = list(map(int, args[1].split("..") * 2))[:2] if args[0] == "--iter" else (0, 3)
    assert [r["iter"] for r in s["rows"]] == list(range(lo, hi + 1))


@pytest.mark.parametrize("key", ["node", "op", "kind", "action", "iter"])
def test_group_by(enc, key):
    path, _, events = enc
    s = trace_json(path, "--group-by", key)
    inside = in_inference(events)
    want = Counter(e[key] for e in inside)
    assert {g[key]: g["events"] for g in s["groups"]} == dict(want)
    assert all(g["ms"] >= 0 for g in s["groups"])
    r = invoke("trace", path, "--group-by", key, "--op", "MatMul")
    assert r.exit_code == 0 and f"grouped by {key}" in r.stdout


def test_group_by_with_filter_counts_only_matching(enc):
    path, _, events = enc
    s = trace_json(path, "--group-by", "action", "--kind", "realloc")
    want = Counter(e["action"] for e in in_inference(events) if e["kind"] == "realloc")
    assert {g["action"]: g["events"] for g in s["groups"]} == dict(want)


def _nest_ok(xs):
    """X events of one thread: each pair disjoint or one inside the other."""
    stack = []
    for x in sorted(xs, key=lambda x: (x["ts"], -x["dur"])):
        end = x["ts"] + x["dur"]
        while stack and stack[-1] <= x["ts"]:
            stack.pop()
        if stack and end > stack[-1]:
            return False
        stack.append(end)
    return True


def test_chrome_export(enc, tmp_path):
    path, run_s, events = enc
    out = tmp_path / "enc.chrome.json"
    r = invoke("trace", path, "--format", "chrome", "-o", out)
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    evs = doc["traceEvents"]
    need = {"X": {"name", "ts", "dur", "pid", "tid"}, "i": {"name", "ts", "pid", "tid", "s"},
            "C": {"name", "ts", "pid", "args"}, "M": {"name", "pid", "args"}}
    phases = Counter(e["ph"] for e in evs)
    assert set(phases) == set(need)
    for e in evs:
        assert need[e["ph"]] <= set(e), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], int) and e["dur"] >= 0
    threads = {e["tid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"inference", "node", "update_shape", "update_impl", "realloc", "set_args", "execute"} <= set(threads.values())
    assert any(e["name"] == "process_name" for e in evs if e["ph"] == "M")
    by_tid = {}
    for e in evs:
        if e["ph"] == "X":
            by_tid.setdefault(e["tid"], []).append(e)
    for tid, xs in by_tid.items():
        assert _nest_ok(xs), threads[tid]
    infer_tid = next(t for t, n in threads.items() if n == "inference")
    infer_x = by_tid[infer_tid]
    assert len(infer_x) == 4
    # every stage sits inside its inference
    for e in (x for t, xs in by_tid.items() if t != infer_tid for x in xs):
        assert any(i["ts"] <= e["ts"] and e["ts"] + e["dur"] <= i["ts"] + i["dur"] for i in infer_x)
    stage_x = [e for e in evs if e["ph"] == "X" and threads[e["tid"]] not in ("inference", "node")]
    assert len(stage_x) == sum(1 for e in in_inference(events) if e["kind"] not in RECORD_KINDS)
    mem = [e for e in evs if e["ph"] == "C"]
    assert mem[-1]["args"]["allocated"] == run_s["counters"]["bytes_allocated"]
    assert all(m["args"]["live"] > 0 for m in mem)
    instants = [e for e in evs if e["ph"] == "i" and e["name"].startswith("update_impl.build")]
    assert instants and all("impl" in e["args"] for e in instants)


def test_chrome_export_filtered_to_stdout(enc):
    path, _, events = enc
    r = invoke("trace", path, "--format", "chrome", "-o", "-", "--iter", "3", "--kind", "execute")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") == "execute"]
    assert len(xs) == sum(1 for e in events if e["iter"] == 3 and e["kind"] == "execute")
    assert all(e["args"]["iter"] == 3 for e in xs)


def test_diff_two_predictor_settings(enc, tmp_path):
    path, _, _ = enc
    other = tmp_path / "noprealloc.jsonl"
    r = record(other, prealloc="0 0 0 1.0")
    assert r.exit_code == 0, r.output
    d = json.loads(invoke("trace", path, other, "--diff", "--json").stdout)
    a, b = d["a"]["counters"], d["b"]["counters"]
    assert d["delta"]["realloc.alloc"] == b.get("realloc.alloc", 0) - a.get("realloc.alloc", 0)
    assert d["delta"]["inferences"] == 0
    assert set(d["delta"]) >= set(a) | set(b)
    r = invoke("trace", path, other, "--diff")
    assert r.exit_code == 0 and "B - A" in r.stdout and "realloc.alloc" in r.stdout


def test_expect_on_trace(enc):
    path, run_s, _ = enc
    allocs = run_s["counters"]["realloc.alloc"]
    ok = invoke("trace", path, "--expect", f"reallocs<={allocs}", "--expect", "update_shape.skipped >= 1",
                "--expect", "inferences==4", "--expect", "update_impl.evict==0", "--expect", "check_failed==0",
                "--expect", "static_compiles<=8")
    assert ok.exit_code == 0, ok.output
    assert "expectation holds: reallocs" in ok.stdout
    bad = invoke("trace", path, "--expect", f"reallocs<{allocs}", "--expect", "inferences==4")
    assert bad.exit_code == 1
    assert f"expected reallocs < {allocs}, seen {allocs}" in bad.stderr
    r = invoke("trace", path, "--expect", "max_latency_ms<0", "--json")
    assert r.exit_code == 1 and json.loads(r.stdout)["expect"][0]["ok"] is False


@pytest.mark.parametrize("expr,needle", [
    ("reallocs=<10", "expected NAME OP NUMBER"),
    ("reallocs<=ten", "expected NAME OP NUMBER"),
    ("realocs<=10", "unknown name 'realocs'"),
    ("update_shape.explode>=1", "unknown name"),
])
def test_malformed_expect_exits_2(enc, expr, needle):
    r = invoke("trace", enc[0], "--expect", expr)
    assert r.exit_code == 2, r.output
    assert needle in r.stderr and "Traceback" not in r.output
    if "unknown" in needle:
        assert "valid names:" in r.stderr and "reallocs" in r.stderr


def test_expect_on_run_same_verdict_as_trace(tmp_path):
    t = tmp_path / "r.jsonl"
    args = ["run", ENCODER, "--shapes", "input_ids:1x8,attention_mask:1x8*2", "--trace", t, "-q"]
    r = invoke(*args, "--expect", "update_shape.skipped>=20", "--expect", "reallocs<=1")
    assert r.exit_code == 1, r.output
    assert "expectation holds: update_shape.skipped>=20" in r.stdout
    assert "expectation failed: reallocs<=1" in r.stderr
    assert os.path.exists(t)  # written before judging
    seen = json.loads(invoke("trace", t, "--json", "--expect", "reallocs<=1").stdout)["expect"][0]
    assert seen["ok"] is False and f"seen {seen['seen']}" in r.stderr
    assert invoke("trace", t, "--expect", "update_shape.skipped>=20").exit_code == 0
    r = invoke(*args, "--expect", "reallocs>1", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["expect"][0]["ok"] is True
    r = invoke(*args, "--expect", "reallocs<<1")
    assert r.exit_code == 2 and "expected NAME OP NUMBER" in r.stderr


def test_run_killed_with_sigkill_is_readable(tmp_path):
    t = tmp_path / "killed.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "dyncli", "run", ENCODER, "--trace", str(t), "-q",
                             "--shapes", "input_ids:1x{4..40},attention_mask:1x{4..40}*1000"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if t.exists() and t.read_text().count('"kind":"infer_end"') >= 2:
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.05)
        else:
            pytest.fail("no complete inference within 120 s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    text = t.read_text()
    assert '"kind":"run_end"' not in text
    complete = text.count('"kind":"infer_end"')
    r = invoke("trace", t, "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["status"] == "incomplete" and s["inferences"] == complete
    assert [row["iter"] for row in s["rows"]] == list(range(complete))
    assert "warning:" in r.stderr and "killed" in r.stderr
    # the kill may also land in the middle of a line: read with a warning too
    with open(t, "a") as f:
        f.write('{"kind":"update_shape","iter":99,"node":"x"')
    r = invoke("trace", t)
    assert r.exit_code == 0 and "truncated last line" in r.stderr


def test_corrupted_middle_line_exits_2_naming_it(enc, tmp_path):
    lines = open(enc[0]).read().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(lines[:100] + ['{"kind": "realloc", "iter": 0, oops\n'] + lines[101:]))
    r = invoke("trace", bad)
    assert r.exit_code == 2 and f"{bad}:101: not JSON" in r.stderr and "Traceback" not in r.output
    lines[200] = json.dumps({"kind": "warp_drive", "iter": 0, "node": "", "op": "", "action": "",
                             "reason": "", "ts": 0}) + "\n"
    bad.write_text("".join(lines))
    r = invoke("trace", bad, "--format", "chrome", "-o", tmp_path / "c.json")
    assert r.exit_code == 2 and ":201: bad event" in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--iter", "5..2"], "LAST is before FIRST"),
    (["--iter", "x"], "expected N or FIRST..LAST"),
    (["--group-by", "color"], "--group-by 'color'"),
    (["--format", "svg"], "--format 'svg'"),
    (["--format", "chrome"], "needs -o"),
    (["--diff"], "two trace files"),
])
def test_trace_usage_errors(enc, args, needle):
    r = invoke("trace", enc[0], *args)
    assert r.exit_code == 2 and needle in r.stderr, r.output


def test_missing_and_non_trace_files(tmp_path):
    r = invoke("trace", tmp_path / "nope.jsonl")
    assert r.exit_code == 2 and "trace file not found" in r.stderr
    p = tmp_path / "x.jsonl"
    p.write_text("hello\n")
    r = invoke("trace", p)
    assert r.exit_code == 2 and ":1: not a dyncli trace header" in r.stderr


def test_expect_doc_is_generated_from_the_names_table():
    from traces.expect import NAMES, render_markdown
    with open(os.path.join(ROOT, "docs", "expect.md")) as f:
        assert f.read() == render_markdown()
    for name in NAMES:
        assert f"`{name}`" in render_markdown()


@pytest.mark.parametrize("text,name,op,value", [
    ("reallocs<=10", "reallocs", "<=", 10), (" max_latency_ms < 2.5 ", "max_latency_ms", "<", 2.5),
    ("update_shape.skip.shape_unchanged!=0", "update_shape.skip.shape_unchanged", "!=", 0),
    ("kernels>=1e3", "kernels", ">=", 1000), ("x==-1", "x", "==", -1),
])
def test_expect_parse(text, name, op, value):
    from traces.expect import parse
    e = parse(text)
    assert (e.name, e.op, e.value) == (name, op, value)


def test_expect_names_resolve_any_counter():
    from traces.expect import ExpectError, parse
    s = {"inferences": 2, "latency_ms": {"first": 5.0, "max": 5.0, "mean": 3.0, "median": 3.0, "total": 6.0},
         "counters": {"realloc.alloc": 3, "runtime_skip": 7, "update_shape.skip": 4}, "check": None}
    seen = {t: parse(t).evaluate(s)["seen"] for t in
            ["reallocs<1", "update_shape.skipped<1", "runtime_skip<1", "static_compiles<1",
             "update_impl.evict<1", "first_latency_ms<1", "check_failed<1"]}
    assert seen == {"reallocs<1": 3, "update_shape.skipped<1": 4, "runtime_skip<1": 7, "static_compiles<1": 0,
                    "update_impl.evict<1": 0, "first_latency_ms<1": 5.0, "check_failed<1": 0}
    with pytest.raises(ExpectError, match="runtime_skip"):  # the valid names include the counters present
        parse("runtime_skips<1").evaluate(s)


def test_filtered_views_print_only_what_was_asked(enc):
    path = enc[0]
    full = invoke("trace", path).stdout
    assert all(t in full for t in ("one row per inference", "totals", "nodes that cost most",
                                   "decisions that changed something"))
    grouped = invoke("trace", path, "--group-by", "op").stdout
    assert "grouped by op" in grouped
    assert not any(t in grouped for t in ("one row per inference", "totals", "nodes that cost most"))
    by_op = invoke("trace", path, "--op", "MatMul").stdout
    assert "filters --op MatMul" in by_op and "nodes that cost most" in by_op and "totals" not in by_op
    nodes = by_op[by_op.index("nodes that cost most"):by_op.index("decisions that changed")]
    rows = [line.split() for line in nodes.splitlines()[4:] if line.strip()]
    assert rows and all(r[1] == "MatMul" for r in rows), nodes


def test_diff_names_what_differed_and_prints_bytes(enc, tmp_path):
    path = enc[0]
    other = tmp_path / "noprealloc.jsonl"
    assert record(other, "--check", "--impls", "dynamic", prealloc="0 0 0 1.0").exit_code == 0
    out = invoke("trace", path, other, "--diff").stdout
    lines = out.splitlines()
    assert f"A: {path}" in lines and f"B: {other}" in lines
    assert 'differ: prealloc: "10 16384 2 1.1" -> "0 0 0 1.0"' in lines, out
    assert "e+" not in out
    bytes_row = next(line.split() for line in lines if line.split()[:1] == ["bytes_allocated"])
    assert bytes_row[2] in ("B", "KiB", "MiB"), bytes_row   # '12.3 KiB', not 12595
    same = invoke("trace", path, path, "--diff").stdout
    assert "differ: nothing (same model, device and options)" in same
