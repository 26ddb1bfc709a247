"""NonZero (`dynamic_output`): split into count_nonzero + gather_nonzero at program build,
gather's shape inference reads only the 8-byte count from the device, its update_shape is never
skipped; every output is compared with onnxruntime."""
import json

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from dyncli.cli import app
from engine import Network, build_program
from engine.program import ModelError
from tests.conftest import assert_close, ort_session, run_vs_ort
from traces import MemoryTrace, read_trace

NP = {TensorProto.FLOAT: np.float32, TensorProto.INT64: np.int64, TensorProto.INT32: np.int32,
      TensorProto.BOOL: np.bool_}


def _model(nodes, inputs, outputs, inits=(), opset=13) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "nonzero", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def nonzero_alone(elem: int, dims) -> onnx.ModelProto:
    return _model([helper.make_node("NonZero", ["x"], ["y"], name="NonZero")],
                  [helper.make_tensor_value_info("x", elem, dims)],
                  [helper.make_tensor_value_info("y", TensorProto.INT64, [len(dims) or 1, "n"])])


def masked_select() -> onnx.ModelProto:
    """rows = Relu(Gather(x, Squeeze(NonZero(mask)), axis 0)) * 2 (a boolean row select), and
    pos = Cast(Transpose(NonZero(mask))) + 0.5: NonZero feeding device ops."""
    nodes = [
        helper.make_node("NonZero", ["mask"], ["nz"], name="NonZero"),
        helper.make_node("Squeeze", ["nz", "axis0"], ["idx"], name="Squeeze"),
        helper.make_node("Gather", ["x", "idx"], ["sel"], name="Gather", axis=0),
        helper.make_node("Relu", ["sel"], ["r"], name="Relu"),
        helper.make_node("Mul", ["r", "two"], ["rows"], name="Mul"),
        helper.make_node("Transpose", ["nz"], ["nzt"], name="Transpose", perm=[1, 0]),
        helper.make_node("Cast", ["nzt"], ["nzf"], name="Cast", to=TensorProto.FLOAT),
        helper.make_node("Add", ["nzf", "half"], ["pos"], name="Add"),
    ]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "axis0"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8]),
                          helper.make_tensor_value_info("mask", TensorProto.BOOL, ["n"])],
                  [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["k", 8]),
                   helper.make_tensor_value_info("pos", TensorProto.FLOAT, ["k", 1])], inits)


def _sparse(rng, shape, dtype, density=0.4):
    """Random values of `dtype` with about `density` of them nonzero (never a constant array)."""
    keep = rng.random(shape) < density
    if dtype == np.bool_:
        return np.asarray(keep)
    vals = rng.integers(1, 9, shape).astype(dtype) * np.where(rng.random(shape) < 0.5, -1, 1).astype(dtype)
    return np.asarray(np.where(keep, vals, 0), dtype=dtype)


def _traced(model, device):
    trace = MemoryTrace()
    return Network(build_program(model), device, trace=trace, impls="dynamic"), trace


def _masked_feeds(rng, n, mask):
    return {"x": rng.standard_normal((n, 8)).astype(np.float32), "mask": mask}


@pytest.mark.parametrize("elem,shape", [
    (TensorProto.FLOAT, (37,)), (TensorProto.FLOAT, (6, 9)), (TensorProto.INT64, (3, 4, 5)),
    (TensorProto.INT32, (2, 3, 1, 4)), (TensorProto.BOOL, (700,)), (TensorProto.FLOAT, (2, 3, 2, 3, 2, 3)),
    (TensorProto.INT64, ()), (TensorProto.BOOL, (5, 0)),
])
def test_nonzero_alone_matches_onnxruntime(device, elem, shape):
    rng = np.random.default_rng(len(shape) * 10 + elem)
    dims = ["d%d" % i for i in range(len(shape))]
    feeds = [{"x": _sparse(rng, shape, NP[elem])} for _ in range(3)]
    if shape == ():  # a scalar: one nonzero and one zero value
        feeds = [{"x": np.array(3, np.int64)}, {"x": np.array(0, np.int64)}, {"x": np.array(-1, np.int64)}]
    net = run_vs_ort(nonzero_alone(elem, dims), feeds, device)
    assert [n.node.op for n in net.insts] == ["count_nonzero", "gather_nonzero"]


def test_nonzero_large_input_row_major_order(device):
    """More elements than work-items (chunks of several elements each) and chunk boundaries
    inside runs of nonzeros: the order must still be row-major."""
    rng = np.random.default_rng(3)
    x = _sparse(rng, (97, 131), np.float32, density=0.7)
    x[:, :5] = 1.0
    run_vs_ort(nonzero_alone(TensorProto.FLOAT, ["a", "b"]), [{"x": x}, {"x": x[:50, :3]}], device)


_NETS: dict = {}


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4).flatmap(lambda r: st.lists(st.integers(0, 9), min_size=r, max_size=r)),
       st.sampled_from([TensorProto.FLOAT, TensorProto.INT32, TensorProto.BOOL]),
       st.floats(0.0, 1.0), st.integers(0, 2**32 - 1))
def test_nonzero_any_shape_and_density_matches_onnxruntime(device, shape, elem, density, seed):
    """One network per (rank, dtype) sees every drawn shape: shape changes, repeats, empties."""
    key = (len(shape), elem)
    if key not in _NETS:
        model = nonzero_alone(elem, ["d%d" % i for i in range(len(shape))])
        _NETS[key] = (Network(build_program(model), device), ort_session(model))
    net, sess = _NETS[key]
    x = _sparse(np.random.default_rng(seed), tuple(shape), NP[elem], density)
    assert_close(net.infer({"x": x})["y"], sess.run(None, {"x": x})[0], what=f"{shape} {x.dtype}")


def test_nonzero_feeding_gather_transpose_cast(device):
    rng = np.random.default_rng(1)
    masks = [rng.random(n) < 0.5 for n in (12, 12, 20)]
    masks[0][:2] = True   # at least two rows on every inference: outputs are not constant
    masks[1][:3] = True
    masks[2][5:8] = True
    run_vs_ort(masked_select(), [_masked_feeds(rng, len(m), m) for m in masks], device)


def test_same_shape_new_data_infers_dynamic_output(device):
    """The input layouts repeat but the data changes: gather_nonzero re-infers with reason
    dynamic_output (new output shapes), nodes after it see the new shape; the count node and
    the shape-independent nodes skip."""
    rng = np.random.default_rng(2)
    model = masked_select()
    net, trace = _traced(model, device)
    m0 = np.zeros(16, bool)
    m0[[1, 4, 9]] = True
    m1 = m0.copy()
    m1[[2, 3, 12, 15]] = True            # 7 rows
    m2 = m1.copy()
    m2[[1, 2, 3]] = False                # 4 rows, different positions
    m2[[5, 6, 7]] = True
    m2[[12, 15, 4]] = False
    m2[[0, 4]] = True
    seq = [_masked_feeds(rng, 16, m) for m in (m0, m1, m1, m2)]
    run_vs_ort(model, seq, device, net=net)
    want_k = [3, 7, 7, 6]
    for it, k in enumerate(want_k):
        g = [e for e in trace.of(it, "update_shape") if e["op"] == "gather_nonzero"]
        assert len(g) == 1 and g[0]["action"] == "infer"
        assert g[0]["reason"] == ("first_run" if it == 0 else "dynamic_output")
        assert [list(s) for s in g[0]["out_shapes"]] == [[1, k]]
        assert g[0]["device_reads"] == 1
        if it:
            cnt = [e for e in trace.of(it, "update_shape") if e["op"] == "count_nonzero"]
            assert [(e["action"], e["reason"]) for e in cnt] == [("skip", "shape_unchanged")]
    # inference 2 repeats inference 1's data: the gather re-infers but its output did not
    # move, so the nodes after it skip and nothing is rebound or rebuilt
    later = {e["node"]: e for e in trace.of(2, "update_shape") if e["op"] not in ("gather_nonzero",)}
    assert later and all(e["action"] == "skip" for e in later.values())
    assert not trace.of(2, "update_impl") and not trace.of(2, "realloc", "alloc")
    assert all(e["action"] == "skip" for e in trace.of(2, "set_args"))
    # inference 3: same input shapes, new count: the Gather after it re-infers its shape
    gather = [e for e in trace.of(3, "update_shape") if e["node"] == "Gather"]
    assert [(e["action"], e["reason"]) for e in gather] == [("infer", "shape_changed")]


def test_all_zero_input_skips_execution_with_empty_result(device):
    rng = np.random.default_rng(4)
    model = masked_select()
    net, trace = _traced(model, device)
    some = np.zeros(10, bool)
    some[[0, 3, 7]] = True
    seq = [_masked_feeds(rng, 10, some), _masked_feeds(rng, 10, np.zeros(10, bool)),
           _masked_feeds(rng, 10, some)]
    net = run_vs_ort(model, seq, device, net=net)
    skipped = {e["node"] for e in trace.of(1, "execute", "skip") if e["reason"] == "empty_output"}
    assert {"NonZero", "Gather"} <= skipped
    # the count is the only kernel: everything after an empty NonZero is empty too
    assert [e["node"] for e in trace.of(1, "execute", "enqueue")] == ["NonZero_count"]
    sess = ort_session(model)
    out = net.infer(_masked_feeds(rng, 10, np.zeros(10, bool)))
    assert out["rows"].shape == (0, 8) and out["pos"].shape == (0, 1)
    ref = sess.run(None, _masked_feeds(rng, 10, np.zeros(10, bool)))
    assert_close(out["rows"], ref[0], what="rows")
    assert_close(out["pos"], ref[1], what="pos")


def test_device_reads_are_the_8_byte_counts_only(device):
    """Shape inference reads from the device only the counts: one 8-byte read per NonZero per
    inference, counted in `device_reads` (the run summary's counter), never the input."""
    two = _model([helper.make_node("NonZero", ["a"], ["ya"], name="NZa"),
                  helper.make_node("NonZero", ["b"], ["yb"], name="NZb")],
                 [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n"]),
                  helper.make_tensor_value_info("b", TensorProto.INT32, [4, "m"])],
                 [helper.make_tensor_value_info("ya", TensorProto.INT64, [1, "k"]),
                  helper.make_tensor_value_info("yb", TensorProto.INT64, [2, "l"])])
    net, trace = _traced(two, device)
    reads = []
    orig = net.queue.read_to_host

    def spy(t):
        reads.append((net.iter, t.name, t.layout.nbytes))
        return orig(t)
    net.queue.read_to_host = spy
    rng = np.random.default_rng(5)
    seq = [{"a": _sparse(rng, (n,), np.float32), "b": _sparse(rng, (4, n), np.int32)}
           for n in (300, 300, 64)]
    sess = ort_session(two)
    for it, feeds in enumerate(seq):
        reads.clear()
        outs = net.infer(feeds)
        for name, want in zip(("ya", "yb"), sess.run(None, feeds)):
            assert_close(outs[name], want, what=name)
        shape_reads = [r for r in reads if r[1] not in ("ya", "yb")]   # minus the outputs
        assert sorted(r[1:] for r in shape_reads) == [("ya_count", 8), ("yb_count", 8)]
        assert net.counters["device_reads"] == 2
        per_node = {e["node"]: e["device_reads"] for e in trace.of(it, "update_shape", "infer")}
        assert per_node.get("NZa") == 1 and per_node.get("NZb") == 1
        assert sum(per_node.values()) == 2


def test_nonzero_in_a_shape_subgraph_stays_on_the_host(device):
    """NonZero over host values (a Shape) is shape math: one host node, no device read."""
    model = _model([helper.make_node("Shape", ["x"], ["s"], name="Shape"),
                    helper.make_node("NonZero", ["s"], ["nz"], name="NonZero"),
                    helper.make_node("Cast", ["nz"], ["nzf"], name="Cast", to=TensorProto.FLOAT),
                    helper.make_node("Add", ["nzf", "x"], ["y"], name="Add")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b"])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])])
    net, trace = _traced(model, device)
    rng = np.random.default_rng(6)
    run_vs_ort(model, [{"x": rng.standard_normal((1, 2)).astype(np.float32)},
                       {"x": rng.standard_normal((1, 2)).astype(np.float32)}], device, net=net)
    assert {n.node.op: n.node.host for n in net.insts}["NonZero"] is True
    assert net.counters.get("device_reads", 0) == 0


def test_internal_ops_are_not_accepted_from_a_model():
    m = _model([helper.make_node("count_nonzero", ["x"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
               [helper.make_tensor_value_info("y", TensorProto.INT64, [1])])
    with pytest.raises(ModelError, match="unsupported ops: count_nonzero"):
        build_program(m)


def test_cli_run_check_on_a_nonzero_model(tmp_path):
    path = tmp_path / "masked.onnx"
    onnx.save(masked_select(), path)
    trace = tmp_path / "t.jsonl"
    r = CliRunner().invoke(app, ["run", str(path), "--shapes", "x:{16..18}x8,mask:{16..18}",
                                 "--shapes", "x:16x8,mask:16*2", "--check", "--trace", str(trace),
                                 "--impls", "dynamic"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "5 passed, 0 failed" in r.output
    header, events = read_trace(str(trace))
    events = list(events)
    reasons = {(e["iter"], e["reason"]) for e in events
               if e["kind"] == "update_shape" and e["op"] == "gather_nonzero"}
    assert reasons == {(0, "first_run"), (1, "shape_changed"), (2, "shape_changed"),
                       (3, "shape_changed"), (4, "dynamic_output")}
    ends = [e for e in events if e["kind"] == "infer_end"]
    assert [e["counters"]["device_reads"] for e in ends] == [1] * 5
    assert "device reads for shape inference" in r.output
    r = CliRunner().invoke(app, ["run", str(path), "--shapes", "x:9x8,mask:9*3", "--json",
                                 "--trace", str(tmp_path / "j.jsonl")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["counters"]["device_reads"] == 3
    assert s["counters"]["update_shape.infer.dynamic_output"] == 2


def test_memory_dep_new_version_same_value_is_not_a_change(device):
    """A memory dep re-fed with the same value (a new tensor version) does not re-run shape
    inference; a new value does (`memory_deps_changed`). Static dims everywhere do not make the
    Reshape `static_output`: its target is a value that can change."""
    model = _model([helper.make_node("Reshape", ["x", "target"], ["r"], name="Reshape"),
                    helper.make_node("Relu", ["r"], ["y"], name="Relu")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6]),
                    helper.make_tensor_value_info("target", TensorProto.INT64, [2])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    net, trace = _traced(model, device)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    targets = [[3, 8], [3, 8], [8, 3]]
    run_vs_ort(model, [{"x": x, "target": np.array(t, np.int64)} for t in targets], device, net=net)
    reshape = [(e["action"], e["reason"]) for e in trace.events
               if e["kind"] == "update_shape" and e["node"] == "Reshape"]
    assert reshape == [("infer", "first_run"), ("skip", "shape_unchanged"),
                       ("infer", "memory_deps_changed")]
