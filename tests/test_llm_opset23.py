"""The ONNX ops of an LLM decode step at opset 23 (RMSNormalization, RotaryEmbedding,
Attention with grouped-query heads and past / present KV), expanded at load
(engine/ops/llm/), against onnxruntime: each op over sequences of shapes, then the decoder of
scripts/make_llm_opset23.py fed back over a prompt, single tokens and a chunk, its KV cache
appended in place and its attention run as the fused kernel."""
import os

import numpy as np
import pytest
from onnx import TensorProto, helper

from engine import ModelError, Network, build_program
from tests.conftest import assert_close, ort_session, run_vs_ort
from traces import MemoryTrace

F = TensorProto.FLOAT
FIXTURE = os.path.join(os.path.dirname(__file__), "llm_opset23", "decoder.onnx")
RTOL, ATOL = 2e-4, 2e-5


def _model(node, ins, outs, opset=23):
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info(o, F, None) for o in outs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _vi(name, dims, t=F):
    return helper.make_tensor_value_info(name, t, dims)


def _x(rng, *dims):
    return rng.standard_normal(dims).astype(np.float32)


@pytest.mark.parametrize("axis", [-1, -2])
def test_rms_normalization(device, axis):
    rng = np.random.default_rng(1)
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=axis, epsilon=1e-3)
    scale = [64] if axis == -1 else [5, 64]
    feeds = [{"x": _x(rng, b, s, 64), "scale": _x(rng, *scale)} for b, s in ((2, 5), (1, 5), (3, 5))]
    run_vs_ort(_model(node, [_vi("x", ["b", "s", 64]), _vi("scale", scale)], ["y"]), feeds, device, RTOL, ATOL)


@pytest.mark.parametrize("attrs", [{"num_heads": 4}, {"num_heads": 4, "interleaved": 1},
                                   {"num_heads": 4, "rotary_embedding_dim": 8}])
def test_rotary_embedding_3d(device, attrs):
    rng = np.random.default_rng(2)
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], **attrs)
    half = attrs.get("rotary_embedding_dim", 16) // 2
    ins = [_vi("x", ["b", "s", 64]), _vi("cos", [32, half]), _vi("sin", [32, half]),
           _vi("pos", ["b", "s"], TensorProto.INT64)]
    cos, sin = _x(rng, 32, half), _x(rng, 32, half)
    feeds = [{"x": _x(rng, b, s, 64), "cos": cos, "sin": sin, "pos": rng.integers(0, 32, (b, s))}
             for b, s in ((1, 8), (1, 1), (2, 3))]
    run_vs_ort(_model(node, ins, ["y"]), feeds, device, RTOL, ATOL)


def test_rotary_embedding_4d_without_position_ids(device):
    """[B, N, S, H] heads, the caches already per token [B, S, H / 2]."""
    rng = np.random.default_rng(3)
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], interleaved=1)
    ins = [_vi("x", ["b", 2, "s", 16]), _vi("cos", ["b", "s", 8]), _vi("sin", ["b", "s", 8])]
    feeds = [{"x": _x(rng, b, 2, s, 16), "cos": _x(rng, b, s, 8), "sin": _x(rng, b, s, 8)}
             for b, s in ((1, 6), (2, 1))]
    run_vs_ort(_model(node, ins, ["y"]), feeds, device, RTOL, ATOL)


def _attention(q_heads=4, kv_heads=2, **attrs):
    """3-D GQA Attention with past and present, optional mask."""
    mask = attrs.pop("mask", None)
    inputs = ["q", "k", "v", "mask" if mask else "", "past_k", "past_v"]
    node = helper.make_node("Attention", inputs, ["y", "present_k", "present_v"], name="att",
                            q_num_heads=q_heads, kv_num_heads=kv_heads, **attrs)
    ins = [_vi("q", ["b", "s", q_heads * 8]), _vi("k", ["b", "s", kv_heads * 8]), _vi("v", ["b", "s", kv_heads * 8]),
           _vi("past_k", ["b", kv_heads, "p", 8]), _vi("past_v", ["b", kv_heads, "p", 8])]
    if mask:
        ins.append(_vi("mask", mask[0], mask[1]))
    return _model(node, ins, ["y", "present_k", "present_v"])


def _attention_feeds(rng, shapes, q_heads=4, kv_heads=2, mask=None):
    out = []
    for b, s, p in shapes:
        f = {"q": _x(rng, b, s, q_heads * 8), "k": _x(rng, b, s, kv_heads * 8), "v": _x(rng, b, s, kv_heads * 8),
             "past_k": _x(rng, b, kv_heads, p, 8), "past_v": _x(rng, b, kv_heads, p, 8)}
        if mask is not None:
            f["mask"] = mask(rng, b, s, p + s)
        out.append(f)
    return out


SHAPES = [(1, 4, 0), (1, 1, 4), (2, 3, 5), (1, 1, 9)]    # (batch, new tokens, past)


@pytest.mark.parametrize("attrs", [{"is_causal": 1}, {"is_causal": 1, "scale": 0.3, "softcap": 2.0}, {}])
def test_attention_gqa_with_past(device, attrs):
    """Causal with a past: query i sees keys up to past + i."""
    rng = np.random.default_rng(4)
    run_vs_ort(_attention(**attrs), _attention_feeds(rng, SHAPES), device, RTOL, ATOL)


def test_attention_bool_mask_broadcast(device):
    """A bool [B, 1, S, T] mask broadcast over the heads, with is_causal (every row keeps its
    first key; onnxruntime takes no broadcast over the queries)."""
    rng = np.random.default_rng(5)

    def mask(rng, b, s, t):
        m = rng.random((b, 1, s, t)) > 0.3
        m[..., 0] = True
        return m
    model = _attention(is_causal=1, mask=(["b", 1, "s", "t"], TensorProto.BOOL))
    run_vs_ort(model, _attention_feeds(rng, SHAPES, mask=mask), device, RTOL, ATOL)


@pytest.mark.parametrize("kv_heads, dims", [(2, ("s", "t")), (4, ("s", "t")), (2, ("b", 4, "s", "t"))])
def test_attention_float_mask(device, kv_heads, dims):
    """A float mask added to the scores: [S, T], or per head [B, N, S, T] (the grouped view
    reshapes it); 4 query heads over 2 kv heads or as many."""
    rng = np.random.default_rng(6)
    model = _attention(4, kv_heads, mask=(list(dims), F))
    per_head = len(dims) == 4
    feeds = _attention_feeds(rng, SHAPES, 4, kv_heads,
                             mask=lambda rng, b, s, t: _x(rng, b, 4, s, t) if per_head else _x(rng, s, t))
    run_vs_ort(model, feeds, device, RTOL, ATOL)


def test_attention_mask_broadcast_over_queries(device):
    """A float [B, 1, 1, T] mask (its query dim a symbol at load, 1 at run time) broadcast over
    the queries of grouped heads: onnxruntime refuses it, onnx.reference runs it (not with
    is_causal: it takes the causal rows from the mask's query dim, one row here)."""
    from onnx.reference import ReferenceEvaluator
    rng = np.random.default_rng(8)
    model = _attention(mask=(["b", 1, "m", "t"], F))
    net = Network(build_program(model), device, impls="dynamic")
    ref = ReferenceEvaluator(model)
    for feeds in _attention_feeds(rng, SHAPES, mask=lambda rng, b, s, t: _x(rng, b, 1, 1, t)):
        got = net.infer(feeds)
        for name, want in zip(["y", "present_k", "present_v"], ref.run(None, feeds)):
            assert_close(got[name], want, RTOL, ATOL, name)


def test_attention_4d_qk_matmul_output(device):
    """4-D inputs, the qk output (mode 0: the scaled q k^T)."""
    rng = np.random.default_rng(7)
    node = helper.make_node("Attention", ["q", "k", "v"], ["y", "", "", "qk"], qk_matmul_output_mode=0)
    ins = [_vi("q", ["b", 4, "s", 8]), _vi("k", ["b", 2, "l", 8]), _vi("v", ["b", 2, "l", 8])]
    feeds = [{"q": _x(rng, b, 4, s, 8), "k": _x(rng, b, 2, l, 8), "v": _x(rng, b, 2, l, 8)}
             for b, s, l in ((1, 3, 5), (2, 1, 7))]
    run_vs_ort(_model(node, ins, ["y", "qk"]), feeds, device, RTOL, ATOL)


def test_attention_external_cache_nonpad_kv_seqlen(device):
    """Opset 24: K and V the whole static cache [B, Nkv, L, H], nonpad_kv_seqlen [B] its valid
    keys; causal from nonpad_kv_seqlen - S (a prompt, then decode steps, rows of unequal length)."""
    rng = np.random.default_rng(9)
    node = helper.make_node("Attention", ["q", "k", "v", "", "", "", "lens"], ["y"], is_causal=1)
    ins = [_vi("q", ["b", 4, "s", 8]), _vi("k", ["b", 2, 12, 8]), _vi("v", ["b", 2, 12, 8]),
           _vi("lens", ["b"], TensorProto.INT64)]
    feeds = [{"q": _x(rng, b, 4, s, 8), "k": _x(rng, b, 2, 12, 8), "v": _x(rng, b, 2, 12, 8),
              "lens": np.array(lens, np.int64)} for b, s, lens in ((1, 5, [5]), (2, 1, [6, 9]), (2, 2, [8, 12]))]
    run_vs_ort(_model(node, ins, ["y"], opset=24), feeds, device, RTOL, ATOL)


def test_attention_refusal_names_the_node():
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], name="att3d")
    model = _model(node, [_vi("q", ["b", "s", 32]), _vi("k", ["b", "s", 32]), _vi("v", ["b", "s", 32])], ["y"])
    with pytest.raises(ModelError, match=r"node att3d \(Attention\): 3-D inputs need q_num_heads"):
        build_program(model)


# ---- the decoder, fed back ------------------------------------------------------------------

FEEDBACK = {f"present_{w}_{i}": f"past_{w}_{i}" for i in range(2) for w in ("key", "value")}


def _kv_appends_while_capacity_lasts(trace, steps):
    """Each cache's events: after the first run, a copy only when the new length exceeds the
    capacity the buffer had (its room along the sequence axis), else an in-place append."""
    held, appends = {}, 0
    for step in range(steps):
        events = trace.of(step, "kv_cache")
        assert {e["node"] for e in events} == {f"Attention_attn_{i}/Concat{s}" for i in range(2) for s in ("", "_2")}
        for e in events:
            if e["node"] in held and e["length"] <= held[e["node"]]:
                assert e["action"] == "append", e
                appends += 1
            else:
                assert e["action"] == "copy" and e["reason"] in ("first_run", "capacity"), e
            held[e["node"]] = e["capacity"]
    return appends


def test_decoder_fed_back_matches_onnxruntime(device):
    """A prompt of 8 over an empty past, single tokens, a chunk of 3, single tokens: the
    presents fed back on the device (--feedback present:past), onnxruntime fed its own."""
    import onnx
    model = onnx.load(FIXTURE)
    assert {n.op_type for n in model.graph.node} >= {"Attention", "RotaryEmbedding", "RMSNormalization"}
    trace = MemoryTrace()
    net = Network(build_program(model), device, trace=trace, impls="dynamic", feedback=FEEDBACK)
    sess = ort_session(model)
    names = [o.name for o in sess.get_outputs()]
    rng = np.random.default_rng(23)
    past = {p: np.zeros((1, 2, 0, 16), np.float32) for p in FEEDBACK.values()}
    steps = [8, 1, 1, 3, 1, 1, 1]
    for step, n in enumerate(steps):
        ids = rng.integers(0, 128, (1, n))
        fed = {p: o for o, p in FEEDBACK.items()} if step else {}
        got = net.infer({"input_ids": ids, **past}, fed_back=fed)
        ref = dict(zip(names, sess.run(None, {"input_ids": ids, **past})))
        for name in names:
            assert_close(got[name], ref[name], RTOL, ATOL, f"step {step} {name}")
        assert float(np.abs(ref["logits"]).max()) > 0.1        # real values, not zeros
        past = {FEEDBACK[o]: ref[o] for o in FEEDBACK}
        # each layer's attention runs as the fused kernel, never its unfused subgraph
        ran = {e["node"] for e in trace.of(step, "execute", "enqueue")}
        assert {f"Attention_attn_{i}/Softmax_attention" for i in range(2)} <= ran
        assert not [e for e in trace.of(step, "fusion", "unfuse") if "attention" in e["node"]]
    assert past["past_key_0"].shape[2] == sum(steps)
    assert _kv_appends_while_capacity_lasts(trace, len(steps)) >= 4 * 4


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter(device, mode):
    """The update written at each row's index along the sequence axis (wrapping in circular
    mode), over caches of several batches and updates of several lengths."""
    rng = np.random.default_rng(24)
    node = helper.make_node("TensorScatter", ["past", "update", "idx"], ["y"], axis=2, mode=mode)
    ins = [_vi("past", ["b", 2, 8, 4]), _vi("update", ["b", 2, "s", 4]), _vi("idx", ["b"], TensorProto.INT64)]
    feeds = []
    for b, s in ((1, 3), (2, 1), (3, 2)):
        top = 8 if mode == "circular" else 8 - s + 1     # linear: the update fits
        feeds.append({"past": _x(rng, b, 2, 8, 4), "update": _x(rng, b, 2, s, 4),
                      "idx": rng.integers(0, top, (b,))})
    run_vs_ort(_model(node, ins, ["y"], opset=24), feeds, device, RTOL, ATOL)
