"""The preprocessing pipeline's decisions, read from the trace of real runs; every
run's outputs are compared with onnxruntime as well."""
import numpy as np
import pytest

from engine import Network, PreallocSettings, build_program
from tests.conftest import run_vs_ort
from tests.models import bert_encoder, encoder_block, mlp
from traces import MemoryTrace


def _encoder_feeds(rng, b, s):
    return {"x": rng.standard_normal((b, s, 64)).astype(np.float32),
            "mask": (rng.random((b, s)) > 0.2).astype(np.float32)}


def _traced(model, device, prealloc=PreallocSettings(), impls="dynamic", **kw):
    """Shape-agnostic impls only by default: a background static build landing mid-test would
    switch impls (and reorder weights) at a moment that depends on the compiler's speed."""
    trace = MemoryTrace()
    return Network(build_program(model), device, trace=trace, prealloc=prealloc, impls=impls,
                   **kw), trace


@pytest.mark.parametrize("which", ["encoder_block", "bert_encoder"])
def test_repeated_shape_skips_every_update_shape_and_set_args(device, which):
    """The encoder block's Reshape targets copy their inputs' own dims (folded at load: no
    Shape node left); the BERT encoder keeps the Shape of its position ids' slice."""
    rng = np.random.default_rng(0)
    if which == "encoder_block":
        model, feeds = encoder_block(), [_encoder_feeds(rng, 2, 7), _encoder_feeds(rng, 2, 7)]
    else:
        model = bert_encoder(layers=1, d_model=32, heads=2, ff=64)
        feeds = [{"input_ids": rng.integers(0, 100, (2, 7)), "attention_mask": np.ones((2, 7), np.int64)}] * 2
    net, trace = _traced(model, device)
    run_vs_ort(model, feeds, device, rtol=2e-4, atol=2e-5, net=net)
    shapes = trace.of(1, "update_shape")
    assert shapes and all(e["action"] == "skip" for e in shapes)
    by_op = {e["reason"] for e in shapes if e["op"] == "Shape"}
    assert by_op == (set() if which == "encoder_block" else {"shape_of_unchanged"})
    assert {e["reason"] for e in shapes if e["op"] != "Shape"} <= {
        "shape_unchanged", "shape_of_subgraph_unchanged"}
    assert not trace.of(1, "realloc", "alloc")
    assert net.counters.get("bytes_allocated", 0) == 0
    set_args = trace.of(1, "set_args")
    assert set_args and all(e["action"] == "skip" for e in set_args)
    assert not trace.of(1, "update_impl")


def _reshape_by_shape_of() -> "onnx.ModelProto":
    """y = Relu(Reshape(x, concat([-1], Shape(x, start=1) * [1, 1]))): a shape subgraph whose
    Shape source reads only the non-batch dims."""
    from onnx import TensorProto, helper, numpy_helper
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="Shape_tail", start=1),
        helper.make_node("Mul", ["s", "ones"], ["s1"], name="Mul_shape"),
        helper.make_node("Concat", ["minus1", "s1"], ["target"], name="Concat_target", axis=0),
        helper.make_node("Relu", ["x"], ["r"], name="Relu"),
        helper.make_node("Reshape", ["r", "target"], ["y"], name="Reshape"),
    ]
    inits = [numpy_helper.from_array(np.array([1, 1], np.int64), "ones"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    g = helper.make_graph(nodes, "reshape_by_shape_of",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 8])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_shape_subgraph_unchanged_when_only_batch_changes(device):
    rng = np.random.default_rng(1)
    model = _reshape_by_shape_of()
    net, trace = _traced(model, device)
    seq = [{"x": rng.standard_normal((b, s, 8)).astype(np.float32)} for b, s in [(1, 5), (3, 5), (3, 6)]]
    run_vs_ort(model, seq, device, net=net)
    us = {e["node"]: e for e in trace.of(1, "update_shape")}
    assert us["Shape_tail"]["action"] == "infer" and us["Shape_tail"]["value_unchanged"]
    for name in ("Mul_shape", "Concat_target"):
        assert (us[name]["action"], us[name]["reason"]) == ("skip", "shape_of_subgraph_unchanged")
    assert us["Relu"]["action"] == us["Reshape"]["action"] == "infer"
    # a new sequence length reaches the subgraph: it runs again
    us2 = {e["node"]: e for e in trace.of(2, "update_shape")}
    assert us2["Mul_shape"]["action"] == us2["Concat_target"]["action"] == "infer"


def test_growth_by_one_preallocates_ten_steps_ahead(device):
    rng = np.random.default_rng(2)
    lengths = list(range(8, 24))
    seq = [_encoder_feeds(rng, 1, s) for s in lengths]
    # the memory pool off: a pooled buffer (up to twice the request) moves a tensor's next
    # growth, and this is the ShapePredictor's test
    net, trace = _traced(encoder_block(), device, memory_pool=False)
    run_vs_ort(encoder_block(), seq, device, rtol=2e-4, atol=2e-5, net=net)
    allocs = [len(trace.of(i, "realloc", "alloc")) for i in range(len(lengths))]
    predicted = [i for i in range(len(lengths))
                 if any(e.get("predicted") for e in trace.of(i, "realloc", "alloc"))]
    # three growths (nothing -> 8 -> 9 -> 10) fill the history of 3 with a fixed step: the
    # buffers of 10 are allocated 10 steps ahead (room up to 20)
    assert predicted[:1] == [2], (allocs, predicted)
    assert all(a > 0 for a in allocs[:3])
    assert allocs[3:13] == [0] * 10, allocs     # 11..20 reuse every buffer
    assert allocs[13] > 0 and predicted[1] == 13

    off, trace_off = _traced(encoder_block(), device, PreallocSettings.parse("0 0 0 1.0"),
                             memory_pool=False)
    run_vs_ort(encoder_block(), seq, device, rtol=2e-4, atol=2e-5, net=off)
    allocs_off = [len(trace_off.of(i, "realloc", "alloc")) for i in range(len(lengths))]
    assert all(a > 0 for a in allocs_off), allocs_off
    assert not any(e.get("predicted") for e in trace_off.events)


def test_shrink_reuses_and_a_tenth_reclaims(device):
    rng = np.random.default_rng(3)
    net, trace = _traced(mlp(), device)
    seq = [{"x": rng.standard_normal((b, 32)).astype(np.float32)} for b in (200, 50, 19, 21)]
    run_vs_ort(mlp(), seq, device, net=net)
    assert not trace.of(1, "realloc", "alloc")          # 50 of 200: reuse
    assert trace.of(1, "realloc", "reuse")
    reclaimed = trace.of(2, "realloc", "alloc")          # 19 < 200 / 10: give the memory back
    assert reclaimed and all(e["reason"] == "reclaim" for e in reclaimed)
    assert net.buffers.used_bytes < sum(e["bytes"] for e in trace.of(0, "realloc", "alloc"))


def _matmul_bias_relu():
    """y = Relu(x @ W + bias) with bias a graph input [n, 1, 8]: n > batch grows the output."""
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(7).standard_normal((16, 8)).astype(np.float32) / 4
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"], name="MatMul"),
             helper.make_node("Add", ["mm", "bias"], ["pre"], name="Add_bias"),
             helper.make_node("Relu", ["pre"], ["y"], name="Relu")]
    g = helper.make_graph(nodes, "matmul_bias_relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 16]),
                           helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["n", 1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "W")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_fused_matmul_bias_relu_unfuses_when_broadcast_grows(device):
    model = _matmul_bias_relu()
    prog = build_program(model)
    mm = next(n for n in prog.nodes if n.op == "MatMul")
    assert mm.fusion.names() == ["Add_bias", "Relu"]
    rng = np.random.default_rng(8)
    shapes = [(2, 5, 1), (2, 5, 2), (1, 5, 3), (1, 5, 3), (3, 4, 3)]   # (b, s, n)
    seq = [{"x": rng.standard_normal((b, s, 16)).astype(np.float32),
            "bias": rng.standard_normal((n, 1, 8)).astype(np.float32)} for b, s, n in shapes]
    trace = MemoryTrace()
    net = Network(prog, device, trace=trace, impls="dynamic")
    run_vs_ort(model, seq, device, net=net)
    for i, (b, s, n) in enumerate(shapes):
        unfuse = trace.of(i, "fusion", "unfuse")
        nodes = {e["node"] for e in trace.of(i, "execute", "enqueue")}
        if n > b:   # [b, s, 8] + [n, 1, 8] -> [n, s, 8]: the fused kernel cannot write that
            assert [(e["node"], e["reason"], e["ops"]) for e in unfuse] == [
                ("MatMul", "broadcast_grows_output", ["Add_bias", "Relu"])]
            assert nodes == {"MatMul", "Add_bias", "Relu"}
        else:
            assert not unfuse and nodes == {"MatMul"}
    assert any(e["impl"] == "gemm:MatMul+fused" for e in trace.events if e["kind"] == "update_impl")


def test_kv_cache_concat_appends_in_place_with_feedback(device):
    """64 decode steps, present_k/v fed back as past_k/v on the device: the concat writes only
    the new entries while the predictor's room lasts."""
    from tests.conftest import assert_close, ort_session
    from tests.models import kv_decoder_step
    model = kv_decoder_step()
    trace = MemoryTrace()
    net = Network(build_program(model), device, trace=trace, impls="dynamic",
                  feedback={"present_k": "past_k", "present_v": "past_v"})
    sess = ort_session(model)
    names = [o.name for o in sess.get_outputs()]
    rng = np.random.default_rng(9)
    past = {"past_k": np.zeros((1, 2, 0, 16), np.float32), "past_v": np.zeros((1, 2, 0, 16), np.float32)}
    new_bytes = 2 * 16 * 4
    for step in range(64):
        feeds = {"x": rng.standard_normal((1, 1, 32)).astype(np.float32), **past}
        outs = net.infer(feeds, fed_back={"past_k": "present_k", "past_v": "present_v"} if step else {})
        ref = dict(zip(names, sess.run(None, feeds)))
        for name in names:
            assert_close(outs[name], ref[name], 2e-4, 2e-5, f"step {step} {name}")
        past = {"past_k": ref["present_k"], "past_v": ref["present_v"]}
        kv = trace.of(step, "kv_cache")
        assert sorted(e["node"] for e in kv) == ["Concat_present_k", "Concat_present_v"]
        for e in kv:
            assert e["length"] == step + 1
            if e["action"] == "append":
                assert e["bytes_copied"] == new_bytes      # the past is not copied again
            else:
                assert e["bytes_copied"] == (step + 1) * new_bytes
        # one new token: the head split/merge Transposes only move unit dims
        skips = [e["op"] for e in trace.of(step, "execute", "skip") if e["reason"] == "runtime_skip"]
        # (K^T, q's heads split and the context's heads merge run inside the fused attention,
        # which reads the padded KV buffer in place: the k and v heads splits remain)
        assert skips.count("Transpose") == 2, skips
        assert "Softmax_0_attention" in {e["node"] for e in trace.of(step, "execute", "enqueue")}
        assert not trace.of(step, "fusion", "unfuse")
        if step:
            ext = [e for e in trace.of(step, "realloc", "external") if e["node"].startswith("past")]
            assert {e["reason"] for e in ext} == {"feedback_alias"}
    copies = [e for e in trace.events if e["kind"] == "kv_cache" and e["action"] == "copy"]
    appends = [e for e in trace.events if e["kind"] == "kv_cache" and e["action"] == "append"]
    assert len(appends) >= 2 * 50, (len(copies), len(appends))
    assert all(e["reason"] in ("first_run", "capacity") for e in copies)
    total = sum(e["bytes_copied"] for e in copies + appends)
    assert total < 0.25 * sum(2 * (s + 1) * new_bytes for s in range(64))  # vs copying every step


def test_static_output_nodes_skip_with_their_own_reason(device):
    """y = x @ Relu(w) with w declared [8, 8]: Relu(w) has a static output."""
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Relu", ["w"], ["rw"], name="Relu_w"),
             helper.make_node("MatMul", ["x", "rw"], ["y"], name="MatMul")]
    g = helper.make_graph(nodes, "static_branch",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 8])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    rng = np.random.default_rng(10)
    net, trace = _traced(model, device)
    seq = [{"x": rng.standard_normal((b, 8)).astype(np.float32),
            "w": rng.standard_normal((8, 8)).astype(np.float32)} for b in (2, 5)]
    run_vs_ort(model, seq, device, net=net)
    us = {e["node"]: (e["action"], e["reason"]) for e in trace.of(1, "update_shape")}
    assert us["Relu_w"] == ("skip", "static_output")
    assert us["MatMul"] == ("infer", "shape_changed")
