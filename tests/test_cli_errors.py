"""What a user types or feeds that is wrong gets one line on stderr naming the cause, with the
exit status the README documents (2: input error, 130: interrupted), never a traceback:
files that are JSON but not trace events, binary files, Ctrl-C during start-up, misleading
messages (empty model, shapeless inputs, newer opsets, NaN under --check), onnxruntime's own
failures, text Rich would read as markup, a peer that is not installed."""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from dyncli.cli import app
from tests.models import mlp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
runner = CliRunner()
HEADER = {"kind": "header", "schema": 1, "tool": "dyncli", "model": "m.onnx", "device": "d",
          "options": {}, "inputs": {"x": [2, 32]}, "outputs": ["y"], "nodes": 1}


def invoke(*args, **kw):
    return runner.invoke(app, [str(a) for a in args], **kw)


def one_line_error(r, status=2) -> str:
    """The command failed with `status`, printed no traceback and exactly one line on stderr:
    that line."""
    assert r.exit_code == status, (r.exit_code, r.output)
    assert "Traceback" not in r.output
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


def _event(**over):
    ev = {"kind": "realloc", "iter": 0, "node": "n", "op": "Relu", "action": "alloc", "reason": "",
          "ts": 0.0, "shape": [2, 32], "dtype": "f32", "bytes": 256}
    ev.update(over)
    return ev


def _model(nodes, inputs, outputs, opset=17, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _save(model, path):
    with open(path, "wb") as f:   # raw bytes, no checker: what a user may have
        f.write(model.SerializeToString())
    return path


# ---- trace files whose lines are JSON but not events -------------------------------------------
NOT_EVENTS = {
    "a number": "42",
    "an array": "[1, 2, 3]",
    "a string": '"realloc"',
    "null": "null",
    "a text iter": json.dumps(_event(iter="zero")),
    "a list for node": json.dumps(_event(node=["n"])),
    "a text ts": json.dumps(_event(ts="now")),
    "counters as a list": json.dumps({**_event(kind="infer_end", action=""), "counters": [1, 2],
                                      "latency_ms": 1.0}),
    "latency as text": json.dumps({**_event(kind="infer_end", action=""), "counters": {},
                                   "latency_ms": "fast"}),
    "shapes as text": json.dumps({**_event(kind="infer_start", action=""), "shapes": "1x2"}),
    "realloc shape as text": json.dumps(_event(shape="2x32")),
    "realloc dtype as a number": json.dumps(_event(dtype=4)),
}


@pytest.mark.parametrize("what", list(NOT_EVENTS))
@pytest.mark.parametrize("command", ["trace", "predictor-sim"])
def test_json_lines_that_are_not_events(tmp_path, what, command):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(HEADER) + "\n" + NOT_EVENTS[what] + "\n" + json.dumps(_event()) + "\n")
    args = ("trace", p) if command == "trace" else ("predictor-sim", "--from-trace", p)
    line = one_line_error(invoke(*args))
    assert f"{p}:2: " in line and "bad event" in line, line


@pytest.mark.parametrize("header", ["42", "[1]", '"header"', json.dumps({**HEADER, "options": [1]}),
                                    json.dumps({**HEADER, "inputs": "x"})])
def test_header_that_is_not_a_header(tmp_path, header):
    p = tmp_path / "t.jsonl"
    p.write_text(header + "\n" + json.dumps(_event()) + "\n")
    line = one_line_error(invoke("trace", p))
    assert f"{p}:1: " in line and "header" in line, line
    line = one_line_error(invoke("predictor-sim", "--from-trace", p))
    assert f"{p}:1: " in line, line


@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe",
                                     json.dumps(HEADER).encode() + b"\n\xff\xfe\x00binary\n"])
def test_binary_file_names_the_file(tmp_path, content):
    p = tmp_path / "t.jsonl"
    p.write_bytes(content)
    for args in (("trace", p), ("predictor-sim", "--from-trace", p)):
        line = one_line_error(invoke(*args))
        assert str(p) in line and "not a text file" in line, line


# ---- Ctrl-C during start-up --------------------------------------------------------------------
def test_ctrl_c_during_the_imports_is_one_line_and_130():
    """An interrupt inside the heavy imports (here: when onnx is imported) ends the program as
    an interrupt anywhere else does."""
    code = ("import sys\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'onnx':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Interrupt())\n"
            "sys.argv = ['dyncli', 'devices']\n"
            "import runpy\n"
            "runpy.run_module('dyncli', run_name='__main__')\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 130, p.stderr
    assert p.stderr == "interrupted\n" and p.stdout == ""


# ---- messages that said something else than the cause ------------------------------------------
def test_zero_byte_model_says_it_is_empty(tmp_path):
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    for cmd in ("run", "inspect"):
        extra = ("--shapes", "2x32") if cmd == "run" else ()
        line = one_line_error(invoke(cmd, p, *extra))
        assert line == f"error: {p} is empty (0 bytes): not an ONNX model", line


def test_model_without_a_graph_is_not_an_onnx_model(tmp_path):
    p = tmp_path / "text.onnx"
    p.write_bytes(onnx.ModelProto(ir_version=8).SerializeToString())
    line = one_line_error(invoke("run", p, "--shapes", "2x32"))
    assert line == f"error: {p} is not an ONNX model: it has no graph and no opset", line


def _relu_any_rank(tmp_path):
    x = onnx.ValueInfoProto(name="x")
    x.type.tensor_type.elem_type = TensorProto.FLOAT   # typed, no shape: any rank
    y = onnx.ValueInfoProto(name="y")
    y.type.tensor_type.elem_type = TensorProto.FLOAT
    return _save(_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [x], [y]),
                 tmp_path / "anyrank.onnx")


def test_input_without_a_declared_shape_takes_the_users_shapes(tmp_path):
    p = _relu_any_rank(tmp_path)
    r = invoke("run", p, "--shapes", "[2,3,4][5][1,2,3,4]", "--check", "--json", "--trace", "none")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["check"] == {**s["check"], "passed": 3, "failed": 0}
    assert [d["outputs"]["y"] for d in s["inferences_detail"]] == [[2, 3, 4], [5], [1, 2, 3, 4]]
    r = invoke("run", p, "--trace", "none")
    assert one_line_error(r).endswith("(model inputs: x:any rank (no declared shape))")


def test_newer_opset_warns_in_one_line(tmp_path):
    from engine.opsets import MAX_OPSET
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n"]) for n in "xy")
    p = _save(_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [x], [y],
                     opset=MAX_OPSET + 1), tmp_path / "new.onnx")
    r = invoke("run", p, "--shapes", "4", "--trace", "none", "-q")
    assert r.exit_code == 0, r.output
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: opset {MAX_OPSET + 1}: Relu not checked"), r.stderr
    assert "UserWarning" not in r.stderr and ".py:" not in r.stderr


def test_nan_under_check_is_reported_in_words(tmp_path):
    """log(x - x) is -inf and (x - x) / (x - x) NaN on both sides: equal, and the comparison
    prints no numpy RuntimeWarning; a NaN where onnxruntime has a number is a mismatch said in
    words."""
    x, y, z = (helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n"]) for n in "xyz")
    p = _save(_model([helper.make_node("Sub", ["x", "x"], ["zero"], name="sub"),
                      helper.make_node("Log", ["zero"], ["y"], name="log"),
                      helper.make_node("Div", ["zero", "zero"], ["z"], name="div")], [x], [y, z]),
              tmp_path / "nan.onnx")
    r = invoke("run", p, "--shapes", "4", "--check", "--trace", "none", "-q")
    assert r.exit_code == 0, r.output
    assert r.stderr == "" and "1 passed, 0 failed" in r.stdout
    from dyncli.check import compare
    with np.errstate(all="raise"):   # the comparison itself never computes with NaN or inf - inf
        c = compare("y", np.array([1, np.nan, 3, np.nan], np.float32), np.array([1, 2, np.nan, np.nan], np.float32))
        assert not c.ok and c.detail == ("NaN where onnxruntime has a number at 1 element(s) (first at index 1); "
                                         "a number where onnxruntime has NaN at 1 element(s) (first at index 2)")
        c = compare("y", np.array([np.inf, 1], np.float32), np.array([-np.inf, 1], np.float32))
        assert not c.ok and c.detail == "onnxruntime has -inf at index 0, dyncli inf"
        assert compare("y", np.array([-np.inf, 1], np.float32), np.array([-np.inf, 1], np.float32)).ok
    from dyncli.check import compare
    with np.errstate(all="raise"):   # the comparison itself never computes with a NaN
        c = compare("y", np.array([1.0, np.nan, 3.0], np.float32), np.array([1.0, 2.0, np.nan], np.float32))
    assert not c.ok and c.detail == "NaN where onnxruntime has a number at 1 element(s) (first at index 1); " \
                                    "a number where onnxruntime has NaN at 1 element(s) (first at index 2)"


def test_ops_unknown_op_on_stderr():
    r = invoke("ops", "--op", "NoSuchOp")
    assert one_line_error(r) == "error: NoSuchOp is not a supported op (`dyncli ops` lists them)"
    assert r.stdout == ""


# ---- onnxruntime's own failures under --check --------------------------------------------------
def test_onnxruntime_refusing_the_model_is_one_line(tmp_path):
    """onnxruntime has no uint16 Max kernel ('Could not find an implementation'); the engine
    runs it. Its coloured log line and C++ text stay out, its reason is said once."""
    x, y = (helper.make_tensor_value_info(n, TensorProto.UINT16, ["n"]) for n in "xy")
    p = _save(_model([helper.make_node("Max", ["x", "x"], ["y"], name="max")], [x], [y], opset=13),
              tmp_path / "u16.onnx")
    ok = invoke("run", p, "--shapes", "4", "--trace", "none", "-q")
    assert ok.exit_code == 0, ok.output
    line = one_line_error(invoke("run", p, "--shapes", "4", "--check", "--trace", "none"))
    assert line.startswith("error: --check: onnxruntime refused the model: "), line
    assert "Could not find an implementation for Max(13)" in line, line
    assert "\x1b" not in line and "[ONNXRuntimeError]" not in line, line


def test_onnxruntime_refusing_an_inference_is_one_line():
    """A failure of onnxruntime's run (here a dim its model declares static) comes back as its
    reason alone: no code prefix, no colour codes, no C++ text on further lines."""
    from dyncli.check import OnnxRuntimeRefused, Reference, ort_reason
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "xy")
    ref = Reference(_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [x], [y]))
    assert ref.run({"x": np.ones(2, np.float32)})["y"].tolist() == [1.0, 1.0]
    with pytest.raises(OnnxRuntimeRefused) as e:
        ref.run({"x": np.ones(3, np.float32)})
    assert str(e.value).startswith("--check: onnxruntime refused the inference: Got invalid dimensions for input: x")
    assert "\n" not in str(e.value) and "[ONNXRuntimeError]" not in str(e.value)
    coloured = RuntimeError("\x1b[1;31m[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : bad input\x1b[m\nat foo.cc:12")
    assert ort_reason(coloured) == "bad input"


# ---- markup and missing peers ------------------------------------------------------------------
def test_install_hints_keep_their_brackets(tmp_path, monkeypatch):
    p = _save(mlp(), tmp_path / "mlp.onnx")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)   # import onnxruntime raises ImportError
    line = one_line_error(invoke("run", p, "--shapes", "2x32", "--check", "--trace", "none"))
    assert line == "error: --check needs onnxruntime: pip install 'dyncli[check]'"
    line = one_line_error(invoke("bench", p, "--shapes", "2x32", "--compare", "onnxruntime",
                                 "--repeat", 1, "--warmup", 0, "--same-runs", 2))
    assert line == "error: --compare onnxruntime needs onnxruntime: pip install 'dyncli[check]'"


def test_compare_torch_without_torch_exits_2(tmp_path, monkeypatch):
    p = _save(mlp(), tmp_path / "mlp.onnx")
    monkeypatch.setitem(sys.modules, "torch", None)
    line = one_line_error(invoke("bench", p, "--shapes", "2x32", "--compare", "torch",
                                 "--repeat", 1, "--warmup", 0, "--same-runs", 2))
    assert line == "error: --compare torch needs torch: pip install torch"
