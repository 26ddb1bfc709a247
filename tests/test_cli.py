"""The `dyncli run` command end to end: tables, --check, --json, trace file, inputs/outputs
files, and one-line errors with documented exit statuses."""
import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from dyncli.cli import app
from tests.conftest import ort_session
from tests.models import light_model_paths, mlp
from traces import read_trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENCODER = os.path.join(ROOT, "examples", "encoder.onnx")
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_run_encoder_check_table_and_trace(tmp_path):
    trace = tmp_path / "enc.trace.jsonl"
    r = invoke("run", ENCODER, "--shapes", "input_ids:1x{8..16..4},attention_mask:1x{8..16..4}",
               "--shapes", "input_ids:2x8,attention_mask:2x8*2", "--shapes", "input_ids:1x4,attention_mask:1x4",
               "--check", "--trace", trace)
    assert r.exit_code == 0, r.output
    assert "check vs onnxruntime" in r.output and "6 passed, 0 failed" in r.output
    header, events = read_trace(str(trace))
    assert header["kind"] == "header" and header["schema"] == 1 and header["model"].endswith("encoder.onnx")
    events = list(events)
    # the attention scale and mask run inside the Softmax's input reads (prologue fusion), and
    # QK^T, the Softmax and x V inside one attention kernel (engine/attention_fusion.py)
    fus = header["fusions"]
    sm = [v for n, v in fus.items() if n.startswith("Softmax") and v["position"] == "prologue"]
    assert len(sm) == 1 and len(sm[0]["ops"]) == 2
    att = fus["Softmax_0_attention"]
    # q's heads split Transpose too: the scale's Shape(q) read folds to a constant (static_dims)
    assert att["position"] == "subgraph" and [o.split("_")[0] for o in att["ops"]] == \
        ["Transpose"] * 4 + ["MatMul", "Softmax", "MatMul", "Transpose"]
    assert fus["LayerNormalization_0"] == {"position": "prologue", "ops": ["Add_0", "Add_1"]}
    inside = sm[0]["ops"] + att["ops"] + ["Add_0", "Add_1"]
    assert not [e for e in events if e["node"] in inside and e["kind"] == "execute"]
    kinds = {e["kind"] for e in events}
    assert {"infer_start", "update_shape", "update_impl", "realloc", "set_args", "execute",
            "infer_end", "check", "run_end"} <= kinds
    ends = [e for e in events if e["kind"] == "infer_end"]
    assert len(ends) == 6
    # inference 4 repeats inference 3's shapes: every node skips shape inference, nothing allocated
    rep = ends[4]["counters"]
    assert rep.get("update_shape.infer", 0) == 0 and rep.get("realloc.alloc", 0) == 0
    assert events[-1]["kind"] == "run_end" and events[-1]["action"] == "ok"
    for e in events:
        for k in ("kind", "iter", "node", "op", "action", "reason", "ts"):
            assert k in e


def test_run_json_and_saved_tensors_roundtrip(tmp_path):
    model = tmp_path / "mlp.onnx"
    onnx.save(mlp(), model)
    ins, outs = tmp_path / "in.npz", tmp_path / "out.npz"
    r = invoke("run", model, "--shapes", "[3,32][5,32]", "--shapes", "2x32", "--seed", 7, "--json",
               "--save-inputs", ins, "--save-outputs", outs, "--trace", tmp_path / "t.jsonl")
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["inferences"] == 3 and [d["inputs"]["x"] for d in s["inferences_detail"]] == [[3, 32], [5, 32], [2, 32]]
    xi, yo = np.load(ins), np.load(outs)
    assert sorted(xi.files) == ["0/x", "1/x", "2/x"] and yo["1/y"].shape == (5, 10)
    sess = ort_session(mlp())
    for i in range(3):  # anyone can check the saved results independently
        np.testing.assert_allclose(yo[f"{i}/y"], sess.run(None, {"x": xi[f"{i}/x"]})[0], rtol=1e-4, atol=1e-5)
    # --load-inputs replays the same tensors (shapes come from the file)
    r2 = invoke("run", model, "--load-inputs", ins, "--check", "--json", "--trace", tmp_path / "t2.jsonl")
    assert r2.exit_code == 0, r2.output
    assert json.loads(r2.output)["check"]["failed"] == 0


def test_check_mismatch_exits_1(tmp_path):
    r = invoke("run", ENCODER, "--shapes", "input_ids:2x16,attention_mask:2x16", "--check",
               "--atol", 0, "--rtol", 0, "--trace", tmp_path / "t.jsonl")
    assert r.exit_code == 1
    assert "differ from onnxruntime" in r.output


def _unsupported_model(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
    g = helper.make_graph([helper.make_node("Multinomial", ["x"], ["a"], name="mn1"),
                           helper.make_node("Det", ["a"], ["b"], name="det1"),
                           helper.make_node("Multinomial", ["b"], ["y"], name="mn2")], "g", [x], [y])
    p = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    return p


@pytest.mark.parametrize("args,needle", [
    (["run", "missing.onnx", "--shapes", "1x2"], "model file not found"),
    (["run", ENCODER, "--shapes", "foo:1x2"], "unknown input 'foo'"),
    (["run", ENCODER, "--shapes", "1x8"], "input"),
    (["run", ENCODER], "no inferences to run"),
    (["run", ENCODER, "--shapes", "input_ids:1x8,attention_mask:1x8", "--prealloc", "1 2"], "--prealloc"),
    (["run", ENCODER, "--shapes", "input_ids:1x8,attention_mask:1x8", "--device", "9:9"], "no OpenCL device"),
    (["run", ENCODER, "--shapes", "input_ids:1x8,attention_mask:1x8", "--compiled-plans", "yes"],
     "--compiled-plans must be one of off, partial, all"),
])
def test_usage_errors_are_one_line_exit_2(args, needle):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert "Traceback" not in r.output


def test_unsupported_ops_listed_before_running(tmp_path):
    r = runner.invoke(app, ["run", str(_unsupported_model(tmp_path)), "--shapes", "4"])
    assert r.exit_code == 2
    assert "Multinomial (nodes: mn1, mn2)" in r.output and "Det (nodes: det1)" in r.output


def test_declared_static_dim_contradiction_and_relaxing(tmp_path):
    squeeze = light_model_paths()["squeezenet"]
    r = runner.invoke(app, ["run", squeeze, "--shapes", "1x3x64x64"])
    assert r.exit_code == 2 and "dim 2 is 64 but the model declares 224" in r.output
    assert "--model-shape" in r.output
    r = invoke("run", squeeze, "--model-shape", "?x3x?x?", "--shapes", "[1,3,64,64][2,3,48,48]",
               "--check", "--trace", tmp_path / "sq.jsonl", "--quiet")
    assert r.exit_code == 0, r.output
    assert "2 passed, 0 failed" in r.output


def test_devices_lists_a_working_device():
    r = invoke("devices", "--json")
    assert r.exit_code == 0
    rows = json.loads(r.output)
    assert any(d["builds"] for d in rows)


def test_feedback_drives_a_decode_loop_on_device(tmp_path):
    import onnx
    from tests.models import kv_decoder_step
    model = tmp_path / "kv.onnx"
    onnx.save(kv_decoder_step(), model)
    r = invoke("run", model, "--shapes", "x:1x1x32,past_k:1x2x0x16,past_v:1x2x0x16*24",
               "--feedback", "present_k:past_k,present_v:past_v", "--check", "--json",
               "--trace", tmp_path / "t.jsonl")
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["check"]["failed"] == 0 and s["inferences"] == 24
    c = s["counters"]
    assert c["kv_cache.append"] >= 2 * 15 and c["realloc.external.feedback_alias"] == 2 * 23
    assert c["plan.compiled"] >= 10          # compiled steps serve the traced run
    bad = invoke("run", model, "--shapes", "x:1x1x32,past_k:1x2x0x16,past_v:1x2x0x16",
                 "--feedback", "present_k:nope", "--trace", tmp_path / "t2.jsonl")
    assert bad.exit_code == 2 and "'nope' is not a model input" in bad.output


def test_run_freezes_what_the_network_keeps_after_its_first_inference(tmp_path):
    """`dyncli run` stops the collector from walking the network's long-lived objects once its
    first inference has built them (dyncli/gc_policy.py), and lets them go when it ends."""
    import gc
    from dyncli.runner import RunOptions, execute_run
    from tests.models import kv_decoder_step
    model = tmp_path / "kv.onnx"
    onnx.save(kv_decoder_step(), model)
    seen = []
    before = gc.get_freeze_count()
    execute_run(RunOptions(model=str(model), shapes=["x:1x1x32,past_k:1x2x0x16,past_v:1x2x0x16*3"],
                           feedback=["present_k:past_k,present_v:past_v"], trace="none"),
                progress=lambda i, n, shapes: seen.append(gc.get_freeze_count()))
    assert len(seen) == 3 and all(k > before for k in seen)
    assert gc.get_freeze_count() == before


def test_a_traced_run_of_new_lengths_compiles_and_its_trace_reads_as_the_flows(tmp_path):
    """`dyncli run` by default: new lengths within a range traced before run as one compiled
    plan each, and the trace the reader expands holds the flow's decisions, node by node, fields
    included (`--no-fast-path` runs the flow itself)."""
    from engine.fast_path import NOT_DECISIONS
    from tests.test_steady_steps import _events
    spec = "input_ids:1x{40..10..-3},attention_mask:1x{40..10..-3}"
    runs = {}
    for name, extra in (("default", []), ("flow", ["--no-fast-path"])):
        trace = tmp_path / f"{name}.jsonl"
        r = invoke("run", ENCODER, "--shapes", spec, "--impls", "dynamic", "--json", "--trace", trace, *extra)
        assert r.exit_code == 0, r.output
        runs[name] = (json.loads(r.output), trace)
    detail = {k: [{c: v for c, v in d["counters"].items() if c not in NOT_DECISIONS}
                  for d in runs[k][0]["inferences_detail"]] for k in runs}
    assert detail["default"] == detail["flow"]
    assert runs["default"][0]["counters"].get("plan.compiled", 0) >= 5
    for i in range(len(detail["flow"])):
        assert _events(runs["default"][1], i) == _events(runs["flow"][1], i), f"inference {i}"
