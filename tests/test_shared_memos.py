"""Nodes of one class share the memo tables of their output layouts and dynamic kernel calls
(engine/memo.py node_class): a transformer's layers are one class each, and nodes that differ
in anything their pure functions read (an attribute, a fused op, an input left out) are not."""
import numpy as np
import onnx
from onnx import TensorProto, helper

from engine import Network, build_program
from engine.memo import node_class
from tests.conftest import run_vs_ort
from tests.models import gpt2_decoder

F = TensorProto.FLOAT


def _twins() -> onnx.ModelProto:
    """Two Transposes, two Softmaxes and two Gemms that see the same input layouts but differ by
    an attribute; a third Transpose that is the first one's twin."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", F, [6, 6], rng.standard_normal(36).astype(np.float32))
    nodes = [helper.make_node("Transpose", ["x"], ["t1"], name="t1", perm=[1, 0, 2]),
             helper.make_node("Transpose", ["x"], ["t2"], name="t2", perm=[0, 2, 1]),
             helper.make_node("Transpose", ["x"], ["t3"], name="t3", perm=[1, 0, 2]),
             helper.make_node("Softmax", ["x"], ["s1"], name="s1", axis=-1),
             helper.make_node("Softmax", ["x"], ["s2"], name="s2", axis=1),
             helper.make_node("Gemm", ["m", "w"], ["g1"], name="g1"),
             helper.make_node("Gemm", ["m", "w"], ["g2"], name="g2", transB=1)]
    g = helper.make_graph(nodes, "twins", [helper.make_tensor_value_info("x", F, ["a", "b", "c"]),
                                            helper.make_tensor_value_info("m", F, ["r", 6])],
                          [helper.make_tensor_value_info(n, F, None) for n in ("t1", "t2", "t3", "s1", "s2", "g1", "g2")],
                          [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_twins_that_differ_by_an_attribute_are_not_one_class(device):
    model = _twins()
    net = Network(build_program(model), device, fast_path=False)
    cls = {i.node.name: i.shape_class for i in net.insts}
    assert cls["t1"] == cls["t3"] and len({cls["t1"], cls["t2"]}) == 2
    assert cls["s1"] != cls["s2"] and cls["g1"] != cls["g2"]
    rng = np.random.default_rng(1)
    seq = [{"x": rng.standard_normal(s).astype(np.float32), "m": rng.standard_normal((r, 6)).astype(np.float32)}
           for s, r in [((2, 3, 4), 1), ((3, 3, 3), 5), ((2, 3, 4), 2), ((4, 4, 4), 5)]]
    run_vs_ort(model, seq, device, rtol=1e-5, atol=1e-5, net=net)


def test_a_gpt2_layers_nodes_are_one_class_each(device):
    """Every layer's attention, KV-cache concats, LayerNorms and projections: one class per role,
    so 12 layers ask the shape functions once per new KV length."""
    prog = build_program(gpt2_decoder(layers=3, d_model=32, heads=2, vocab=50, max_pos=64))
    fb = {f"present_{k}_{i}": f"past_{k}_{i}" for i in range(3) for k in ("key", "value")}
    net = Network(prog, device, feedback=fb)
    by_op: dict = {}
    for i in net.insts:
        if not i.node.host:
            by_op.setdefault(i.node.op, set()).add(i.shape_class)
    assert len(by_op["attention"]) == 1 and None not in by_op["attention"]
    assert len(by_op["Concat"] - {None}) <= 2          # KV concats (keys and values alike) + head shapes
    assert node_class(net.insts[0].node, None, 1, False) is not None
