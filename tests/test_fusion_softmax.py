"""Softmax prologue fusion ("Add + Softmax input"): the scale and mask ops feeding a
Softmax are applied on every read of its input, and the node unfuses for shapes whose mask
broadcast would grow the scores. Every run is compared with onnxruntime. The attention models
are built with attention=False here so the Softmax runs on its own (tests/test_attention.py
covers the whole chain as one kernel, with this prologue inside)."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from engine import Network, build_program
from tests.conftest import run_vs_ort
from tests.models import encoder_block, masked_attention
from traces import MemoryTrace

H, DH = 2, 8


def _feeds(rng, qb, s, l, mask_shape):
    q = rng.standard_normal((qb, H, s, DH)).astype(np.float32)
    k, v = (rng.standard_normal((qb, H, l, DH)).astype(np.float32) for _ in range(2))
    # mostly kept (0), some masked (-10000), plus noise so every mask element matters
    mask = np.where(rng.random(mask_shape) > 0.25, 0.0, -10000.0) + \
        0.5 * rng.standard_normal(mask_shape)
    return {"q": q, "k": k, "v": v, "mask": mask.astype(np.float32)}


def _run(model, shapes, mask_shape, device, impls="dynamic", seed=0):
    """Run (qb, s, l, mb) shapes; mask_shape(qb, s, l, mb) gives the mask's dims."""
    rng = np.random.default_rng(seed)
    seq = [_feeds(rng, qb, s, l, mask_shape(qb, s, l, mb)) for qb, s, l, mb in shapes]
    trace = MemoryTrace()
    net = Network(build_program(model, attention=False), device, trace=trace, impls=impls)
    run_vs_ort(model, seq, device, rtol=2e-4, atol=2e-5, net=net)
    return net, trace


def _enqueued(trace, i):
    return {e["node"] for e in trace.of(i, "execute", "enqueue")}


# mask dims as declared in the model, and its shape for (qb, s, l, mb)
MASKS = {
    "keys_per_batch": (("mb", 1, 1, "l"), lambda qb, s, l, mb: (mb, 1, 1, l)),
    "causal_shared": ((1, 1, "s", "l"), lambda qb, s, l, mb: (1, 1, s, l)),
    "per_batch_query": (("mb", 1, "s", "l"), lambda qb, s, l, mb: (mb, 1, s, l)),
    "full": (("mb", H, "s", "l"), lambda qb, s, l, mb: (mb, H, s, l)),
    "rank2": (("s", "l"), lambda qb, s, l, mb: (s, l)),
    "rank1": (("l",), lambda qb, s, l, mb: (l,)),
}


def test_attention_chain_is_a_softmax_prologue():
    prog = build_program(masked_attention(), attention=False)
    by_name = {n.name: n for n in prog.nodes}
    sm = by_name["Softmax"]
    f = sm.fusion
    assert f.prologue and f.names() == ["Mul_scale", "Add_mask"]
    assert f.base == by_name["MatMul_scores"].outputs[0]
    # the scale, one value, is written into the kernel: only the mask is read
    assert f.extra == ["mask"]
    (k0, _), (k1, (literal, _)) = f.ops[0].operands
    assert (k0, k1) == ("v", "c") and np.float32(literal.strip("()f")) == np.float32(1 / np.sqrt(8))
    assert by_name["Add_mask"].fused_into is sm and by_name["Mul_scale"].fused_into is sm
    # the scores MatMul keeps no epilogue: its output is the prologue's base
    assert by_name["MatMul_scores"].fusion is None
    assert prog.fused == 2


@pytest.mark.parametrize("mask", sorted(MASKS))
def test_masked_attention_fused_for_every_mask_broadcast(device, mask):
    dims, shape = MASKS[mask]
    shapes = [(1, 4, 6, 1), (2, 5, 9, 2), (2, 5, 9, 2), (2, 3, 11, 1)]
    if "mb" not in dims:
        shapes = [(qb, s, l, 1) for qb, s, l, _ in shapes]
    _, trace = _run(masked_attention(mask_dims=dims), shapes, shape, device)
    for i in range(len(shapes)):
        assert not trace.of(i, "fusion", "unfuse")
        ran = _enqueued(trace, i)
        assert "Softmax" in ran and not ran & {"Add_mask", "Mul_scale"}
    impls = {e["impl"] for e in trace.events if e["kind"] == "update_impl" and e["node"] == "Softmax"}
    assert impls == {"norm:Softmax+prologue"}


def test_prologue_unfuses_when_the_mask_grows_the_scores(device):
    # scores [qb, H, s, l] + mask [mb, 1, s, l]: with mb > qb the sum is [mb, H, s, l], larger
    # than the scores the fused Softmax reads
    dims, shape = MASKS["per_batch_query"]
    shapes = [(2, 4, 6, 2), (1, 4, 6, 3), (1, 4, 6, 1), (3, 5, 7, 1), (1, 5, 7, 2)]
    _, trace = _run(masked_attention(mask_dims=dims), shapes, shape, device, seed=3)
    for i, (qb, s, l, mb) in enumerate(shapes):
        unfuse = [(e["node"], e["reason"], e["ops"], e["position"])
                  for e in trace.of(i, "fusion", "unfuse")]
        ran = _enqueued(trace, i)
        if mb > qb:
            assert unfuse == [("Softmax", "broadcast_grows_input", ["Mul_scale", "Add_mask"],
                               "prologue")]
            assert {"Mul_scale", "Add_mask", "Softmax"} <= ran
            # the unfused Softmax runs the plain kernel on the materialised sum
            impls = {e["impl"] for e in trace.of(i, "update_impl") if e["node"] == "Softmax"}
            assert impls <= {"norm:Softmax"}
        else:
            assert not unfuse and "Softmax" in ran and not ran & {"Mul_scale", "Add_mask"}
    assert trace.of(1, "update_impl") and any(
        e["impl"] == "norm:Softmax" for e in trace.of(1, "update_impl") if e["node"] == "Softmax")


@pytest.mark.parametrize("scale_op,mask_first", [("Div", True), ("Mul", True), ("Div", False)])
def test_prologue_keeps_operand_order_and_finds_the_scores(device, scale_op, mask_first):
    """Sub/Div are not commutative and the mask may come first: the base is still the scores."""
    model = masked_attention(scale_op=scale_op, mask_first=mask_first)
    prog = build_program(model)
    sm = next(n for n in prog.nodes if n.op == "Softmax")
    mm = next(n for n in prog.nodes if n.name == "MatMul_scores")
    assert sm.fusion.prologue and sm.fusion.base == mm.outputs[0]
    assert sm.fusion.names() == [f"{scale_op}_scale", "Add_mask"]
    dims, shape = MASKS["keys_per_batch"]
    _, trace = _run(model, [(2, 3, 5, 2), (1, 6, 4, 1)], shape, device, seed=5)
    assert all(not _enqueued(trace, i) & {"Add_mask", f"{scale_op}_scale"} for i in range(2))


@pytest.mark.parametrize("mask", ["causal_shared", "keys_per_batch"])
def test_prologue_with_flattened_softmax_axis(device, mask):
    """Opset 11 Softmax normalises the flattened tail [s, l] from axis 2: a mask broadcast
    along s is not linear along that row, so its offsets are computed per read."""
    dims, shape = MASKS[mask]
    model = masked_attention(mask_dims=dims, axis=2, opset=11)
    assert next(n for n in build_program(model).nodes if n.op == "Softmax").fusion.prologue
    _run(model, [(1, 3, 4, 1), (2, 5, 6, 2), (2, 1, 6, 2)], shape, device, seed=6)


def test_static_softmax_applies_the_prologue(device):
    """--impls static: the static Softmax bakes the mask's dims into its table, prologue included."""
    dims, shape = MASKS["keys_per_batch"]
    _, trace = _run(masked_attention(mask_dims=dims), [(2, 4, 6, 2), (1, 3, 7, 1), (2, 4, 6, 2)],
                    shape, device, impls="static", seed=7)
    names = {e["impl"] for e in trace.events
             if e["kind"] == "update_impl" and e["node"] == "Softmax" and e.get("impl_kind") == "static"}
    assert names and all(n.startswith("norm:Softmax+prologue/static") for n in names)
    assert all(not _enqueued(trace, i) & {"Add_mask", "Mul_scale"} for i in range(3))


def _add_softmax(add_is_output: bool):
    """y = Softmax(x + m); with add_is_output the sum is a graph output too."""
    nodes = [helper.make_node("Add", ["x", "m"], ["s"], name="Add_m"),
             helper.make_node("Softmax", ["s"], ["y"], name="Softmax", axis=-1)]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if add_is_output:
        outs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "add_softmax",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "n"]),
                           helper.make_tensor_value_info("m", TensorProto.FLOAT, ["mb", "n"])], outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("add_is_output", [False, True])
def test_add_softmax_on_graph_inputs(device, add_is_output):
    """A sum that is also a graph output must be materialised: no prologue then."""
    model = _add_softmax(add_is_output)
    sm = next(n for n in build_program(model).nodes if n.op == "Softmax")
    assert (sm.fusion is None) == add_is_output
    rng = np.random.default_rng(9)
    seq = [{"x": rng.standard_normal((b, n)).astype(np.float32),
            "m": rng.standard_normal((mb, n)).astype(np.float32)}
           for b, n, mb in [(3, 5, 1), (3, 5, 3), (1, 7, 2)]]
    trace = MemoryTrace()
    net = Network(build_program(model), device, trace=trace, impls="dynamic")
    run_vs_ort(model, seq, device, net=net)
    if not add_is_output:   # [1, 7] + [2, 7] grows the input: unfused for the last inference
        assert [e["reason"] for e in trace.of(2, "fusion", "unfuse")] == ["broadcast_grows_input"]
        assert not trace.of(1, "fusion", "unfuse")


def test_encoder_block_softmax_gets_the_scale_and_mask(device):
    model = encoder_block()
    prog = build_program(model)
    sm = next(n for n in prog.nodes if n.op == "Softmax")
    assert sm.fusion.prologue and [o.node.op for o in sm.fusion.ops] == ["Div", "Add"]
    assert prog.producers[sm.fusion.base][0].op == "MatMul"
    rng = np.random.default_rng(10)
    seq = [{"x": rng.standard_normal((b, s, 64)).astype(np.float32),
            "mask": (rng.random((b, s)) > 0.2).astype(np.float32)} for b, s in [(1, 5), (3, 9)]]
    trace = MemoryTrace()
    net = Network(prog, device, trace=trace, impls="dynamic")
    run_vs_ort(model, seq, device, rtol=2e-4, atol=2e-5, net=net)
    fused = {o.node.name for o in sm.fusion.ops}
    assert all(not _enqueued(trace, i) & fused for i in range(2))
    assert not [e for e in trace.events if e["kind"] == "fusion"]


def test_no_prologue_through_a_non_float_constant():
    """Pow with an int64 exponent: the fused kernel reads f32 operands only, so the chain stops
    before it (program level only: the chain never reaches the device)."""
    from onnx import numpy_helper
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"], name="Pow_int"),
             helper.make_node("Add", ["p", "m"], ["s"], name="Add_m"),
             helper.make_node("Softmax", ["s"], ["y"], name="Softmax", axis=-1)]
    g = helper.make_graph(nodes, "pow_softmax",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4]),
                           helper.make_tensor_value_info("m", TensorProto.FLOAT, ["b", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])],
                          [numpy_helper.from_array(np.array(2, np.int64), "two")])
    prog = build_program(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    sm = next(n for n in prog.nodes if n.op == "Softmax")
    assert sm.fusion.names() == ["Add_m"] and sm.fusion.base == "p"


def test_prologue_without_extra_operands(device):
    """Softmax(x + x): both operands are the base value, so the prologue has no extra inputs."""
    nodes = [helper.make_node("Add", ["x", "x"], ["s"], name="Add_xx"),
             helper.make_node("Softmax", ["s"], ["y"], name="Softmax", axis=-1)]
    g = helper.make_graph(nodes, "double_softmax",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 5])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sm = next(n for n in build_program(model).nodes if n.op == "Softmax")
    assert sm.fusion.extra == [] and sm.fusion.ops[0].operands == [("v", 0), ("v", 0)]
    rng = np.random.default_rng(11)
    run_vs_ort(model, [{"x": rng.standard_normal((b, 5)).astype(np.float32)} for b in (2, 3)],
               device)


def _where_masked(keep_first: bool):
    """softmax(Where(m, scores * 0.25, -3.4e38)) @ v (keep_first) or softmax(Where(m, -3.4e38,
    scores * 0.25)) @ v (m says what is masked): the mask chain of HF GPT-2 exports, with a bool
    condition m [mb, 1, s, l] that broadcasts against the scores."""
    F, B = TensorProto.FLOAT, TensorProto.BOOL
    low = helper.make_tensor("low", F, [], [float(np.finfo(np.float32).min)])
    quarter = helper.make_tensor("quarter", F, [], [0.25])
    ins = ["m", "sc", "low"] if keep_first else ["m", "low", "sc"]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "quarter"], ["sc"]),
             helper.make_node("Where", ins, ["w"]),
             helper.make_node("Softmax", ["w"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "where_mask",
                          [vi("q", F, ["b", H, "s", DH]), vi("k", F, ["b", H, "l", DH]),
                           vi("v", F, ["b", H, "l", DH]), vi("m", B, ["mb", 1, "ms", "l"])],
                          [vi("y", F, None)], [low, quarter])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("keep_first", [True, False])
def test_a_where_mask_runs_in_the_attention(device, keep_first):
    """Where(bool mask, scores, finfo.min) joins the Softmax's prologue (its condition read as
    bool) and the attention becomes one kernel, on both kernel variants; a mask whose batch grows
    the scores unfuses for that inference. Against onnxruntime."""
    from engine.fusion import fusion_map
    model = _where_masked(keep_first)
    prog = build_program(model)
    att = [v for v in fusion_map(prog).values() if v["position"] == "subgraph"]
    assert len(att) == 1
    rng = np.random.default_rng(3)
    shapes = [(1, 1, 5, 1, 1), (2, 3, 7, 2, 3), (1, 4, 4, 1, 1), (1, 2, 9, 3, 2)]   # b, s, l, mb, ms
    seq = []
    for b, s, l, mb, ms in shapes:
        f = _feeds(rng, b, s, l, (1,))
        f.pop("mask")
        m = rng.random((mb, 1, ms, l)) > 0.3
        m[..., 0] = True if keep_first else False       # a row keeps at least one key
        f["m"] = m
        seq.append(f)
    for kind in ("cpu", "gpu"):
        trace = MemoryTrace()
        net = Network(prog, device, trace=trace, impls="dynamic")
        net.impls.device_type = kind
        run_vs_ort(model, seq, device, rtol=2e-4, atol=2e-5, net=net)
        for i, (b, s, l, mb, ms) in enumerate(shapes):
            unfused = bool(trace.of(i, "fusion", "unfuse"))
            assert unfused == (mb > b), (kind, i)
