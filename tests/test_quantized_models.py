"""Quantized models as onnxruntime's quantization tool writes them, against onnxruntime over
shape sequences, and the quantization ops one by one.

tests/quantized/ holds what `python scripts/make_quantized_models.py tests/quantized` wrote: a
small CNN quantized by `quantize_static` (QDQ: per-channel int8 weights, uint8 activations) and
by `quantize_dynamic` (DynamicQuantizeLinear + ConvInteger), and a tiny BERT-like layer
quantized by `quantize_dynamic` (DynamicQuantizeLinear + MatMulInteger).

onnxruntime fuses the QDQ groups into integer kernels and rounds requantized sums of integer
products; the engine runs DequantizeLinear, the float op and QuantizeLinear, and the floats
before a DynamicQuantizeLinear come from kernels that differ from onnxruntime's in the last
bits. A quantized value can so land one step apart (docs/ops.md#quantization). Each model's
quantized activations are made outputs too: each must be within one step of onnxruntime's; the
real outputs must match as float outputs do, and where an activation was one step apart, within
the effect of that step (QUANTIZED_SLACK of the output's range).

onnxruntime itself is judged by the operators' definition (onnx.reference) on every run
(_Judged): on some CPUs its integer kernels (1.31-1.32) put outputs far off the exact integer
result for some data, and there the definition is the reference, with a warning in the summary.
"""
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from engine import Network, build_program
from tests.conftest import assert_close_for, ort_session, run_vs_ort


class _Judged:
    """onnxruntime's session, judged by onnx.reference (the operators' definition) on every
    run: where onnxruntime is further from the definition than the quantization slack (one
    step on an integer output, QUANTIZED_SLACK of a float output's range), the definition's
    outputs are the reference, with a warning that says so. onnxruntime 1.31-1.32's integer
    kernels are wrong on some CPUs, for some data: a batched QLinearMatMul 13 steps off the
    exact integer result in 3 of 105 outputs, a MatMulInteger 21655 off, a QLinearConv 83,
    where the engine and onnx.reference both give the exact result."""

    def __init__(self, model):
        from onnx.reference import ReferenceEvaluator
        from onnx.version_converter import convert_version
        self.ort = ort_session(model)
        # onnx.reference implements the quantization ops of opset 19 and later only
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        self.spec = ReferenceEvaluator(convert_version(model, 21) if opset < 19 else model)

    def get_outputs(self):
        return self.ort.get_outputs()

    def run(self, _, feeds):
        got = self.ort.run(None, feeds)
        want = self.spec.run(None, feeds)
        for o, (g, w) in zip(self.ort.get_outputs(), zip(got, want)):
            g, w = np.asarray(g), np.asarray(w)
            off = np.abs(g.astype(np.float64) - w.astype(np.float64)).max(initial=0)
            slack = 1 if w.dtype.kind in "iu" else QUANTIZED_SLACK * float(np.ptp(w)) + 1e-6
            if g.shape != w.shape or off > slack:
                warnings.warn(f"onnxruntime {ort.__version__} is {off:g} off the operators' definition "
                              f"(onnx.reference) on {o.name}: the engine is checked against the definition")
                return want
        return got


def reference(model):
    """The judge of the engine's outputs on quantized models: onnxruntime where it agrees with
    the operators' definition (_Judged)."""
    return _Judged(model)

HERE = os.path.join(os.path.dirname(__file__), "quantized")
# a real output downstream of an activation one step apart: at most this fraction of its range
QUANTIZED_SLACK = 0.01


def _with_quantized_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The model with every quantized activation (QuantizeLinear / DynamicQuantizeLinear output
    computed from an input) as an extra graph output, and those names."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    consts = {t.name: t.data_type for t in m.graph.initializer}
    names = []
    for n in m.graph.node:
        if n.op_type in ("QuantizeLinear", "DynamicQuantizeLinear") and n.input[0] not in consts:
            names.append(n.output[0])
            code = consts[n.input[2]] if len(n.input) > 2 and n.input[2] else TensorProto.UINT8
            m.graph.output.append(helper.make_tensor_value_info(n.output[0], code, None))
    return m, names


def _run(path, feed_seq, device):
    """Every inference of feed_seq through one Network and onnxruntime; returns the count of
    quantized elements one step apart."""
    model, qnames = _with_quantized_outputs(onnx.load(path))
    assert qnames, "the fixture has no quantized activation"
    net = Network(build_program(model), device, impls="dynamic")
    sess = reference(model)
    names = [o.name for o in sess.get_outputs()]
    apart = 0
    for i, feeds in enumerate(feed_seq):
        outs = net.infer(feeds)
        ref = dict(zip(names, sess.run(None, feeds)))
        what = f"inference {i} {({k: v.shape for k, v in feeds.items()})}"
        step = 0
        for q in qnames:
            assert outs[q].dtype == ref[q].dtype and outs[q].shape == ref[q].shape, (what, q)
            d = np.abs(outs[q].astype(np.int32) - ref[q].astype(np.int32))
            assert d.max(initial=0) <= 1, f"{what} {q}: {int(d.max())} quantization steps apart"
            step += int(np.count_nonzero(d))
            assert np.count_nonzero(d) <= max(2, d.size // 100), f"{what} {q}: {np.count_nonzero(d)} apart"
        apart += step
        for name in names:
            if name in qnames:
                continue
            want = ref[name]
            assert np.ptp(want) > 0, f"{what}: reference {name} is constant"
            if step == 0:
                assert_close_for(outs[name], want, f"{what} {name}")
            else:
                err = np.abs(outs[name] - want).max()
                assert err <= QUANTIZED_SLACK * np.ptp(want), f"{what} {name}: {err} after {step} steps"
    return apart


@pytest.mark.parametrize("name", ["convnet.qdq.onnx", "convnet.dynamic.onnx"])
def test_convnet_over_batch_and_resolution(device, name):
    rng = np.random.default_rng(0)
    shapes = [(1, 16, 16), (2, 16, 16), (2, 16, 16), (1, 24, 20), (3, 9, 13), (1, 32, 32), (1, 16, 16)]
    feeds = [{"x": rng.standard_normal((b, 3, h, w)).astype(np.float32)} for b, h, w in shapes]
    _run(os.path.join(HERE, name), feeds, device)


def test_bert_dynamic_over_sequence_lengths(device):
    rng = np.random.default_rng(1)
    shapes = [(1, 8), (1, 8), (2, 16), (3, 12), (1, 5), (2, 24), (1, 8)]
    feeds = [{"input_ids": rng.integers(0, 100, s).astype(np.int64)} for s in shapes]
    _run(os.path.join(HERE, "bert.dynamic.onnx"), feeds, device)


def test_fixtures_hold_what_the_quantizer_writes():
    conv = onnx.load(os.path.join(HERE, "convnet.qdq.onnx"))
    bert = onnx.load(os.path.join(HERE, "bert.dynamic.onnx"))
    ops = lambda m: {n.op_type for n in m.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops(conv)
    inits = {t.name: t for t in conv.graph.initializer}
    per_channel = [n for n in conv.graph.node if n.op_type == "DequantizeLinear"
                   and inits.get(n.input[0]) is not None and inits[n.input[0]].data_type == TensorProto.INT8
                   and len(inits[n.input[1]].dims) == 1]
    assert per_channel, "no per-channel int8 weight"
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops(bert)
    assert {"DynamicQuantizeLinear", "ConvInteger"} <= ops(onnx.load(os.path.join(HERE, "convnet.dynamic.onnx")))
    for p in ("convnet.qdq.onnx", "bert.dynamic.onnx", "convnet.dynamic.onnx"):
        assert os.path.getsize(os.path.join(HERE, p)) < 300_000


# ---- the ops one by one, over shape sequences ---------------------------------------------------
def _model(nodes, inputs, outputs, inits=(), opset=21):
    g = helper.make_graph(nodes, "q", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, code, dims):
    return helper.make_tensor_value_info(name, code, dims)


@pytest.mark.parametrize("opset", [13, 21])
def test_quantize_dequantize_per_axis_ties_and_saturation(device, opset):
    """x / scale exactly on .5 ties (round half to even), far out of range (saturate), per
    channel on axis 1, over changing batch and length."""
    scale = np.array([0.5, 0.25, 2.0], np.float32)
    zp = np.array([0, 128, 3], np.uint8)
    inits = [helper.make_tensor("s", TensorProto.FLOAT, [3], scale),
             helper.make_tensor("z", TensorProto.UINT8, [3], zp)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)]
    m = _model(nodes, [_vi("x", TensorProto.FLOAT, ["n", 3, "l"])],
               [_vi("q", TensorProto.UINT8, None), _vi("y", TensorProto.FLOAT, None)], inits, opset)
    rng = np.random.default_rng(2)
    seq = []
    for n, l in [(1, 8), (2, 8), (1, 13), (3, 5)]:
        ties = (rng.integers(-40, 40, (n, 3, l)) + 0.5) * scale[None, :, None]
        wide = rng.standard_normal((n, 3, l)) * 300
        seq.append({"x": np.where(rng.random((n, 3, l)) < 0.5, ties, wide).astype(np.float32)})
    run_vs_ort(m, seq, device, 0, 0, check_nonconstant=False, reference=reference)


def test_dynamic_quantize_linear_including_all_zeros(device):
    """An empty range gives scale 1 and zero point 0, as onnxruntime (ONNX's formula divides by 0)."""
    m = _model([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])],
               [_vi("x", TensorProto.FLOAT, ["n", "l"])],
               [_vi("y", TensorProto.UINT8, None), _vi("s", TensorProto.FLOAT, None),
                _vi("z", TensorProto.UINT8, None)], opset=11)
    rng = np.random.default_rng(3)
    seq = [{"x": (rng.standard_normal((n, l)) * k + o).astype(np.float32)}
           for n, l, k, o in [(2, 300, 3.0, 0.0), (1, 5, 1.0, 2.0), (4, 70, 0.5, -1.0), (2, 300, 1.0, 0.0)]]
    seq.append({"x": np.zeros((3, 4), np.float32)})
    run_vs_ort(m, seq, device, 0, 0, check_nonconstant=False)  # onnx.reference scales an all-zero input by 1/255, onnxruntime and the engine by 1


def test_matmul_integer_batched_per_column_zero_points(device):
    nodes = [helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])]
    rng = np.random.default_rng(4)
    inits = [helper.make_tensor("za", TensorProto.UINT8, [], [7]),
             helper.make_tensor("zb", TensorProto.INT8, [5], rng.integers(-3, 3, 5))]
    m = _model(nodes, [_vi("a", TensorProto.UINT8, ["b", "m", 6]), _vi("b", TensorProto.INT8, [6, 5])],
               [_vi("y", TensorProto.INT32, None)], inits, opset=10)
    seq = [{"a": rng.integers(0, 256, (bb, mm, 6)).astype(np.uint8),
            "b": rng.integers(-128, 128, (6, 5)).astype(np.int8)} for bb, mm in [(1, 4), (2, 4), (3, 1), (1, 9)]]
    run_vs_ort(m, seq, device, 0, 0, reference=reference)


def test_qlinear_conv_per_channel_with_bias(device):
    """QLinearConv with per-channel int8 weights and an int32 bias, over batch and resolution:
    the engine requantizes as onnxruntime (float(acc) * (x_scale * w_scale / y_scale))."""
    rng = np.random.default_rng(5)
    w = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    inits = [helper.make_tensor("xs", TensorProto.FLOAT, [], [0.02]),
             helper.make_tensor("xz", TensorProto.UINT8, [], [120]),
             helper.make_tensor("w", TensorProto.INT8, [4, 3, 3, 3], w),
             helper.make_tensor("ws", TensorProto.FLOAT, [4], [0.01, 0.02, 0.005, 0.03]),
             helper.make_tensor("wz", TensorProto.INT8, [4], [0, 0, 0, 0]),
             helper.make_tensor("ys", TensorProto.FLOAT, [], [0.05]),
             helper.make_tensor("yz", TensorProto.UINT8, [], [100]),
             helper.make_tensor("bias", TensorProto.INT32, [4], rng.integers(-2000, 2000, 4))]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "bias"], ["y"],
                            pads=[1, 1, 1, 1], strides=[2, 1])
    m = _model([node], [_vi("x", TensorProto.UINT8, ["n", 3, "h", "w"])],
               [_vi("y", TensorProto.UINT8, None)], inits, opset=10)
    seq = [{"x": rng.integers(0, 256, (n, 3, h, ww)).astype(np.uint8)}
           for n, h, ww in [(1, 8, 8), (2, 8, 8), (1, 11, 6)]]
    run_vs_ort(m, seq, device, 0, 0, reference=reference)


def test_conv_integer_grouped(device):
    rng = np.random.default_rng(6)
    inits = [helper.make_tensor("w", TensorProto.UINT8, [4, 2, 3, 3], rng.integers(0, 256, (4, 2, 3, 3))),
             helper.make_tensor("xz", TensorProto.UINT8, [], [128]),
             helper.make_tensor("wz", TensorProto.UINT8, [], [127])]
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], group=2, pads=[0, 1, 2, 1])
    m = _model([node], [_vi("x", TensorProto.UINT8, ["n", 4, "h", "w"])],
               [_vi("y", TensorProto.INT32, None)], inits, opset=10)
    seq = [{"x": rng.integers(0, 256, (n, 4, h, ww)).astype(np.uint8)}
           for n, h, ww in [(1, 5, 7), (2, 5, 7), (1, 9, 4)]]
    run_vs_ort(m, seq, device, 0, 0, reference=reference)


def test_conv_integer_1d_dilated_strided(device):
    rng = np.random.default_rng(7)
    inits = [helper.make_tensor("w", TensorProto.UINT8, [3, 2, 3], rng.integers(0, 256, (3, 2, 3))),
             helper.make_tensor("xz", TensorProto.UINT8, [], [100]),
             helper.make_tensor("wz", TensorProto.UINT8, [], [120])]
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], dilations=[2], pads=[2, 1], strides=[2])
    m = _model([node], [_vi("x", TensorProto.UINT8, ["n", 2, "l"])], [_vi("y", TensorProto.INT32, None)],
               inits, opset=10)
    run_vs_ort(m, [{"x": rng.integers(0, 256, (n, 2, l)).astype(np.uint8)} for n, l in [(1, 9), (2, 9), (1, 20)]],
               device, 0, 0, reference=reference)


def test_qlinear_matmul_per_column_scale_over_batch(device):
    rng = np.random.default_rng(8)
    inits = [helper.make_tensor("as", TensorProto.FLOAT, [], [0.03]),
             helper.make_tensor("az", TensorProto.UINT8, [], [128]),
             helper.make_tensor("b", TensorProto.INT8, [8, 5], rng.integers(-128, 128, (8, 5))),
             helper.make_tensor("bs", TensorProto.FLOAT, [5], rng.random(5) * 0.02 + 0.001),
             helper.make_tensor("bz", TensorProto.INT8, [5], [0] * 5),
             helper.make_tensor("ys", TensorProto.FLOAT, [], [0.07]),
             helper.make_tensor("yz", TensorProto.UINT8, [], [110])]
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    m = _model([node], [_vi("a", TensorProto.UINT8, ["b", "m", 8])], [_vi("y", TensorProto.UINT8, None)], inits)
    run_vs_ort(m, [{"a": rng.integers(0, 256, (b, r, 8)).astype(np.uint8)} for b, r in [(1, 3), (2, 3), (3, 7)]],
               device, 0, 0, reference=reference)


@pytest.mark.parametrize("attrs,shape", [({}, []), ({"axis": 1}, [4]), ({"axis": 1, "block_size": 2}, [2, 2, 3])])
def test_host_impls_match_onnx_reference(attrs, shape):
    """The numpy host impls (constant folding) give onnx.reference's outputs, dtype included."""
    from onnx.reference import ReferenceEvaluator
    from engine.graph import Node
    from engine.ops import quant_host
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((2, 4, 3)) * 40).astype(np.float32)
    scale = (rng.random(shape) + 0.1).astype(np.float32)
    zp = rng.integers(-20, 20, shape).astype(np.int8)
    for op, fn, args in (("QuantizeLinear", quant_host.quantize, (x, scale, zp)),
                         ("DequantizeLinear", quant_host.dequantize, (x.astype(np.int8), scale, zp))):
        proto = helper.make_node(op, ["a", "s", "z"], ["y"], **attrs)
        g = helper.make_graph([proto], "g", [_vi(n, TensorProto.UNDEFINED, None) for n in "asz"],
                              [_vi("y", TensorProto.UNDEFINED, None)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
        want = ReferenceEvaluator(m).run(None, dict(zip(["a", "s", "z"], args)))[0]
        got = fn(Node("n", op, ["a", "s", "z"], ["y"], attrs, proto, 21), *args)[0]
        assert got.dtype == want.dtype and np.array_equal(got, want), op


def test_check_tolerates_one_quantization_step_on_8_bit_outputs():
    """--check: int8/uint8 outputs one step apart pass by default, two do not; --atol counts
    steps there; every other integer output stays exact."""
    from dyncli.check import compare
    want = np.array([0, 5, 255], np.uint8)
    c = compare("q", np.array([1, 5, 254], np.uint8), want)
    assert c.ok and c.max_abs == 1 and c.detail == "2 elements within 1 quantization step(s)"
    assert not compare("q", np.array([2, 5, 255], np.uint8), want).ok
    assert not compare("q", np.array([1, 5, 255], np.uint8), want, atol=0).ok
    assert compare("q", np.array([-128, 3], np.int8), np.array([-127, 3], np.int8)).ok
    assert not compare("i", np.array([1, 5], np.int32), np.array([0, 5], np.int32)).ok
    assert not compare("i", np.array([1, 5], np.int64), np.array([0, 5], np.int64), atol=1).ok
