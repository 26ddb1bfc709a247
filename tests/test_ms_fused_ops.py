"""com.microsoft ops (what onnxruntime's transformer optimizer emits) against onnxruntime's CPU
kernels: the optimized BERT fixture over a shape sequence, then each op alone in a small model.

tests/ort_optimized/bert.ortopt.f32.onnx is scripts/make_optimized_bert.py's output: a small
random-weight BERT that `optimize_model(model_type='bert')` fused into EmbedLayerNormalization,
Attention (fed the embedding's 1-D mask index), SkipLayerNormalization and BiasGelu.
"""
import collections
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine import build_program
from engine.graph import ModelError
from tests.conftest import run_vs_ort

FIXTURE = os.path.join(os.path.dirname(__file__), "ort_optimized", "bert.ortopt.f32.onnx")
MS = "com.microsoft"
F, I32 = TensorProto.FLOAT, TensorProto.INT32
RTOL, ATOL = 2e-4, 3e-5


def _bert_feeds(shapes, seed=0):
    """Rows after the first padded at the end (each keeps at least one token)."""
    rng = np.random.default_rng(seed)
    out = []
    for b, s in shapes:
        mask = np.ones((b, s), np.int64)
        for r in range(1, b):
            mask[r, s - min(s - 1, 3 * r):] = 0
        out.append({"input_ids": rng.integers(0, 100, (b, s)), "token_type_ids": rng.integers(0, 2, (b, s)),
                    "attention_mask": mask})
    return out


BERT_SHAPES = [(1, 8), (2, 16), (2, 16), (1, 5), (2, 12), (1, 8)]


def test_fixture_holds_the_optimizers_fused_ops():
    m = onnx.load(FIXTURE)
    ops = collections.Counter(n.op_type for n in m.graph.node if n.domain == MS)
    assert ops == {"EmbedLayerNormalization": 1, "Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}
    assert os.path.getsize(FIXTURE) < 300_000
    assert {p.key for p in m.metadata_props} >= {"dyncli.optimizer", "dyncli.fused"}


def test_optimized_bert_matches_onnxruntime_over_shapes(device):
    m = onnx.load(FIXTURE)
    net = run_vs_ort(m, _bert_feeds(BERT_SHAPES), device, RTOL, ATOL)
    # each Attention runs as the fused attention kernel, each layer norm as LayerNormalization's;
    # the layers share one bias of the mask (their inputs' dims have the same symbols)
    ran = collections.Counter(i.node.op for i in net.insts)
    assert ran["attention"] == 2 and ran["LayerNormalization"] == 5 and "Softmax" not in ran
    assert ran["Where"] == 1


def test_optimized_bert_with_a_raw_2d_mask(device):
    """What `--use_raw_attention_mask` makes: each Attention reads the [B, S] mask (int32)."""
    m = onnx.load(FIXTURE)
    for n in m.graph.node:
        if n.op_type == "Attention":
            n.input[3] = "attention_mask_int32"
    run_vs_ort(m, _bert_feeds([(2, 10), (1, 6), (2, 10)], seed=1), device, RTOL, ATOL)


def test_bert_optimized_by_an_onnxruntime_session(device, tmp_path):
    """The other way models are optimized for onnxruntime: a session's own graph optimizer
    (ORT_ENABLE_EXTENDED, optimized_model_filepath) over the unfused BERT of
    scripts/make_optimized_bert.py writes FusedMatMul and BiasGelu."""
    import importlib.util
    import onnxruntime as ort
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "make_optimized_bert.py")
    spec = importlib.util.spec_from_file_location("make_optimized_bert", script)
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    from dyncli.check import ort_session
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(tmp_path / "bert.ort.onnx")
    ort_session(mk.unfused_bert(), opts)       # at the newest IR version this onnxruntime reads
    m = onnx.load(tmp_path / "bert.ort.onnx")
    assert {n.op_type for n in m.graph.node if n.domain == MS} >= {"FusedMatMul", "BiasGelu"}
    net = run_vs_ort(m, _bert_feeds([(1, 8), (2, 12), (1, 5)], seed=3), device, RTOL, ATOL)
    assert collections.Counter(i.node.op for i in net.insts)["attention"] == 2


def test_optimized_bert_in_float16(device):
    """Converted as onnxruntime's tools convert an optimized model (OnnxModel's
    convert_float_to_float16): the ops' expansions run in half, float32 inside the kernels."""
    from onnxruntime.transformers.onnx_model import OnnxModel
    from tests.conftest import assert_close_for, ort_session
    from engine import Network
    m = OnnxModel(onnx.load(FIXTURE))
    m.convert_float_to_float16(keep_io_types=False)
    sess = ort_session(m.model)
    net = Network(build_program(m.model), device, impls="dynamic")
    for k, feeds in enumerate(_bert_feeds([(1, 8), (2, 12), (1, 5)], seed=2)):
        got, want = net.infer(feeds)["last_hidden_state"], sess.run(None, feeds)[0]
        assert want.dtype == np.float16
        assert_close_for(got, want, f"inference {k}")


# ---- one op per model ---------------------------------------------------------------------
def _model(node, inputs, outputs, inits=()):
    g = helper.make_graph([node], "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def _vi(name, elem, dims):
    return helper.make_tensor_value_info(name, elem, dims)


def _w(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _x(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_embed_layer_norm_with_segments_and_mask(device):
    rng = np.random.default_rng(0)
    h = 16
    inits = [("word", _w(rng, 30, h)), ("pos", _w(rng, 12, h)), ("seg", _w(rng, 2, h)),
             ("gamma", 1 + _w(rng, h, scale=0.1)), ("beta", _w(rng, h, scale=0.1))]
    node = helper.make_node("EmbedLayerNormalization", ["ids", "segs", "word", "pos", "seg", "gamma", "beta", "mask"],
                            ["y", "mask_index", "sum"], domain=MS, epsilon=1e-5)
    ins = [_vi(n, I32, ["b", "s"]) for n in ("ids", "segs", "mask")]
    outs = [_vi("y", F, None), _vi("mask_index", I32, None), _vi("sum", F, None)]
    feeds = []
    for b, s in ((2, 7), (1, 12), (3, 4)):
        mask = (rng.random((b, s)) > 0.3).astype(np.int32)
        mask[0, 0] = 2                            # counted only where exactly 1, as onnxruntime
        feeds.append({"ids": rng.integers(0, 30, (b, s), dtype=np.int32),
                      "segs": rng.integers(0, 2, (b, s), dtype=np.int32), "mask": mask})
    run_vs_ort(_model(node, ins, outs, inits), feeds, device, RTOL, ATOL)


def test_embed_layer_norm_with_position_ids_and_no_mask(device):
    rng = np.random.default_rng(1)
    h = 8
    inits = [("word", _w(rng, 20, h)), ("pos", _w(rng, 10, h)), ("gamma", 1 + _w(rng, h, scale=0.1)),
             ("beta", _w(rng, h, scale=0.1))]
    node = helper.make_node("EmbedLayerNormalization", ["ids", "", "word", "pos", "", "gamma", "beta", "", "pids"],
                            ["y", "mask_index"], domain=MS)
    ins = [_vi("ids", I32, ["b", "s"]), _vi("pids", I32, ["b", "s"])]
    outs = [_vi("y", F, None), _vi("mask_index", I32, None)]
    feeds = [{"ids": rng.integers(0, 20, (b, s), dtype=np.int32), "pids": rng.integers(0, 10, (b, s), dtype=np.int32)}
             for b, s in ((2, 5), (1, 9))]
    run_vs_ort(_model(node, ins, outs, inits), feeds, device, RTOL, ATOL)


@pytest.mark.parametrize("form", ["bias_sum_out", "no_beta", "skip_2d"])
def test_skip_layer_norm(device, form):
    rng = np.random.default_rng(2)
    h = 24
    inits = [("gamma", 1 + _w(rng, h, scale=0.1)), ("beta", _w(rng, h, scale=0.1)), ("bias", _w(rng, h))]
    inputs = {"bias_sum_out": ["x", "skip", "gamma", "beta", "bias"], "no_beta": ["x", "skip", "gamma"],
              "skip_2d": ["x", "skip", "gamma", "beta"]}[form]
    outputs = ["y", "", "", "sum"] if form == "bias_sum_out" else ["y"]
    node = helper.make_node("SkipLayerNormalization", inputs, outputs, domain=MS, epsilon=1e-6)
    skip_dims = ["s", h] if form == "skip_2d" else ["b", "s", h]
    ins = [_vi("x", F, ["b", "s", h]), _vi("skip", F, skip_dims)]
    outs = [_vi(o, F, None) for o in outputs if o]
    feeds = [{"x": _x(rng, b, s, h), "skip": _x(rng, *((s, h) if form == "skip_2d" else (b, s, h)))}
             for b, s in ((2, 5), (1, 9), (2, 5))]
    run_vs_ort(_model(node, ins, outs, inits), feeds, device, RTOL, ATOL)


@pytest.mark.parametrize("op,bias", [("Gelu", False), ("BiasGelu", True), ("FastGelu", True), ("FastGelu", False),
                                     ("QuickGelu", False)])
def test_gelus(device, op, bias):
    rng = np.random.default_rng(3)
    attrs = {"alpha": 1.5} if op == "QuickGelu" else {}
    node = helper.make_node(op, ["x", "bias"] if bias else ["x"], ["y"], domain=MS, **attrs)
    inits = [("bias", _w(rng, 12))] if bias else []
    feeds = [{"x": 2 * _x(rng, b, s, 12)} for b, s in ((2, 3), (1, 7))]
    run_vs_ort(_model(node, [_vi("x", F, ["b", "s", 12])], [_vi("y", F, None)], inits), feeds, device, RTOL, ATOL)


@pytest.mark.parametrize("form", ["sum_and_inv_std", "no_bias"])
def test_rms_norms(device, form):
    rng = np.random.default_rng(4)
    h = 16
    inits = [("gamma", 1 + _w(rng, h, scale=0.1)), ("bias", _w(rng, h))]
    if form == "sum_and_inv_std":
        node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma", "bias"],
                                ["y", "", "inv", "sum"], domain=MS, epsilon=1e-6)
        outs = [_vi(o, F, None) for o in ("y", "inv", "sum")]
    else:
        node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"], ["y"], domain=MS)
        outs = [_vi("y", F, None)]
    ins = [_vi("x", F, ["b", "s", h]), _vi("skip", F, ["b", "s", h])]
    feeds = [{"x": _x(rng, b, s, h), "skip": _x(rng, b, s, h)} for b, s in ((2, 5), (1, 3))]
    run_vs_ort(_model(node, ins, outs, inits), feeds, device, RTOL, ATOL)


def test_simplified_layer_norm(device):
    rng = np.random.default_rng(5)
    # onnxruntime keeps it in the ONNX domain
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y", "inv"], axis=-1, epsilon=1e-6)
    inits = [("gamma", 1 + _w(rng, 20, scale=0.1))]
    feeds = [{"x": _x(rng, b, s, 20)} for b, s in ((2, 5), (3, 1))]
    run_vs_ort(_model(node, [_vi("x", F, ["b", "s", 20])], [_vi("y", F, None), _vi("inv", F, None)], inits),
               feeds, device, RTOL, ATOL)


@pytest.mark.parametrize("form", ["trans_b_alpha", "trans_a", "plain_2d"])
def test_fused_matmul(device, form):
    rng = np.random.default_rng(18)
    attrs = {"trans_b_alpha": {"transB": 1, "alpha": 0.25}, "trans_a": {"transA": 1}, "plain_2d": {}}[form]
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain=MS, **attrs)
    if form == "plain_2d":
        dims, shapes = (["m", 8], [8, "n"]), [((3, 8), (8, 5)), ((6, 8), (8, 2))]
    else:
        dims = (["b", 2, "m", 8], ["b", 2, "n", 8]) if form == "trans_b_alpha" else (["b", 2, 8, "m"], ["b", 2, 8, "n"])
        shapes = [((2, 2, 5, 8), (2, 2, 7, 8)), ((1, 2, 3, 8), (1, 2, 4, 8))]
        if form == "trans_a":
            shapes = [((b, h, k, m), (b, h, k, n)) for (b, h, m, k), (_, _, n, _) in shapes]
    ins = [_vi("a", F, dims[0]), _vi("b", F, dims[1])]
    feeds = [{"a": _x(rng, *sa), "b": _x(rng, *sb)} for sa, sb in shapes]
    run_vs_ort(_model(node, ins, [_vi("y", F, None)]), feeds, device, RTOL, ATOL)


# ---- Attention ----------------------------------------------------------------------------
HID, HEADS = 16, 2


def _lengths(b, s, rng):
    return rng.integers(1, s + 1, (b,)).astype(np.int32)


def _ends_starts(b, s, rng):
    ends = rng.integers(s // 2 + 1, s + 1, (b,))
    return np.concatenate([ends, rng.integers(0, s // 2, (b,))]).astype(np.int32)


def _raw(b, s, rng):
    m = (rng.random((b, s)) > 0.3).astype(np.int32)
    m[:, 0] = 1
    return m


def _raw3(b, s, rng):
    m = (rng.random((b, s, s)) > 0.3).astype(np.int32)
    m[:, :, 0] = 1
    return m


MASKS = {"none": None, "lengths": (_lengths, ["b"]), "ends_starts": (_ends_starts, ["b2"]),
         "raw_2d": (_raw, ["b", "s"]), "raw_3d": (_raw3, ["b", "s", "s"])}


@pytest.mark.parametrize("mask", list(MASKS))
def test_attention_mask_forms(device, mask):
    rng = np.random.default_rng(6)
    inits = [("w", _w(rng, HID, 3 * HID, scale=0.5)), ("bias", _w(rng, 3 * HID, scale=0.1))]
    inputs = ["x", "w", "bias"] + (["mask"] if MASKS[mask] else [])
    node = helper.make_node("Attention", inputs, ["y"], domain=MS, num_heads=HEADS)
    ins = [_vi("x", F, ["b", "s", HID])] + ([_vi("mask", I32, MASKS[mask][1])] if MASKS[mask] else [])
    feeds = []
    for b, s in ((2, 6), (1, 9), (3, 4)):
        f = {"x": _x(rng, b, s, HID)}
        if MASKS[mask]:
            f["mask"] = MASKS[mask][0](b, s, rng)
        feeds.append(f)
    run_vs_ort(_model(node, ins, [_vi("y", F, None)], inits), feeds, device, RTOL, ATOL)


def test_attention_causal_past_present_and_bias(device):
    """unidirectional with a past (a prompt, then decode steps), a raw mask over past + new,
    explicit scale and mask_filter_value; present = past + new keys/values."""
    rng = np.random.default_rng(7)
    inits = [("w", _w(rng, HID, 3 * HID, scale=0.5)), ("bias", _w(rng, 3 * HID, scale=0.1))]
    node = helper.make_node("Attention", ["x", "w", "bias", "mask", "past"], ["y", "present"], domain=MS,
                            num_heads=HEADS, unidirectional=1, scale=0.3, mask_filter_value=-1000.0)
    ins = [_vi("x", F, ["b", "s", HID]), _vi("mask", I32, ["b", "t"]),
           _vi("past", F, [2, "b", HEADS, "p", HID // HEADS])]
    feeds = []
    for b, s, p in ((2, 3, 0), (2, 1, 3), (1, 4, 5)):
        feeds.append({"x": _x(rng, b, s, HID), "mask": _raw(b, p + s, rng),
                      "past": _x(rng, 2, b, HEADS, p, HID // HEADS)})
    run_vs_ort(_model(node, ins, [_vi("y", F, None), _vi("present", F, None)], inits), feeds, device, RTOL, ATOL)


def test_attention_decode_with_the_present_fed_back(device):
    """A GPT-2 style decode: a prompt, then one token at a time, the present fed back as the
    past on the device (--feedback), onnxruntime fed its own presents."""
    from engine import Network
    from tests.conftest import assert_close, ort_session
    rng = np.random.default_rng(16)
    inits = [("w", _w(rng, HID, 3 * HID, scale=0.5)), ("bias", _w(rng, 3 * HID, scale=0.1))]
    node = helper.make_node("Attention", ["x", "w", "bias", "mask", "past"], ["y", "present"], domain=MS,
                            num_heads=HEADS, unidirectional=1)
    ins = [_vi("x", F, ["b", "s", HID]), _vi("mask", I32, ["b", "t"]),
           _vi("past", F, [2, "b", HEADS, "p", HID // HEADS])]
    model = _model(node, ins, [_vi("y", F, None), _vi("present", F, None)], inits)
    sess = ort_session(model)
    net = Network(build_program(model), device, impls="dynamic", feedback={"present": "past"})
    past = np.zeros((2, 2, HEADS, 0, HID // HEADS), np.float32)
    for k, s in enumerate([4, 1, 1, 1]):
        t = past.shape[3] + s
        mask = np.ones((2, t), np.int32)
        mask[1, 1] = 0                  # a hole (not the first key: no query may see no key)
        feeds = {"x": _x(rng, 2, s, HID), "mask": mask}
        got = net.infer(feeds, fed_back={"past": "present"}) if k else net.infer({**feeds, "past": past})
        y, past = sess.run(None, {**feeds, "past": past})
        assert_close(got["y"], y, RTOL, ATOL, f"step {k}")
        assert_close(got["present"], past, RTOL, ATOL, f"step {k} present")


def test_attention_bias_input(device):
    """attention_bias [B, N, S, T] added to the scores (onnxruntime takes it without a past)."""
    rng = np.random.default_rng(11)
    inits = [("w", _w(rng, HID, 3 * HID, scale=0.5))]
    node = helper.make_node("Attention", ["x", "w", "", "mask", "", "ab"], ["y"], domain=MS, num_heads=HEADS)
    ins = [_vi("x", F, ["b", "s", HID]), _vi("mask", I32, ["b"]), _vi("ab", F, ["b", HEADS, "s", "s"])]
    feeds = [{"x": _x(rng, b, s, HID), "mask": _lengths(b, s, rng), "ab": _x(rng, b, HEADS, s, s)}
             for b, s in ((2, 4), (1, 7))]
    run_vs_ort(_model(node, ins, [_vi("y", F, None)], inits), feeds, device, RTOL, ATOL)


def test_attention_unequal_head_sizes(device):
    rng = np.random.default_rng(8)
    sizes = [16, 16, 8]
    inits = [("w", _w(rng, HID, sum(sizes), scale=0.5)), ("bias", _w(rng, sum(sizes), scale=0.1))]
    node = helper.make_node("Attention", ["x", "w", "bias"], ["y"], domain=MS, num_heads=HEADS,
                            qkv_hidden_sizes=sizes)
    feeds = [{"x": _x(rng, b, s, HID)} for b, s in ((2, 5), (1, 3))]
    run_vs_ort(_model(node, [_vi("x", F, ["b", "s", HID])], [_vi("y", F, None)], inits), feeds, device, RTOL, ATOL)


@pytest.mark.parametrize("mask", ["none", "lengths", "raw_2d"])
def test_multi_head_attention(device, mask):
    """Separate q, k, v (cross attention: L != S) with a bias; a past with present outputs."""
    rng = np.random.default_rng(9)
    inits = [("bias", _w(rng, 3 * HID, scale=0.1))]
    inputs = ["q", "k", "v", "bias", "mask" if mask != "none" else "", "", "pk", "pv"]
    node = helper.make_node("MultiHeadAttention", inputs, ["y", "present_k", "present_v"], domain=MS,
                            num_heads=HEADS)
    mdims = {"lengths": ["b"], "raw_2d": ["b", "t"]}.get(mask)
    ins = [_vi("q", F, ["b", "s", HID]), _vi("k", F, ["b", "l", HID]), _vi("v", F, ["b", "l", HID])] + \
        ([_vi("mask", I32, mdims)] if mdims else []) + \
        [_vi(n, F, ["b", HEADS, "p", HID // HEADS]) for n in ("pk", "pv")]
    feeds = []
    for b, s, l, p in ((2, 3, 5, 2), (1, 4, 4, 0), (2, 1, 6, 3)):
        f = {"q": _x(rng, b, s, HID), "k": _x(rng, b, l, HID), "v": _x(rng, b, l, HID),
             "pk": _x(rng, b, HEADS, p, HID // HEADS), "pv": _x(rng, b, HEADS, p, HID // HEADS)}
        if mask == "lengths":
            f["mask"] = rng.integers(1, p + l + 1, (b,)).astype(np.int32)
        elif mask == "raw_2d":
            f["mask"] = _raw(b, p + l, rng)
        feeds.append(f)
    outs = [_vi(n, F, None) for n in ("y", "present_k", "present_v")]
    run_vs_ort(_model(node, ins, outs, inits), feeds, device, RTOL, ATOL)


def test_multi_head_attention_over_per_head_keys(device):
    """Cross attention over keys and values already split in heads [B, N, L, H] (an encoder's,
    computed once): the bias applies to the query only."""
    rng = np.random.default_rng(15)
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "bias", "mask"], ["y"], domain=MS,
                            num_heads=HEADS)
    ins = [_vi("q", F, ["b", "s", HID]), _vi("k", F, ["b", HEADS, "l", HID // HEADS]),
           _vi("v", F, ["b", HEADS, "l", HID // HEADS]), _vi("mask", I32, ["b", "l"])]
    feeds = [{"q": _x(rng, b, s, HID), "k": _x(rng, b, HEADS, l, HID // HEADS),
              "v": _x(rng, b, HEADS, l, HID // HEADS), "mask": _raw(b, l, rng)} for b, s, l in ((2, 1, 5), (1, 3, 7))]
    run_vs_ort(_model(node, ins, [_vi("y", F, None)], [("bias", _w(rng, 3 * HID, scale=0.1))]), feeds, device,
               RTOL, ATOL)


# ---- what is refused ------------------------------------------------------------------------
def test_other_domains_and_unknown_ms_ops_are_refused_by_name():
    x = _vi("x", F, ["n"])
    nodes = [helper.make_node("Foo", ["x"], ["a"], domain="org.example", name="foo"),
             helper.make_node("QOrderedGelu", ["a"], ["y"], domain=MS, name="qg")]
    g = helper.make_graph(nodes, "g", [x], [_vi("y", F, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelError) as e:
        build_program(m)
    assert str(e.value) == ("unsupported ops: com.microsoft::QOrderedGelu (nodes: qg); "
                            "org.example::Foo (custom domain)")


def test_attention_refuses_a_4d_mask_naming_the_node():
    rng = np.random.default_rng(10)
    node = helper.make_node("Attention", ["x", "w", "", "mask"], ["y"], domain=MS, num_heads=2, name="att")
    m = _model(node, [_vi("x", F, ["b", "s", HID]), _vi("mask", I32, ["b", 1, 8, 8])], [_vi("y", F, None)],
               [("w", _w(rng, HID, 3 * HID))])
    with pytest.raises(ModelError, match=r"node att \(com.microsoft::Attention\): mask_index of rank 4"):
        build_program(m)


# ---- RotaryEmbedding ------------------------------------------------------------------------
ROTARY = {  # form: (input dims, num_heads, rotary_embedding_dim, interleaved, position ids dims)
    "bsd_halves_partial": (["b", "s", 32], 2, 8, 0, ["b", "s"]),
    "bsd_interleaved_start": (["b", "s", 32], 2, 0, 1, [1]),
    "bnsh_halves": (["b", 2, "s", 16], 0, 0, 0, ["b", "s"]),
    "bnsh_interleaved_partial": (["b", 2, "s", 16], 2, 8, 1, [1]),
}


@pytest.mark.parametrize("form", list(ROTARY))
def test_rotary_embedding(device, form):
    dims, heads, rot, inter, pdims = ROTARY[form]
    rng = np.random.default_rng(12)
    half = (rot or 16) // 2
    inits = [("cos", np.cos(rng.random((20, half))).astype(np.float32)),
             ("sin", np.sin(rng.random((20, half))).astype(np.float32))]
    attrs = {"interleaved": inter, **({"num_heads": heads} if heads else {}),
             **({"rotary_embedding_dim": rot} if rot else {})}
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, **attrs)
    ins = [_vi("x", F, dims), _vi("pos", TensorProto.INT64, pdims)]
    feeds = []
    for b, s in ((2, 5), (1, 3), (2, 1)):
        shape = [b if d == "b" else s if d == "s" else d for d in dims]
        pos = np.array([4], np.int64) if pdims == [1] else rng.integers(0, 20, (b, s))
        feeds.append({"x": _x(rng, *shape), "pos": pos})
    run_vs_ort(_model(node, ins, [_vi("y", F, None)], inits), feeds, device, RTOL, ATOL)


# ---- GroupQueryAttention --------------------------------------------------------------------
GQ_HEADS, GQ_KV, GQ_H = 4, 2, 16     # onnxruntime rotates heads of a multiple of 16


def _gqa_model(packed=False, rotary=False, **attrs):
    names = ["q", "" if packed else "k", "" if packed else "v", "pk", "pv", "sl", "tot"]
    qw = (GQ_HEADS + 2 * GQ_KV) * GQ_H if packed else GQ_HEADS * GQ_H
    ins = [_vi("q", F, ["b", "s", qw])] + ([] if packed else [_vi(n, F, ["b", "s", GQ_KV * GQ_H]) for n in "kv"]) + \
        [_vi(n, F, ["b", GQ_KV, "p", GQ_H]) for n in ("pk", "pv")] + [_vi("sl", I32, ["b"]), _vi("tot", I32, [])]
    inits = []
    if rotary:
        names += ["cos", "sin"]
        angles = np.arange(32)[:, None] * (10000.0 ** (-np.arange(GQ_H // 2) / (GQ_H // 2)))[None]
        inits = [("cos", np.cos(angles).astype(np.float32)), ("sin", np.sin(angles).astype(np.float32))]
        attrs["do_rotary"] = 1
    node = helper.make_node("GroupQueryAttention", names, ["y", "present_k", "present_v"], domain=MS,
                            num_heads=GQ_HEADS, kv_num_heads=GQ_KV, **attrs)
    return _model(node, ins, [_vi(n, F, None) for n in ("y", "present_k", "present_v")], inits)


def _gqa_feeds(steps, packed=False, seed=13):
    """steps: (batch, new tokens, past buffer length, seqlens_k, total_sequence_length)."""
    rng = np.random.default_rng(seed)
    out = []
    for b, s, p, sl, tot in steps:
        f = {"pk": _x(rng, b, GQ_KV, p, GQ_H), "pv": _x(rng, b, GQ_KV, p, GQ_H),
             "sl": np.array(sl, np.int32), "tot": np.array(tot, np.int32)}
        if packed:
            f["q"] = _x(rng, b, s, (GQ_HEADS + 2 * GQ_KV) * GQ_H)
        else:
            f.update(q=_x(rng, b, s, GQ_HEADS * GQ_H), k=_x(rng, b, s, GQ_KV * GQ_H), v=_x(rng, b, s, GQ_KV * GQ_H))
        out.append(f)
    return out


# prompts (one with right padding: seqlens below the length), decode steps over a past of
# the rows' own lengths, and over a longer shared buffer
GQA_STEPS = [(2, 5, 0, [4, 4], 5), (2, 6, 0, [5, 2], 6), (2, 1, 5, [5, 5], 6), (2, 1, 4, [4, 2], 5),
             (2, 1, 8, [4, 6], 7), (1, 3, 4, [6], 7)]


@pytest.mark.parametrize("form", ["separate", "packed", "rotary", "rotary_interleaved", "softcap", "window"])
def test_group_query_attention(device, form):
    attrs = {"softcap": {"softcap": 2.0}, "rotary_interleaved": {"rotary_interleaved": 1},
             "window": {"local_window_size": 2}}.get(form, {})
    model = _gqa_model(packed=form == "packed", rotary=form.startswith("rotary"), **attrs)
    run_vs_ort(model, _gqa_feeds(GQA_STEPS, packed=form == "packed"), device, RTOL, ATOL)


@pytest.mark.parametrize("form", ["smooth_softmax", "head_sink"])
def test_group_query_attention_sinks(device, form):
    """One more logit per head in the softmax's denominator: 0 (smooth_softmax) or head_sink's."""
    m = _gqa_model(**({"smooth_softmax": 1} if form == "smooth_softmax" else {}))
    if form == "head_sink":
        m.graph.node[0].input.extend(["", "", "", "", "sink"])
        m.graph.initializer.append(numpy_helper.from_array(np.array([0.5, -1.0, 2.0, 0.0], np.float32), "sink"))
    run_vs_ort(m, _gqa_feeds(GQA_STEPS), device, RTOL, ATOL)


def test_group_query_attention_bias(device):
    """attention_bias [B, N, S, total_sequence_length], also over a longer shared buffer."""
    m = _gqa_model()
    m.graph.node[0].input.extend(["", "", "", "ab"])
    m.graph.input.append(_vi("ab", F, ["b", GQ_HEADS, "s", "t"]))
    feeds = _gqa_feeds(GQA_STEPS)
    rng = np.random.default_rng(14)
    for f, (b, s, _, _, tot) in zip(feeds, GQA_STEPS):
        f["ab"] = _x(rng, b, GQ_HEADS, s, tot)
    run_vs_ort(m, feeds, device, RTOL, ATOL)


def test_group_query_attention_rotary_position_ids(device):
    """onnxruntime reads position_ids so: on the first prompt the first id and those after it,
    on later steps each token's."""
    m = _gqa_model(rotary=True)
    m.graph.node[0].input.extend(["pids"])
    m.graph.input.append(_vi("pids", TensorProto.INT64, ["b", "s"]))
    feeds = _gqa_feeds(GQA_STEPS)
    rng = np.random.default_rng(17)
    for f in feeds:
        f["pids"] = rng.integers(0, 30, f["q"].shape[:2])
    run_vs_ort(m, feeds, device, RTOL, ATOL)


def test_inspect_counts_the_ms_ops_as_supported(tmp_path):
    import json
    from typer.testing import CliRunner
    from dyncli.cli import app
    r = CliRunner().invoke(app, ["inspect", FIXTURE, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["unsupported"] == []
    g = helper.make_graph([helper.make_node("QOrderedGelu", ["x"], ["y"], domain=MS, name="qg")], "g",
                          [_vi("x", F, ["n"])], [_vi("y", F, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    r = CliRunner().invoke(app, ["inspect", str(tmp_path / "m.onnx"), "--json"])
    assert json.loads(r.stdout)["unsupported"] == [{"op": "com.microsoft::QOrderedGelu", "nodes": ["qg"]}]
