"""Shapes the model cannot take, through the CLI: one line naming the node, its op, its input
shapes and what limits them, exit 2 (README "Exit statuses"), never "internal error"."""
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

I64 = TensorProto.INT64


def _save(path, nodes, inputs, inits):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _run(model, shapes):
    r = subprocess.run([sys.executable, "-m", "dyncli", "run", str(model), "--shapes", shapes,
                        "--trace", "none", "-q"], capture_output=True, text=True, timeout=300)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr)
    return lines[0]


@pytest.mark.parametrize("case", ["broadcast", "reshape", "past_int64", "position_past_table"])
def test_shape_the_model_cannot_take_is_one_line_exit_2(case, tmp_path):
    f = TensorProto.FLOAT
    if case == "broadcast":    # a device node's shape inference refuses: Add with a 128 constant
        m = _save(tmp_path / "m.onnx", [helper.make_node("Add", ["x", "c"], ["y"], name="add")],
                  [("x", f, [1, "seq", 128])], {"c": np.zeros((1, 128, 128), np.float32)})
        want = ("node add (Add) cannot run on input shapes [1x200x128, 1x128x128]: x seq 200 "
                "exceeds a constant of 128 along that axis (c)")
        shapes = "1x200x128"
    elif case == "reshape":    # a view's: its target shape is a value, not a dim limit
        m = _save(tmp_path / "m.onnx", [helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")],
                  [("x", f, ["n"])], {"s": np.array([-1, 4], np.int64)})
        want = ("node rs (Reshape) cannot run on input shapes [6, 2]: cannot reshape 6 elements "
                "to [-1, 4]: 6 is not a multiple of 4")
        shapes = "6"
    elif case == "position_past_table":   # a host Gather of a position past a [4, 3] table
        m = _save(tmp_path / "m.onnx", [helper.make_node("Shape", ["x"], ["s"], name="shape"),
                                        helper.make_node("Gather", ["s", "zero"], ["n"], name="len", axis=0),
                                        helper.make_node("Gather", ["pos", "n"], ["y"], name="row", axis=0)],
                  [("x", f, ["n"])], {"zero": np.array(0, np.int64), "pos": np.ones((4, 3), np.int64)})
        want = ("node row (Gather) cannot run on input shapes [4x3, scalar]: index 4 is out of bounds "
                "for axis 0 with size 4")
        shapes = "4"
    else:                      # shape math past int64 on the host: numpy would wrap it silently
        m = _save(tmp_path / "m.onnx", [helper.make_node("Shape", ["x"], ["s"], name="shape"),
                                        helper.make_node("Mul", ["s", "k"], ["t"], name="mul"),
                                        helper.make_node("ConstantOfShape", ["t"], ["y"], name="cos")],
                  [("x", f, ["n"])], {"k": np.array([2 ** 62], np.int64)})
        want = ("node mul (Mul) cannot run on input shapes [1, 1]: 4 * 4611686018427387904 is past "
                "int64 (-9223372036854775808..9223372036854775807)")
        shapes = "4"
    assert _run(m, shapes) == f"error: inference 0 failed: {want}"
