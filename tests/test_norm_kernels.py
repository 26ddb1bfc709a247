"""LayerNormalization and Softmax row kernels against onnxruntime: the CPU variant (a work-item
per row) and the GPU variant (row_lanes lanes per row, NORM_WG / lanes rows per work-group), both
run on the suite's device (`net.impls.device_type` picks the variant), over rows and row lengths that
cross the lanes and rows-per-group sizes, shapes changing on one Network; and LayerNormalization
with the residual Add before it as a prologue (engine/fusion.py)."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from engine import Network, build_program
from engine.fusion import fusion_map
from engine.ops.norm import NORM_WG, row_lanes
from tests.conftest import run_vs_ort
from traces import MemoryTrace

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, opset=17):
    g = helper.make_graph(nodes, "norm", [helper.make_tensor_value_info(n, F, d) for n, d in inputs],
                          [helper.make_tensor_value_info(n, F, None) for n in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _net(model, device, kind):
    trace = MemoryTrace()
    net = Network(build_program(model), device, trace=trace, impls="dynamic")
    net.impls.device_type = kind
    return net, trace


def _shapes():
    """(rows, d): d = 1, lanes-per-row boundaries (8 * lanes +- 1), 384, 768, primes and a row
    longer than the GPU kernel holds in registers (ROW_PER_LANE * NORM_WG = 1024); rows
    = 1 and around rows-per-group for that d."""
    out = []
    for d in (1, 7, 8, 9, 63, 64, 65, 383, 384, 768, 1021, 1031):   # 1031: over 8 x 128
        per = NORM_WG // row_lanes(d)
        out += [(1, d), (per + 1, d)] + ([(per - 1, d)] if per > 1 else [])
    return out + [(37, 384), (128, 384)]


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_layer_norm_rows(device, kind):
    model = _model([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)],
                   [("x", ["r", "d"]), ("s", ["d"]), ("b", ["d"])], ["y"])
    rng = np.random.default_rng(0)
    seq = [{"x": (3 + 2 * rng.standard_normal((r, d))).astype(np.float32),
            "s": rng.uniform(0.5, 1.5, d).astype(np.float32),
            "b": rng.standard_normal(d).astype(np.float32)} for r, d in _shapes()]
    for f in seq[:3]:   # d = 1: the normalised value is 0 for every row, the output is the bias
        f["x"][:, 0] += np.arange(f["x"].shape[0], dtype=np.float32)
    net, _ = _net(model, device, kind)
    run_vs_ort(model, seq, device, rtol=1e-4, atol=2e-5, net=net, check_nonconstant=False)
    want = "layer_norm_wg" if kind == "gpu" else "layer_norm"
    assert [b.call.kernel for i in net.insts for b in i.bound] == [want]


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_softmax_rows(device, kind):
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", ["r", "d"])], ["y"])
    rng = np.random.default_rng(1)
    seq = [{"x": (4 * rng.standard_normal((r, d))).astype(np.float32)} for r, d in _shapes() if d > 1]
    net, _ = _net(model, device, kind)
    run_vs_ort(model, seq, device, rtol=1e-4, atol=1e-6, net=net)
    want = "softmax_wg" if kind == "gpu" else "softmax"
    assert [b.call.kernel for i in net.insts for b in i.bound] == [want]


def _residual_ln(axis=-1, sum_is_output=False, bias_add=True):
    """y = LayerNorm((x + c) + r) [c a constant bias]; with sum_is_output the sum is a graph
    output too."""
    rng = np.random.default_rng(2)
    c = helper.make_tensor("c", F, [16], rng.standard_normal(16).astype(np.float32))
    s = helper.make_tensor("s", F, [16], rng.uniform(0.5, 1.5, 16).astype(np.float32))
    b = helper.make_tensor("bias", F, [16], rng.standard_normal(16).astype(np.float32))
    nodes = [helper.make_node("Add", ["x", "c"], ["xc"], name="Add_bias")] if bias_add else []
    nodes += [helper.make_node("Add", ["xc" if bias_add else "x", "r"], ["sum"], name="Add_res"),
              helper.make_node("LayerNormalization", ["sum", "s", "bias"], ["y"], name="LN", axis=axis)]
    outs = ["y"] + (["sum"] if sum_is_output else [])
    m = _model(nodes, [("x", ["b", "t", 16]), ("r", ["rb", "t", 16])], outs)
    m.graph.initializer.extend([c, s, b])
    return m


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_layer_norm_takes_the_residual_add(device, kind):
    """LN(x + c + r): both Adds run in the LayerNorm's reads; a residual whose batch grows the
    sum unfuses (broadcast_grows_input) for that inference only."""
    model = _residual_ln()
    prog = build_program(model)
    assert fusion_map(prog) == {"LN": {"position": "prologue", "ops": ["Add_bias", "Add_res"]}}
    assert prog.nodes[-1].fusion.base == "x"
    rng = np.random.default_rng(3)
    shapes = [(2, 5, 2), (2, 5, 1), (1, 7, 3), (3, 1, 3)]   # (b, t, rb): rb > b grows the sum
    seq = [{"x": rng.standard_normal((b, t, 16)).astype(np.float32),
            "r": rng.standard_normal((rb, t, 16)).astype(np.float32)} for b, t, rb in shapes]
    net, trace = _net(model, device, kind)
    run_vs_ort(model, seq, device, rtol=1e-4, atol=2e-5, net=net)
    for i, (b, _, rb) in enumerate(shapes):
        ran = {e["node"] for e in trace.of(i, "execute", "enqueue")}
        if rb > b:
            assert [e["reason"] for e in trace.of(i, "fusion", "unfuse")] == ["broadcast_grows_input"]
            assert ran == {"Add_bias", "Add_res", "LN"}
        else:
            assert not trace.of(i, "fusion", "unfuse") and ran == {"LN"}


def test_layer_norm_prologue_over_several_dims(device):
    """axis=1 normalises [t, 16]: a residual broadcast along t is not linear along that row, so
    its offsets are computed per read."""
    model = _residual_ln(axis=1, bias_add=False)
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_value = 1   # r [rb, 1, 16]
    assert fusion_map(build_program(model))["LN"]["ops"] == ["Add_res"]
    rng = np.random.default_rng(4)
    for kind in ("cpu", "gpu"):
        net, trace = _net(model, device, kind)
        seq = [{"x": rng.standard_normal((2, t, 16)).astype(np.float32),
                "r": rng.standard_normal((rb, 1, 16)).astype(np.float32)} for t, rb in [(3, 1), (4, 2)]]
        run_vs_ort(model, seq, device, rtol=1e-4, atol=2e-5, net=net)
        assert not [e for e in trace.events if e["kind"] == "fusion"]


def test_layer_norm_keeps_a_sum_that_is_used_elsewhere(device):
    """The sum is a graph output: it must be materialised, so the LayerNorm takes no prologue."""
    model = _residual_ln(sum_is_output=True)
    assert "LN" not in fusion_map(build_program(model))
    rng = np.random.default_rng(5)
    net, trace = _net(model, device, "cpu")
    run_vs_ort(model, [{"x": rng.standard_normal((2, 3, 16)).astype(np.float32),
                        "r": rng.standard_normal((2, 3, 16)).astype(np.float32)}], device, net=net)


def test_eltwise_vector_path_and_unaligned_slices(device):
    """Flat eltwise kernels take 4 elements per work-item, as vectors when every offset is a
    multiple of 4: an in-place concat slice at offset 15 and counts that are not multiples of 4
    take the scalar tail; int64 and bool (Equal, Where) go through the same path."""
    nodes = [helper.make_node("Relu", ["a"], ["ra"], name="Relu_a"),
             helper.make_node("Add", ["a", "b"], ["ab"], name="Add_ab"),
             helper.make_node("Concat", ["ra", "ab"], ["cat"], name="Concat", axis=0),
             helper.make_node("Equal", ["a", "b"], ["eq"], name="Equal"),
             helper.make_node("Where", ["eq", "a", "b"], ["w"], name="Where")]
    model = _model(nodes, [("a", ["n", 5]), ("b", ["n", 5])], ["cat", "w"])
    rng = np.random.default_rng(6)
    seq = []
    for n in (3, 4, 1, 13):
        a = rng.standard_normal((n, 5)).astype(np.float32)
        b = np.where(rng.random((n, 5)) > 0.5, a, rng.standard_normal((n, 5))).astype(np.float32)
        seq.append({"a": a, "b": b})
    net, trace = _net(model, device, "cpu")
    run_vs_ort(model, seq, device, net=net)
    applied = [e for e in trace.events if e["kind"] == "in_place_concat" and e["action"] == "apply"]
    assert applied and applied[0]["offsets"] == [0, 15]


def _embedding(pos_first: bool):
    """x = Gather(table, ids) + pos; y = LN(x); z = y + x (the residual stream reads x too).
    `pos_first`: pos comes from an earlier Gather of positions (available to the token
    Gather's epilogue); else the positions are gathered after the tokens."""
    rng = np.random.default_rng(9)
    table = helper.make_tensor("table", F, [50, 16], rng.standard_normal(800).astype(np.float32))
    ptab = helper.make_tensor("ptab", F, [32, 16], rng.standard_normal(512).astype(np.float32))
    tok = helper.make_node("Gather", ["table", "ids"], ["e"], name="G_tok")
    pos = helper.make_node("Gather", ["ptab", "pids"], ["p"], name="G_pos")
    nodes = ([pos, tok] if pos_first else [tok, pos]) + [
        helper.make_node("Add", ["e", "p"], ["x"], name="Add_pos"),
        helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], name="LN", axis=-1),
        helper.make_node("Add", ["y", "x"], ["z"], name="Add_res")]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "emb", [vi("ids", TensorProto.INT64, ["b", "t"]),
                                         vi("pids", TensorProto.INT64, ["t"])],
                          [vi("z", F, None)],
                          [table, ptab, helper.make_tensor("s", F, [16], np.ones(16, np.float32)),
                           helper.make_tensor("b", F, [16], np.zeros(16, np.float32))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("pos_first", [True, False])
def test_an_embedding_gather_takes_the_position_add(device, pos_first):
    """A Gather's kernel applies the fused ops (the position add of GPT-2's embedding) when the
    other operand is written before it; otherwise the add stays with the LayerNorm's prologue
    when it can take it (here x is read again by the residual: it stays a kernel of its own)."""
    model = _embedding(pos_first)
    fm = fusion_map(build_program(model))
    assert fm.get("G_tok") == ({"position": "epilogue", "ops": ["Add_pos"]} if pos_first else None)
    rng = np.random.default_rng(10)
    seq = [{"ids": rng.integers(0, 50, (b, t)).astype(np.int64), "pids": np.arange(t, dtype=np.int64)}
           for b, t in [(1, 5), (2, 3), (1, 1), (3, 7)]]
    for kind in ("cpu", "gpu"):
        net, trace = _net(model, device, kind)
        run_vs_ort(model, seq, device, rtol=1e-4, atol=2e-5, net=net)
        ran = {e["node"] for e in trace.of(0, "execute", "enqueue")}
        assert ("Add_pos" in ran) != pos_first
