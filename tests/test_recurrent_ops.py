"""LSTM, GRU and RNN against onnxruntime over sequences of sequence lengths and batch sizes,
one Network per model (the shape-agnostic kernels serve every length).

The fixtures in tests/recurrent/ are written by scripts/make_recurrent_models.py: helper-built
models (bidirectional LSTM with peepholes, sequence_lens and initial states; two batch-first
GRUs, one with linear_before_reset; two RNNs) and torch exports of nn.LSTM (2 layers) and
nn.GRU, bidirectional and batch_first, by both of torch's exporters. The attribute cases
below (clip, input_forget, the other activations, opset 7, layout 1 with every output) are
built here, small. onnxruntime runs no layout 1: batch-first models are checked against it on
their layout-0 twin. Each runs both kernel variants on the suite's device
(`net.impls.device_type`): "cpu" (a work-item per direction and batch row) and "gpu" (a
work-group of lanes over the hidden units, barriers between steps; GEMM tiles, GEMV and split-K
for the input projection).
"""
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine import Network, build_program
from tests.conftest import run_vs_ort

HERE = os.path.join(os.path.dirname(__file__), "recurrent")
I, H = 16, 32
# (sequence length, batch): growth, a repeat, a shrink, a batch change, length 1
SHAPES = [(5, 2), (5, 2), (9, 3), (1, 1), (12, 2), (3, 4)]
KINDS = ["cpu", "gpu"]


def _load(name):
    return onnx.load(os.path.join(HERE, name))


def _net(model, device, kind):
    net = Network(build_program(model), device, impls="dynamic")
    net.impls.device_type = kind
    return net


def _lens(rng, s, b):
    """Lengths in 1..s, one row at full length."""
    lens = rng.integers(1, s + 1, b).astype(np.int32)
    lens[0] = s
    return lens


@pytest.mark.parametrize("kind", KINDS)
def test_lstm_bidirectional_with_states_and_lengths(device, kind):
    rng = np.random.default_rng(0)
    feeds = [{"X": rng.standard_normal((s, b, I)).astype(np.float32),
              "sequence_lens": _lens(rng, s, b),
              "initial_h": rng.standard_normal((2, b, H)).astype(np.float32) * 0.5,
              "initial_c": rng.standard_normal((2, b, H)).astype(np.float32) * 0.5}
             for s, b in SHAPES]
    model = _load("lstm_bidir.onnx")
    net = run_vs_ort(model, feeds[:1], device, net=_net(model, device, kind))
    for f in feeds[1:]:
        run_vs_ort(model, [f], device, net=net)
        # the sequence length is read from shape_info: no length builds a kernel of its own
        assert net.counters.get("update_impl.build", 0) == 0, f["X"].shape


def _seq_first(model):
    """The batch-first model with layout 0 (onnxruntime runs no layout 1): the reference."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for n in m.graph.node:
        for a in n.attribute:
            if a.name == "layout":
                a.i = 0
    for vi in list(m.graph.input) + list(m.graph.output):
        dims = vi.type.tensor_type.shape.dim
        order = {4: (2, 0, 1, 3), 3: (1, 0, 2)}.get(len(dims), (0,))   # where each dim goes
        if vi.name != "sequence_lens":
            kept = [onnx.TensorShapeProto.Dimension() for _ in dims]
            for k, d in zip(order, dims):
                kept[k].CopyFrom(d)
            del dims[:]
            dims.extend(kept)
    return m


def _lstm_batch_first():
    """A bidirectional LSTM in layout 1 with sequence_lens, initial states and every output."""
    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array(rng.uniform(-0.3, 0.3, s).astype(np.float32), n)
             for n, s in (("W", (2, 4 * H, I)), ("R", (2, 4 * H, H)), ("B", (2, 8 * H)))]
    node = helper.make_node("LSTM", ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c"],
                            ["Y", "Y_h", "Y_c"], hidden_size=H, direction="bidirectional", layout=1)
    vi = helper.make_tensor_value_info
    g = helper.make_graph([node], "lstm_batch_first",
                          [vi("X", TensorProto.FLOAT, ["b", "s", I]), vi("sequence_lens", TensorProto.INT32, ["b"]),
                           vi("initial_h", TensorProto.FLOAT, ["b", 2, H]),
                           vi("initial_c", TensorProto.FLOAT, ["b", 2, H])],
                          [vi("Y", TensorProto.FLOAT, ["b", "s", 2, H]), vi("Y_h", TensorProto.FLOAT, ["b", 2, H]),
                           vi("Y_c", TensorProto.FLOAT, ["b", 2, H])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which", ["gru.onnx", "lstm"])
def test_batch_first(device, which, kind):
    """layout 1 against onnxruntime on the same model in layout 0 (transposed feeds and outputs)."""
    from tests.conftest import assert_close, ort_session
    model = _load(which) if which.endswith(".onnx") else _lstm_batch_first()
    net = _net(model, device, kind)
    sess = ort_session(_seq_first(model))
    names = [o.name for o in model.graph.output]
    states = [i.name for i in model.graph.input if i.name.startswith("initial_")]
    rng = np.random.default_rng(1)
    for s, b in SHAPES:
        feeds = {"X": rng.standard_normal((b, s, I)).astype(np.float32),
                 "sequence_lens": _lens(rng, s, b)}
        for n in states:
            d = 2 if which == "lstm" else 1
            feeds[n] = rng.standard_normal((b, d, H)).astype(np.float32) * 0.5
        ref = sess.run(None, {k: v if v.ndim == 1 else v.transpose(1, 0, 2) for k, v in feeds.items()})
        got = net.infer(feeds)
        for n, r in zip(names, ref):
            want = r.transpose(2, 0, 1, 3) if r.ndim == 4 else r.transpose(1, 0, 2)
            assert_close(got[n], want, what=f"{n} {s}x{b}")


@pytest.mark.parametrize("kind", KINDS)
def test_rnn(device, kind):
    rng = np.random.default_rng(2)
    feeds = [{"X": rng.standard_normal((s, b, I)).astype(np.float32),
              "initial_h": rng.standard_normal((2, b, H)).astype(np.float32) * 0.5}
             for s, b in SHAPES]
    model = _load("rnn.onnx")
    run_vs_ort(model, feeds, device, net=_net(model, device, kind))


TORCH = ["torch_lstm.legacy.onnx", "torch_lstm.dynamo.onnx", "torch_gru.legacy.onnx",
         "torch_gru.dynamo.onnx"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", TORCH)
def test_torch_export(device, name, kind):
    """torch's nn.LSTM (2 layers) and nn.GRU, bidirectional and batch_first, as its TorchScript
    and torch.export exporters write them."""
    model = _load(name)
    layers = 4 if "lstm" in name else 2
    rng = np.random.default_rng(3)
    feeds = []
    for s, b in SHAPES:
        f = {"x": rng.standard_normal((b, s, I)).astype(np.float32),
             "h0": rng.standard_normal((layers, b, H)).astype(np.float32) * 0.5}
        if "lstm" in name:
            f["c0"] = rng.standard_normal((layers, b, H)).astype(np.float32) * 0.5
        feeds.append(f)
    run_vs_ort(model, feeds, device, net=_net(model, device, kind))


@pytest.mark.parametrize("kind", KINDS)
def test_zero_length_rows_give_zeros(device, kind):
    """A row of length 0: Y, Y_h and Y_c are zero there (onnxruntime's convention); so is
    everything for an empty sequence."""
    m = _load("lstm_bidir.onnx")
    rng = np.random.default_rng(4)
    feeds = [{"X": rng.standard_normal((4, 3, I)).astype(np.float32),
              "sequence_lens": np.array([4, 0, 2], np.int32),
              "initial_h": np.ones((2, 3, H), np.float32),
              "initial_c": np.ones((2, 3, H), np.float32)}]
    net = run_vs_ort(m, feeds, device, net=_net(m, device, kind))
    out = net.infer(feeds[0])
    assert not out["Y_h"][:, 1].any() and not out["Y_c"][:, 1].any() and not out["Y"][:, :, 1].any()
    empty = {**feeds[0], "X": np.zeros((0, 3, I), np.float32), "sequence_lens": np.zeros(3, np.int32)}
    out = net.infer(empty)
    assert out["Y"].shape == (0, 2, 3, H) and not out["Y_h"].any() and not out["Y_c"].any()


def _single(op, attrs, gates, dirs=1, bias=True, opset=14, inp=4):
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.uniform(-0.5, 0.5, s).astype(np.float32), n)
             for n, s in (("W", (dirs, gates * 8, inp)), ("R", (dirs, gates * 8, 8)),
                          ("B", (dirs, 2 * gates * 8)))][:3 if bias else 2]
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, ["X", "W", "R"] + (["B"] if bias else []), outs, hidden_size=8,
                            **attrs)
    g = helper.make_graph([node], op, [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["s", "b", inp])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


ATTR_CASES = {
    "lstm_clip_input_forget": ("LSTM", {"clip": 0.7, "input_forget": 1}, 4, 1),
    "lstm_other_activations": ("LSTM", {"activations": ["HardSigmoid", "Softsign", "Elu"],
                                        "activation_alpha": [0.3, 0.8], "activation_beta": [0.4]}, 4, 1),
    "gru_reverse_activations": ("GRU", {"direction": "reverse", "activations": ["Sigmoid", "ScaledTanh"],
                                        "activation_alpha": [1.5], "activation_beta": [0.7]}, 3, 1),
    "rnn_bidirectional_per_direction": ("RNN", {"direction": "bidirectional",
                                                "activations": ["LeakyRelu", "Softplus"],
                                                "activation_alpha": [0.2]}, 1, 2),
    "rnn_affine_thresholded": ("RNN", {"direction": "bidirectional",
                                       "activations": ["Affine", "ThresholdedRelu"],
                                       "activation_alpha": [0.5, 0.1], "activation_beta": [0.2]}, 1, 2),
    # the oldest form the engine runs (no layout attribute)
    "gru_opset7": ("GRU", {"linear_before_reset": 1, "direction": "bidirectional"}, 3, 2, 7),
    "lstm_opset7": ("LSTM", {"direction": "reverse"}, 4, 1, 7),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", sorted(ATTR_CASES))
def test_attributes(device, case, kind):
    op, attrs, gates, dirs, *opset = ATTR_CASES[case]
    m = _single(op, attrs, gates, dirs, opset=opset[0] if opset else 14)
    rng = np.random.default_rng(6)
    feeds = [{"X": rng.standard_normal((s, b, 4)).astype(np.float32)} for s, b in ((3, 2), (6, 1), (3, 2))]
    run_vs_ort(m, feeds, device, net=_net(m, device, kind), check_nonconstant=False)


@pytest.mark.parametrize("kind", KINDS)
def test_few_rows_long_input(device, kind):
    """Few rows and a long input: the projection splits K on GPUs (its partial sums in one
    more internal buffer)."""
    m = _single("LSTM", {"direction": "bidirectional"}, 4, 2, inp=1024)
    rng = np.random.default_rng(8)
    feeds = [{"X": (0.05 * rng.standard_normal((s, 1, 1024))).astype(np.float32)} for s in (2, 4, 1, 3)]
    run_vs_ort(m, feeds, device, net=_net(m, device, kind))


def test_bad_weight_shape_is_named():
    m = _single("GRU", {}, 3)
    m.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.zeros((1, 24, 5), np.float32), "R"))
    net = Network(build_program(m))
    with pytest.raises(Exception, match="GRU"):
        net.infer({"X": np.zeros((2, 1, 4), np.float32)})


def test_float16_model(device):
    """A float16 model runs the float32 kernels between the Casts the program inserts."""
    from tests.conftest import assert_close, ort_session
    from tests.models import to_float16
    model = _load("lstm_bidir.onnx")
    net = Network(build_program(to_float16(model)), device)
    sess = ort_session(model)
    rng = np.random.default_rng(10)
    for s, b in ((5, 2), (9, 3)):
        feeds = {"X": rng.standard_normal((s, b, I)).astype(np.float16),
                 "sequence_lens": _lens(rng, s, b),
                 "initial_h": np.zeros((2, b, H), np.float16), "initial_c": np.zeros((2, b, H), np.float16)}
        ref = sess.run(None, {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in feeds.items()})
        got = net.infer(feeds)
        for n, r in zip(("Y", "Y_h", "Y_c"), ref):
            assert got[n].dtype == np.float16
            assert_close(got[n].astype(np.float32), r, 1e-2, 1e-2, f"{n} {s}x{b}")
