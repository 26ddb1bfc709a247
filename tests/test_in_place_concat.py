"""Runtime in-place concat: producers write straight into slices of the concat's
buffer when the shapes allow it, and the concat falls back to copying, saying why, when not.
Every inference is compared with onnxruntime."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import run_traced


def _fire(opset: int = 17) -> onnx.ModelProto:
    """SqueezeNet's fire module: squeeze 1x1 -> (expand 1x1, expand 3x3) -> Concat(channels)
    -> 1x1 conv. The two expands read only the squeeze output, so both shapes are known when
    the first expand is about to run."""
    rng = np.random.default_rng(0)
    inits = []

    def conv(x, name, cin, cout, k, out=None):
        w = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2 / (cin * k * k))).astype(np.float32)
        b = rng.normal(0, 0.1, cout).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(b, f"{name}.b")])
        pads = [k // 2] * 4
        return [helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [f"{name}.c"], name=name,
                                 kernel_shape=[k, k], pads=pads),
                helper.make_node("Relu", [f"{name}.c"], [out or f"{name}.r"], name=f"{name}_relu")]

    nodes = conv("x", "squeeze", 8, 4, 1) + conv("squeeze.r", "e1", 4, 6, 1) + \
        conv("squeeze.r", "e3", 4, 10, 3)
    nodes.append(helper.make_node("Concat", ["e1.r", "e3.r"], ["cat"], name="Concat", axis=1))
    nodes += conv("cat", "head", 16, 8, 1, out="y")
    g = helper.make_graph(nodes, "fire", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, "h", "w"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8, "h", "w"])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _matmul_cat() -> onnx.ModelProto:
    """Two projections of x concatenated along the rows (axis 0 of [s, d]) and, as a graph
    output too, along the features (axis 1: contiguous only when s == 1)."""
    rng = np.random.default_rng(1)
    w = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), f"w{k}") for k in range(4)]
    nodes = [helper.make_node("MatMul", ["x", f"w{k}"], [f"p{k}"], name=f"MatMul_{k}") for k in range(4)]
    nodes += [helper.make_node("Concat", ["p0", "p1"], ["rows"], name="Concat_rows", axis=0),
              helper.make_node("Concat", ["p2", "p3"], ["cols"], name="Concat_cols", axis=1)]
    g = helper.make_graph(nodes, "matmul_cat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s", 8])],
                          [helper.make_tensor_value_info("rows", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("cols", TensorProto.FLOAT, None)], w)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _node_events(trace, it, node):
    return [(e["kind"], e["action"], e["reason"]) for e in trace.of(it) if e["node"] == node]


def test_fire_module_concat_in_place_then_fallback(device):
    rng = np.random.default_rng(2)
    shapes = [(1, 9, 9), (1, 9, 9), (2, 9, 9), (1, 12, 7)]
    seq = [{"x": rng.standard_normal(s[:1] + (8,) + s[1:]).astype(np.float32)} for s in shapes]
    net, trace = run_traced(_fire(), seq, device)
    # batch 1: the expands write into the concat's buffer, the concat enqueues nothing
    ev = trace.of(0, "in_place_concat")
    assert [(e["action"], e["offsets"]) for e in ev] == [("apply", [0, 6 * 81])]
    concat = _node_events(trace, 0, "Concat")
    assert ("execute", "skip", "in_place") in concat and ("execute", "enqueue", "") not in concat
    for prod in ("e1", "e3"):   # fused Conv+Relu producers
        evs = _node_events(trace, 0, prod)
        assert ("update_shape", "skip", "done_by_other") in evs
        assert ("realloc", "by_other", "") in evs
        assert any(e["node"] == prod and e.get("by") == "Concat" for e in trace.of(0, "update_shape"))
    # the same shape again: nothing is inferred or allocated, shapes are still done by the concat
    assert not trace.of(1, "realloc", "alloc") and not trace.of(1, "update_shape", "infer")
    assert ("update_shape", "skip", "done_by_other") in _node_events(trace, 1, "e1")
    # batch 2: each input's region is two runs -> the concat copies, producers own buffers
    fb = trace.of(2, "in_place_concat")
    assert [(e["action"], e["reason"]) for e in fb] == [("fallback", "not_contiguous")]
    assert ("execute", "enqueue", "") in _node_events(trace, 2, "Concat")
    assert ("realloc", "by_other", "") not in _node_events(trace, 2, "e1")
    # back to batch 1: in place again
    assert [e["action"] for e in trace.of(3, "in_place_concat")] == ["apply"]
    assert net.counters["in_place_concat.apply"] == 1


def test_matmul_rows_always_in_place_features_only_for_one_row(device):
    rng = np.random.default_rng(3)
    seq = [{"x": rng.standard_normal((s, 8)).astype(np.float32)} for s in (5, 1, 3)]
    net, trace = run_traced(_matmul_cat(), seq, device)
    for it, cols in ((0, "fallback"), (1, "apply"), (2, "fallback")):
        got = {e["node"]: e["action"] for e in trace.of(it, "in_place_concat")}
        assert got == {"Concat_rows": "apply", "Concat_cols": cols}, (it, got)
