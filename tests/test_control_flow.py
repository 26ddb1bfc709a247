"""ONNX control flow (If, Loop, Scan) over sequences of inputs, against onnxruntime: the fixtures
of scripts/make_control_flow_models.py (tests/control_flow/), with the fast path on and off,
the trace of a control decision and of a subgraph's nodes, and `dyncli run --check`."""
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h
from typer.testing import CliRunner

from dyncli.cli import app
from engine.network import Network
from engine.program import build_program, load_program
from tests.conftest import ort_session
from traces import MemoryTrace

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "control_flow")
rng = np.random.default_rng(7)


def _f32(*shape, shift=0.0):
    return (rng.standard_normal(shape) + shift).astype(np.float32)


# each a sequence of feeds: shapes change, branches change, trip counts change, values repeat
SEQUENCES = {
    "if_sum": [{"x": _f32(n, 8, shift=s)} for n, s in
               [(2, 2), (3, -2), (2, 2), (2, -2), (5, -2), (3, 2), (3, -2), (3, -2)]],
    "loop_counted": [{"M": np.array(m, np.int64), "s0": _f32(n, 3), "x": _f32(n, 3)} for n, m in
                     [(2, 3), (2, 5), (4, 0), (2, 3), (1, 1), (2, 5), (2, 5)]],
    "loop_while": [{"y": np.abs(_f32(n)) + 0.1, "threshold": np.array(t, np.float32)} for n, t in
                   [(3, 10), (3, 100), (5, 1e6), (3, 10), (2, -1), (3, 100), (3, 1e30)]],
    "scan_cumsum": [{"acc0": _f32(b, 4), "x": _f32(b, t, 4)} for b, t in
                    [(2, 3), (2, 5), (1, 1), (2, 3), (3, 7), (2, 5)]],
}


def _path(name):
    return os.path.join(HERE, f"{name}.onnx")


def _run(name, fast_path=True, trace=None):
    net = Network(load_program(_path(name)), fast_path=fast_path, trace=trace)
    outs, counters = [], []
    for feeds in SEQUENCES[name]:
        outs.append({k: v.copy() for k, v in net.infer(feeds).items()})
        counters.append(dict(net.counters))
    return outs, counters


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_fixture_matches_onnxruntime_fast_path_on_and_off(name):
    sess = ort_session(onnx.load(_path(name)))
    names = [o.name for o in sess.get_outputs()]
    on, counters = _run(name)
    off, _ = _run(name, fast_path=False)
    for k, feeds in enumerate(SEQUENCES[name]):
        ref = dict(zip(names, sess.run(None, feeds)))
        for out in names:
            assert on[k][out].shape == ref[out].shape, (k, out)
            np.testing.assert_allclose(on[k][out], ref[out], rtol=1e-5, atol=1e-5, err_msg=f"{k} {out}")
            np.testing.assert_array_equal(on[k][out], off[k][out])
    # the same shapes with other values take another branch or trip count: never a stale plan
    assert not any(c.get("plan.replay") for c in counters)


def test_if_branch_and_device_read_in_the_trace():
    trace = MemoryTrace()
    outs, counters = _run("if_sum", trace=trace)
    ctl = [e for e in trace.events if e["kind"] == "control"]
    assert [e["reason"] for e in ctl] == ["then", "else", "then", "else", "else", "then", "else", "else"]
    assert all(e["action"] == "branch" and e["node"] == "If_3" and e["device_reads"] == 1 for e in ctl)
    # the condition (ReduceSum > 0, computed by kernels) is read back: a device read
    assert all(c["device_reads"] >= 1 for c in counters)
    # a subgraph's nodes run the flow under `<node>/<branch>/<node>`
    sub = {e["node"] for e in trace.events if e["node"].startswith("If_3/")}
    assert any(n.startswith("If_3/then/MatMul") for n in sub)
    assert any(n.startswith("If_3/else/Concat") for n in sub)
    kinds = {(e["kind"], e["action"]) for e in trace.events if e["node"].startswith("If_3/then/")}
    assert {("update_shape", "infer"), ("realloc", "alloc"), ("execute", "enqueue")} <= kinds
    # a repeated shape and branch: the branch's nodes skip shape inference
    last = [e for e in trace.events if e["iter"] == 7 and e["node"].startswith("If_3/else/")
            and e["kind"] == "update_shape"]
    assert last and all(e["action"] == "skip" for e in last)
    # the node's own outputs: shape per branch
    assert outs[0]["y"].shape == (2, 4) and outs[1]["y"].shape == (3, 16)


def test_loop_iterations_and_stop_reason_in_the_trace():
    trace = MemoryTrace()
    outs, _ = _run("loop_while", trace=trace)
    ctl = [e for e in trace.events if e["kind"] == "control"]
    assert all(e["action"] == "iterate" for e in ctl)
    assert [e["iterations"] for e in ctl] == [int(o["count"]) for o in outs]
    assert ctl[4]["iterations"] == 0          # the threshold is below the start: no iteration
    assert ctl[-1]["reason"] == "trip_count" and ctl[-1]["iterations"] == 64   # the cap
    assert {e["reason"] for e in ctl[:-1]} == {"cond_false"}
    body = [e for e in trace.events if e["node"].startswith("Loop_4/body/") and e["iter"] == 1]
    assert body and {e["kind"] for e in body} >= {"update_shape", "execute"}

    trace = MemoryTrace()
    _run("loop_counted", trace=trace)
    ctl = [e for e in trace.events if e["kind"] == "control"]
    assert [(e["reason"], e["iterations"]) for e in ctl] == \
        [("trip_count", m) for m in [3, 5, 0, 3, 1, 5, 5]]


def _nested_model():
    """If inside a Loop body, the branch reading a value of the outermost graph."""
    then = h.make_graph([h.make_node("Add", ["acc_in", "w"], ["t"])], "then", [],
                        [h.make_tensor_value_info("t", TP.FLOAT, [3])])
    other = h.make_graph([h.make_node("Sub", ["acc_in", "w"], ["e"])], "else", [],
                         [h.make_tensor_value_info("e", TP.FLOAT, [3])])
    body = h.make_graph(
        [h.make_node("Constant", [], ["two"], value=onnx.numpy_helper.from_array(np.int64(2), "two")),
         h.make_node("Mod", ["i", "two"], ["r"]),
         h.make_node("Equal", ["r", "zero"], ["even"]),
         h.make_node("If", ["even"], ["acc_out"], name="pick", then_branch=then, else_branch=other),
         h.make_node("Identity", ["c"], ["c_out"])],
        "body", [h.make_tensor_value_info("i", TP.INT64, []), h.make_tensor_value_info("c", TP.BOOL, []),
                 h.make_tensor_value_info("acc_in", TP.FLOAT, [3])],
        [h.make_tensor_value_info("c_out", TP.BOOL, []), h.make_tensor_value_info("acc_out", TP.FLOAT, [3])])
    g = h.make_graph([h.make_node("Constant", [], ["zero"], value=onnx.numpy_helper.from_array(np.int64(0), "zero")),
                      h.make_node("Loop", ["M", "", "a"], ["out"], name="loop", body=body)], "g",
                     [h.make_tensor_value_info("M", TP.INT64, []), h.make_tensor_value_info("a", TP.FLOAT, [3]),
                      h.make_tensor_value_info("w", TP.FLOAT, [3])],
                     [h.make_tensor_value_info("out", TP.FLOAT, [3])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_nested_if_in_loop_reads_the_outer_scope(tmp_path):
    m = _nested_model()
    path = tmp_path / "nested.onnx"
    onnx.save(m, path)
    sess = ort_session(m)
    trace = MemoryTrace()
    net = Network(build_program(m), trace=trace)
    for trips in (0, 1, 4, 3, 4):
        feeds = {"M": np.array(trips, np.int64), "a": _f32(3), "w": _f32(3)}
        got = net.infer(feeds)["out"]
        np.testing.assert_allclose(got, sess.run(None, feeds)[0], rtol=1e-6, atol=1e-6)
    names = {e["node"] for e in trace.events if e["kind"] == "control"}
    assert names == {"loop", "loop/body/pick"}
    assert any(e["node"].startswith("loop/body/pick/else/") for e in trace.events)


def test_dyncli_run_check_on_a_scan(tmp_path):
    r = CliRunner().invoke(app, ["run", _path("scan_cumsum"), "--shapes", "acc0:2x4,x:2x{3..5..2}x4",
                                 "--check", "--trace", str(tmp_path / "t.jsonl")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "2 passed, 0 failed" in r.output


def _scan_model(in_dir, out_dir, out_axis):
    body = h.make_graph([h.make_node("Add", ["acc_in", "x_t"], ["acc_out"]),
                         h.make_node("Mul", ["acc_out", "x_t"], ["y_t"])], "body",
                        [h.make_tensor_value_info("acc_in", TP.FLOAT, [2]), h.make_tensor_value_info("x_t", TP.FLOAT, [2])],
                        [h.make_tensor_value_info("acc_out", TP.FLOAT, [2]), h.make_tensor_value_info("y_t", TP.FLOAT, [2])])
    g = h.make_graph([h.make_node("Scan", ["acc0", "x"], ["acc", "y"], body=body, num_scan_inputs=1,
                                  scan_input_directions=[in_dir], scan_output_directions=[out_dir],
                                  scan_output_axes=[out_axis])], "g",
                     [h.make_tensor_value_info("acc0", TP.FLOAT, [2]), h.make_tensor_value_info("x", TP.FLOAT, ["t", 2])],
                     [h.make_tensor_value_info("acc", TP.FLOAT, [2]), h.make_tensor_value_info("y", TP.FLOAT, None)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 11)])


@pytest.mark.parametrize("in_dir,out_dir,out_axis", [(1, 0, 0), (0, 1, 0), (1, 1, -1), (0, 0, 1)])
def test_scan_directions_and_output_axis(in_dir, out_dir, out_axis):
    m = _scan_model(in_dir, out_dir, out_axis)
    sess = ort_session(m)
    net = Network(build_program(m))
    for t in (3, 1, 4):
        feeds = {"acc0": _f32(2), "x": _f32(t, 2)}
        got = net.infer(feeds)
        for name, want in zip(("acc", "y"), sess.run(None, feeds)):
            assert got[name].shape == want.shape
            np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6)


def test_unsupported_op_in_a_subgraph_refused_at_load():
    then = h.make_graph([h.make_node("Det", ["x"], ["t"], name="det_in_then")], "then", [],
                        [h.make_tensor_value_info("t", TP.FLOAT, None)])
    g = h.make_graph([h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=then)], "g",
                     [h.make_tensor_value_info("c", TP.BOOL, []), h.make_tensor_value_info("x", TP.FLOAT, [2, 2])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)])
    with pytest.raises(ValueError, match="unsupported ops: Det"):
        build_program(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))


def _while_model(trip):
    """Loop as scripted exporters write a while loop: no trip count ("") or INT64_MAX, the
    condition computed in the body, a scan output whose length only the end tells."""
    body = h.make_graph(
        [h.make_node("Constant", [], ["k"], value=onnx.numpy_helper.from_array(np.float32(1.5), "k")),
         h.make_node("Mul", ["v_in", "k"], ["v_out"]),
         h.make_node("ReduceMax", ["v_out"], ["mx"], keepdims=0),
         h.make_node("Less", ["mx", "limit"], ["c_out"]),
         h.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),
         h.make_node("Add", ["v_out", "fi"], ["s"])],
        "body", [h.make_tensor_value_info("i", TP.INT64, []), h.make_tensor_value_info("c", TP.BOOL, []),
                 h.make_tensor_value_info("v_in", TP.FLOAT, ["n"])],
        [h.make_tensor_value_info("c_out", TP.BOOL, []), h.make_tensor_value_info("v_out", TP.FLOAT, ["n"]),
         h.make_tensor_value_info("s", TP.FLOAT, ["n"])])
    nodes = [h.make_node("Constant", [], ["t"], value=onnx.numpy_helper.from_array(np.bool_(True), "t")),
             h.make_node("Loop", [trip, "t", "v"], ["v_final", "scan"], body=body)]
    inits = [onnx.numpy_helper.from_array(np.int64(np.iinfo(np.int64).max), "big")] if trip else []
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("v", TP.FLOAT, ["n"]),
                                  h.make_tensor_value_info("limit", TP.FLOAT, [])],
                     [h.make_tensor_value_info("v_final", TP.FLOAT, ["n"]),
                      h.make_tensor_value_info("scan", TP.FLOAT, ["m", "n"])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("trip", ["", "big"])
def test_while_loop_without_a_trip_count(trip):
    m = _while_model(trip)
    sess = ort_session(m)
    net = Network(build_program(m))
    for n, limit in [(3, 10.0), (3, 500.0), (2, 1e4), (3, 10.0)]:
        feeds = {"v": np.abs(_f32(n)) + 0.5, "limit": np.array(limit, np.float32)}
        got = net.infer(feeds)
        for name, want in zip(("v_final", "scan"), sess.run(None, feeds)):
            assert got[name].shape == want.shape
            np.testing.assert_allclose(got[name], want, rtol=1e-5)


def test_loop_carried_values_swapped_and_passed_through():
    """(a, b) -> (b, a + b): a carried output that is another body input (Fibonacci), and
    (p, q) -> (q, p): a plain swap."""
    body = h.make_graph([h.make_node("Add", ["a", "b"], ["ab"])], "body",
                        [h.make_tensor_value_info("i", TP.INT64, []), h.make_tensor_value_info("c", TP.BOOL, []),
                         *[h.make_tensor_value_info(n, TP.FLOAT, [2]) for n in "abpq"]],
                        [h.make_tensor_value_info("c", TP.BOOL, []), h.make_tensor_value_info("b", TP.FLOAT, [2]),
                         h.make_tensor_value_info("ab", TP.FLOAT, [2]), h.make_tensor_value_info("q", TP.FLOAT, [2]),
                         h.make_tensor_value_info("p", TP.FLOAT, [2])])
    g = h.make_graph([h.make_node("Loop", ["M", "", "a0", "b0", "p0", "q0"], ["a", "b", "p", "q"], body=body)], "g",
                     [h.make_tensor_value_info("M", TP.INT64, [])] +
                     [h.make_tensor_value_info(n, TP.FLOAT, [2]) for n in ("a0", "b0", "p0", "q0")],
                     [h.make_tensor_value_info(n, TP.FLOAT, [2]) for n in "abpq"])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    sess = ort_session(m)
    net = Network(build_program(m))
    for trips in (5, 0, 1, 2, 7):
        feeds = {"M": np.array(trips, np.int64), **{n: _f32(2) for n in ("a0", "b0", "p0", "q0")}}
        got = net.infer(feeds)
        for name, want in zip("abpq", sess.run(None, feeds)):
            np.testing.assert_allclose(got[name], want, rtol=1e-6, err_msg=f"{trips} {name}")


@pytest.mark.parametrize("direction", [0, 1])
def test_scan8_over_a_batch_axis(direction):
    body = h.make_graph([h.make_node("Add", ["acc_in", "x_t"], ["acc_out"]),
                         h.make_node("Identity", ["acc_out"], ["y_t"])], "body",
                        [h.make_tensor_value_info("acc_in", TP.FLOAT, [2]), h.make_tensor_value_info("x_t", TP.FLOAT, [2])],
                        [h.make_tensor_value_info("acc_out", TP.FLOAT, [2]), h.make_tensor_value_info("y_t", TP.FLOAT, [2])])
    g = h.make_graph([h.make_node("Scan", ["", "acc0", "x"], ["acc", "y"], body=body, num_scan_inputs=1,
                                  directions=[direction])], "g",
                     [h.make_tensor_value_info("acc0", TP.FLOAT, ["b", 2]),
                      h.make_tensor_value_info("x", TP.FLOAT, ["b", "t", 2])],
                     [h.make_tensor_value_info("acc", TP.FLOAT, ["b", 2]),
                      h.make_tensor_value_info("y", TP.FLOAT, ["b", "t", 2])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 8)])
    m.ir_version = 3
    sess = ort_session(m)
    net = Network(build_program(m))
    for b, t in [(2, 3), (3, 1), (1, 4)]:
        feeds = {"acc0": _f32(b, 2), "x": _f32(b, t, 2)}
        got = net.infer(feeds)
        for name, want in zip(("acc", "y"), sess.run(None, feeds)):
            np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6)


def test_shape_math_inside_a_branch_follows_new_shapes():
    """A branch's host shape subgraph (Shape -> Gather -> Concat -> Reshape) re-runs when the
    shapes it reads change (its Shape nodes are known under their prefixed names)."""
    c = lambda name, v: h.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(v), name))
    then = h.make_graph([h.make_node("Shape", ["x"], ["s"]), c("i0", np.array([0], np.int64)),
                         h.make_node("Gather", ["s", "i0"], ["n"], axis=0), c("m1", np.array([-1], np.int64)),
                         h.make_node("Concat", ["n", "m1"], ["target"], axis=0),
                         h.make_node("Reshape", ["x", "target"], ["t"])], "then", [],
                        [h.make_tensor_value_info("t", TP.FLOAT, ["a", "b"])])
    other = h.make_graph([h.make_node("Shape", ["x"], ["s2"]), c("i1", np.array([1], np.int64)),
                          h.make_node("Gather", ["s2", "i1"], ["k"], axis=0), c("m2", np.array([-1], np.int64)),
                          h.make_node("Concat", ["m2", "k"], ["target2"], axis=0),
                          h.make_node("Reshape", ["x", "target2"], ["e"])], "else", [],
                         [h.make_tensor_value_info("e", TP.FLOAT, ["a", "b"])])
    g = h.make_graph([h.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)], "g",
                     [h.make_tensor_value_info("flag", TP.BOOL, []),
                      h.make_tensor_value_info("x", TP.FLOAT, ["p", "q", "r"])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["a", "b"])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    sess = ort_session(m)
    net = Network(build_program(m))
    for flag, shape in [(1, (2, 3, 4)), (1, (5, 3, 4)), (0, (5, 3, 4)), (0, (2, 6, 1)), (1, (2, 6, 1))]:
        feeds = {"flag": np.array(bool(flag)), "x": _f32(*shape)}
        got, want = net.infer(feeds)["y"], sess.run(None, feeds)[0]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_carried_value_grows_in_a_loop_inside_a_branch():
    """A carried value that grows each iteration (Concat) in a Loop inside an If's branch,
    whose trip count is the outer graph's input."""
    body = h.make_graph([h.make_node("Concat", ["acc", "x"], ["acc_out"], axis=0),
                         h.make_node("Identity", ["c"], ["c_out"])], "body",
                        [h.make_tensor_value_info("i", TP.INT64, []), h.make_tensor_value_info("c", TP.BOOL, []),
                         h.make_tensor_value_info("acc", TP.FLOAT, ["k", 2])],
                        [h.make_tensor_value_info("c_out", TP.BOOL, []), h.make_tensor_value_info("acc_out", TP.FLOAT, ["k", 2])])
    then = h.make_graph([h.make_node("Loop", ["M", "", "x"], ["grown"], body=body)], "then", [],
                        [h.make_tensor_value_info("grown", TP.FLOAT, ["k", 2])])
    other = h.make_graph([h.make_node("Identity", ["x"], ["e"])], "else", [],
                         [h.make_tensor_value_info("e", TP.FLOAT, ["n", 2])])
    g = h.make_graph([h.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)], "g",
                     [h.make_tensor_value_info("flag", TP.BOOL, []), h.make_tensor_value_info("M", TP.INT64, []),
                      h.make_tensor_value_info("x", TP.FLOAT, ["n", 2])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["k", 2])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    sess = ort_session(m)
    net = Network(build_program(m))
    for flag, trips, n in [(1, 3, 2), (0, 3, 2), (1, 5, 1), (1, 0, 3), (0, 1, 4), (1, 2, 4)]:
        feeds = {"flag": np.array(bool(flag)), "M": np.array(trips, np.int64), "x": _f32(n, 2)}
        got, want = net.infer(feeds)["y"], sess.run(None, feeds)[0]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_a_branch_may_return_an_outer_value_itself():
    """ONNX allows a subgraph output that is an outer value with no node (onnxruntime asks for
    an Identity): the value is copied into the node's output."""
    then = h.make_graph([h.make_node("Neg", ["x"], ["t"])], "then", [], [h.make_tensor_value_info("t", TP.FLOAT, ["n"])])
    other = h.make_graph([], "else", [], [h.make_tensor_value_info("x", TP.FLOAT, ["n"])])
    g = h.make_graph([h.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)], "g",
                     [h.make_tensor_value_info("flag", TP.BOOL, []), h.make_tensor_value_info("x", TP.FLOAT, ["n"])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["n"])])
    net = Network(build_program(h.make_model(g, opset_imports=[h.make_opsetid("", 17)])))
    for flag, n in [(0, 3), (1, 3), (0, 5)]:
        x = _f32(n)
        np.testing.assert_array_equal(net.infer({"flag": np.array(bool(flag)), "x": x})["y"], -x if flag else x)


def test_partial_replays_run_the_control_node_every_time():
    """With a host condition (a graph input) no device read stops the fast path from taking
    partial plans: the chain before the If repeats as recorded blocks, the If (whose decisions
    are never clean) runs its flow each time and takes the branch the flag says."""
    then = h.make_graph([h.make_node("Relu", ["a8"], ["t"])], "then", [], [h.make_tensor_value_info("t", TP.FLOAT, ["n", 8])])
    other = h.make_graph([h.make_node("Neg", ["a8"], ["e"])], "else", [], [h.make_tensor_value_info("e", TP.FLOAT, ["n", 8])])
    nodes = [h.make_node("Sigmoid", ["x"], ["a0"])]
    nodes += [h.make_node("Tanh" if k % 2 else "Sin", [f"a{k}"], [f"a{k + 1}"]) for k in range(8)]
    nodes += [h.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other), h.make_node("Exp", ["y"], ["z"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, ["n", 8]),
                                  h.make_tensor_value_info("flag", TP.BOOL, [])],
                     [h.make_tensor_value_info("z", TP.FLOAT, ["n", 8])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    sess = ort_session(m)
    on, off = Network(build_program(m)), Network(build_program(m), fast_path=False)
    partial = 0
    for k in range(12):
        feeds = {"x": _f32(2 if k < 6 else 3, 8), "flag": np.array(k % 3 == 0)}
        got = on.infer(feeds)["z"]
        partial += on.counters.get("plan.partial", 0)
        np.testing.assert_array_equal(got, off.infer(feeds)["z"])
        np.testing.assert_allclose(got, sess.run(None, feeds)[0], rtol=1e-5, atol=1e-6)
    assert partial > 0


def test_if_on_shape_math_decides_without_a_device_read():
    """If(Shape(x)[0] > 2), as exporters write a size check: the condition is a host value of
    the shape subgraph, so the decision takes no device read."""
    c = lambda name, v: h.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(v), name))
    then = h.make_graph([h.make_node("ReduceSum", ["x"], ["t"], keepdims=1)], "then", [],
                        [h.make_tensor_value_info("t", TP.FLOAT, [1, "m"])])
    other = h.make_graph([h.make_node("Abs", ["x"], ["e"])], "else", [], [h.make_tensor_value_info("e", TP.FLOAT, ["n", "m"])])
    g = h.make_graph([h.make_node("Shape", ["x"], ["s"]), c("i0", np.int64(0)), c("two", np.int64(2)),
                      h.make_node("Gather", ["s", "i0"], ["n"], axis=0), h.make_node("Greater", ["n", "two"], ["big"]),
                      h.make_node("If", ["big"], ["y"], name="size_check", then_branch=then, else_branch=other)], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, ["n", "m"])], [h.make_tensor_value_info("y", TP.FLOAT, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    sess = ort_session(m)
    trace = MemoryTrace()
    net = Network(build_program(m), trace=trace)
    for n in (1, 4, 2, 3):
        feeds = {"x": _f32(n, 3)}
        np.testing.assert_allclose(net.infer(feeds)["y"], sess.run(None, feeds)[0], rtol=1e-5, atol=1e-6)
        assert net.counters.get("device_reads", 0) == 0
    ctl = [e for e in trace.events if e["kind"] == "control"]
    assert [e["reason"] for e in ctl] == ["else", "then", "else", "then"]
    assert all(e["device_reads"] == 0 for e in ctl)
