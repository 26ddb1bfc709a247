"""Mean (variadic elementwise, like Sum) and Size (the element count as an int64 scalar) against
onnxruntime over shape sequences (growth, shrink, repeats) on one Network each: Size on the
device (it counts a data tensor) and on the host (inside shape math)."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import run_vs_ort

F, F16, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64


def _model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                          list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_mean_broadcasts_over_shapes(device, n):
    rng = np.random.default_rng(n)
    names = "abcde"[:n]
    # a full-rank first input, the others broadcast along different dims
    ranks = {"a": ["x", "y", "z"], "b": ["y", "z"], "c": ["x", 1, "z"], "d": ["z"], "e": [1, 1, 1]}
    model = _model([helper.make_node("Mean", list(names), ["m"])],
                   [(k, F, ranks[k]) for k in names], [("m", F, None)])

    def feeds(x, y, z):
        dims = {"x": x, "y": y, "z": z}
        return {k: rng.standard_normal([dims.get(d, d) for d in ranks[k]]).astype(np.float32)
                for k in names}

    run_vs_ort(model, [feeds(2, 3, 4), feeds(3, 5, 7), feeds(2, 3, 4), feeds(1, 1, 9)], device)


def test_mean_refuses_integers(device):
    from engine import build_program, Network
    from engine.ops.common import ShapeInferenceError
    model = _model([helper.make_node("Mean", ["a", "b"], ["m"])],
                   [("a", I64, ["n"]), ("b", I64, ["n"])], [("m", I64, None)])
    with pytest.raises(ShapeInferenceError, match="float types only"):
        Network(build_program(model), device).infer({"a": np.arange(3), "b": np.arange(3)})


def test_size_on_device_and_in_shape_math(device):
    """Size(x) counts a data tensor (a device node); Size(Shape(x)) is the rank (host shape
    math); Reshape(x, [Size(x)]) flattens through a Size value read back as a memory dep."""
    axes = helper.make_tensor("axes", I64, [1], [0])
    model = _model([helper.make_node("Size", ["x"], ["count"]),
                    helper.make_node("Shape", ["x"], ["shape"]),
                    helper.make_node("Size", ["shape"], ["rank"]),
                    helper.make_node("Unsqueeze", ["count", "axes"], ["flat_shape"]),
                    helper.make_node("Reshape", ["x", "flat_shape"], ["flat"])],
                   [("x", F, ["a", "b", "c"])],
                   [("count", I64, []), ("rank", I64, []), ("flat", F, None)], inits=[axes])
    rng = np.random.default_rng(0)
    seq = [{"x": rng.standard_normal(s).astype(np.float32)}
           for s in [(2, 3, 4), (2, 3, 4), (5, 1, 7), (0, 3, 2), (2, 3, 4)]]
    run_vs_ort(model, seq, device, check_nonconstant=False)


def test_size_of_float16_reads_no_element(device):
    """Size takes a float16 input as it is (no Cast in front: its kernel reads no element)."""
    from engine import build_program
    model = _model([helper.make_node("Size", ["x"], ["n"])], [("x", F16, ["a", "b"])],
                   [("n", I64, [])])
    prog = build_program(model)
    assert [n.op for n in prog.nodes] == ["Size"]
    seq = [{"x": np.ones(s, np.float16)} for s in [(3, 4), (1, 9), (3, 4)]]
    run_vs_ort(model, seq, device, check_nonconstant=False)
