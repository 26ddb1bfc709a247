"""Fused attention (engine/attention_fusion.py): QK^T, scale, mask, Softmax and x V run as one kernel
that keeps the scores out of global memory; the unfused nodes run for shapes it does not take,
and the trace says why. Both kernel variants (a work-item per query row for CPUs, a work-group
per row for GPUs) run here on the suite's device: `net.impls.device_type` picks the variant."""
import numpy as np
import pytest

from engine import Network, build_program
from engine.fusion import fusion_map
from engine.ops.attention import ATT_WG, MAX_D, MAX_L
from tests.conftest import run_vs_ort
from tests.models import encoder_block, kv_decoder_step, masked_attention
from traces import MemoryTrace

H = 2


def _feeds(rng, qb, s, l, dh, mask_shape=None):
    q = rng.standard_normal((qb, H, s, dh)).astype(np.float32)
    k, v = (rng.standard_normal((qb, H, l, dh)).astype(np.float32) for _ in range(2))
    mask = np.where(rng.random(mask_shape or (qb, 1, 1, l)) > 0.25, 0.0, -10000.0) + \
        0.5 * rng.standard_normal(mask_shape or (qb, 1, 1, l))
    return {"q": q, "k": k, "v": v, "mask": mask.astype(np.float32)}


def _net(model, device, kind, attention=True):
    trace = MemoryTrace()
    net = Network(build_program(model, attention=attention), device, trace=trace, impls="dynamic")
    net.impls.device_type = kind
    return net, trace


def _enqueued(trace, i):
    return {e["node"] for e in trace.of(i, "execute", "enqueue")}


def test_attention_chain_becomes_one_internal_node():
    prog = build_program(masked_attention())
    by = {n.name: n for n in prog.nodes}
    att = by["Softmax_attention"]
    assert att.op == "attention" and att.opdef.internal and att.opdef.padded_ok
    assert att.fusion.position == "subgraph"
    assert att.fusion.names() == ["Transpose_0", "MatMul_scores", "Softmax", "MatMul_ctx"]
    # q, k before its Transpose, v, then the Softmax prologue's mask (its scale, one value, is
    # written into the kernel)
    assert att.inputs == ["q", "k", "v", "mask"]
    assert att.attrs["perms"] == (None, (0, 1, 3, 2), None) and att.outputs == ["y"]
    assert att.attrs["out_perm"] is None
    assert all(by[n].fused_into is att for n in att.fusion.names())
    # the scale and mask stay in the Softmax's prologue (run so when the attention unfuses)
    assert by["Mul_scale"].fused_into is by["Softmax"]
    assert prog.producers["y"][0] is att
    assert fusion_map(prog)["Softmax_attention"] == {
        "position": "subgraph", "ops": ["Transpose_0", "MatMul_scores", "Softmax", "MatMul_ctx"]}


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_fused_attention_matches_ort_across_sizes(device, kind):
    """One Network, the key length crossing the GPU work-group (ATT_WG) and the limit (MAX_L),
    the batch and query length changing (GPU: attention_dec up to s 4, one row per work-group of
    attention_wg up to s 16, blocks of rows past it): fused where it fits, unfused (seq_too_long)
    past it."""
    model = masked_attention(d_head=8)
    rng = np.random.default_rng(1)
    shapes = [(1, 1, 1), (2, 5, ATT_WG - 1), (1, 3, ATT_WG), (2, 4, ATT_WG + 1), (1, 7, 131),
              (1, 2, MAX_L), (1, 2, MAX_L + 1), (2, 3, 9), (2, 40, 70)]
    net, trace = _net(model, device, kind)
    run_vs_ort(model, [_feeds(rng, qb, s, l, 8) for qb, s, l in shapes], device, rtol=2e-4,
               atol=2e-5, net=net)
    for i, (_, _, l) in enumerate(shapes):
        unfuse = [(e["node"], e["reason"], e["position"]) for e in trace.of(i, "fusion", "unfuse")]
        ran = _enqueued(trace, i)
        if l > MAX_L:
            assert unfuse == [("Softmax_attention", "seq_too_long", "subgraph")]
            # the unfused Softmax still takes the scale and mask as its prologue
            assert {"Transpose_0", "MatMul_scores", "Softmax", "MatMul_ctx"} <= ran
            assert not ran & {"Mul_scale", "Add_mask"}
        else:
            assert not unfuse and ran == {"Softmax_attention"}
    impl = "attention:attention+prologue"
    assert any(e.get("impl") == impl for e in trace.events if e["kind"] == "update_impl")


@pytest.mark.parametrize("dh", sorted({3, ATT_WG // 2 + 5, min(ATT_WG + 5, MAX_D), MAX_D}))
def test_head_sizes_around_the_work_group(device, dh):
    """Dv below, around and at the limit of the GPU kernel's lanes (above them when MAX_D
    allows): the (d, keys) split changes."""
    model = masked_attention(d_head=dh, scale_op="Div", mask_first=True)
    rng = np.random.default_rng(2)
    for kind in ("cpu", "gpu"):
        net, trace = _net(model, device, kind)
        run_vs_ort(model, [_feeds(rng, 1, 3, 17, dh), _feeds(rng, 2, 1, 70, dh)], device,
                   rtol=2e-4, atol=2e-5, net=net)
        assert not [e for e in trace.events if e["kind"] == "fusion"]


def test_unfuse_reasons(device):
    """A head over MAX_D, and a mask that grows the scores' batch (the prologue's own reason)."""
    model = masked_attention(d_head=MAX_D + 1)
    rng = np.random.default_rng(3)
    net, trace = _net(model, device, "cpu")
    run_vs_ort(model, [_feeds(rng, 1, 2, 5, MAX_D + 1)], device, rtol=2e-4, atol=2e-5, net=net)
    assert [e["reason"] for e in trace.of(0, "fusion", "unfuse")] == ["head_too_large"]

    model = masked_attention(mask_dims=("mb", 1, "s", "l"))
    net, trace = _net(model, device, "gpu")
    seq = [_feeds(rng, 1, 3, 6, 8, (2, 1, 3, 6)), _feeds(rng, 2, 3, 6, 8, (2, 1, 3, 6))]
    run_vs_ort(model, seq, device, rtol=2e-4, atol=2e-5, net=net)
    assert [(e["node"], e["reason"]) for e in trace.of(0, "fusion", "unfuse")] == [
        ("Softmax_attention", "broadcast_grows_input"), ("Softmax", "broadcast_grows_input")]
    assert not trace.of(1, "fusion", "unfuse") and _enqueued(trace, 1) == {"Softmax_attention"}


def test_fused_equals_unfused(device):
    model = masked_attention(d_head=16, mask_dims=(1, 1, "s", "l"))
    rng = np.random.default_rng(4)
    feeds = [_feeds(rng, qb, s, l, 16, (1, 1, s, l)) for qb, s, l in [(2, 9, 33), (1, 16, 16)]]
    for kind in ("cpu", "gpu"):
        fused, _ = _net(model, device, kind)
        plain, trace = _net(model, device, kind, attention=False)
        for f in feeds:
            a, b = fused.infer(f)["y"], plain.infer(f)["y"]
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert "MatMul_scores" in _enqueued(trace, 0)


@pytest.mark.parametrize("vocab", [None, 50])
def test_encoder_attention_is_one_kernel(device, vocab):
    """encoder_block (HF-BERT export style: Div by sqrt of a Shape-derived size, mask
    [b, 1, 1, s], Transpose of K): attention, embeddings Add chain + LayerNorm fused."""
    model = encoder_block(vocab=vocab)
    prog = build_program(model)
    fm = fusion_map(prog)
    att = [v for v in fm.values() if v["position"] == "subgraph"]
    # q's heads split (the scale's Shape(q) read folds to a constant: engine/static_dims.py),
    # k's heads split and k^T, v's heads split, the chain, the heads merge of the context
    assert len(att) == 1 and [o.split("_")[0] for o in att[0]["ops"]] == \
        ["Transpose"] * 4 + ["MatMul", "Softmax", "MatMul", "Transpose"]
    sm = [v for n, v in fm.items() if n.startswith("Softmax") and v["position"] == "prologue"]
    assert [[o.split("_")[0] for o in v["ops"]] for v in sm] == [["Div", "Add"]]
    lns = {n: v for n, v in fm.items() if n.startswith("LayerNormalization")}
    # the embeddings' word + type + position sum runs in the LayerNorm's reads; the other two
    # LayerNorms follow a MatMul whose epilogue already adds the bias and the residual
    assert lns == ({} if vocab is None else
                   {"LayerNormalization_0": {"position": "prologue", "ops": ["Add_0", "Add_1"]}})
    rng = np.random.default_rng(5)
    if vocab is None:
        seq = [{"x": rng.standard_normal((b, s, 64)).astype(np.float32),
                "mask": (rng.random((b, s)) > 0.2).astype(np.float32)} for b, s in [(1, 5), (3, 9), (1, 5)]]
    else:
        seq = [{"input_ids": rng.integers(0, vocab, (b, s)).astype(np.int64),
                "attention_mask": (rng.random((b, s)) > 0.2).astype(np.int64)}
               for b, s in [(1, 5), (3, 9), (1, 5)]]
    for kind in ("cpu", "gpu"):
        net, trace = _net(model, device, kind)
        run_vs_ort(model, seq, device, rtol=2e-4, atol=5e-5, net=net)
        assert not [e for e in trace.events if e["kind"] == "fusion"]
        # kernels per inference: the QKV GEMM (one, packed: engine/packed_projections.py),
        # attention (q's heads split Transpose too: the scale's Shape(q) folds,
        # engine/static_dims.py), 3 GEMMs, 2 LayerNorms, the mask's Sub(*-10000) (+ embeddings:
        # the word, type and position Gathers (rows of a table by the length run on the device
        # too: engine/fusion.py embedding_rows), the mask's Cast, Equal and Where, a LayerNorm)
        want = 8 if vocab is None else 14
        assert [e["counters"]["kernels"] for e in trace.events if e["kind"] == "infer_end"] == [want] * 3


def _kv_net(device, kind):
    """kv_decoder_step with its KV caches fed back: (network, its trace, onnxruntime's session,
    the output names)."""
    from tests.conftest import ort_session
    model = kv_decoder_step()
    trace = MemoryTrace()
    net = Network(build_program(model), device, trace=trace, impls="dynamic",
                  feedback={"present_k": "past_k", "present_v": "past_v"})
    net.impls.device_type = kind
    sess = ort_session(model)
    return net, trace, sess, [o.name for o in sess.get_outputs()]


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_kv_decoder_reads_the_padded_cache_in_place(device, kind):
    """Mul by a constant scale, K and V from KV-cache concats fed back on the device: the
    attention reads the padded buffers (room along the sequence axis) with their strides."""
    from tests.conftest import assert_close
    net, trace, sess, names = _kv_net(device, kind)
    rng = np.random.default_rng(6)
    past = {n: np.zeros((1, 2, 0, 16), np.float32) for n in ("past_k", "past_v")}
    for step in range(12):
        new = 3 if step == 0 else 1     # a prompt, then decoding
        feeds = {"x": rng.standard_normal((1, new, 32)).astype(np.float32), **past}
        outs = net.infer(feeds, fed_back={"past_k": "present_k", "past_v": "present_v"} if step else {})
        ref = dict(zip(names, sess.run(None, feeds)))
        for name in names:
            assert_close(outs[name], ref[name], 2e-4, 2e-5, f"step {step} {name}")
        past = {"past_k": ref["present_k"], "past_v": ref["present_v"]}
        assert "Softmax_0_attention" in _enqueued(trace, step)
        assert not trace.of(step, "fusion", "unfuse")
    appends = [e for e in trace.events if e["kind"] == "kv_cache" and e["action"] == "append"]
    assert len(appends) >= 2 * 8


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
@pytest.mark.parametrize("fits", [None, 5])
def test_the_attention_appends_the_kv_caches(device, kind, fits, monkeypatch):
    """The KV-cache concats leave their new entries to the fused attention, which reads them
    from the new tensors and writes them into the caches: no append kernel of their own. With
    `fits` (the attention kernel taking at most that many keys), longer steps run the unfused
    subgraph, which reads the caches whole: the attention copies the new entries in first. Two
    sequences (the second restarts from an empty past, not fed back), against onnxruntime."""
    from tests.conftest import assert_close
    if fits is not None:
        monkeypatch.setattr("engine.attention_fusion.MAX_L", fits)
    net, trace, sess, names = _kv_net(device, kind)
    rng = np.random.default_rng(7)
    it = -1
    for seq in range(2):
        past = {n: np.zeros((1, 2, 0, 16), np.float32) for n in ("past_k", "past_v")}
        for step in range(7):
            it += 1
            new = 2 + seq if step == 0 else 1
            feeds = {"x": rng.standard_normal((1, new, 32)).astype(np.float32), **past}
            outs = net.infer(feeds, fed_back={"past_k": "present_k", "past_v": "present_v"} if step else {})
            ref = dict(zip(names, sess.run(None, feeds)))
            for name in names:
                assert_close(outs[name], ref[name], 2e-4, 2e-5, f"sequence {seq} step {step} {name}")
            past = {"past_k": ref["present_k"], "past_v": ref["present_v"]}
            kv = trace.of(it, "kv_cache")
            assert [e["by"] for e in kv] == ["Softmax_0_attention"] * 2
            unfused = bool(trace.of(it, "fusion", "unfuse"))
            assert unfused == (fits is not None and past["past_k"].shape[2] > fits)
            kernels = {e["node"]: e["kernels"] for e in trace.of(it, "execute", "enqueue")}
            in_place = {e["node"] for e in trace.of(it, "execute", "skip") if e["reason"] == "in_place"}
            for e in kv:     # an append enqueues nothing (the attention writes); a copy, the past's
                if e["action"] == "append" or step == 0:
                    assert e["node"] in in_place and e["node"] not in kernels
                else:
                    assert kernels[e["node"]] == 1
            assert kernels["Softmax_0_attention"] == (2 if unfused else 1)


def _single_head(axis=-1, opset=17):
    """softmax(q @ k^T / 4 + mask) @ v on rank-3 tensors [b, s, d] (one head, perm [0, 2, 1])."""
    from onnx import TensorProto, helper, numpy_helper
    F = TensorProto.FLOAT
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], name="Transpose_k", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="MatMul_scores"),
             helper.make_node("Div", ["s", "four"], ["sd"], name="Div_scale"),
             helper.make_node("Add", ["sd", "mask"], ["sm"], name="Add_mask"),
             helper.make_node("Softmax", ["sm"], ["p"], name="Softmax", axis=axis),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="MatMul_ctx")]
    vi = lambda n, d: helper.make_tensor_value_info(n, F, d)  # noqa: E731
    g = helper.make_graph(nodes, "single_head",
                          [vi("q", ["b", "s", 16]), vi("k", ["b", "l", 16]), vi("v", ["b", "l", 16]),
                           vi("mask", ["mb", 1, "l"])], [vi("y", None)],
                          [numpy_helper.from_array(np.array(4.0, np.float32), "four")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_rank3_single_head(device, kind):
    """[b, s, d] tensors are one head; a mask [b, 1, l] broadcasts against the scores [b, s, l]."""
    model = _single_head()
    prog = build_program(model)
    att = next(n for n in prog.nodes if n.op == "attention")
    assert att.attrs["perms"] == (None, (0, 2, 1), None) and att.fusion.names()[0] == "Transpose_k"
    rng = np.random.default_rng(7)
    seq = []
    for b, s, l in [(2, 3, 5), (3, 1, 70), (1, 4, 4)]:
        f = {n: rng.standard_normal((b, s if n == "q" else l, 16)).astype(np.float32) for n in "qkv"}
        f["mask"] = np.where(rng.random((b, 1, l)) > 0.3, 0.0, -1e4).astype(np.float32)
        seq.append(f)
    net, trace = _net(model, device, kind)
    run_vs_ort(model, seq, device, rtol=2e-4, atol=2e-5, net=net)
    assert not [e for e in trace.events if e["kind"] == "fusion"]
    assert all(_enqueued(trace, i) == {att.name} for i in range(3))


def test_softmax_not_over_the_keys_unfuses(device):
    """Softmax axis 2 of rank-4 scores normalises over the queries: matched at program build
    (axis 2 is the last of rank-3 scores) but unfused at run time; axis 1 is never matched."""
    assert not [n for n in build_program(_single_head(axis=1)).nodes if n.op == "attention"]
    model = masked_attention(axis=2)
    rng = np.random.default_rng(8)
    net, trace = _net(model, device, "cpu")
    run_vs_ort(model, [_feeds(rng, 2, 3, 5, 8)], device, rtol=2e-4, atol=2e-5, net=net)
    assert [e["reason"] for e in trace.of(0, "fusion", "unfuse")] == ["softmax_axis"]


def test_absorbed_transposes_any_perm(device):
    """q arrives as [b, s, h, d] (a heads split absorbed), k^T as a tensor (no Transpose), and the
    context leaves through perm [0, 3, 1, 2] (d no longer innermost: strided stores)."""
    from onnx import TensorProto, helper
    F = TensorProto.FLOAT
    nodes = [helper.make_node("Transpose", ["qi"], ["q"], name="Transpose_q", perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="MatMul_scores"),
             helper.make_node("Softmax", ["s"], ["p"], name="Softmax", axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["c"], name="MatMul_ctx"),
             helper.make_node("Transpose", ["c"], ["y"], name="Transpose_y", perm=[0, 3, 1, 2])]
    vi = lambda n, d: helper.make_tensor_value_info(n, F, d)  # noqa: E731
    g = helper.make_graph(nodes, "perms", [vi("qi", ["b", "s", 2, 8]), vi("kt", ["b", 2, 8, "l"]),
                                           vi("v", ["b", 2, "l", 8])], [vi("y", None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    att = next(n for n in build_program(model).nodes if n.op == "attention")
    assert att.attrs["perms"] == ((0, 2, 1, 3), None, None) and att.attrs["out_perm"] == (0, 3, 1, 2)
    assert att.inputs == ["qi", "kt", "v"] and att.outputs == ["y"]
    rng = np.random.default_rng(9)
    seq = [{"qi": rng.standard_normal((b, s, 2, 8)).astype(np.float32),
            "kt": rng.standard_normal((b, 2, 8, l)).astype(np.float32),
            "v": rng.standard_normal((b, 2, l, 8)).astype(np.float32)} for b, s, l in [(2, 3, 5), (1, 9, 12)]]
    for kind in ("cpu", "gpu"):
        net, trace = _net(model, device, kind)
        run_vs_ort(model, seq, device, rtol=2e-4, atol=2e-5, net=net)
        assert all(_enqueued(trace, i) == {att.name} for i in range(2))


def _sdpa_export_pattern():
    """torch.export's scaled_dot_product_attention: q and k^T each times sqrt(scale), the mask
    added, softmax, Where(IsNaN(p), 0, p), times v (q, k, v, mask: graph inputs)."""
    from onnx import TensorProto, helper, numpy_helper
    c = numpy_helper.from_array(np.array(0.5, np.float32), "c")
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("Mul", ["q", "c"], ["qs"]), helper.make_node("Mul", ["kt", "c"], ["ks"]),
             helper.make_node("MatMul", ["qs", "ks"], ["scores"]),
             helper.make_node("Add", ["scores", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
             helper.make_node("IsNaN", ["p"], ["nan"]), helper.make_node("Where", ["nan", "zero", "p"], ["pg"]),
             helper.make_node("MatMul", ["pg", "v"], ["y"])]
    vi = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    g = helper.make_graph(nodes, "sdpa", [vi("q", ["b", H, "s", 8]), vi("k", ["b", H, "l", 8]),
                                          vi("v", ["b", H, "l", 8]), vi("mask", ["b", 1, "s", "l"])],
                          [vi("y", ["b", H, "s", 8])], [c, zero])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_torch_export_sdpa_pattern_fuses_with_scale_and_nan_guard(device, kind):
    """The operand scales fold into one factor (0.5 * 0.5) and the NaN guard runs in the kernel:
    a query row whose keys are all masked with -inf, or with a +inf score (softmax NaN), gets a
    context of 0, as the unfused Where makes it; onnxruntime agrees across shapes."""
    model = _sdpa_export_pattern()
    net, trace = _net(model, device, kind)
    att = next(n for n in net.program.nodes if n.op == "attention")
    assert att.attrs["scale"] == 0.25 and att.attrs["nan_guard"]
    assert {"Mul", "IsNaN", "Where"} <= {o.node.op for o in att.fusion.ops}
    rng = np.random.default_rng(3)
    seq = []
    for b, s, l in [(1, 4, 6), (2, 3, 70), (1, 4, 6), (2, 1, 9)]:
        f = _feeds(rng, b, s, l, 8, (b, 1, s, l))
        f["mask"][0, 0, 0, :] = -np.inf               # every key of one query row masked
        if s > 1:
            f["mask"][-1, 0, -1, 0] = np.inf          # a +inf score: that row's softmax is NaN too
        seq.append(f)
    run_vs_ort(model, seq, device, rtol=2e-4, atol=2e-5, net=net)
    outs = net.infer(seq[0])
    assert np.all(outs["y"][0, :, 0, :] == 0.0) and np.all(outs["y"][-1, :, -1, :] == 0.0)
    assert np.ptp(outs["y"]) > 0
    assert all(_enqueued(trace, i) == {att.name} for i in range(len(seq)))
