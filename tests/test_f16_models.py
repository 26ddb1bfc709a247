"""The example models in float16 (weights, inputs, outputs, KV cache) against onnxruntime's own
float16 run, over the same shape sequences as their float32 tests.

Tolerance rtol = atol = 1e-2: a half has an 11-bit significand (relative spacing 2^-10 ~ 1e-3),
and every tensor between two ops is rounded to half in both engines, but at different points
(we compute each op in float32 and round its output; onnxruntime rounds some intermediates
itself, and ops we run through float32 Casts round once instead of per step). Through a few
matmuls and a softmax the roundings add up to several ulps; 1e-2 is about 10 ulps at 1.0, well
below the error of a wrong kernel (which is O(1)).
"""
import numpy as np
import pytest

from engine import Network, build_program
from tests.conftest import assert_close, ort_session, run_vs_ort
from tests.models import encoder_block, kv_decoder_step, mlp, small_cnn, to_float16
from traces import MemoryTrace

TOL = dict(rtol=1e-2, atol=1e-2)
F16 = np.float16


def test_mlp_f16_dynamic_batch(device):
    rng = np.random.default_rng(1)
    seq = [{"x": rng.standard_normal((b, 32)).astype(F16)} for b in (1, 4, 4, 9, 2, 0, 9, 1)]
    net = run_vs_ort(to_float16(mlp()), seq, device, **TOL)
    nodes = {n.op: n for n in net.program.nodes}
    # Gemm and Softmax run their float32 kernels between Casts; Relu/Tanh/Mul run in half
    assert all(i.endswith("::f32") for i in nodes["Gemm"].inputs[:2])
    assert not any(i.endswith("::f32") for i in nodes["Mul"].inputs)
    assert net.program.fused == 0
    outs = net.infer(seq[1])
    assert outs["y"].dtype == F16


@pytest.mark.parametrize("variant", ["float", "ids"])
def test_encoder_block_f16_batch_and_seq(device, variant):
    rng = np.random.default_rng(2)
    shapes = [(1, 8), (1, 8), (2, 16), (2, 5), (1, 0), (3, 12), (2, 5)]
    if variant == "float":
        model = to_float16(encoder_block())
        seq = [{"x": rng.standard_normal((b, s, 64)).astype(F16),
                "mask": (rng.random((b, s)) > 0.2).astype(F16)} for b, s in shapes]
    else:
        model = to_float16(encoder_block(vocab=100))
        seq = [{"input_ids": rng.integers(0, 100, (b, s)).astype(np.int64),
                "attention_mask": (rng.random((b, s)) > 0.2).astype(np.int64)} for b, s in shapes]
    run_vs_ort(model, seq, device, **TOL)


def test_small_cnn_f16_batch_and_spatial(device):
    """Conv (static impls too), BatchNorm, LRN and GlobalAveragePool through float32 Casts
    (their constants converted once at program build); pooling and Relu in half."""
    rng = np.random.default_rng(4)
    shapes = [(1, 16, 16), (2, 16, 16), (2, 16, 16), (1, 33, 20), (0, 8, 8), (1, 16, 16)]
    seq = [{"x": rng.standard_normal((b, 3, h, w)).astype(F16)} for b, h, w in shapes]
    net = run_vs_ort(to_float16(small_cnn()), seq, device, **TOL)
    nodes = net.program.nodes
    assert any(n.op == "MaxPool" and not n.inputs[0].endswith("::f32") for n in nodes)
    conv = next(n for n in nodes if n.op == "Conv")
    assert all(i.endswith("::f32") for i in conv.inputs)
    assert conv.inputs[1] in net.program.constants   # the f16 weight converted once


def test_kv_decoder_f16_feedback_keeps_a_half_cache(device):
    """Decode steps with present_k/v fed back as past_k/v on the device: the KV cache is float16
    (half the bytes), compared with onnxruntime fed its own presents at every step."""
    model, trace = to_float16(kv_decoder_step()), MemoryTrace()
    sess, names = ort_session(model), ["y", "present_k", "present_v"]
    fed = {"past_k": "present_k", "past_v": "present_v"}
    net = Network(build_program(model), device, trace=trace, impls="dynamic",
                  feedback={v: k for k, v in fed.items()})
    rng = np.random.default_rng(9)
    past = {k: np.zeros((1, 2, 0, 16), F16) for k in fed}
    for step in range(12):
        new = 3 if step == 0 else 1
        feeds = {"x": rng.standard_normal((1, new, 32)).astype(F16), **past}
        outs = net.infer(feeds, fed_back=fed if step else {})
        ref = dict(zip(names, sess.run(None, feeds)))
        for name in names:
            assert_close(outs[name], ref[name], what=f"step {step} {name}", **TOL)
        # feed back onnxruntime's presents: the comparison stays per step
        past = {"past_k": ref["present_k"], "past_v": ref["present_v"]}
        assert outs["present_k"].dtype == F16 and outs["present_k"].shape[2] == step + 3
    # both caches append in place (V is read through a Cast to float32 for the MatMul: the
    # Cast reads the padded cache with a converting strided copy)
    for node in ("Concat_present_k", "Concat_present_v"):
        kv = [e for e in trace.events if e["kind"] == "kv_cache" and e["node"] == node]
        assert len(kv) == 12 and sum(e["action"] == "append" for e in kv) >= 8, kv
        assert all(e["bytes_copied"] == 2 * 16 * 2 for e in kv if e["action"] == "append")
    ext = [e for e in trace.events if e["kind"] == "realloc" and e["action"] == "external"
           and e["node"] == "past_k" and e["iter"] > 0]
    assert {e["reason"] for e in ext} == {"feedback_alias"}
    # 2 bytes an element: the cache holds half the float32 bytes
    assert all(e["dtype"] == "f16" for e in trace.events
               if e["kind"] == "realloc" and e["node"] == "Concat_present_k" and "dtype" in e)


def test_cli_says_how_float16_runs(tmp_path, monkeypatch):
    """`dyncli devices` has a float16 column; a run's trace header says how half ran; --check
    of a float16 model with float16 tolerances."""
    import json

    import onnx
    from typer.testing import CliRunner

    from dyncli.cli import app
    from traces import read_trace
    r = CliRunner().invoke(app, ["devices", "--json"], catch_exceptions=False)
    rows = json.loads(r.output)
    assert all(row["float16"].startswith("stored half, computed f32") for row in rows)
    monkeypatch.chdir(tmp_path)   # short paths: the tables' titles hold them
    path = "mlp16.onnx"
    onnx.save(to_float16(mlp()), path)
    trace = "mlp16.trace.jsonl"
    r = CliRunner().invoke(app, ["run", str(path), "--shapes", "x:{1..3}x32", "--check", "--rtol",
                                 "1e-2", "--atol", "1e-2", "--trace", str(trace)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "3 passed, 0 failed" in r.output
    header, _ = read_trace(str(trace))
    f16 = header["float16"]
    assert f16["compute"] == "float32" and "cl_khr_fp16" in f16
    assert f16["f32_ops"] == ["Gemm", "MatMul", "Softmax"] and f16["casts"] >= 5
    r = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["trace", str(trace)], catch_exceptions=False)
    flat = "".join(c for c in r.output if not c.isspace() and c != "│")   # a cell may wrap
    assert "computedfloat32" in flat and "CastsaroundGemm,MatMul,Softmax" in flat


def test_cast_f16_to_and_from_every_type(device):
    """Cast between float16 and float32, int64, int32, bool, with Where/Equal/Add in half."""
    from onnx import TensorProto as TP, helper
    n = helper.make_node
    nodes = [n("Cast", ["x"], ["x32"], to=TP.FLOAT), n("Cast", ["x32"], ["y16"], to=TP.FLOAT16),
             n("Cast", ["x"], ["xi"], to=TP.INT64), n("Cast", ["xi"], ["yi16"], to=TP.FLOAT16),
             n("Cast", ["x"], ["xi32"], to=TP.INT32), n("Cast", ["xi32"], ["yi32"], to=TP.FLOAT16),
             n("Cast", ["x"], ["xb"], to=TP.BOOL), n("Cast", ["xb"], ["yb16"], to=TP.FLOAT16),
             n("Equal", ["yi16", "y16"], ["eq"]), n("Where", ["eq", "y16", "yb16"], ["w"]),
             n("Add", ["w", "f"], ["y"])]
    g = helper.make_graph(nodes, "casts", [helper.make_tensor_value_info("x", TP.FLOAT16, ["n"]),
                                          helper.make_tensor_value_info("f", TP.FLOAT, ["n"])],
                          [helper.make_empty_tensor_value_info(o)
                           for o in ("y16", "yi16", "yi32", "xi", "xb", "y")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    # y = w + f mixes half and float: not valid ONNX, so f is cast to half first
    model.graph.node.insert(0, n("Cast", ["f"], ["f16"], to=TP.FLOAT16))
    model.graph.node[-1].input[1] = "f16"
    rng = np.random.default_rng(3)
    seq = []
    for size in (5, 70, 5, 0, 131):
        x = (rng.standard_normal(size) * 40).astype(F16)
        x[: size // 4] = 0
        x[size // 4: size // 3] = -0.0
        seq.append({"x": x, "f": rng.standard_normal(size).astype(np.float32)})
    # the casts are exact; the half Add is the float32 sum rounded to nearest even (numpy's
    # answer), which onnxruntime's half Add misses by one ulp in a few percent of elements
    run_vs_ort(model, seq, device, rtol=1e-3, atol=1e-3, check_nonconstant=False)
    net = Network(build_program(model), device)
    for feeds in seq:
        outs = net.infer(feeds)
        x = feeds["x"]
        want = {"xi": x.astype(np.int64), "xb": x.astype(bool), "yi16": x.astype(np.int64).astype(F16),
                "yi32": x.astype(np.int32).astype(F16)}
        for name, w in want.items():
            assert_close(outs[name], w, rtol=0, atol=0, what=name)
        # Where: x where it is a whole number, else bool(x) as half; plus f rounded to half
        w = np.where(want["yi16"] == x, x, x.astype(bool)).astype(np.float32)
        f16 = feeds["f"].astype(F16).astype(np.float32)
        assert_close(outs["y"], (w + f16).astype(F16), rtol=0, atol=0, what="y")


def test_f16_fill_expand_concat_slice_gather(device):
    """Half data through the ops that only move or make it: ConstantOfShape with a half value
    (on the device: its shape comes from x), Expand, Concat, Slice, Gather, Transpose."""
    from onnx import TensorProto as TP, helper, numpy_helper
    n = helper.make_node
    fill = numpy_helper.from_array(np.array([1.5], F16), "v")
    nodes = [n("Shape", ["x"], ["s"]), n("ConstantOfShape", ["s"], ["ones"], value=fill),
             n("Add", ["x", "ones"], ["a"]), n("Expand", ["b", "s"], ["be"]),
             n("Concat", ["a", "be"], ["c"], axis=1), n("Transpose", ["c"], ["t"], perm=[1, 0]),
             n("Slice", ["t", "st", "en", "ax"], ["sl"]), n("Gather", ["sl", "idx"], ["y"], axis=1)]
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
             {"st": [1], "en": [-1], "ax": [0], "idx": [0, 2, 1, 0]}.items()]
    g = helper.make_graph(nodes, "moves", [helper.make_tensor_value_info("x", TP.FLOAT16, ["n", "m"]),
                                           helper.make_tensor_value_info("b", TP.FLOAT16, [1, "m"])],
                          [helper.make_empty_tensor_value_info("y")], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    rng = np.random.default_rng(8)
    seq = [{"x": rng.standard_normal((r, c)).astype(F16), "b": rng.standard_normal((1, c)).astype(F16)}
           for r, c in [(3, 4), (70, 5), (3, 4), (4, 9)]]
    net = run_vs_ort(model, seq, device, rtol=1e-3, atol=1e-3)
    assert not any(t.endswith("::f32") for nd in net.program.nodes for t in nd.inputs)
