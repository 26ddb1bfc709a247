"""TopK (K an input: a memory dep) and Unique (split into count_unique + gather_unique, whose
shape inference reads only the 8-byte count) against onnxruntime: data-dependent output sizes,
zero-size outputs, the `dynamic_output` reason of update_shape, float16."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from engine import Network, build_program
from tests.conftest import assert_close, ort_session, run_vs_ort
from traces import MemoryTrace

FLOAT, FLOAT16, INT64, INT32 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.INT32
NP = {FLOAT: np.float32, FLOAT16: np.float16, INT64: np.int64, INT32: np.int32}


def _model(nodes, inputs, outputs, opset=13):
    vis = [helper.make_tensor_value_info(n, t, dims) for n, t, dims in inputs]
    g = helper.make_graph(nodes, "t", vis, [helper.make_empty_tensor_value_info(o) for o in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def topk_model(elem=FLOAT, axis=-1, largest=1, k_plus_one=False):
    """values, indices = TopK(x, k); with k_plus_one, K = k + 1 is computed on the device."""
    nodes = [helper.make_node("TopK", ["x", "k1" if k_plus_one else "k"], ["v", "i"], axis=axis,
                              largest=largest)]
    if k_plus_one:
        nodes.insert(0, helper.make_node("Add", ["k", "one"], ["k1"]))
    inputs = [("x", elem, ["a", "b", "c"]), ("k", INT64, [1])] + ([("one", INT64, [1])] if k_plus_one else [])
    return _model(nodes, inputs, ["v", "i"])


def _traced(model):
    trace = MemoryTrace()
    return Network(build_program(model), trace=trace, impls="dynamic"), trace


def _distinct(rng, shape, dt):
    """Values with no ties (ties are ordered by index, which onnxruntime also does, but keep
    the comparison about values)."""
    n = int(np.prod(shape))
    v = rng.permutation(n * 3)[:n].reshape(shape) - n
    return (v / 8 if dt == np.float16 else v).astype(dt)   # eighths: exact in half


@pytest.mark.parametrize("elem,axis,largest", [(FLOAT, -1, 1), (FLOAT, 1, 0), (INT64, 0, 1),
                                               (FLOAT16, -1, 1), (INT32, 2, 0)])
def test_topk_k_changes_on_one_network(elem, axis, largest):
    rng = np.random.default_rng(elem + axis)
    dt = NP[elem]
    seq = []
    for shape, k in [((2, 70, 3), 5), ((2, 70, 3), 1), ((1, 300, 4), 0), ((2, 70, 3), 2), ((3, 5, 9), 3)]:
        ax = axis % 3
        seq.append({"x": _distinct(rng, shape, dt), "k": np.array([min(k, shape[ax])], np.int64)})
    run_vs_ort(topk_model(elem, axis, largest), seq, check_nonconstant=False)


def test_topk_ties_lower_index_first():
    x = np.array([[3, 1, 3, 2, 3, 1]], np.float32).reshape(1, 1, 6)
    run_vs_ort(topk_model(), [{"x": x, "k": np.array([4], np.int64)}], check_nonconstant=False)
    run_vs_ort(topk_model(largest=0), [{"x": x, "k": np.array([3], np.int64)}], check_nonconstant=False)


@pytest.mark.parametrize("dt", [np.int8, np.uint8, np.int16])
def test_topk_small_int_types(dt):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    rng = np.random.default_rng(5)
    info = np.iinfo(dt)
    seq = [{"x": rng.integers(info.min, info.max + 1, s).astype(dt), "k": np.array([k], np.int64)}
           for s, k in [((2, 70, 3), 4), ((1, 9, 2), 9), ((3, 130, 1), 1)]]   # ties among them
    for largest in (1, 0):
        run_vs_ort(topk_model(elem, 1, largest), seq, check_nonconstant=False)


def test_topk_uint64_orders_unsigned():
    """uint64 (onnxruntime has no uint64 TopK): values above 2^63 must rank above the others;
    the reference is onnxruntime's int64 TopK of the values with the top bit flipped (an
    order-preserving map), flipped back."""
    model = topk_model(TensorProto.UINT64, 1)
    ref = ort_session(topk_model(INT64, 1))
    net = Network(build_program(model))
    rng = np.random.default_rng(6)
    top = np.uint64(1 << 63)
    for shape, k in [((2, 70, 3), 5), ((1, 9, 2), 9), ((3, 130, 1), 2)]:
        x = rng.integers(0, 1 << 63, shape, dtype=np.uint64) ^ (rng.random(shape) < 0.5) * top
        x[0, :3] = 7   # a tie
        feeds = {"x": x, "k": np.array([k], np.int64)}
        outs = net.infer(feeds)
        v, i = outs["v"], outs["i"]
        rv, ri = ref.run(None, {"x": (x ^ top).view(np.int64), "k": feeds["k"]})
        np.testing.assert_array_equal(v, rv.view(np.uint64) ^ top)
        np.testing.assert_array_equal(i, ri)
        assert v.dtype == np.uint64 and (v[:, 0] >= top).all()


def test_topk_same_shapes_new_k_is_dynamic_output():
    """Same input layouts, new K: update_shape infers with reason dynamic_output (never skipped);
    K computed on the device costs one 8-byte read; K = 0 gives empty outputs and no kernel."""
    model = topk_model(k_plus_one=True)
    net, trace = _traced(model)
    sess = ort_session(model)
    rng = np.random.default_rng(4)
    x = _distinct(rng, (2, 3, 40), np.float32)
    for k in (3, 3, 7, -1):
        feeds = {"x": x, "k": np.array([k], np.int64), "one": np.array([1], np.int64)}
        outs = net.infer(feeds)
        for got, want in zip((outs["v"], outs["i"]), sess.run(None, feeds)):
            assert_close(got, want, what=f"k={k}")
        ev = [e for e in trace.events if e["iter"] == net.iter and e["op"] == "TopK"
              and e["kind"] == "update_shape"]
        assert len(ev) == 1 and ev[0]["action"] == "infer"
        if net.iter:
            assert ev[0]["reason"] == "dynamic_output"
            assert ev[0]["device_reads"] == 1   # K's 8 bytes, not x
    assert outs["v"].shape == (2, 3, 0)
    assert net.counters["execute.skip.empty_output"] >= 1


# ---------------------------------------------------------------- Unique
def unique_model(elem=FLOAT, sorted_=1, outputs=("y", "idx", "inv", "cnt")):
    node = helper.make_node("Unique", ["x"], list(outputs), sorted=sorted_)
    return _model([node], [("x", elem, ["a", "b"])], [o for o in outputs if o])


def _repeats(rng, shape, dt, distinct):
    vals = rng.permutation(1000)[:distinct] - 500
    return (vals[rng.integers(0, distinct, shape)] / (4 if dt != np.int64 else 1)).astype(dt)


@pytest.mark.parametrize("elem,sorted_", [(FLOAT, 1), (FLOAT, 0), (INT64, 1), (FLOAT16, 1), (INT32, 0)])
def test_unique_data_dependent_sizes(elem, sorted_):
    rng = np.random.default_rng(elem * 2 + sorted_)
    dt = NP[elem]
    seq = [{"x": _repeats(rng, s, dt, d)} for s, d in
           [((3, 7), 5), ((3, 7), 12), ((20, 30), 300), ((1, 1), 1), ((0, 4), 1), ((3, 7), 2), ((5, 90), 450)]]
    if elem in (FLOAT, INT64):
        net = run_vs_ort(unique_model(elem, sorted_), seq, check_nonconstant=False)
    else:   # onnxruntime has no float16 or int32 Unique: the wider type on the same values
        wide = FLOAT if elem == FLOAT16 else INT64
        net = Network(build_program(unique_model(elem, sorted_)))
        sess = ort_session(unique_model(wide, sorted_))
        for feeds in seq:
            outs = net.infer(feeds)
            ref = sess.run(None, {"x": feeds["x"].astype(NP[wide])})
            ref[0] = ref[0].astype(dt)
            for name, want in zip(("y", "idx", "inv", "cnt"), ref):
                assert_close(outs[name], want, rtol=0, atol=0, what=f"{feeds['x'].shape} {name}")
    assert [i.node.op for i in net.insts] == ["count_unique", "gather_unique"]


def test_unique_same_shape_new_data_reads_only_the_count():
    model = unique_model(outputs=("y", "", "inv"))
    net, trace = _traced(model)
    sess = ort_session(model)
    rng = np.random.default_rng(9)
    for d in (3, 3, 40, 1):
        x = _repeats(rng, (8, 16), np.float32, d)
        outs = net.infer({"x": x})
        for name, want in zip(("y", "inv"), sess.run(None, {"x": x})):
            assert_close(outs[name], want, what=f"{d} distinct: {name}")
        ev = [e for e in trace.events if e["iter"] == net.iter and e["op"] == "gather_unique"
              and e["kind"] == "update_shape"]
        assert len(ev) == 1 and ev[0]["action"] == "infer"
        if net.iter:
            assert ev[0]["reason"] == "dynamic_output" and ev[0]["device_reads"] == 1
        count = [e for e in trace.events if e["iter"] == net.iter and e["op"] == "count_unique"
                 and e["kind"] == "update_shape"]
        assert net.iter == 0 or count[0]["action"] == "skip"


@pytest.mark.parametrize("axis,sorted_", [(0, 1), (1, 0), (-1, 1)])
def test_unique_along_an_axis(axis, sorted_):
    """Slices along the axis compared whole (lexicographic order when sorted); repeated
    slices and a changing number of them."""
    node = helper.make_node("Unique", ["x"], ["y", "idx", "inv", "cnt"], axis=axis, sorted=sorted_)
    model = _model([node], [("x", FLOAT, ["a", "b", "c"])], ["y", "idx", "inv", "cnt"], opset=11)
    rng = np.random.default_rng(axis + 5)
    seq = []
    for shape, distinct in [((6, 3, 2), 3), ((6, 3, 2), 5), ((9, 4, 3), 2), ((2, 1, 1), 1)]:
        ax = axis % 3
        pool = rng.integers(-3, 3, (distinct,) + tuple(d for k, d in enumerate(shape) if k != ax))
        pick = pool[rng.integers(0, distinct, shape[ax])]
        seq.append({"x": np.moveaxis(pick, 0, ax).astype(np.float32)})
    run_vs_ort(model, seq, check_nonconstant=False)


_NETS: dict = {}


def _net_and_session(key, make):
    if key not in _NETS:
        model = make()
        _NETS[key] = (Network(build_program(model)), ort_session(model))
    return _NETS[key]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=3), st.integers(0, 2), st.booleans(),
       st.floats(0.0, 1.0), st.integers(0, 2**32 - 1))
def test_topk_any_shape_and_k_matches_onnxruntime(shape, axis, largest, frac, seed):
    """One network per (rank, axis, largest) sees every drawn shape and K, ties included."""
    axis %= len(shape)
    model = lambda: _model(  # noqa: E731
        [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=int(largest))],
        [("x", FLOAT, [f"d{j}" for j in range(len(shape))]), ("k", INT64, [1])], ["v", "i"])
    net, sess = _net_and_session(("topk", len(shape), axis, largest), model)
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.integers(-4, 5, shape).astype(np.float32),
             "k": np.array([int(frac * shape[axis])], np.int64)}
    outs = net.infer(feeds)
    for name, want in zip(("v", "i"), sess.run(None, feeds)):
        assert_close(outs[name], want, what=f"{shape} axis {axis} k {feeds['k']} {name}")


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=3), st.booleans(), st.integers(1, 20),
       st.integers(0, 2**32 - 1))
def test_unique_any_shape_matches_onnxruntime(shape, sorted_, spread, seed):
    """One network per (rank, sorted) sees every drawn shape (empty ones too) and spread."""
    outputs = ["y", "idx", "inv", "cnt"]
    model = lambda: _model(  # noqa: E731
        [helper.make_node("Unique", ["x"], outputs, sorted=int(sorted_))],
        [("x", INT64, [f"d{j}" for j in range(len(shape))])], outputs)
    net, sess = _net_and_session(("unique", len(shape), sorted_), model)
    x = np.random.default_rng(seed).integers(-spread, spread + 1, shape).astype(np.int64)
    outs = net.infer({"x": x})
    for name, want in zip(outputs, sess.run(None, {"x": x})):
        assert_close(outs[name], want, what=f"{shape} sorted={sorted_} {name}")
