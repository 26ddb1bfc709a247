"""Runtime in-place crop (the GPU plugin's do_runtime_in_place_crop, here for Split): when every
dim before the split axis is 1 for the current shapes, each output is one contiguous run of the
input and becomes a slice of its buffer (no kernel); other shapes copy. The outputs' readers see
the offsets; values against onnxruntime, the same decisions with the fast path on and off."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from engine import Network, build_program
from tests.conftest import run_vs_ort
from traces import MemoryTrace

F = TensorProto.FLOAT


def _qkv_split(axis: int) -> onnx.ModelProto:
    """x @ W + b -> Split(axis) into three parts; q * k + v, k read again by a Transpose, v a
    graph output."""
    rng = np.random.default_rng(1)
    w = helper.make_tensor("w", F, [8, 12], rng.standard_normal(96).astype(np.float32))
    b = helper.make_tensor("b", F, [12], rng.standard_normal(12).astype(np.float32))
    split = helper.make_tensor("sizes", TensorProto.INT64, [3], [4, 4, 4])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="proj"),
             helper.make_node("Add", ["xw", "b"], ["qkv"], name="bias"),
             helper.make_node("Split", ["qkv", "sizes"] if axis == -1 else ["qkv"],
                              ["q", "k", "v"], name="split", axis=axis),
             helper.make_node("Mul", ["q", "k"], ["qk"], name="mul"),
             helper.make_node("Add", ["qk", "v"], ["y"], name="add"),
             helper.make_node("Transpose", ["k"], ["kt"], name="kt")]
    g = helper.make_graph(nodes, "qkv", [helper.make_tensor_value_info("x", F, ["a", "s", 8])],
                          [helper.make_tensor_value_info(n, F, None) for n in ("y", "kt", "v")],
                          [w, b] + ([split] if axis == -1 else []))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


@pytest.mark.parametrize("fast_path", [True, False])
def test_split_of_one_row_is_sliced_in_place(device, fast_path):
    model = _qkv_split(-1)
    rng = np.random.default_rng(2)
    shapes = [(1, 1), (1, 3), (1, 1), (1, 1), (2, 1), (1, 1), (1, 3), (1, 3)]
    seq = [{"x": rng.standard_normal((a, s, 8)).astype(np.float32)} for a, s in shapes]
    trace = MemoryTrace()
    net = Network(build_program(model), device, trace=trace, fast_path=fast_path)
    run_vs_ort(model, seq, device, rtol=1e-5, atol=1e-5, net=net)
    for i, (a, s) in enumerate(shapes):
        ev = [e for e in trace.events if e.get("iter") == i and e.get("node") == "split"]
        if not ev:        # a whole-plan replay: its events are the recorded inference's
            assert fast_path
            continue
        crop = any(e["kind"] == "execute" and e["reason"] == "in_place_crop" for e in ev)
        assert crop == (a * s == 1), (i, ev)


def test_split_along_the_first_axis_is_always_in_place(device):
    """axis 0: no dim before it, every shape is sliced; no kernel for the Split ever."""
    model = _qkv_split(0)
    model.graph.node[2].attribute.append(helper.make_attribute("num_outputs", 3))
    rng = np.random.default_rng(3)
    seq = [{"x": rng.standard_normal((3 * r, 1, 8)).astype(np.float32)} for r in (1, 2, 1, 3)]
    trace = MemoryTrace()
    net = Network(build_program(model), device, trace=trace, fast_path=False)
    run_vs_ort(model, seq, device, rtol=1e-5, atol=1e-5, net=net)
    assert not [e for e in trace.events if e.get("node") == "split" and e["kind"] == "execute"
                and e["action"] == "enqueue"]


def _slices() -> onnx.ModelProto:
    """Slices of x [a, b, c] by runtime starts/ends (inputs), read by an Add so each is used on
    the device: y1 = x[s:e] (rows: contiguous), y2 = x[:, s:e] (contiguous when a is 1),
    y3 = x[..., s:e] (contiguous when a and b are 1 or the cut is whole), y4 = x[s:e:2]."""
    i64 = TensorProto.INT64
    consts = [helper.make_tensor("ax0", i64, [1], [0]), helper.make_tensor("ax1", i64, [1], [1]),
              helper.make_tensor("ax2", i64, [1], [2]), helper.make_tensor("two", i64, [1], [2]),
              helper.make_tensor("one", F, [], [1.0])]
    nodes = [helper.make_node("Slice", ["x", "s", "e", "ax0"], ["y1"], name="rows"),
             helper.make_node("Slice", ["x", "s", "e", "ax1"], ["y2"], name="mid"),
             helper.make_node("Slice", ["x", "s", "e", "ax2"], ["y3"], name="last"),
             helper.make_node("Slice", ["x", "s", "e", "ax0", "two"], ["y4"], name="stepped")]
    outs = []
    for k in range(1, 5):
        nodes.append(helper.make_node("Add", [f"y{k}", "one"], [f"z{k}"], name=f"add{k}"))
        outs.append(f"z{k}")
    g = helper.make_graph(nodes, "slices", [helper.make_tensor_value_info("x", F, ["a", "b", "c"]),
                                            helper.make_tensor_value_info("s", i64, [1]),
                                            helper.make_tensor_value_info("e", i64, [1])],
                          [helper.make_tensor_value_info(n, F, None) for n in outs], consts)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("fast_path", [True, False])
def test_slices_that_are_one_run_become_views(device, fast_path):
    model = _slices()
    rng = np.random.default_rng(4)
    cases = [((4, 3, 5), 0, 3), ((1, 4, 5), 1, 2), ((1, 1, 6), 2, 5), ((3, 2, 4), 0, 9), ((1, 3, 4), 2, 3),
             ((4, 3, 5), 2, 3)]
    seq = [{"x": rng.standard_normal(shape).astype(np.float32), "s": np.array([s], np.int64),
            "e": np.array([e], np.int64)} for shape, s, e in cases]
    trace = MemoryTrace()
    net = Network(build_program(model), device, trace=trace, fast_path=fast_path)
    run_vs_ort(model, seq, device, rtol=1e-6, atol=1e-6, net=net)
    crops = [{e["node"] for e in trace.events if e.get("iter") == i and e["kind"] == "execute"
              and e["reason"] == "in_place_crop"} for i in range(len(cases))]
    assert crops[0] >= {"rows"} and "stepped" not in crops[0]        # rows 0-2; 0 and 2
    assert crops[1] >= {"rows", "mid"}                                # a = 1: a row block of b
    assert crops[2] >= {"rows", "mid", "last"}                        # a = b = 1
    assert "mid" not in crops[0] and "last" not in crops[0]
