"""Every failure a user can cause gives one line naming what and why, with the exit status the README documents; model files are untrusted input; long and
concurrent runs stay bounded; tables read well at 80 columns."""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console
from typer.testing import CliRunner

from dyncli.cli import app
from dyncli.render import inference_table
from dyncli.runner import ROW_WINDOW, InferRecord, RunResult
from dyncli.trace_view import trace_view
from engine import Network, build_program
from engine.device import list_devices
from engine.diagnose import DeviceMemoryError, nbytes_text
from engine.kernels import build_options
from engine.program import ModelError
from tests.models import mlp
from traces import MemoryTrace, read_trace
from traces.summary import summarise
from traces.sinks import DECISION_KINDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENCODER = os.path.join(ROOT, "examples", "encoder.onnx")
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(r, status=2) -> str:
    """The run failed with `status` and printed exactly one line, no traceback: that line."""
    assert r.exit_code == status, r.output
    assert "Traceback" not in r.output
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def relu3(tmp_path):
    """x[a, b, c] -> Relu: any rank-3 shape."""
    p = tmp_path / "relu3.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x", ["a", "b", "c"])],
                     [_vi("y", ["a", "b", "c"])]), p)
    return p


def mlp_path(tmp_path):
    p = tmp_path / "mlp.onnx"
    onnx.save(mlp(), p)
    return p


# ---- failures in words ---------------------------------------------------------------------
def test_shape_subgraph_failure_names_node_and_limit_then_trace_says_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # a short trace path: the messages below wrap at 80 columns
    trace = "enc.jsonl"
    r = invoke("run", ENCODER, "--shapes", "input_ids:1x8,attention_mask:1x8",
               "--shapes", "input_ids:1x264,attention_mask:1x264", "--impls", "dynamic", "--trace", trace)
    why = ("node Expand_0 (Expand) cannot run on input shapes [1x256, 2]: input_ids seq 264 exceeds a "
           "constant of 256 along that axis (embeddings.token_type_ids)")
    assert one_line_error(r) == f"error: inference 1 failed: {why} (trace kept: {trace})"
    header, events = read_trace(trace)
    events = list(events)
    assert [e["iter"] for e in events if e["kind"] == "infer_end"] == [0]
    assert events[-1]["kind"] == "run_end" and events[-1]["action"] == "error" and events[-1]["reason"] == why
    t = invoke("trace", trace)
    assert t.exit_code == 0, t.output
    warning = " ".join(t.stderr.split())
    assert warning == (f"warning: {trace}: run ended with an error at inference 1: {why}; showing the 1 "
                       "complete inferences")
    assert "never ended" not in t.output


def test_input_too_large_for_the_device_refused_before_allocating(tmp_path, device):
    r = invoke("run", relu3(tmp_path), "--shapes", "x:64x1000000x64", "--trace", tmp_path / "t.jsonl")
    need = 64 * 1000000 * 64 * 4
    assert one_line_error(r) == (
        f"error: input x of inference 0 (64x1000000x64 f32) needs {nbytes_text(need)}: the device's largest "
        f"buffer is {nbytes_text(device.max_mem_alloc_size)} (max_mem_alloc_size; "
        f"{nbytes_text(device.global_mem_size)} in all, global_mem_size)")
    assert "one row per inference" not in r.stdout


def _concat_model():
    """x[n] -> Concat(x, x) = y[2n]: the output is twice the input."""
    return _model([helper.make_node("Concat", ["x", "x"], ["y"], name="cat", axis=0)],
                  [_vi("x", ["n"])], [_vi("y", ["m"])])


def test_allocation_over_the_limit_drops_the_prediction_then_fails_in_words(device):
    trace = MemoryTrace()
    net = Network(build_program(_concat_model()), device, trace=trace, impls="dynamic")
    for n in (1000, 2000, 3000):   # a steady step: the predictor preallocates ahead
        net.infer({"x": np.ones(n, np.float32)})
    grown = trace.of(2, "realloc", "alloc")
    assert [e["predicted"] for e in grown if e["node"] == "cat"] == [True]
    # the device's largest buffer fits inference 3's output exactly but not the predictor's extra
    gmem = device.global_mem_size
    net.memory.limits = (gmem, 2 * 8000 * 4)
    outs = net.infer({"x": np.arange(8000, dtype=np.float32)})
    np.testing.assert_array_equal(outs["y"], np.tile(np.arange(8000, dtype=np.float32), 2))
    ev = [e for e in trace.of(3, "realloc", "alloc") if e["node"] == "cat"]
    assert [(e["bytes"], e["predicted"]) for e in ev] == [(64000, False)]
    with pytest.raises(DeviceMemoryError) as e:
        net.infer({"x": np.ones(9000, np.float32)})
    assert str(e.value) == (
        f"tensor y (output of node cat (Concat)) needs {nbytes_text(72000)} (18000 f32): the device's "
        f"largest buffer is {nbytes_text(64000)} (max_mem_alloc_size; {nbytes_text(gmem)} in all, "
        "global_mem_size)")


def test_trace_path_errors_in_words(tmp_path):
    model = mlp_path(tmp_path)
    r = invoke("run", model, "--shapes", "2x32", "--trace", tmp_path / "no" / "t.jsonl")
    assert one_line_error(r) == f"error: cannot write the trace {tmp_path / 'no' / 't.jsonl'}: the folder " \
                                f"{tmp_path / 'no'} does not exist"
    r = invoke("run", model, "--shapes", "2x32", "--trace", tmp_path)
    assert one_line_error(r) == f"error: cannot write the trace {tmp_path}: it is a folder"
    assert not list(tmp_path.glob("*.lock"))


def _saved_inputs(tmp_path, arrays):
    p = tmp_path / "in.npz"
    np.savez(p, **arrays)
    return p


@pytest.mark.parametrize("arrays,message", [
    ({"0/x": np.zeros((2, 32), np.float32), "1/y": np.zeros((2, 32), np.float32)},
     "{p}: key '1/y' names no model input (inputs: x)"),
    ({"0/x": np.zeros((2, 32), np.float32), "2/x": np.zeros((2, 32), np.float32)},
     "{p}: inference numbers must run 0..1"),
    ({"0/x": np.zeros((2, 32), np.float64)}, "{p}: 0/x is float64, the model wants float32"),
    ({"0/x": np.zeros((2, 31), np.float32)},
     "input 'x' dim 1 is 31 but the model declares 32; relax it with --model-shape 'x:?x?'"),
    ({"0/x": np.zeros((2, 32, 1), np.float32)}, "input 'x': rank 3 given, model declares rank 2 (?x32)"),
])
def test_load_inputs_errors(tmp_path, arrays, message):
    p = _saved_inputs(tmp_path, arrays)
    r = invoke("run", mlp_path(tmp_path), "--load-inputs", p, "--trace", "none")
    assert one_line_error(r) == "error: " + message.format(p=p)


def test_load_inputs_unreadable(tmp_path):
    model = mlp_path(tmp_path)
    r = invoke("run", model, "--load-inputs", tmp_path / "missing.npz", "--trace", "none")
    assert one_line_error(r) == f"error: cannot read the inputs file {tmp_path / 'missing.npz'}: no such file"
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"\x00garbage" * 10)
    r = invoke("run", model, "--load-inputs", junk, "--trace", "none")
    assert one_line_error(r) == f"error: cannot read the inputs file {junk}: not an .npz written by --save-inputs"


def _feedback_model(tmp_path):
    """x[n, 4] -> y = Relu(x) [n, 4]; z[n, 8] -> w = Relu(z)."""
    p = tmp_path / "fb.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"], name="r1"),
                      helper.make_node("Relu", ["z"], ["w"], name="r2")],
                     [_vi("x", ["n", 4]), _vi("z", ["n", 8])], [_vi("y", ["n", 4]), _vi("w", ["n", 8])]), p)
    return p


@pytest.mark.parametrize("spec,message", [
    ("nope:x", "--feedback 'nope:x': 'nope' is not a model output (outputs: y, w)"),
    ("y:nope", "--feedback 'y:nope': 'nope' is not a model input (inputs: x, z)"),
    ("y", "--feedback 'y': expected OUT:IN"),
    ("y:z", "--feedback 'y:z': output 'y' is declared ?x4 but input 'z' ?x8; their shapes cannot match"),
    ("y:x,w:x", "--feedback: input 'x' is fed twice"),
])
def test_feedback_errors(tmp_path, spec, message):
    r = invoke("run", _feedback_model(tmp_path), "--shapes", "x:2x4,z:2x8", "--feedback", spec, "--trace", "none")
    assert one_line_error(r) == "error: " + message


def test_option_errors(tmp_path):
    model = mlp_path(tmp_path)
    known = ", ".join(d.index for d in list_devices())
    cases = [
        (["--device", "9:9"], f"no OpenCL device '9:9' (known: {known}; see `dyncli devices`)"),
        (["--impl-cache-capacity", "-1"], "--impl-cache-capacity must be >= 0 (0 = unbounded), not -1"),
        (["--prealloc", "10 16384 2"], "--prealloc: bad preallocation options '10 16384 2': expected 4 values "
                                       "'ITERS MAX_BYTES_PER_ITER MAX_PER_DIM_DIFF RATIO', e.g. '10 16384 2 1.1', "
                                       "got 3 value(s)"),
        (["--prealloc", "10 x 2 1.1"], "--prealloc: bad preallocation options '10 x 2 1.1': MAX_BYTES_PER_ITER "
                                       "must be a non-negative integer, got 'x'"),
        (["--trace-level", "some"], "--trace-level must be one of all, decisions, not 'some'"),
    ]
    for extra, message in cases:
        r = invoke("run", model, "--shapes", "2x32", "--trace", tmp_path / "t.jsonl", *extra)
        assert one_line_error(r) == "error: " + message, extra


# ---- untrusted model files -------------------------------------------------------------------
def _external_model(folder, location):
    """y = x + W with W stored outside the protobuf at `location` (relative to `folder`)."""
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32), "W")
    w.data_location = TensorProto.EXTERNAL
    w.ClearField("raw_data")
    for k, v in (("location", location), ("offset", "0"), ("length", "16")):
        e = w.external_data.add()
        e.key, e.value = k, v
    m = _model([helper.make_node("Add", ["x", "W"], ["y"], name="add")], [_vi("x", [4])], [_vi("y", [4])], [w])
    p = folder / "ext.onnx"
    with open(p, "wb") as f:
        f.write(m.SerializeToString())
    return p


def test_external_data_inside_the_folder_runs(tmp_path):
    (tmp_path / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    r = invoke("run", _external_model(tmp_path, "w.bin"), "--shapes", "4", "--check", "--trace", "none", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["check"]["passed"] == 1


def test_external_data_outside_the_folder_is_refused(tmp_path):
    inner = tmp_path / "model"
    inner.mkdir()
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\x00" * 16)
    (inner / "link.bin").symlink_to(secret)
    cases = [("../secret.bin", "initializer W: external data location '../secret.bin' is outside the model's "
                               "folder; refused"),
             (str(secret), f"initializer W: external data location '{secret}' is outside the model's folder; "
                           "refused"),
             ("link.bin", f"initializer W: external data location 'link.bin' leads outside the model's folder "
                          f"(to {secret}); refused"),
             ("gone.bin", f"initializer W: external data file {inner / 'gone.bin'} is missing")]
    for location, message in cases:
        r = invoke("run", _external_model(inner, location), "--shapes", "4", "--trace", "none")
        assert one_line_error(r) == "error: " + message, location


def test_declared_size_past_the_device_is_refused_before_loading(tmp_path, device):
    big = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[1 << 20, 1 << 20])   # dims, no data
    p = tmp_path / "big.onnx"
    onnx.save(_model([helper.make_node("Add", ["x", "W"], ["y"], name="add")], [_vi("x", [1])],
                     [_vi("y", [1 << 20, 1 << 20])], [big]), p)
    r = invoke("run", p, "--shapes", "1", "--trace", "none")
    assert one_line_error(r) == (
        f"error: initializer W: declared dims 1048576x1048576 need 4096.0 GiB, more than the device's largest "
        f"buffer ({nbytes_text(device.max_mem_alloc_size)}, max_mem_alloc_size); refused before loading")
    const = helper.make_node("Constant", [], ["C"], name="big_const",
                             value=TensorProto(name="v", data_type=TensorProto.FLOAT, dims=[1 << 40]))
    onnx.save(_model([const, helper.make_node("Add", ["x", "C"], ["y"], name="add")], [_vi("x", [1])],
                     [_vi("y", [1 << 40])]), p)
    r = invoke("run", p, "--shapes", "1", "--trace", "none")
    assert one_line_error(r).startswith("error: Constant node big_const: declared dims 1099511627776 need "
                                        "4096.0 GiB, more than the device's largest buffer")


@pytest.mark.parametrize("nodes,outputs,message", [
    ([helper.make_node("Relu", ["b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2"),
      helper.make_node("Add", ["x", "b"], ["y"], name="n3")], ["y"],
     "nodes n1 -> n2 form a cycle (node n1 depends on its own output)"),
    ([helper.make_node("Add", ["x", "ghost"], ["y"], name="n1")], ["y"],
     "node n1 (Add) reads tensor 'ghost', which no node, graph input or initializer defines"),
    ([helper.make_node("Relu", ["x"], ["y"], name="n1"), helper.make_node("Sigmoid", ["x"], ["y"], name="n2")],
     ["y"], "node n2 (Sigmoid) writes tensor 'y', which node n1 also writes"),
    ([helper.make_node("Relu", ["x"], ["x"], name="n1")], ["x"],
     "node n1 (Relu) writes tensor 'x', which is a graph input"),
    ([helper.make_node("Relu", ["x"], ["y"], name="n1")], ["y", "y"], "graph output 'y' is listed twice"),
])
def test_graph_checker_names_the_node(tmp_path, nodes, outputs, message):
    m = _model(nodes, [_vi("x", [4])], [_vi(o, [4]) for o in outputs])
    with pytest.raises(ModelError) as e:
        build_program(m)
    assert str(e.value) == message
    p = tmp_path / "bad.onnx"
    with open(p, "wb") as f:   # onnx.save would run no checker either; the raw bytes are what users have
        f.write(m.SerializeToString())
    r = invoke("run", p, "--shapes", "4", "--trace", "none")
    assert one_line_error(r) == "error: " + message


# ---- long runs and many runs -----------------------------------------------------------------
def test_trace_none_and_decisions_level(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = mlp_path(tmp_path)
    r = invoke("run", model, "--shapes", "[2,32][5,32][5,32]", "--trace", "none", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["trace"] == "none" and sorted(os.listdir(tmp_path)) == ["mlp.onnx"]
    full, dec = tmp_path / "all.jsonl", tmp_path / "dec.jsonl"
    runs = {}
    for path, level in ((full, "all"), (dec, "decisions")):
        r = invoke("run", model, "--shapes", "[2,32][5,32][5,32]", "--trace", path, "--trace-level", level,
                   "--json", "--impls", "dynamic")
        assert r.exit_code == 0, r.output
        runs[level] = json.loads(r.stdout)
    _, evs = read_trace(str(dec))
    kinds = {e["kind"] for e in evs}
    assert kinds <= DECISION_KINDS and not kinds & {"set_args", "execute", "compile"}
    _, evs = read_trace(str(full))
    assert {"set_args", "execute"} <= {e["kind"] for e in evs}
    assert os.path.getsize(dec) < 0.8 * os.path.getsize(full)
    t = invoke("trace", dec, "--json")
    assert t.exit_code == 0, t.output
    s = json.loads(t.stdout)
    assert s["inferences"] == 3 and s["counters"] == runs["decisions"]["counters"]
    assert s["counters"]["set_args.set"] == runs["all"]["counters"]["set_args.set"]


def test_rows_kept_are_bounded_and_totals_are_not():
    res = RunResult("m", "d", "t")
    for i in range(ROW_WINDOW + 5):
        res.add(InferRecord(i, {"x": (1, i)}, {}, 1.0, {"kernels": 2, "peak_bytes": i}))
    assert len(res.records) == ROW_WINDOW and res.records[0].iter == 5 and res.inferences == ROW_WINDOW + 5
    assert res.totals.counters["kernels"] == 2 * (ROW_WINDOW + 5)
    assert res.totals.counters["peak_bytes"] == ROW_WINDOW + 4
    text = _render(inference_table(res))
    assert f"the last {ROW_WINDOW} of {ROW_WINDOW + 5}; the trace has them all" in " ".join(text.split())


# ---- output that reads well -----------------------------------------------------------------
def _render(renderable, width=80) -> str:
    c = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None)
    c.print(renderable)
    return c.export_text()


def _readable(text: str, width=80):
    for line in text.splitlines():
        assert len(line) <= width, line
    assert "…" not in text


def test_run_table_readable_at_80_columns():
    res = RunResult("examples/encoder.onnx", "dev", "t")
    for i, (ids, mask) in enumerate([((1, 8), (1, 8)), ((1, 256), (1, 256)), ((2, 128), (1, 128))]):
        res.add(InferRecord(i, {"input_ids": ids, "attention_mask": mask}, {"last_hidden_state": (*ids, 64)},
                            1234.56, {"kernels": 123, "update_shape.infer": 70, "update_shape.skip": 15,
                                      "realloc.reuse": 10, "realloc.from_pool": 11, "realloc.alloc": 12,
                                      "bytes_allocated": 123456789, "peak_bytes": 2 ** 30}))
    narrow = _render(inference_table(res))
    _readable(narrow)
    assert "input_ids:2x128" in narrow and "attention_mask:1x128" in narrow   # folded, never cut
    for head in ("kern", "shape", "buffers", "alloc"):
        assert head in narrow.splitlines()[2]
    assert "kern: kernels enqueued; shape: shape inference run/skipped" in " ".join(narrow.split())
    wide = _render(inference_table(res, wide=True), width=160)
    assert "reuse/pool/new" in wide and "outputs" in wide and "1.0 GiB" in wide


def test_trace_view_readable_at_80_columns(tmp_path):
    path = tmp_path / "t.jsonl"
    # a shrink, so that every realloc action shows up (a repeated shape makes no realloc decision);
    # logits as wide as the hidden layer, so a dead activation's buffer serves them (from_pool)
    model = tmp_path / "mlp64.onnx"
    onnx.save(mlp(d_out=64), model)
    r = invoke("run", model, "--shapes", "[2,32][5,32][3,32]", "--trace", path, "--impls", "dynamic", "-q")
    assert r.exit_code == 0, r.output
    s = summarise(str(path))
    text = _render(trace_view(s))
    _readable(text)
    assert "shape: inferred/skipped; impl: kernel builds/switches to static" in " ".join(text.split())
    _readable(_render(trace_view(summarise(str(path), group_by="op"))))   # the grouped table alone
    wide = _render(trace_view(s, wide=True), width=200)
    assert "build/keep" in wide and "alloc/external/from_pool/reuse" in wide


def test_help_uses_metavars_not_types():
    for cmd in ("run", "trace", "predictor-sim"):
        r = runner.invoke(app, [cmd, "--help"], env={"COLUMNS": "120"})
        assert r.exit_code == 0
        for bad in ("<str>", "<list[str]>", "<int>", "<float>"):
            assert bad not in r.stdout, (cmd, bad)
    r = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "120"})
    for good in ("MODEL", "--shapes SPEC", "--shapes-file FILE", "--seed N", "--trace FILE|none",
                 "--trace-level LEVEL", "--device P:D"):
        assert good in r.stdout, good


def test_kernel_builds_are_silent_unless_debug(tmp_path, monkeypatch):
    monkeypatch.delenv("DYNCLI_KERNEL_WARNINGS", raising=False)
    assert build_options() == ["-w"]
    monkeypatch.setenv("DYNCLI_KERNEL_WARNINGS", "1")
    assert build_options() == []
    env = {k: v for k, v in os.environ.items() if k != "DYNCLI_KERNEL_WARNINGS"}
    env.update(PYOPENCL_NO_CACHE="1", POCL_KERNEL_CACHE="0")
    p = subprocess.run([sys.executable, "-m", "dyncli", "run", str(mlp_path(tmp_path)), "--shapes", "[3,32][4,32]",
                        "--impls", "static", "--trace", "none", "-q"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""


def test_progress_reports_each_inference_with_its_shapes(tmp_path):
    from dyncli.cli import progress_shapes
    from dyncli.runner import RunOptions, execute_run
    calls = []
    res = execute_run(RunOptions(model=str(mlp_path(tmp_path)), shapes=["[2,32][5,32]"], trace="none",
                                 impls="dynamic"), lambda i, n, shapes: calls.append((i, n, progress_shapes(shapes))))
    assert res.status == "ok" and calls == [(1, 2, "2x32"), (2, 2, "5x32")]
    assert progress_shapes({"input_ids": (1, 8), "attention_mask": (1, 8)}) == "1x8"
    assert progress_shapes({"a": (1, 8), "b": (2,)}) == "a:1x8 b:2"


def test_bench_an_inference_that_cannot_run_is_one_line(tmp_path):
    """`dyncli bench --feedback` past a decoder's position table: one line naming the node, exit
    2, as `dyncli run` says it (no traceback)."""
    from tests.models import gpt2_decoder_step
    model = tmp_path / "step.onnx"
    onnx.save(gpt2_decoder_step(max_pos=8), model)
    past = [1, 2, 0, 16]
    steps = [{"input_ids": [1, 1], "attention_mask": [1, t + 1], **{f"past_{k}_{i}": past for i in range(2)
                                                                       for k in ("key", "value")}}
             for t in range(12)]
    (tmp_path / "decode.json").write_text(json.dumps(steps))
    spec = ",".join(f"present_{k}_{i}:past_{k}_{i}" for i in range(2) for k in ("key", "value"))
    r = invoke("bench", model, "--shapes-file", tmp_path / "decode.json", "--feedback", spec,
               "--warmup", "0", "--repeat", "1")
    assert one_line_error(r).startswith("error: node ")
