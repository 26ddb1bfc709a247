"""Adversarial sequences for partial replay (engine/fast_path/partial.py): with the fast path on
and off, outputs are bit-identical and equal onnxruntime's, and every inference makes the same
decisions. Each model is small and built here; each sequence aims at one way a clean block could
repeat what the flow would no longer do."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from engine import build_program
from tests.conftest import assert_close_for, ort_session
from tests.test_partial_replay import _run, _same


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                               for o in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _same_and_ort(model, steps, device, feedback=None, **kw):
    """_same, and the fast path's outputs against onnxruntime's (inputs not fed back only)."""
    plans = _same(build_program(model), steps, device, feedback, **kw)
    if not feedback:
        sess = ort_session(model)
        outs = _run(build_program(model), steps, device, True, **kw)[0]
        for i, ((feeds, _), got) in enumerate(zip(steps, outs)):
            want = sess.run(None, feeds)
            for name, w in zip([o.name for o in sess.get_outputs()], want):
                assert_close_for(got[name], w, f"inference {i} output {name}")
    return plans


def _batch_reshape() -> onnx.ModelProto:
    """y = Reshape(Relu(z), [batch of x, -1]) then a few unary nodes: the target is a host value
    (Shape -> Gather -> Concat) whose layout never changes, read as a memory dep by a view."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Shape", ["x"], ["sx"], name="Shape"),
             helper.make_node("Gather", ["sx", "i0"], ["b"], name="Gather", axis=0),
             helper.make_node("Concat", ["b", "m1"], ["target"], name="Target", axis=0),
             helper.make_node("Relu", ["z"], ["rz"], name="Relu"),
             helper.make_node("Reshape", ["rz", "target"], ["r"], name="Reshape"),
             helper.make_node("Neg", ["r"], ["n"], name="Neg"),
             helper.make_node("Abs", ["n"], ["a"], name="Abs"),
             helper.make_node("Sigmoid", ["a"], ["y"], name="Sigmoid")]
    inits = [helper.make_tensor("i0", TensorProto.INT64, [1], [0]),
             helper.make_tensor("m1", TensorProto.INT64, [1], [-1])]
    return _model(nodes, [helper.make_tensor_value_info("x", f, ["b", "s"]),
                          helper.make_tensor_value_info("z", f, [2, 6])], ["y"], inits)


def test_a_shape_value_that_changes_where_the_base_saw_it_repeat(device):
    """The base changed x's length (the batch value recomputed, the same); the next inference
    changes x's batch: the same input changed, the target's value now differs (same layout),
    so the Reshape must infer a new shape, not repeat the base's."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((2, 6)).astype(np.float32)
    steps = [({"x": np.zeros(s, np.float32), "z": z}, False)
             for s in [(1, 4), (1, 5), (2, 5), (2, 6), (1, 6), (1, 7)]]
    _same_and_ort(_batch_reshape(), steps, device)


def _batch_of_shape_reshape() -> onnx.ModelProto:
    """As _batch_reshape, the batch taken by Shape(start=0, end=1): a length change leaves the
    Shape's value as it was, so the host Concat after it only repeats."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Shape", ["x"], ["b"], name="Shape", start=0, end=1),
             helper.make_node("Concat", ["b", "m1"], ["target"], name="Target", axis=0),
             helper.make_node("Relu", ["z"], ["rz"], name="Relu"),
             helper.make_node("Reshape", ["rz", "target"], ["r"], name="Reshape"),
             helper.make_node("Neg", ["r"], ["n"], name="Neg"),
             helper.make_node("Sigmoid", ["n"], ["y"], name="Sigmoid")]
    inits = [helper.make_tensor("m1", TensorProto.INT64, [1], [-1])]
    return _model(nodes, [helper.make_tensor_value_info("x", f, ["b", "s"]),
                          helper.make_tensor_value_info("z", f, [2, 6])], ["y"], inits)


def test_a_shape_value_the_base_left_unchanged_reaches_a_host_node(device):
    """The base's Shape saw a new layout and the same value (its host reader repeated); the
    next inference changes the value: the host reader must compute again."""
    z = np.random.default_rng(1).standard_normal((2, 6)).astype(np.float32)
    steps = [({"x": np.zeros(s, np.float32), "z": z}, False)
             for s in [(1, 4), (1, 5), (1, 6), (2, 6), (2, 7), (2, 8), (1, 8), (1, 9)]]
    _same_and_ort(_batch_of_shape_reshape(), steps, device)


def _fed_back_target() -> onnx.ModelProto:
    """y = Neg(Reshape(Relu(x), tgt)); tgt_next = tgt + d, fed back as the next tgt: a shape
    value that stays on the device (its host value given by the caller)."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="Relu"),
             helper.make_node("Reshape", ["r", "tgt"], ["rs"], name="Reshape"),
             helper.make_node("Neg", ["rs"], ["y"], name="Neg"),
             helper.make_node("Add", ["tgt", "d"], ["tgt_next"], name="Next")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [12]),
                                       helper.make_tensor_value_info("tgt", i64, [2]),
                                       helper.make_tensor_value_info("d", i64, [2])],
                          [helper.make_tensor_value_info("y", f, None),
                           helper.make_tensor_value_info("tgt_next", i64, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_fed_back_shape_value_that_changes_with_its_layout_repeated(device):
    """The fed-back target keeps its value in the base and changes in the next step: its
    Reshape must infer the new shape (the input changed by value, not by layout)."""
    x = np.random.default_rng(2).standard_normal(12).astype(np.float32)
    ds = [[0, 0], [1, -1], [-1, 1], [0, 0], [0, 0], [1, -1], [0, 0]]
    steps, tgt = [], np.array([3, 4], np.int64)
    for k, d in enumerate(ds):
        steps.append(({"x": x, "tgt": tgt.copy(), "d": np.array(d, np.int64)}, k > 0))
        tgt = tgt + np.array(d, np.int64)
    outs = _run(build_program(_fed_back_target()), steps, device, True, {"tgt_next": "tgt"})[0]
    for (feeds, _), got in zip(steps, outs):
        assert np.array_equal(got["y"], -np.maximum(x, 0).reshape(feeds["tgt"]))
    _same(build_program(_fed_back_target()), steps, device, {"tgt_next": "tgt"})


def _target_also_data() -> onnx.ModelProto:
    """A graph input that is both a Reshape target (read by value) and data (Cast, Sigmoid)."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="Relu"),
             helper.make_node("Reshape", ["r", "t"], ["rs"], name="Reshape"),
             helper.make_node("Neg", ["rs"], ["y"], name="Neg"),
             helper.make_node("Cast", ["t"], ["tf"], name="Cast", to=f),
             helper.make_node("Sigmoid", ["tf"], ["y2"], name="Sigmoid")]
    return _model(nodes, [helper.make_tensor_value_info("x", f, [12]),
                          helper.make_tensor_value_info("t", i64, ["k"])], ["y", "y2"])


def test_an_input_that_changed_by_value_in_the_base_then_changes_its_layout(device):
    """The base changed the target's value only (its data readers repeated); the next inference
    changes its length: the same input changed, but now every reader sees a new layout."""
    x = np.random.default_rng(3).standard_normal(12).astype(np.float32)
    steps = [({"x": x, "t": np.array(t, np.int64)}, False)
             for t in ([3, 4], [4, 3], [12], [2, 6], [6, 2], [2, 3, 2], [12], [4, 3])]
    _same_and_ort(_target_also_data(), steps, device)
