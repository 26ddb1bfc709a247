"""Symbolic host values (engine/fast_path/host_values.py): the shape math of a decode step's host
nodes traced on symbolic dims, compiled, and called with other dims gives what onnx.reference
gives for those dims; ops and cases it does not take are declined (None)."""
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.fast_path.host_values import Sliced, sym_outputs
from engine.layout import Layout
from engine.symbolic import Session, args_of
from tests.test_host_ops import I64, _node, _reference

# (op, attrs, opset, the inputs: "s" a symbolic int vector of the drawn values, else a constant)
CASES = [
    ("Gather", {"axis": 0}, 18, ["s", np.array(2, I64)]),
    ("Gather", {"axis": 0}, 18, ["s", np.array([-1, 0], I64)]),
    ("Unsqueeze", {}, 18, ["s", np.array([0], I64)]),
    ("Unsqueeze", {"axes": [-1]}, 11, ["s"]),
    ("Concat", {"axis": 0}, 18, ["s", np.array([7, 9], I64)]),
    ("Add", {}, 18, ["s", np.array(1, I64)]),
    ("Sub", {}, 18, ["s", np.array([3, 2, 1, 0], I64)]),
    ("Mul", {}, 18, ["s", "s"]),
    ("Identity", {}, 18, ["s"]),
]


def _inst(op, attrs, opset, n, dtype="i64"):
    node = _node(op, list(range(n)), opset, **attrs)
    return SimpleNamespace(node=node, outputs=[SimpleNamespace(layout=Layout((1,), dtype))])


@settings(max_examples=20, deadline=None, derandomize=True)
@given(first=st.lists(st.integers(1, 600), min_size=4, max_size=4),
       later=st.lists(st.integers(1, 600), min_size=4, max_size=4))
@pytest.mark.parametrize("op,attrs,opset,ins", CASES, ids=[f"{c[0]}{k}" for k, c in enumerate(CASES)])
def test_traced_host_math_gives_the_reference_at_other_dims(op, attrs, opset, ins, first, later):
    inst = _inst(op, attrs, opset, len(ins))
    s = Session()
    with s:
        dims = s.layout(Layout(tuple(first), "i64")).shape      # four symbolic dims
        vec = np.empty(4, dtype=object)
        for k, d in enumerate(dims):
            vec[k] = d
        vals = [vec if isinstance(v, str) else v for v in ins]
        out = sym_outputs(inst, [None] * len(ins), vals)
        assert out is not None
        fn, _ = s.function("f", "(" + "".join(s.source(x) + ", " for x in out[0].ravel()) + ")")
    for drawn in (first, later):
        got = np.array(fn(*drawn), I64).reshape(out[0].shape)
        ref = _reference(inst.node, [np.array(drawn, I64) if isinstance(v, str) else v for v in ins])
        assert got.shape == ref.shape and np.array_equal(got, ref), (op, drawn)


def test_shape_gives_the_symbolic_dims_within_start_and_end():
    s = Session()
    with s:
        layout = s.layout(Layout((1, 12, 7, 64), "f32"))
        inst = _inst("Shape", {"start": 1, "end": -1}, 18, 1)
        out = sym_outputs(inst, [layout], [None])
        assert list(out[0]) == list(layout.shape[1:3])
        fn, _ = s.function("f", "(" + "".join(s.source(x) + ", " for x in out[0].ravel()) + ")")
    assert fn(*args_of([Layout((2, 3, 40, 5), "f32")], ())) == (3, 40)


def test_what_is_not_integer_shape_math_is_declined():
    s = Session()
    with s:
        vec = np.empty(2, dtype=object)
        vec[0], vec[1] = s.layout(Layout((3, 4), "i64")).shape
        # a float output, an op it does not take, a symbolic index, a value it does not know
        assert sym_outputs(_inst("Add", {}, 18, 2, "f32"), [None] * 2, [vec, np.array(1, I64)]) is None
        assert sym_outputs(_inst("Range", {}, 18, 3), [None] * 3, [vec, vec, vec]) is None
        assert sym_outputs(_inst("Gather", {"axis": 0}, 18, 2), [None] * 2, [np.array([5, 6], I64), vec]) is None
        assert sym_outputs(_inst("Add", {}, 18, 2), [None] * 2, [vec, None]) is None


@settings(max_examples=40, deadline=None, derandomize=True)
@given(first=st.integers(0, 80), later=st.integers(0, 80), start=st.sampled_from([0, 1, 3, -5, -70]),
       step=st.sampled_from([1, 2, 3]), end_off=st.sampled_from([0, -1, 2, -100]), axis=st.sampled_from([1, -1]))
def test_a_slice_of_a_constant_by_symbolic_bounds_gives_the_reference_at_other_dims(first, later, start, step,
                                                                                   end_off, axis):
    """A Slice of a constant whose end is a dim plus a constant (BERT's position ids): the
    generated function slices the constant as onnx.reference does, clamping past its end and
    before its start, for dims other than the traced one."""
    data = np.arange(2 * 40, dtype=I64).reshape(2, 40)
    inst = _inst("Slice", {}, 18, 5)
    s = Session()
    with s:
        n = s.layout(Layout((first,), "i64")).shape[0]
        end = np.empty(1, dtype=object)
        end[0] = n + end_off
        out = sym_outputs(inst, [None] * 5, [data, np.array([start], I64), end, np.array([axis], I64),
                                             np.array([step], I64)], slices=True)
        assert out is not None and isinstance(out[0], Sliced)
        fn, _ = s.function("f", out[0].source(s))
    for drawn in (first, later):
        ref = _reference(inst.node, [data, np.array([start], I64), np.array([drawn + end_off], I64),
                                     np.array([axis], I64), np.array([step], I64)])
        got = fn(drawn)
        assert got.shape == ref.shape and np.array_equal(got, ref), drawn


def test_a_slice_is_a_value_only_where_asked_and_only_of_a_constant_by_positive_steps():
    s = Session()
    with s:
        vec = np.empty(1, dtype=object)
        vec[0] = s.layout(Layout((9,), "i64")).shape[0]
        data, zero = np.arange(20, dtype=I64), np.array([0], I64)
        inst = _inst("Slice", {}, 18, 5)
        assert sym_outputs(inst, [None] * 5, [data, zero, vec, zero, np.array([1], I64)]) is None   # not asked
        assert sym_outputs(inst, [None] * 5, [data, zero, vec, zero, np.array([-1], I64)], slices=True) is None
        assert sym_outputs(inst, [None] * 5, [vec, zero, vec, zero, None], slices=True) is None      # symbolic data
        sliced = sym_outputs(inst, [None] * 5, [data, zero, vec, zero, None], slices=True)[0]
        # a host node reading a Sliced declines (only a device node may read one)
        assert sym_outputs(_inst("Identity", {}, 18, 1), [None], [sliced]) is None
