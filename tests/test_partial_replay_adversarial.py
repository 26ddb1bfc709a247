"""Adversarial sequences for partial replay (engine/fast_path/partial.py): with the fast path on
and off, outputs are bit-identical and equal onnxruntime's, and every inference makes the same
decisions. Each model is small and built here; each sequence aims at one way a clean block could
repeat what the flow would no longer do."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from engine import Network, build_program
from engine.fast_path import NOT_DECISIONS
from tests.conftest import assert_close_for, ort_session
from tests.models import kv_decoder_step
from tests.test_partial_replay import _decisions, _run, _same
from traces import MemoryTrace


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


def _mixed() -> onnx.ModelProto:
    """Several features on separate inputs, so a change of one leaves the others' nodes clean:
    a runtime in-place concat (contiguous only while its batch is 1) read after by a graph
    output that later nodes read too; a view chain of a device tensor whose producer changes
    shape (Shape -> Concat -> Reshape, Unsqueeze, Squeeze), empty dims included; intermediates
    of different sizes that share pooled buffers."""
    f = TensorProto.FLOAT
    w = helper.make_tensor("w", f, [4, 3], np.linspace(-1, 1, 12).astype(np.float32))
    i64 = lambda n, v: helper.make_tensor(n, TensorProto.INT64, [len(v)], v)  # noqa: E731
    nodes = [
        # in-place concat over a (n, s1) and b (n, s2)
        helper.make_node("Relu", ["a"], ["ra"], name="RelA"),
        helper.make_node("Sigmoid", ["b"], ["sb"], name="SigB"),
        helper.make_node("Concat", ["ra", "sb"], ["cat"], name="Cat", axis=1),
        helper.make_node("Neg", ["cat"], ["y_cat"], name="NegCat"),
        helper.make_node("Exp", ["y_cat"], ["y_exp"], name="ExpCat"),
        # view chain of c (m, 4): Reshape to (m*4/2, 2) via the shape subgraph, then back
        helper.make_node("Abs", ["c"], ["ac"], name="AbsC"),
        helper.make_node("Shape", ["c"], ["sc"], name="ShapeC"),
        helper.make_node("Gather", ["sc", "i0"], ["m"], name="GatherM", axis=0),
        helper.make_node("Mul", ["m", "two"], ["m2"], name="MulM"),
        helper.make_node("Concat", ["m2", "two"], ["tgt"], name="Tgt", axis=0),
        helper.make_node("Reshape", ["ac", "tgt"], ["rc"], name="ReshC"),
        helper.make_node("Unsqueeze", ["rc", "ax0"], ["uc"], name="UnsqC"),
        helper.make_node("Squeeze", ["uc", "ax0"], ["qc"], name="SqC"),
        helper.make_node("Reshape", ["qc", "back"], ["bc"], name="BackC"),
        helper.make_node("MatMul", ["bc", "w"], ["mm"], name="MatMulC"),
        helper.make_node("Tanh", ["mm"], ["y_c"], name="TanhC"),
        # sizes that grow and shrink: d (k,) -> Concat(d, d, d) -> Slice -> Sum
        helper.make_node("Sin", ["d"], ["sd"], name="SinD"),
        helper.make_node("Concat", ["sd", "sd", "sd"], ["d3"], name="Cat3", axis=0),
        helper.make_node("Cos", ["d3"], ["cd3"], name="CosD3"),
        helper.make_node("ReduceSum", ["cd3"], ["rsd"], name="SumD", keepdims=1),
        helper.make_node("Add", ["cd3", "rsd"], ["y_d"], name="AddD"),
    ]
    inits = [w, i64("i0", [0]), i64("two", [2]), i64("ax0", [0]), i64("back", [-1, 4])]
    return _model(nodes, [helper.make_tensor_value_info("a", f, ["n", "s1"]),
                          helper.make_tensor_value_info("b", f, ["n", "s2"]),
                          helper.make_tensor_value_info("c", f, ["m", 4]),
                          helper.make_tensor_value_info("d", f, ["k"])],
                  ["y_cat", "y_exp", "y_c", "y_d"], inits)


def _mixed_steps(moves, seed=0):
    """Each move changes one input's shape (or none): a sequence whose changes reach only some
    nodes, with repeats, so partial plans are recorded and used."""
    rng = np.random.default_rng(seed)
    dims = {"n": 1, "s1": 2, "s2": 3, "m": 2, "k": 3}
    steps = []
    for key, v in moves:
        if key is not None:
            dims[key] = v
        n = dims["n"]
        feeds = {"a": rng.standard_normal((n, dims["s1"])).astype(np.float32),
                 "b": rng.standard_normal((n, dims["s2"])).astype(np.float32),
                 "c": rng.standard_normal((dims["m"], 4)).astype(np.float32),
                 "d": rng.standard_normal(dims["k"]).astype(np.float32)}
        steps.append((feeds, False))
    return steps


def test_mixed_features_one_input_at_a_time(device):
    moves = [(None, 0), (None, 0), ("m", 3), ("m", 4), ("m", 5), ("k", 4), ("k", 2), ("k", 0),
             ("k", 5), ("s1", 3), ("s1", 4), ("n", 2), ("s1", 1), ("s1", 5), ("n", 1), ("s2", 0),
             ("s2", 4), ("m", 0), ("m", 2), ("m", 1), (None, 0), ("k", 1), ("k", 9), ("k", 2)]
    plans = _same_and_ort(_mixed(), _mixed_steps(moves), device)
    assert any(e["action"] == "partial" for e in plans)


_MOVES = st.one_of(st.just((None, 0)), st.tuples(st.sampled_from(["n", "s1", "s2", "m", "k"]),
                                                 st.integers(0, 5)))


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.tuples(_MOVES, st.integers(1, 3)), min_size=3, max_size=10))
def test_random_mixed_sequences(device, moves):
    """Random moves, each held for 1 to 3 inferences (a held move repeats its signature)."""
    seq = [(None, 0)] + [m for m, times in moves for m in [m] + [(None, 0)] * (times - 1)]
    _same_and_ort(_mixed(), _mixed_steps(seq), device)


def _kv_with_state() -> onnx.ModelProto:
    """kv_decoder_step and a recurrent state h (batch, d_model): h_next = Tanh(h + sum of y
    over the new tokens, 0 for none), fed back by copy while the KV caches are fed back in
    place."""
    m = kv_decoder_step()
    g = m.graph
    g.initializer.append(helper.make_tensor("axis1", TensorProto.INT64, [1], [1]))
    g.node.extend([helper.make_node("ReduceSum", ["y", "axis1"], ["ym"], name="SumY", keepdims=0),
                   helper.make_node("Add", ["h", "ym"], ["hs"], name="AddH"),
                   helper.make_node("Tanh", ["hs"], ["h_next"], name="TanhH")])
    g.input.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", 32]))
    g.output.append(helper.make_tensor_value_info("h_next", TensorProto.FLOAT, None))
    return m


_KV_STATE_FB = {"present_k": "past_k", "present_v": "past_v", "h_next": "h"}


def _kv_state_steps(seqs, seed=0):
    """seqs: [(batch, [new tokens per step])]: each sequence starts from an empty past and a
    random state; the later steps feed back the caches and the state."""
    rng = np.random.default_rng(seed)
    steps = []
    for b, chunks in seqs:
        for k, n in enumerate(chunks):
            feeds = {"x": rng.standard_normal((b, n, 32)).astype(np.float32)}
            if k == 0:
                feeds.update(past_k=np.zeros((b, 2, 0, 16), np.float32),
                             past_v=np.zeros((b, 2, 0, 16), np.float32),
                             h=rng.standard_normal((b, 32)).astype(np.float32))
            steps.append((feeds, k > 0))
    return steps


def _ort_fed_back(model, steps, feedback):
    """onnxruntime over the steps, feeding the outputs back on the host."""
    sess = ort_session(model)
    names = [o.name for o in sess.get_outputs()]
    prev, outs = {}, []
    for feeds, fed in steps:
        feeds = dict(feeds)
        if fed:
            feeds.update({i: prev[o] for o, i in feedback.items()})
        prev = dict(zip(names, sess.run(None, feeds)))
        outs.append(prev)
    return outs


def _same_fed_back_and_ort(model, steps, feedback, **kw):
    plans = _same(build_program(model), steps, device_of(), feedback, **kw)
    got = _run(build_program(model), steps, device_of(), True, feedback, **kw)[0]
    for i, (g, w) in enumerate(zip(got, _ort_fed_back(model, steps, feedback))):
        for name in g:
            assert_close_for(g[name], w[name], f"inference {i} output {name}")
    return plans


def device_of():
    from engine import select_device
    return select_device()


def test_kv_and_state_fed_back_with_batch_changes(device):
    """Decode with the caches aliased and the state copied; the batch changes between
    sequences (the caches and the state start again), chunked and one-token steps."""
    steps = _kv_state_steps([(1, [2, 1, 1, 1, 1]), (2, [1, 1, 1, 1, 2, 1, 1]),
                             (1, [3, 1, 1, 1]), (2, [2, 1, 1])])
    plans = _same_fed_back_and_ort(_kv_with_state(), steps, _KV_STATE_FB)
    assert any(e["action"] == "partial" for e in plans)


def test_mixed_features_with_static_impls_built_in_the_critical_path(device, static_gemms):
    """As test_mixed_features_one_input_at_a_time with static GEMMs: the MatMul switches impls
    (built, then taken from the impl cache) as its rows change, its weights reordered."""
    moves = [(None, 0), (None, 0), ("m", 3), ("m", 4), ("m", 3), ("k", 4), ("m", 4), ("m", 3),
             ("m", 4), (None, 0), ("s1", 4), ("m", 3), ("m", 1), ("k", 2), ("m", 2), ("m", 1)]
    _same_and_ort(_mixed(), _mixed_steps(moves), device, impls="auto", async_compile=False)


def test_kv_and_state_with_static_impls(device, static_gemms):
    steps = _kv_state_steps([(1, [3, 1, 1, 1, 2, 1, 1]), (2, [1, 1, 1]), (1, [1, 1, 1, 1])])
    _same_fed_back_and_ort(_kv_with_state(), steps, _KV_STATE_FB, impls="auto", async_compile=False)


def _shape_values() -> onnx.ModelProto:
    """Shape values of several kinds side by side: the batch of x through Shape(end=1) and a
    host Concat (a Reshape target), the length of x through Shape -> Gather (an Expand's
    shape), and a target given as an input that is also data (Cast)."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    c = lambda n, v: helper.make_tensor(n, i64, [len(v)], v)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["bx"], name="ShapeB", start=0, end=1),
             helper.make_node("Concat", ["bx", "m1"], ["tb"], name="TgtB", axis=0),
             helper.make_node("Relu", ["z"], ["rz"], name="RelZ"),
             helper.make_node("Reshape", ["rz", "tb"], ["r1"], name="ReshB"),
             helper.make_node("Neg", ["r1"], ["y1"], name="NegB"),
             helper.make_node("Shape", ["x"], ["sx"], name="ShapeX"),
             helper.make_node("Gather", ["sx", "one"], ["sl"], name="GatherS", axis=0),
             helper.make_node("Concat", ["two", "sl"], ["te"], name="TgtE", axis=0),
             helper.make_node("Sigmoid", ["u"], ["su"], name="SigU"),
             helper.make_node("Expand", ["su", "te"], ["ex"], name="ExpandU"),
             helper.make_node("Abs", ["ex"], ["y2"], name="AbsE"),
             helper.make_node("Exp", ["z"], ["ez"], name="ExpZ"),
             helper.make_node("Reshape", ["ez", "t"], ["r3"], name="ReshT"),
             helper.make_node("Tanh", ["r3"], ["y3"], name="TanhT"),
             helper.make_node("Cast", ["t"], ["tf"], name="CastT", to=f),
             helper.make_node("Sin", ["tf"], ["y4"], name="SinT"),
             helper.make_node("Cos", ["x"], ["y5"], name="CosX")]
    inits = [c("m1", [-1]), c("one", [1]), c("two", [2])]
    return _model(nodes, [helper.make_tensor_value_info("x", f, ["b", "s"]),
                          helper.make_tensor_value_info("z", f, [2, 6]),
                          helper.make_tensor_value_info("u", f, [1]),
                          helper.make_tensor_value_info("t", i64, ["k"])],
                  ["y1", "y2", "y3", "y4", "y5"], inits)


_TARGETS = [[3, 4], [4, 3], [12], [2, 6], [2, 3, 2], [6, 2], [1, 12]]


@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["b", "s", "t", None]), st.integers(0, 6),
                          st.integers(1, 3)), min_size=3, max_size=10))
def test_random_shape_value_sequences(device, moves):
    """One of x's batch, x's length or the target changes (or nothing), each held 1 to 3
    inferences: shape values change with and without their layouts."""
    rng = np.random.default_rng(4)
    z = rng.standard_normal((2, 6)).astype(np.float32)
    dims, steps = {"b": 1, "s": 2, "t": 0}, []
    for key, v, times in [(None, 0, 2)] + moves:
        if key is not None:
            dims[key] = v % 3 + 1 if key == "b" else v
        for _ in range(times):
            steps.append(({"x": rng.standard_normal((dims["b"], dims["s"])).astype(np.float32),
                           "z": z, "u": rng.standard_normal(1).astype(np.float32),
                           "t": np.array(_TARGETS[dims["t"]], np.int64)}, False))
    _same_and_ort(_shape_values(), steps, device)


def _fails_for_batch_2() -> onnx.ModelProto:
    """y = -ReduceSum(x, axis 1) + w, w (3, 1): a batch of 2 does not broadcast (shape
    inference refuses it at the Add, after the ReduceSum and the Neg ran for it)."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("ReduceSum", ["x", "ax1"], ["d1"], name="Sum", keepdims=1),
             helper.make_node("Neg", ["d1"], ["c1"], name="Neg"),
             helper.make_node("Add", ["c1", "w"], ["y"], name="Add"),
             helper.make_node("Sigmoid", ["z"], ["s"], name="Sig"),
             helper.make_node("Exp", ["s"], ["y2"], name="Exp")]
    inits = [helper.make_tensor("ax1", TensorProto.INT64, [1], [1]),
             helper.make_tensor("w", f, [3, 1], [1., 2., 3.])]
    return _model(nodes, [helper.make_tensor_value_info("x", f, ["b", "s"]),
                          helper.make_tensor_value_info("z", f, [4])], ["y", "y2"], inits)


def _run_with_failures(model, shapes, device, fast):
    """Like _run, an inference that raises recorded as its exception's type name."""
    trace = MemoryTrace()
    net = Network(build_program(model), device, trace=trace, fast_path=fast, impls="dynamic")
    outs, counters = [], []
    for s in shapes:
        feeds = {"x": np.arange(np.prod(s), dtype=np.float32).reshape(s), "z": np.ones(4, np.float32)}
        try:
            outs.append({k: np.array(v) for k, v in net.infer(feeds).items()})
        except Exception as e:  # noqa: BLE001 - the failure is part of the sequence
            outs.append(type(e).__name__)
        counters.append({k: v for k, v in net.counters.items() if k not in NOT_DECISIONS})
    return outs, counters, trace


@pytest.mark.parametrize("shapes", [
    [(3, 4), (3, 5), (2, 5), (3, 6), (3, 7)],            # a partial replay diverges, then fails
    [(3, 4), (3, 4), (3, 4), (2, 4), (3, 4), (3, 4)],    # a flow fails between whole replays
    [(3, 4), (3, 5), (3, 6), (2, 6), (3, 6), (3, 7)],    # a flow fails between partial replays
], ids=["partial", "whole", "flow"])
def test_an_inference_that_fails_midway_leaves_no_plan_in_use(device, shapes):
    """An inference that raises midway (shape inference refuses a later node) leaves the
    nodes it ran with its shapes: the next inferences must not repeat a plan that assumed
    otherwise; outputs and decisions equal the flow's after the failure too."""
    on = _run_with_failures(_fails_for_batch_2(), shapes, device, True)
    off = _run_with_failures(_fails_for_batch_2(), shapes, device, False)
    assert sum(isinstance(o, str) for o in off[0]) == 1     # the batch of 2 only
    for i, (a, b) in enumerate(zip(on[0], off[0])):
        if isinstance(b, str):
            assert a == b, f"inference {i}"
            continue
        for name in b:
            assert np.array_equal(a[name], b[name]), f"inference {i} output {name}"
        want = -np.arange(np.prod(shapes[i]), dtype=np.float32).reshape(shapes[i]).sum(1, keepdims=True) \
            + np.array([[1.], [2.], [3.]], np.float32)
        np.testing.assert_allclose(a["y"], want, rtol=1e-6)
    assert on[1] == off[1]
    for i in range(len(shapes)):
        assert _decisions(on[2].events, i) == _decisions(off[2].events, i), f"inference {i}"


def test_nodes_that_share_a_name(device):
    """An explicit node name equal to the name an unnamed node gets (op_index): decisions
    name their node, so neither may be taken for a clean node by the other's events."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="Exp_3"),
             helper.make_node("Neg", ["a"], ["y"]),
             helper.make_node("Sigmoid", ["z"], ["s"]),
             helper.make_node("Exp", ["s"], ["e"]),           # named Exp_3 at load
             helper.make_node("Abs", ["e"], ["y2"]),
             helper.make_node("Relu", ["y2"], ["y3"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", f, ["n"]),
                           helper.make_tensor_value_info("z", f, ["k"])], ["y", "y3"])
    rng = np.random.default_rng(5)
    steps = [({"x": rng.standard_normal(n).astype(np.float32),
               "z": rng.standard_normal(k).astype(np.float32)}, False)
             for n, k in [(3, 4), (3, 5), (3, 6), (3, 7), (4, 7), (5, 7), (6, 7), (6, 8)]]
    _same_and_ort(model, steps, device)


def test_a_fused_node_whose_subgraph_repeats_its_name_still_repeats(device):
    """A fused node's unfused subgraph repeats the fused node's name: no clash, so the fused
    z chain stays clean while x changes (partial replays happen)."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="Relu"),
             helper.make_node("Neg", ["a"], ["y"], name="Neg"),
             helper.make_node("Sin", ["z"], ["s"], name="Sin"),
             helper.make_node("Cos", ["s"], ["c"], name="Cos"),
             helper.make_node("Tanh", ["c"], ["t"], name="Tanh"),
             helper.make_node("Sigmoid", ["t"], ["y2"], name="Sig")]
    model = _model(nodes, [helper.make_tensor_value_info("x", f, ["n"]),
                           helper.make_tensor_value_info("z", f, ["k"])], ["y", "y2"])
    net = Network(build_program(model), device, impls="dynamic")
    assert any(len([m for m in i.family() if m.node.name == i.node.name]) > 1 for i in net.insts)
    rng = np.random.default_rng(6)
    steps = [({"x": rng.standard_normal(n).astype(np.float32),
               "z": rng.standard_normal(4).astype(np.float32)}, False) for n in range(2, 8)]
    plans = _same_and_ort(model, steps, device)
    assert [e["iter"] for e in plans if e["action"] == "partial"] == [2, 3, 4, 5]


def test_a_shape_value_refilled_in_place_by_the_caller(device):
    """A caller that keeps one array for the Reshape target and refills it before each
    inference: the engine must see the new value (it kept the caller's array, so the previous
    value it compares with changed too), with the fast path on and off, replays included."""
    x = np.arange(12, dtype=np.float32)
    for fast in (True, False):
        net = Network(build_program(_target_also_data()), device, fast_path=fast, impls="dynamic")
        t = np.zeros(2, np.int64)
        for v in ([3, 4], [3, 4], [3, 4], [4, 3], [4, 3], [4, 3], [6, 2], [3, 4], [3, 4]):
            t[:] = v
            out = net.infer({"x": x, "t": t})
            assert out["y"].shape == tuple(v), f"fast path {fast}"
            np.testing.assert_allclose(out["y2"], 1 / (1 + np.exp(-np.array(v, np.float32))), rtol=1e-5)


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([1, 2]), st.lists(st.integers(0, 3), min_size=1, max_size=6)),
                min_size=1, max_size=3))
def test_random_kv_and_state_decodes(device, seqs):
    """Random sequences of random batches, each a decode of chunked, one-token and empty
    steps (no new token: the caches keep their length) with the caches aliased and the state
    copied."""
    _same_fed_back_and_ort(_kv_with_state(), _kv_state_steps(seqs, seed=len(seqs)), _KV_STATE_FB)


def test_node_names_are_made_unique_at_load():
    """Two nodes given one name, and an explicit name equal to a generated one: every node of
    the program has a name of its own (the second of a pair gets its position)."""
    from engine import build_program as build
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"], name="n"),
                           helper.make_node("Exp", ["a"], ["b"]),
                           helper.make_node("Neg", ["b"], ["c"], name="Exp_1"),
                           helper.make_node("Sigmoid", ["c"], ["y"], name="n")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    prog = build(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    names = [n.name for n in prog.nodes]
    assert len(set(names)) == len(names) == 4
    assert {"n", "Exp_1", "Exp_1#2", "n#3"} == set(names)
