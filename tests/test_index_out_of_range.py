"""Indices out of range are refused, as onnxruntime refuses them, never answered with the
clamped row the kernels read (the ONNX operator docs: every index lies in [-s, s-1]); indices in
range, negative ones included, give onnxruntime's values; through the CLI: one line, exit 2."""
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine import Network, build_program
from engine.diagnose import InferenceError
from tests.conftest import assert_close, ort_session
from traces import MemoryTrace

F, I64 = TensorProto.FLOAT, TensorProto.INT64
DATA = np.arange(24, dtype=np.float32).reshape(4, 6)


def _model(op, idx_dims, data_input=False, **attrs):
    """op(data, i[, updates]) with `i` a graph input; data a constant unless `data_input`."""
    ins = ["d", "i"] + (["u"] if op.startswith("Scatter") else [])
    vis = [helper.make_tensor_value_info("i", I64, idx_dims)]
    inits = []
    if data_input:
        vis.append(helper.make_tensor_value_info("d", F, ["r", 6]))
    else:
        inits.append(numpy_helper.from_array(DATA, "d"))
    if op.startswith("Scatter"):
        vis.append(helper.make_tensor_value_info("u", F, None))
    g = helper.make_graph([helper.make_node(op, ins, ["y"], name="n", **attrs)], "g", vis,
                          [helper.make_tensor_value_info("y", F, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)],
                             ir_version=8)   # onnxruntime 1.30 (the GPU machine) reads IR <= 13


# op, attrs, in-range indices, out-of-range indices, the message's tail
CASES = {
    "Gather": ("Gather", {}, [[0, -1, 3]], [[1, 4, 0]], "index 4 of i is out of range for axis 0 of size 4 (-4..3)"),
    "Gather_axis1": ("Gather", {"axis": 1}, [[5, -6]], [[-7, 0]], "index -7 of i is out of range for axis 1 of size 6 (-6..5)"),
    "GatherElements": ("GatherElements", {"axis": 1}, [[0, 5], [-1, 2]], [[0, 6], [1, 2]],
                       "index 6 of i is out of range for axis 1 of size 6 (-6..5)"),
    "GatherND": ("GatherND", {}, [[3, 5], [-4, 0]], [[1, 1], [4, 0]], "index 4 of i is out of range for axis 0 of size 4 (-4..3)"),
    "ScatterElements": ("ScatterElements", {"axis": 0}, [[3, 0]], [[0, -5]], "index -5 of i is out of range for axis 0 of size 4 (-4..3)"),
    "ScatterND": ("ScatterND", {}, [[2], [-1]], [[1], [9]], "index 9 of i is out of range for axis 0 of size 4 (-4..3)"),
}


def _feeds(op, idx, data_input):
    i = np.array(idx, np.int64)
    feeds = {"i": i}
    if data_input:
        feeds["d"] = DATA
    if op == "ScatterElements":
        feeds["u"] = np.full(i.shape, 100.0, np.float32)
    if op == "ScatterND":
        feeds["u"] = np.full(i.shape[:-1] + (6,), 100.0, np.float32)
    return feeds


@pytest.mark.parametrize("data_input", [False, True], ids=["const_data", "input_data"])
@pytest.mark.parametrize("case", list(CASES))
def test_out_of_range_refused_in_range_as_onnxruntime(case, data_input, device):
    op, attrs, good, bad, why = CASES[case]
    model = _model(op, [f"i{k}" for k in range(np.ndim(good))], data_input, **attrs)
    net = Network(build_program(model), device)
    sess = ort_session(model)
    for _ in range(2):   # the second inference of each signature is a plan replay
        feeds = _feeds(op, good, data_input)
        assert_close(net.infer(feeds)["y"], sess.run(None, feeds)[0])
        feeds = _feeds(op, bad, data_input)
        with pytest.raises(Exception):
            sess.run(None, feeds)   # onnxruntime refuses these too
        with pytest.raises(InferenceError) as e:
            net.infer(feeds)
        shapes = ", ".join("x".join(map(str, np.shape(v))) for v in
                           [DATA] + [feeds[k] for k in ("i", "u") if k in feeds])
        assert str(e.value) == f"node n ({op}) cannot run on input shapes [{shapes}]: {why}"
    assert net.counters["plan.replay"] == 1, "the fast path never replayed: the check after it is untested"


@pytest.mark.parametrize("make, name", [(lambda: _model("Gather", ["batch", "seq"]), "i"),
                                        (lambda: _device_model("Gather", ["batch", "seq"]), "j")],
                         ids=["host_indices", "device_indices"])
def test_gather_out_of_range_through_the_cli_one_line_exit_2(tmp_path, make, name):
    p = tmp_path / "emb.onnx"
    onnx.save(make(), p)
    r = subprocess.run([sys.executable, "-m", "dyncli", "run", str(p), "--shapes", "i:1x8",
                        "--input-range", "i:0..40", "--trace", "none", "-q"],
                       capture_output=True, text=True, timeout=300)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: inference 0 failed: node n (Gather) cannot run on input "
                               "shapes [4x6, 1x8]: index "), lines[0]
    assert lines[0].endswith(f" of {name} is out of range for axis 0 of size 4 (-4..3)"), lines[0]


def test_in_range_on_a_transition_replay_whose_data_the_last_flow_left_shorter(device):
    """A replay stands for an inference of another signature than the last flow ran: the checks
    read the replayed signature's layouts, not the ones the last flow left (a Gather from an
    intermediate along its sequence axis: length 8 replayed after a flow at length 4)."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                           helper.make_node("Gather", ["r", "i"], ["y"], name="g", axis=1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", 4]),
                           helper.make_tensor_value_info("i", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    trace = MemoryTrace()
    net = Network(build_program(model), device, trace=trace, impls="dynamic", predictor="adaptive")
    rng = np.random.default_rng(0)
    seq = [8, 8, 4, 4, 8, 8, 4, 4, 8, 8, 4, 8, 4, 6, 4, 8]   # 6 and then 4: flows; the last 8 a replay
    for k, s in enumerate(seq):
        x = rng.standard_normal((1, s, 4)).astype(np.float32)
        y = net.infer({"x": x, "i": np.array([s - 1], np.int64)})["y"]
        assert np.array_equal(y, np.maximum(x, 0)[:, [s - 1]]), k
    replays = {e["iter"]: e["reason"] for e in trace.events if e["kind"] == "plan"}
    assert replays.get(len(seq) - 1) == "transition", replays


# ---- indices computed on the device: the kernels flag them, read with the outputs ----------
def _device_model(op, idx_dims, **attrs):
    """op(data, i + zero[, updates]): the indices an Add computes on the device (no host value)."""
    ins = ["d", "j"] + (["u"] if op.startswith("Scatter") else [])
    vis = [helper.make_tensor_value_info("i", I64, idx_dims)]
    if op.startswith("Scatter"):
        vis.append(helper.make_tensor_value_info("u", F, None))
    g = helper.make_graph([helper.make_node("Add", ["i", "zero"], ["j"], name="add"),
                           helper.make_node(op, ins, ["y"], name="n", **attrs)], "g", vis,
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(DATA, "d"),
                           numpy_helper.from_array(np.zeros((), np.int64), "zero")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _twice(idx):
    """Another shape of in-range indices: the rows repeated."""
    return np.concatenate([np.array(idx, np.int64)] * 2).tolist()


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast_path", "flow_only"])
@pytest.mark.parametrize("case", list(CASES))
def test_device_computed_indices_out_of_range_refused_over_a_shape_sequence(case, fast_path, device):
    """Bad indices among good ones of two shapes, three rounds: with the fast path the later
    rounds are plan replays, a replayed bad inference refused too; every good inference after a
    refused one gives onnxruntime's values (the flag was cleared)."""
    op, attrs, good, bad, why = CASES[case]
    model = _device_model(op, [f"i{k}" for k in range(np.ndim(good))], **attrs)
    net = Network(build_program(model), device, fast_path=fast_path)
    sess = ort_session(model)
    refused_on_replay = 0
    for _ in range(3):
        for idx, ok in ((good, True), (bad, False), (_twice(good), True)):
            feeds = _feeds(op, idx, False)
            if ok:
                assert_close(net.infer(feeds)["y"], sess.run(None, feeds)[0])
                assert net.tensors["j"].host is None, "the indices are not computed on the device"
                continue
            with pytest.raises(Exception):
                sess.run(None, feeds)
            with pytest.raises(InferenceError) as e:
                net.infer(feeds)
            shapes = ", ".join("x".join(map(str, np.shape(v))) for v in
                               [DATA] + [feeds[k] for k in ("i", "u") if k in feeds])
            assert str(e.value) == f"node n ({op}) cannot run on input shapes [{shapes}]: " + \
                why.replace(" of i ", " of j "), str(e.value)
            refused_on_replay += net.counters.get("plan.replay", 0)
    assert (refused_on_replay > 0) == fast_path, refused_on_replay


def test_argmax_indices_in_range_accepted_over_shapes(device):
    """Indices an ArgMax computes are in range by construction: every length runs, flow and
    replay alike, as onnxruntime runs it."""
    g = helper.make_graph([helper.make_node("ArgMax", ["x"], ["a"], name="am", axis=1, keepdims=0),
                           helper.make_node("Gather", ["x", "a"], ["y"], name="g", axis=1)], "g",
                          [helper.make_tensor_value_info("x", F, [1, "s"])],
                          [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    net = Network(build_program(model), device)
    sess = ort_session(model)
    rng = np.random.default_rng(0)
    for s in [3, 5, 3, 5, 3, 5, 8]:
        x = rng.standard_normal((1, s)).astype(np.float32)
        assert_close(net.infer({"x": x})["y"], sess.run(None, {"x": x})[0])
    assert net.index_checks.flags is not None


def test_argmax_indices_past_the_data_refused(device):
    """ArgMax over a longer axis than the data it indexes: the same words as onnxruntime's refusal."""
    g = helper.make_graph([helper.make_node("ArgMax", ["x"], ["a"], name="am", axis=1, keepdims=0),
                           helper.make_node("Gather", ["d", "a"], ["y"], name="g")], "g",
                          [helper.make_tensor_value_info("x", F, [1, 8])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(DATA, "d")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    net = Network(build_program(model), device)
    x = np.zeros((1, 8), np.float32)
    x[0, 6] = 1
    with pytest.raises(Exception):
        ort_session(model).run(None, {"x": x})
    with pytest.raises(InferenceError) as e:
        net.infer({"x": x})
    assert str(e.value) == "node g (Gather) cannot run on input shapes [4x6, 1]: index 6 of a " \
                           "is out of range for axis 0 of size 4 (-4..3)"
    x[0, 6], x[0, 2] = 0, 1
    assert_close(net.infer({"x": x})["y"], DATA[[2]])


@pytest.mark.parametrize("stopped", ["before the read", "between the read and the check"])
def test_flags_left_by_an_inference_that_failed_midway_are_cleared(device, stopped):
    """An inference that stops before its end never reads the flags its kernels set, or reads
    them (before its outputs) and never looks: the next one clears them first instead of
    refusing good indices."""
    model = _device_model("Gather", ["k"])
    net = Network(build_program(model), device)
    flags = net.index_checks.flags
    import pyopencl as cl
    cl.enqueue_copy(net.queue.cl_queue, flags.buf, np.array([1, 0, 9, 0], np.int32), is_blocking=True)
    if stopped == "before the read":
        flags.unread = True
    else:
        flags.read(net.queue.cl_queue)
        net.queue.cl_queue.finish()
    feeds = {"i": np.array([0, 3], np.int64)}
    assert_close(net.infer(feeds)["y"], DATA[[0, 3]])
