"""Write the recurrent-op fixtures of tests/test_recurrent_ops.py into tests/recurrent/:
models built with onnx.helper (random weights, input size 16, hidden size 32, sequence length
and batch dynamic) and, when torch is importable, a torch nn.LSTM export.

    python scripts/make_recurrent_models.py [OUT_DIR]

- lstm_bidir.onnx (opset 14): a bidirectional LSTM with biases, peepholes, sequence_lens,
  initial_h and initial_c as graph inputs; outputs Y, Y_h, Y_c.
- gru.onnx (opset 22): two GRUs over one batch-first X (layout 1): a reverse one with
  linear_before_reset and initial_h (Y, Y_h), a bidirectional one with sequence_lens (Y_h only).
- rnn.onnx (opset 14): a bidirectional RNN with biases and initial_h (Y_h only) and a forward
  one with Relu and no bias (Y only).
- torch_lstm.{legacy,dynamo}.onnx: nn.LSTM(16, 32, num_layers=2, bidirectional=True,
  batch_first=True) with (h0, c0) inputs, and torch_gru.{legacy,dynamo}.onnx: nn.GRU(16, 32,
  bidirectional=True, batch_first=True) with h0, written by torch's TorchScript exporter
  (opset 17) and its torch.export one (opset 20, needs onnxscript). torch is a dependency of
  neither the engine nor the tests: the files are committed; rerun this script where torch
  is installed (a virtual environment of its own will do) to rewrite them.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

I, H = 16, 32
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(os.path.dirname(HERE), "tests", "recurrent")


def _weights(rng, name, shape):
    return numpy_helper.from_array(rng.uniform(-0.3, 0.3, shape).astype(np.float32), name)


def _input(name, dims, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def _output(name, dims):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def _model(nodes, inputs, outputs, inits, opset, name):
    g = helper.make_graph(nodes, name, inputs, [_output(o, d) for o, d in outputs.items()], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                          producer_name="dyncli-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def lstm_bidir(rng) -> onnx.ModelProto:
    D, G = 2, 4
    inits = [_weights(rng, "W", (D, G * H, I)), _weights(rng, "R", (D, G * H, H)),
             _weights(rng, "B", (D, 2 * G * H)), _weights(rng, "P", (D, 3 * H))]
    node = helper.make_node("LSTM", ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"],
                            ["Y", "Y_h", "Y_c"], hidden_size=H, direction="bidirectional")
    inputs = [_input("X", ["seq", "batch", I]),
              _input("sequence_lens", ["batch"], TensorProto.INT32),
              _input("initial_h", [D, "batch", H]), _input("initial_c", [D, "batch", H])]
    return _model([node], inputs, {"Y": ["seq", D, "batch", H], "Y_h": [D, "batch", H],
                                     "Y_c": [D, "batch", H]}, inits, 14, "lstm_bidir")


def gru(rng) -> onnx.ModelProto:
    G = 3
    inits = [_weights(rng, "W1", (1, G * H, I)), _weights(rng, "R1", (1, G * H, H)),
             _weights(rng, "B1", (1, 2 * G * H)),
             _weights(rng, "W2", (2, G * H, I)), _weights(rng, "R2", (2, G * H, H)),
             _weights(rng, "B2", (2, 2 * G * H))]
    a = helper.make_node("GRU", ["X", "W1", "R1", "B1", "", "initial_h"], ["Y", "Y_h"],
                         hidden_size=H, direction="reverse", linear_before_reset=1, layout=1)
    b = helper.make_node("GRU", ["X", "W2", "R2", "B2", "sequence_lens"], ["", "Y_h2"],
                         hidden_size=H, direction="bidirectional", layout=1)
    inputs = [_input("X", ["batch", "seq", I]),
              _input("sequence_lens", ["batch"], TensorProto.INT32),
              _input("initial_h", ["batch", 1, H])]
    return _model([a, b], inputs, {"Y": ["batch", "seq", 1, H], "Y_h": ["batch", 1, H],
                                     "Y_h2": ["batch", 2, H]}, inits, 22, "gru")


def rnn(rng) -> onnx.ModelProto:
    inits = [_weights(rng, "W1", (2, H, I)), _weights(rng, "R1", (2, H, H)),
             _weights(rng, "B1", (2, 2 * H)),
             _weights(rng, "W2", (1, H, I)), _weights(rng, "R2", (1, H, H))]
    a = helper.make_node("RNN", ["X", "W1", "R1", "B1", "", "initial_h"], ["", "Y_h"],
                         hidden_size=H, direction="bidirectional")
    b = helper.make_node("RNN", ["X", "W2", "R2"], ["Y2"], hidden_size=H, activations=["Relu"])
    inputs = [_input("X", ["seq", "batch", I]), _input("initial_h", [2, "batch", H])]
    return _model([a, b], inputs, {"Y_h": [2, "batch", H], "Y2": ["seq", 1, "batch", H]},
                  inits, 14, "rnn")


def torch_rnn(path: str, cell: str, exporter: str) -> bool:
    """Export torch's nn.LSTM (2 layers) or nn.GRU (1 layer), bidirectional and batch_first,
    with the TorchScript ("legacy", opset 17) or torch.export ("dynamo", opset 20) exporter;
    False when torch (or, for dynamo, onnxscript) is not importable."""
    try:
        import torch
        if exporter == "dynamo":
            import onnxscript  # noqa: F401
    except ImportError:
        return False
    lstm = cell == "LSTM"

    class LSTM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.LSTM(I, H, num_layers=2, bidirectional=True, batch_first=True)

        def forward(self, x, h0, c0):
            y, (h, c) = self.rnn(x, (h0, c0))
            return y, h, c

    class GRU(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.GRU(I, H, bidirectional=True, batch_first=True)

        def forward(self, x, h0):
            return self.rnn(x, h0)

    torch.manual_seed(0)
    layers = 2 if lstm else 1
    states = ["h0", "c0"] if lstm else ["h0"]
    outs = ["y", "h", "c"] if lstm else ["y", "h"]
    args = (torch.randn(2, 5, I),) + tuple(torch.zeros(2 * layers, 2, H) for _ in states)
    names = dict(input_names=["x"] + states, output_names=outs)
    if exporter == "dynamo":
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
        shapes = ({0: batch, 1: seq},) + tuple({1: batch} for _ in states)
        prog = torch.onnx.export((LSTM if lstm else GRU)().eval(), args, dynamo=True, dynamic_shapes=shapes, **names)
        prog.save(path)
    else:
        axes = {"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}}
        axes.update({n: {1: "batch"} for n in states + outs[1:]})
        torch.onnx.export((LSTM if lstm else GRU)().eval(), args, path, opset_version=17, dynamo=False,
                          dynamic_axes=axes, **names)
    m = onnx.load(path)
    onnx.helper.set_model_props(m, {"torch": torch.__version__, "exporter": exporter})
    onnx.save(m, path)
    return True


def main(out: str = DEFAULT_OUT) -> int:
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    for name, make in (("lstm_bidir", lstm_bidir), ("gru", gru), ("rnn", rnn)):
        onnx.save(make(rng), os.path.join(out, f"{name}.onnx"))
        print(f"wrote {name}.onnx")
    for cell in ("LSTM", "GRU"):
        for exporter in ("legacy", "dynamo"):
            name = f"torch_{cell.lower()}.{exporter}.onnx"
            if torch_rnn(os.path.join(out, name), cell, exporter):
                print(f"wrote {name}")
            else:
                print(f"torch (and onnxscript for dynamo) not importable: {name} kept as it is")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
