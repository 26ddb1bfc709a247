"""Every dyncli command's main views at 80 columns: nothing cut ('…'), no number, path, name or
header split inside itself, tables within 80 columns (only free lines holding a path or a
device name may run longer: a terminal wraps them, and they copy whole), and `run --wide`
shows every column. Model: a GPT-2 decode step with KV inputs (6 inputs) and a small MLP."""
import json
import statistics
import os
import re

import onnx
import pytest
from typer.testing import CliRunner

from dyncli import console as console_module
from dyncli.cli import app
from tests.models import gpt2_decoder_step, mlp

runner = CliRunner()
# a long folder name: the trace path in the summary runs past 80 columns and must stay whole
LONG = "a_folder_with_a_long_name_so_that_the_trace_path_runs_past_eighty_columns"
KV = [f"past_{kv}_{layer}" for layer in (0, 1) for kv in ("key", "value")]
DECODE = ",".join(["input_ids:1x1", "attention_mask:1x{1..4}"] + [f"{n}:1x2x0x16" for n in KV])
FEEDBACK = ",".join(f"present_{n[5:]}:{n}" for n in KV)
BOX = "│┃─━┌┐└┘┏┓┗┛"


@pytest.fixture(autouse=True)
def columns_80(monkeypatch):
    monkeypatch.setattr(console_module.console, "width", 80)


def view(*args) -> str:
    r = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    return r.stdout


def readable(text: str) -> list[str]:
    """No '…'; table lines within 80 columns; the lines."""
    assert "…" not in text, text
    lines = text.splitlines()
    for line in lines:
        assert len(line.rstrip()) <= 80 or not any(c in line for c in BOX), line
    return lines


def whole(text: str, token: str) -> None:
    """`token` stands on one line, as one word."""
    assert any(re.search(rf"(^|[\s:(]){re.escape(token)}($|[\s,)])", line) for line in text.splitlines()), \
        f"{token!r} is not whole in:\n{text}"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("views") / LONG
    d.mkdir()
    onnx.save(gpt2_decoder_step(), d / "gpt.onnx")
    onnx.save(mlp(), d / "mlp.onnx")
    return d


@pytest.fixture(scope="module")
def decode(files):
    """One decode run: (its default output, its trace path)."""
    trace = files / "decode.trace.jsonl"
    r = runner.invoke(app, ["run", str(files / "gpt.onnx"), "--shapes", DECODE, "--feedback", FEEDBACK,
                            "--check", "--trace", str(trace)], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    return r.stdout, trace


def test_run_default_view(decode):
    out, trace = decode
    lines = readable(out)
    starts = [k for k, line in enumerate(lines) if re.match(r"^ ?\d+ ", line)]
    # one row per inference, every figure whole: #, inputs, ms, kern, shape, buffers, alloc, check
    row = re.compile(r"^ ?(\d) +(.*?) +\d+\.\d\d +\d+ +\d+/\d+ +\d+/\d+/\d+ +\d+(\.\d)? (B|KiB|MiB) +ok \de-\d\d *$")
    inputs = []
    for n, k in enumerate(starts):
        m = row.match(lines[k])
        assert m and m.group(1) == str(n), lines[k]
        end = starts[n + 1] if n + 1 < len(starts) else next(j for j in range(k, len(lines)) if not lines[j].strip())
        # a decode step's 6 inputs take at most three lines per inference, not one each
        assert end - k <= 3, lines[k:end]
        inputs.append(" ".join([m.group(2)] + [line.strip() for line in lines[k + 1:end]]))
    assert inputs == ["1x1 (x2), 1x2x0x16 (x4)"] + [f"1x1, 1x{n + 1}, 1x2x{n}x16 (x4)" for n in (1, 2, 3)]
    for head in ("#", "inputs", "ms", "kern", "shape", "buffers", "alloc", "check"):
        whole(out, head)
    whole(out, "1x2x3x16")
    assert f"trace: {trace}" in lines   # the path to copy, whole on its line
    assert any(line.startswith("device: ") for line in lines)


def test_run_wide_shows_every_column(files):
    out = view("run", files / "gpt.onnx", "--shapes", DECODE, "--feedback", FEEDBACK, "--check",
               "--trace", files / "wide.jsonl", "--wide")
    assert "…" not in out
    header = "\n".join(out.splitlines()[:5])
    for col in ("inputs", "outputs", "ms", "kernels", "infer/skip", "reuse/pool/new", "allocated", "peak",
                "max abs"):
        assert col in header, (col, header)
    row = next(line for line in out.splitlines() if line.startswith(" 3 "))
    for name in KV:   # every input and output by name, on the inference's own row
        assert f"{name}:1x2x3x16" in row and f"present_{name[5:]}:1x2x4x16" in row, row
    assert "attention_mask:1x4" in row and "logits:1x1x100" in row


def test_first_inference_says_where_its_time_went(files, decode):
    """The summary's data on the first inference always (JSON), its line when it was slow; both
    from the counters its infer_end carries. Whether it was slow is timing: the test checks the
    rule, not the machine's speed."""
    from dyncli.render import first_inference_line
    out, trace = decode
    from traces import read_trace
    _, evs = read_trace(str(trace))
    c = next(e for e in evs if e["kind"] == "infer_end")["counters"]
    s = json.loads(view("run", files / "gpt.onnx", "--shapes", DECODE, "--feedback", FEEDBACK, "--json",
                        "--trace", "none"))
    f = s["first_inference"]
    assert f["latency_ms"] == s["latency_ms"]["first"]
    assert f["slow"] == (f["latency_ms"] > 2 * f["later_median_ms"])
    line = first_inference_line({**f, "compiles": c["compiles"], "compile_ms": c["compile_ms"],
                                 "compile_ms_critical": c["compile_ms_critical"],
                                 "allocations": c["realloc.alloc"]})
    assert line.startswith("inference 0: ") and f"{c['realloc.alloc']} new buffers" in line
    if c["compiles"]:
        assert f"kernel builds: {c['compiles']} program" in line and \
            f"{c['compile_ms_critical']:.0f} ms in the flow" in line
    # the text run prints the line exactly when its own first inference was slow
    ms = [e["latency_ms"] for e in read_trace(str(trace))[1] if e["kind"] == "infer_end"]
    shown = [x for x in out.splitlines() if x.startswith("inference 0: ")]
    assert len(shown) == int(ms[0] > 2 * statistics.median(ms[1:])), (ms, shown)
    s1 = json.loads(view("run", files / "mlp.onnx", "--shapes", "2x32", "--json", "--trace", "none"))
    assert s1["first_inference"]["later_median_ms"] is None     # alone: slow iff it built kernels
    assert s1["first_inference"]["slow"] == bool(s1["first_inference"]["compiles"])


def test_bench_view(files):
    out = view("bench", files / "mlp.onnx", "--shapes", "[2,32][5,32]", "--repeat", 1, "--warmup", 0,
               "--same-runs", 2, "--compare", "onnxruntime")
    readable(out)
    for head in ("shape", "first ms", "median", "p90", "alone", "host", "kernels", "replayed", "ort ms", "x ort"):
        assert any(head in line for line in out.splitlines()), head
    nums = r"(?:\d+\.\d+|\d+|\d+/\d+)"
    for shape in ("2x32", "5x32"):   # each shape's figures whole, in one or more tables
        cells = [line.split() for line in out.splitlines() if line.split()[:1] == [shape]]
        assert cells and all(re.fullmatch(nums, c) for row in cells for c in row[1:]), cells
        assert sum(len(row) - 1 for row in cells) == 9


def test_devices_view():
    out = view("devices")
    readable(out)
    rows = json.loads(view("devices", "--json"))
    for d in rows:
        whole(out, d["platform"].split()[-1])
        assert f"{d['index']} {d['name']}" in out.splitlines()
        assert any(line.split()[:2] == ["float16", *d["float16"].split()[:1]] for line in out.splitlines())


def test_trace_views(files, decode):
    _, trace = decode
    for args in ((), ("--op", "MatMul"), ("--group-by", "op"), ("--iter", "1..2")):
        out = view("trace", trace, *args)
        lines = readable(out)
        assert f"trace   {trace}" in lines, args
    other = files / "noprealloc.jsonl"
    r = runner.invoke(app, ["run", str(files / "gpt.onnx"), "--shapes", DECODE, "--feedback", FEEDBACK,
                            "--trace", str(other), "--prealloc", "0 0 0 1.0", "-q"])
    assert r.exit_code == 0, r.output
    out = view("trace", trace, other, "--diff")
    readable(out)
    for name in ("update_shape.skip", "realloc.alloc", "bytes_allocated", "peak_bytes"):
        whole(out, name)


def test_predictor_sim_views(decode):
    _, trace = decode
    out = view("predictor-sim", "--from-trace", trace)
    readable(out)
    nodes = json.loads(view("predictor-sim", "--from-trace", trace, "--json"))["nodes"]
    for name, n in nodes.items():   # whole, and the rows differ by their names
        assert any(line.split()[-1:] == [name] and line.split()[:2] == [str(n["steps"]), str(n["run_allocations"])]
                   for line in out.splitlines()), name
    out = view("predictor-sim", "--shapes", "1x32x{128..2048..128}x128")
    readable(out)
    whole(out, "1x32x2048x128")


def test_ops_and_inspect_views(files):
    out = view("ops")
    readable(out)
    firsts = {line.split()[0] for line in out.splitlines() if line.split()}
    assert {r["op"] for r in json.loads(view("ops", "--json"))["ops"]} <= firsts
    out = view("inspect", files / "gpt.onnx")
    readable(out)
    for name in ["input_ids", "attention_mask", "logits"] + KV:
        whole(out, name)
    assert any(line.split() == ["past_key_0", "float", "batch", "x", "2", "x", "past", "x", "16"]
               for line in out.splitlines())


def test_bench_decode_view():
    dec = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "decoder.onnx")
    out = view("bench", dec, "--shapes", "x:1x4x32,past_k:1x2x0x16,past_v:1x2x0x16",
               "--shapes", "x:1x1x32,past_k:1x2x0x16,past_v:1x2x0x16*6",
               "--feedback", "present_k:past_k,present_v:past_v", "--repeat", 1, "--warmup", 0)
    readable(out)
    for head in ("pass", "mean", "median", "p90", "kernels", "partial", "KV copies", "host us per kernel"):
        assert any(head in line for line in out.splitlines()), head
