"""Writes tests/control_flow/: small models with ONNX control flow, as exporters emit it.

- if_sum.onnx: If on ReduceSum(x) > 0 (a condition computed on the device); the then branch
  is Relu(x) @ w (x's rows by 4), the else branch Concat(x, -x) along the last axis (x's rows
  by 2 * x's columns): the branches differ in ops and in output shape.
- loop_counted.onnx: Loop with trip count M (an input), a carried state s = s * 0.5 + x and a
  scan output s_i + i (stacked per iteration).
- loop_while.onnx: a data-dependent while loop: the condition is computed in the body
  (keep doubling y while sum(y) <= threshold), with a trip count cap of 64; the number of
  iterations is an output too.
- scan_cumsum.onnx: Scan over axis 1 of x [batch, seq, features]: a running sum (carried) and
  its value at each step (scan output along axis 1).

python scripts/make_control_flow_models.py [out_dir]
"""
from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto as TP, helper as h, numpy_helper

OPSET = 17


def _const(name, value):
    return h.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def _model(nodes, inputs, outputs, inits=()):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", OPSET)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def if_sum():
    w = numpy_helper.from_array(np.linspace(-1, 1, 8 * 4, dtype=np.float32).reshape(8, 4), "w")
    then = h.make_graph([h.make_node("Relu", ["x"], ["r"]), h.make_node("MatMul", ["r", "w"], ["t_out"])],
                        "then", [], [h.make_tensor_value_info("t_out", TP.FLOAT, ["n", 4])])
    other = h.make_graph([h.make_node("Neg", ["x"], ["nx"]),
                          h.make_node("Concat", ["x", "nx"], ["e_out"], axis=-1)],
                         "else", [], [h.make_tensor_value_info("e_out", TP.FLOAT, ["n", 16])])
    nodes = [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             _const("zero", np.float32(0)),
             h.make_node("Greater", ["s", "zero"], ["c"]),
             h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    return _model(nodes, [h.make_tensor_value_info("x", TP.FLOAT, ["n", 8])],
                  [h.make_tensor_value_info("y", TP.FLOAT, ["n", "m"])], [w])


def loop_counted():
    body = h.make_graph(
        [_const("half", np.float32(0.5)),
         h.make_node("Mul", ["s_in", "half"], ["sh"]),
         h.make_node("Add", ["sh", "x"], ["s_out"]),
         h.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),
         h.make_node("Add", ["s_out", "fi"], ["scan"]),
         h.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [h.make_tensor_value_info("i", TP.INT64, []), h.make_tensor_value_info("cond_in", TP.BOOL, []),
         h.make_tensor_value_info("s_in", TP.FLOAT, ["n", 3])],
        [h.make_tensor_value_info("cond_out", TP.BOOL, []), h.make_tensor_value_info("s_out", TP.FLOAT, ["n", 3]),
         h.make_tensor_value_info("scan", TP.FLOAT, ["n", 3])])
    nodes = [h.make_node("Loop", ["M", "", "s0"], ["s_final", "scans"], body=body)]
    return _model(nodes, [h.make_tensor_value_info("M", TP.INT64, []),
                          h.make_tensor_value_info("s0", TP.FLOAT, ["n", 3]),
                          h.make_tensor_value_info("x", TP.FLOAT, ["n", 3])],
                  [h.make_tensor_value_info("s_final", TP.FLOAT, ["n", 3]),
                   h.make_tensor_value_info("scans", TP.FLOAT, ["m", "n", 3])])


def loop_while():
    body = h.make_graph(
        [_const("two", np.float32(2)),
         h.make_node("Mul", ["y_in", "two"], ["y_out"]),
         h.make_node("ReduceSum", ["y_out"], ["total"], keepdims=0),
         h.make_node("LessOrEqual", ["total", "threshold"], ["cond_out"]),
         _const("one", np.int64(1)),
         h.make_node("Add", ["k_in", "one"], ["k_out"])],
        "body",
        [h.make_tensor_value_info("i", TP.INT64, []), h.make_tensor_value_info("cond_in", TP.BOOL, []),
         h.make_tensor_value_info("y_in", TP.FLOAT, ["n"]), h.make_tensor_value_info("k_in", TP.INT64, [])],
        [h.make_tensor_value_info("cond_out", TP.BOOL, []), h.make_tensor_value_info("y_out", TP.FLOAT, ["n"]),
         h.make_tensor_value_info("k_out", TP.INT64, [])])
    nodes = [_const("max_trips", np.int64(64)), _const("k0", np.int64(0)),
             h.make_node("ReduceSum", ["y"], ["s"], keepdims=0),
             h.make_node("LessOrEqual", ["s", "threshold"], ["c0"]),
             h.make_node("Loop", ["max_trips", "c0", "y", "k0"], ["y_final", "count"], body=body)]
    return _model(nodes, [h.make_tensor_value_info("y", TP.FLOAT, ["n"]),
                          h.make_tensor_value_info("threshold", TP.FLOAT, [])],
                  [h.make_tensor_value_info("y_final", TP.FLOAT, ["n"]),
                   h.make_tensor_value_info("count", TP.INT64, [])])


def scan_cumsum():
    body = h.make_graph(
        [h.make_node("Add", ["acc_in", "x_t"], ["acc_out"]),
         h.make_node("Identity", ["acc_out"], ["y_t"])],
        "body",
        [h.make_tensor_value_info("acc_in", TP.FLOAT, ["b", 4]), h.make_tensor_value_info("x_t", TP.FLOAT, ["b", 4])],
        [h.make_tensor_value_info("acc_out", TP.FLOAT, ["b", 4]), h.make_tensor_value_info("y_t", TP.FLOAT, ["b", 4])])
    nodes = [h.make_node("Scan", ["acc0", "x"], ["acc", "y"], body=body, num_scan_inputs=1,
                         scan_input_axes=[1], scan_output_axes=[1])]
    return _model(nodes, [h.make_tensor_value_info("acc0", TP.FLOAT, ["b", 4]),
                          h.make_tensor_value_info("x", TP.FLOAT, ["b", "t", 4])],
                  [h.make_tensor_value_info("acc", TP.FLOAT, ["b", 4]),
                   h.make_tensor_value_info("y", TP.FLOAT, ["b", "t", 4])])


MODELS = {"if_sum": if_sum, "loop_counted": loop_counted, "loop_while": loop_while,
          "scan_cumsum": scan_cumsum}


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    for name, make in MODELS.items():
        onnx.save(make(), os.path.join(out, f"{name}.onnx"))
        print(f"wrote {out}/{name}.onnx")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "control_flow"))
