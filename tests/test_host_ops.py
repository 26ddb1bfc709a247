"""engine/host_ops.py's fast shape-math ops give what onnx.reference gives (values and dtype),
over the cases exporters emit: negative axes, attribute and input forms of axes, omitted
optional inputs, clamped Slice bounds and negative steps, Reshape's 0 and -1, int32/int64/bool;
and each declines (None) what it leaves to the reference (float arithmetic, float casts)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from engine.host_ops import FAST
from engine.program import Node

I64 = np.int64


def _node(op, n_in, opset=18, **attrs):
    names = [f"i{k}" if k is not None else "" for k in n_in]
    proto = helper.make_node(op, names, ["o0"], **attrs)
    from engine.program import _attrs
    return Node(op, op, names, ["o0"], _attrs(proto), proto, opset)


def _reference(node, values):
    names = [n for n in node.inputs if n]
    g = helper.make_graph([node.proto], "g", [helper.make_tensor_value_info(n, 0, None) for n in names],
                          [helper.make_tensor_value_info("o0", 0, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", node.opset)])
    feeds = {n: v for n, v in zip(node.inputs, values) if n}
    return ReferenceEvaluator(m).run(None, feeds)[0]


a = np.arange(24, dtype=I64).reshape(2, 3, 4)
CASES = [
    ("Unsqueeze", [a, np.array([0, -1], I64)], {}, 18),
    ("Unsqueeze", [np.array(5, I64)], {"axes": [0]}, 11),
    ("Squeeze", [a[:1, :, :1], np.array([-1, 0], I64)], {}, 18),
    ("Squeeze", [a[:1, :, :1]], {}, 18),
    ("Concat", [a, a + 1], {"axis": -1}, 18),
    ("Gather", [np.array([4, 7, 9], I64), np.array(-1, I64)], {"axis": 0}, 18),
    ("Gather", [a, np.array([[0, 2]], I64)], {"axis": 1}, 18),
    ("Slice", [a, np.array([1], I64), np.array([2 ** 62], I64)], {}, 18),
    ("Slice", [a, np.array([-1, 3], I64), np.array([-2 ** 62, 0], I64), np.array([2, 1], I64),
               np.array([-1, -1], I64)], {}, 18),
    ("Slice", [a, np.array([0], I64), np.array([-1], I64), None, np.array([2], I64)], {}, 18),
    ("Add", [np.array([3], I64), np.array(4, I64)], {}, 18),
    ("Mul", [np.array([3, 2], np.int32), np.array([4, -1], np.int32)], {}, 18),
    ("Sub", [np.array([3], I64), np.array([4], I64)], {}, 18),
    ("Equal", [np.array([3, 4], I64), np.array([4, 4], I64)], {}, 18),
    ("LessOrEqual", [np.array([3, 5], I64), np.array(4, I64)], {}, 18),
    ("And", [np.array([True, False]), np.array([True, True])], {}, 18),
    ("Max", [np.array([3, 9], I64), np.array([5, 1], I64), np.array(4, I64)], {}, 18),
    ("Not", [np.array([True, False])], {}, 18),
    ("Where", [np.array([True, False]), np.array([1, 2], I64), np.array([7, 8], I64)], {}, 18),
    ("Range", [np.array(2, I64), np.array(9, I64), np.array(3, I64)], {}, 18),
    ("Range", [np.array(5, np.int32), np.array(1, np.int32), np.array(-2, np.int32)], {}, 18),
    ("Expand", [np.array([[1], [2]], I64), np.array([2, 1, 3], I64)], {}, 18),
    ("Reshape", [a, np.array([0, -1], I64)], {}, 18),
    ("Reshape", [np.zeros((0, 3), I64), np.array([0, 3], I64)], {"allowzero": 1}, 18),
    ("ConstantOfShape", [np.array([2, 3], I64)], {"value": numpy_helper.from_array(np.array([1], np.int64))}, 18),
    ("ConstantOfShape", [np.array([2], I64)], {}, 18),
    ("Cast", [np.array([1, 0, 3], I64)], {"to": TensorProto.BOOL}, 18),
    ("Cast", [np.array([True, False])], {"to": TensorProto.INT32}, 18),
    ("Identity", [a], {}, 18),
    ("Trilu", [a], {}, 18),
    ("Trilu", [a, np.array(-1, I64)], {"upper": 0}, 18),
    ("Trilu", [np.ones((3, 5), np.bool_), np.array(2, I64)], {}, 18),
    ("Trilu", [np.full((4, 4), -3.5, np.float32), np.array(1, I64)], {"upper": 0}, 18),
]


@pytest.mark.parametrize("op,values,attrs,opset", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_fast_host_op_matches_onnx_reference(op, values, attrs, opset):
    node = _node(op, [k if v is not None else None for k, v in enumerate(values)], opset, **attrs)
    got = FAST[op](node, *values)
    assert got is not None, f"{op} declined"
    want = _reference(node, values)
    assert got[0].dtype == want.dtype and got[0].shape == want.shape
    np.testing.assert_array_equal(got[0], want)


@pytest.mark.parametrize("op,values,attrs", [
    ("Add", [np.array([0.1], np.float32), np.array([0.2], np.float32)], {}),
    ("Cast", [np.array([1.5], np.float32)], {"to": TensorProto.INT64}),
    ("Range", [np.array(0.0, np.float32), np.array(1.0, np.float32), np.array(0.25, np.float32)], {}),
])
def test_fast_host_op_declines_float_math(op, values, attrs):
    node = _node(op, list(range(len(values))), 18, **attrs)
    assert FAST[op](node, *values) is None


def test_run_host_gives_arrays_for_0d_results():
    """numpy gives a 0-d result as a scalar: run_host hands out arrays, as the reference does."""
    node = _node("Gather", [0, 1], 18, axis=0)
    out = node.run_host([np.array([4, 7, 9], I64), np.array(-1, I64)])
    assert isinstance(out[0], np.ndarray) and out[0].shape == () and out[0] == 9
    add = _node("Add", [0, 1], 18)
    out = add.run_host([np.array(2, I64), np.array(3, I64)])
    assert isinstance(out[0], np.ndarray) and out[0].dtype == I64 and out[0] == 5


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(["Add", "Sub", "Mul"]), dtype=st.sampled_from([np.int32, np.int64]),
       data=st.data())
def test_integer_shape_math_is_exact_or_refused(op, dtype, data):
    """Add/Sub/Mul on int32/int64 host values: the numpy result where Python's exact one fits
    the type, an OverflowError naming the operands where it does not (numpy would wrap); near
    the type's limits too (the quick bound check must never let a wrap through)."""
    lim = np.iinfo(dtype)
    ints = st.one_of(st.integers(-8, 8), st.integers(lim.min, lim.max),
                     st.integers(lim.max // 2 - 2, lim.max // 2 + 2), st.integers(1 << 30, 1 << 32))
    shape = data.draw(st.sampled_from([(), (1,), (3,)]))
    n = int(np.prod(shape)) if shape else 1
    a = np.array([data.draw(ints.filter(lambda v: lim.min <= v <= lim.max)) for _ in range(n)], dtype).reshape(shape)
    b = np.array([data.draw(ints.filter(lambda v: lim.min <= v <= lim.max)) for _ in range(n)], dtype).reshape(shape)
    exact = {"Add": lambda x, y: x + y, "Sub": lambda x, y: x - y, "Mul": lambda x, y: x * y}[op]
    want = [exact(int(x), int(y)) for x, y in zip(a.ravel(), b.ravel())]
    node = _node(op, [0, 1])
    if all(lim.min <= w <= lim.max for w in want):
        (out,) = FAST[op](node, a, b)
        assert out.dtype == dtype and [int(v) for v in out.ravel()] == want
    else:
        with pytest.raises(OverflowError, match="is past"):
            FAST[op](node, a, b)
