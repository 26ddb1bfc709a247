"""Reshape targets that copy the input's own dims become constants with 0s
(engine/reshape_targets.py): which are taken, which keep their shape subgraph, and the outputs
against onnxruntime over changing shapes either way."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine import build_program
from tests.conftest import run_vs_ort


def _i64(name, v):
    return numpy_helper.from_array(np.asarray(v, np.int64), name)


def _dim(src, i, tag, unsqueeze=True):
    """Nodes for Unsqueeze(Gather(Shape(src), i)) (or Gather(Shape(src), [i])): output `tag`."""
    nodes = [helper.make_node("Shape", [src], [f"{tag}_s"]),
             helper.make_node("Gather", [f"{tag}_s", f"{tag}_i"], [f"{tag}_g" if unsqueeze else tag])]
    inits = [_i64(f"{tag}_i", i if unsqueeze else [i])]
    if unsqueeze:
        nodes.append(helper.make_node("Unsqueeze", [f"{tag}_g", "zero_axis"], [tag]))
    return nodes, inits


def _model(dims, tail, allowzero=0, shape_of=("x", "x"), extra_reader=False):
    """x [b, s, 8] (+ 1) -> Reshape(., Concat(dims..., tail)) -> Transpose -> y. `dims`: the
    positions whose Gather reads Shape(shape_of[k]) at index dims[k] (k = position)."""
    nodes, inits = [helper.make_node("Add", ["x", "one"], ["x1"])], \
        [numpy_helper.from_array(np.float32(1.0).reshape(1), "one"), _i64("zero_axis", [0]),
         _i64("tail", tail)]
    parts = []
    for k, i in enumerate(dims):
        n, c = _dim(shape_of[k], i, f"d{k}", unsqueeze=k % 2 == 0)
        nodes += n
        inits += c
        parts.append(f"d{k}")
    nodes += [helper.make_node("Concat", parts + ["tail"], ["target"], axis=0),
              helper.make_node("Reshape", ["x1", "target"], ["r"], allowzero=allowzero),
              helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1, 3])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:      # a Shape read also as a graph output: it stays
        outs.append(helper.make_tensor_value_info("d0_s", TensorProto.INT64, None))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 8])],
                          outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(rng):
    return [{"x": rng.standard_normal(s).astype(np.float32)} for s in [(1, 3, 8), (2, 5, 8), (3, 1, 8), (1, 7, 8)]]


def _target(prog):
    r = next(n for n in prog.nodes if n.op == "Reshape")
    return prog.constants.get(r.inputs[1])


def test_own_dims_become_zeros(device):
    """Both copied dims from x1 itself at their positions: the target is [0, 0, 2, 4] and the
    shape nodes go."""
    model = _model([0, 1], [2, 4], shape_of=("x1", "x1"))
    prog = build_program(model)
    assert _target(prog).tolist() == [0, 0, 2, 4]
    assert not [n.op for n in prog.nodes if n.op in ("Shape", "Gather", "Unsqueeze", "Concat")]
    run_vs_ort(model, _feeds(np.random.default_rng(0)), device)


@pytest.mark.parametrize("case", ["other_tensor", "swapped", "allowzero", "negative_index"])
def test_other_targets_keep_their_subgraph(device, case):
    """A dim of another tensor (x, not the Reshape's input x1), dims at other positions, a
    Reshape with allowzero = 1, a negative Gather index: the subgraph stays, outputs agree."""
    kw = {"other_tensor": dict(dims=[0, 1], shape_of=("x1", "x")),
          "swapped": dict(dims=[1, 0], shape_of=("x1", "x1")),
          "allowzero": dict(dims=[0, 1], shape_of=("x1", "x1"), allowzero=1),
          "negative_index": dict(dims=[0, -2], shape_of=("x1", "x1"))}[case]
    tail = [2, 4]
    model = _model(tail=tail, **kw)
    prog = build_program(model)
    assert _target(prog) is None
    assert any(n.op == "Concat" for n in prog.nodes)
    if case == "swapped":     # [s, b, 2, 4]: a valid reshape only where b * s elements match
        feeds = [{"x": np.random.default_rng(1).standard_normal(s).astype(np.float32)}
                 for s in [(2, 2, 8), (3, 3, 8), (1, 1, 8)]]
    else:
        feeds = _feeds(np.random.default_rng(1))
    run_vs_ort(model, feeds, device)


def test_a_shape_read_elsewhere_stays(device):
    """The target folds; the Shape that a graph output also reads is kept (its Gather goes)."""
    model = _model([0, 1], [2, 4], shape_of=("x1", "x1"), extra_reader=True)
    prog = build_program(model)
    assert _target(prog).tolist() == [0, 0, 2, 4]
    assert [n.outputs for n in prog.nodes if n.op == "Shape"] == [["d0_s"]]
    assert not [n for n in prog.nodes if n.op in ("Gather", "Unsqueeze", "Concat")]
    run_vs_ort(model, _feeds(np.random.default_rng(2)), device, check_nonconstant=False)
