"""Device ops of the NN families (Conv, pooling, GlobalAveragePool/GlobalMaxPool, Softmax,
LayerNormalization, BatchNormalization, LRN, ReduceMean) against onnxruntime, one Network per
model run over a sequence of input shapes (repeats included): the dynamic-shape path, where one
shape-agnostic build serves every shape."""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.conftest import run_vs_ort as _run_vs_ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import Network, build_program  # noqa: E402
from engine.ops.common import ShapeInferenceError  # noqa: E402

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(7)


# ---------------------------------------------------------------- shared helpers
def make_model(nodes, inputs, outputs=("y",), inits=(), opset=13):
    """inputs: [(name, elem_type, rank)] with all-symbolic dims; outputs: names."""
    vis = [helper.make_tensor_value_info(n, t, [f"{n}_d{k}" for k in range(r)])
           for n, t, r in inputs]
    outs = [helper.make_tensor_value_info(o, FLOAT, None) for o in outputs]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()]
    g = helper.make_graph(list(nodes), "t", vis, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def randn(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def run_vs_ort(model, feeds_seq, rtol=1e-4, atol=1e-5):
    """tests.conftest.run_vs_ort; single ops may legitimately give constant outputs."""
    return _run_vs_ort(model, feeds_seq, rtol=rtol, atol=atol, check_nonconstant=False)


def x_feeds(shapes, name="x", scale=1.0):
    return [{name: randn(*s, scale=scale)} for s in shapes]


# ---------------------------------------------------------------- Conv
CONV_SHAPES = [(1, 9, 11), (2, 16, 16), (1, 9, 11), (1, 5, 7), (3, 12, 8)]

CONV_CASES = {
    # name: (C, OC, kernel, attrs, bias)
    "g1_pads1": (3, 20, (3, 3), dict(pads=[1, 1, 1, 1]), True),          # OC tail of a 16-block
    "g2_stride2": (4, 8, (3, 3), dict(group=2, strides=[2, 2]), False),
    "g2_wide": (4, 36, (3, 3), dict(group=2, pads=[1, 1, 1, 1]), True),  # 16-blocks + tail per group
    "depthwise_asym_pads": (6, 6, (3, 3), dict(group=6, pads=[0, 1, 2, 1]), True),
    "depthwise_mult2": (4, 8, (3, 3), dict(group=4, pads=[1, 1, 1, 1]), True),
    "dilation2": (3, 8, (3, 3), dict(dilations=[2, 2], pads=[2, 2, 2, 2]), True),
    "same_upper_s2": (3, 8, (3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2]), True),
    "same_lower_s2_k4": (2, 4, (4, 4), dict(auto_pad="SAME_LOWER", strides=[2, 2]), False),
    "valid_s21_k53": (3, 5, (5, 3), dict(auto_pad="VALID", strides=[2, 1]), False),
    "notset_k1": (5, 32, (1, 1), dict(auto_pad="NOTSET"), True),
}


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv(case):
    C, OC, (kh, kw), attrs, bias = CONV_CASES[case]
    group = attrs.get("group", 1)
    inits = {"w": randn(OC, C // group, kh, kw, scale=1 / np.sqrt(C * kh * kw / group))}
    ins = ["x", "w"]
    if bias:
        inits["b"] = randn(OC)
        ins.append("b")
    node = helper.make_node("Conv", ins, ["y"], kernel_shape=[kh, kw], **attrs)
    opset = 11 if case.startswith("same") else 13
    m = make_model([node], [("x", FLOAT, 4)], inits=inits, opset=opset)
    run_vs_ort(m, x_feeds([(n, C, h, w) for n, h, w in CONV_SHAPES]))


def test_conv_wide_blocks():
    """Several 16-channel blocks, image wider than one 8-pixel block with a ragged tail."""
    C, OC = 16, 48
    inits = {"w": randn(OC, C, 3, 3, scale=1 / 12), "b": randn(OC)}
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    m = make_model([node], [("x", FLOAT, 4)], inits=inits, opset=9)
    run_vs_ort(m, x_feeds([(1, C, 20, 29), (2, C, 8, 8), (1, C, 20, 29)]))


def test_conv_refuses_3d():
    inits = {"w": randn(4, 3, 3, 3, 3)}
    node = helper.make_node("Conv", ["x", "w"], ["y"])
    m = make_model([node], [("x", FLOAT, 5)], inits=inits)
    net = Network(build_program(m))
    with pytest.raises(ShapeInferenceError, match="1-D .* and 2-D"):
        net.infer({"x": randn(1, 3, 6, 6, 6)})


# ---------------------------------------------------------------- pooling
POOL_SHAPES = [(1, 3, 10, 10), (2, 2, 7, 9), (1, 3, 10, 10), (1, 1, 5, 6), (2, 3, 12, 11)]

POOL_CASES = {
    # name: (op, attrs, opset)
    "max_k3s2p1": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), 9),
    "max_ceil": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), 12),
    "max_ceil_pads": ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 0, 1, 0],
                                      ceil_mode=1), 12),
    "max_dilated": ("MaxPool", dict(kernel_shape=[2, 3], dilations=[2, 1], pads=[0, 1, 1, 1]), 12),
    "max_same_upper": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"), 11),
    "avg_excl_pad": ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), 11),
    "avg_incl_pad": ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 2, 1, 0],
                                         count_include_pad=1), 11),
    "avg_ceil_incl_pad": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                              ceil_mode=1, count_include_pad=1), 11),
    "avg_ceil_excl_pad": ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1), 10),
    "avg_same_lower_s2": ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2],
                                              auto_pad="SAME_LOWER"), 11),
    "avg_valid": ("AveragePool", dict(kernel_shape=[2, 3], strides=[1, 2], auto_pad="VALID"), 19),
}


@pytest.mark.parametrize("case", POOL_CASES)
def test_pool(case):
    op, attrs, opset = POOL_CASES[case]
    m = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", FLOAT, 4)], opset=opset)
    run_vs_ort(m, x_feeds(POOL_SHAPES))


# 1-D and 3-D: name: (op, attrs, opset, shapes)
POOL_ND_CASES = {
    "max_1d_k3s2p1": ("MaxPool", dict(kernel_shape=[3], strides=[2], pads=[1, 1]), 12,
                      [(1, 3, 10), (2, 2, 37), (1, 1, 2), (1, 3, 10)]),
    "avg_1d_ceil_incl_pad": ("AveragePool", dict(kernel_shape=[4], strides=[3], pads=[2, 1], ceil_mode=1,
                                                 count_include_pad=1), 19, [(1, 3, 10), (2, 4, 23), (1, 1, 3)]),
    "max_3d_dilated": ("MaxPool", dict(kernel_shape=[2, 2, 3], dilations=[2, 1, 1], pads=[0, 1, 1, 1, 0, 1]), 12,
                       [(1, 2, 5, 6, 7), (2, 3, 4, 9, 5), (1, 2, 5, 6, 7)]),
    "avg_3d_same_upper_s2": ("AveragePool", dict(kernel_shape=[3, 2, 3], strides=[2, 2, 1],
                                                 auto_pad="SAME_UPPER"), 11, [(1, 2, 5, 6, 7), (2, 1, 8, 3, 4)]),
}


@pytest.mark.parametrize("case", POOL_ND_CASES)
def test_pool_1d_3d(case):
    op, attrs, opset, shapes = POOL_ND_CASES[case]
    m = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", FLOAT, len(shapes[0]))],
                   opset=opset)
    run_vs_ort(m, x_feeds(shapes))


@pytest.mark.parametrize("rank,attrs", [
    (4, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    (4, dict(kernel_shape=[2, 3], strides=[1, 2], storage_order=1)),
    (3, dict(kernel_shape=[3], pads=[1, 1], dilations=[2])),
    (5, dict(kernel_shape=[2, 2, 2], strides=[2, 1, 2], storage_order=1)),
    (5, dict(kernel_shape=[3, 1, 2], pads=[1, 0, 0, 1, 0, 1], ceil_mode=1, strides=[2, 2, 2])),
])
def test_maxpool_indices(rank, attrs):
    """The Indices output (int64, N and C offsets included, row- or column-major); inputs of
    few distinct values make ties, which take the first max in row-major scan order."""
    node = helper.make_node("MaxPool", ["x"], ["y", "idx"], **attrs)
    dims = [f"d{k}" for k in range(rank)]
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", FLOAT, dims)],
                          [helper.make_tensor_value_info("y", FLOAT, None),
                           helper.make_tensor_value_info("idx", INT64, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)], ir_version=8)
    shapes = {3: [(1, 3, 10), (2, 2, 31), (1, 3, 10)], 4: [(1, 3, 10, 10), (2, 2, 7, 9), (1, 1, 5, 6)],
              5: [(1, 2, 4, 6, 5), (2, 3, 7, 4, 6)]}[rank]
    seq = [{"x": RNG.integers(-3, 4, s).astype(np.float32)} for s in shapes]
    seq.append({"x": randn(*shapes[1])})
    run_vs_ort(m, seq)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_maxpool_8bit(dt):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1])
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", elem, ["n", "c", "h", "w"])],
                          [helper.make_tensor_value_info("y", elem, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)], ir_version=8)
    info = np.iinfo(dt)
    run_vs_ort(m, [{"x": RNG.integers(info.min, info.max + 1, s).astype(dt)}
                   for s in [(1, 3, 10, 10), (2, 2, 7, 9), (1, 1, 1, 1)]], rtol=0, atol=0)


def test_pool_refuses_4d_spatial():
    m = make_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2, 2, 2])], [("x", FLOAT, 6)],
                   opset=12)
    net = Network(build_program(m))
    with pytest.raises(ShapeInferenceError, match="1-D, 2-D and 3-D"):
        net.infer({"x": randn(1, 1, 3, 3, 3, 3)})


def test_global_average_pool():
    m = make_model([helper.make_node("GlobalAveragePool", ["x"], ["y"])], [("x", FLOAT, 4)])
    run_vs_ort(m, x_feeds([(1, 8, 7, 7), (2, 3, 1, 1), (1, 8, 7, 7), (2, 5, 13, 4)]))


@pytest.mark.parametrize("rank", [3, 4, 5])
def test_global_max_pool(rank):
    m = make_model([helper.make_node("GlobalMaxPool", ["x"], ["y"])], [("x", FLOAT, rank)])
    shapes = [(1, 8, 7, 7, 3), (2, 3, 1, 1, 1), (1, 8, 7, 7, 3), (2, 5, 13, 4, 2)]
    run_vs_ort(m, x_feeds([s[:rank] for s in shapes], scale=3.0))


# ---------------------------------------------------------------- Softmax
@pytest.mark.parametrize("opset,axis,rank", [
    (11, None, 3),   # flattens at axis 1: normalises over dims 1..2
    (11, 2, 4),      # over dims 2..3
    (11, -1, 3),
    (13, None, 3),   # over the last dim
    (13, 1, 4),      # over dim 1 only (strided)
    (13, 0, 2),
])
def test_softmax(opset, axis, rank):
    attrs = {} if axis is None else {"axis": axis}
    m = make_model([helper.make_node("Softmax", ["x"], ["y"], **attrs)], [("x", FLOAT, rank)],
                   opset=opset)
    shapes = [(2, 3, 5, 4), (1, 7, 2, 3), (2, 3, 5, 4), (3, 1, 6, 2)]
    # large magnitudes: a softmax that does not subtract the max overflows
    run_vs_ort(m, x_feeds([s[:rank] for s in shapes], scale=30.0), atol=1e-6)


# ---------------------------------------------------------------- ReduceMean
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, 2], 0), (None, 0), ([-1, 1], 1), ([3], 0)])
def test_reduce_mean_opset13(axes, keepdims):
    attrs = {"keepdims": keepdims}
    if axes is not None:
        attrs["axes"] = axes
    m = make_model([helper.make_node("ReduceMean", ["x"], ["y"], **attrs)], [("x", FLOAT, 4)])
    run_vs_ort(m, x_feeds([(2, 3, 4, 5), (1, 6, 1, 9), (2, 3, 4, 5), (3, 2, 5, 1)]))


@pytest.mark.parametrize("axes,keepdims,noop", [
    ([-1], 0, 0), ([0, 2], 1, 0), (None, 1, 0), (None, 0, 1), ([], 0, 1), ([], 1, 0)])
def test_reduce_mean_opset18(axes, keepdims, noop):
    ins, inits = ["x"], {}
    if axes is not None:
        ins.append("axes")
        inits["axes"] = np.array(axes, dtype=np.int64)
    node = helper.make_node("ReduceMean", ins, ["y"], keepdims=keepdims, noop_with_empty_axes=noop)
    m = make_model([node], [("x", FLOAT, 3)], inits=inits, opset=18)
    run_vs_ort(m, x_feeds([(2, 3, 4), (1, 5, 7), (2, 3, 4), (4, 1, 2)]))


def test_reduce_mean_runtime_axes():
    """opset 18 axes fed at run time: a memory dep that changes between inferences."""
    node = helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1)
    m = make_model([node], [("x", FLOAT, 3), ("axes", INT64, 1)], opset=18)
    feeds = [{"x": randn(2, 3, 4), "axes": np.array(a, dtype=np.int64)}
             for a in ([1], [0, 2], [1], [-1], [0, 1, 2])]
    run_vs_ort(m, feeds)


# ---------------------------------------------------------------- LayerNormalization
@pytest.mark.parametrize("axis,bias", [(-1, True), (-2, False), (1, True)])
def test_layer_norm(axis, bias):
    D, S = 16, 5
    norm_shape = {-1: (D,), -2: (S, D), 1: (S, D)}[axis]
    inits = {"scale": randn(*norm_shape)}
    ins = ["x", "scale"]
    if bias:
        inits["bias"] = randn(*norm_shape)
        ins.append("bias")
    node = helper.make_node("LayerNormalization", ins, ["y"], axis=axis, epsilon=1e-3)
    m = make_model([node], [("x", FLOAT, 3)], inits=inits, opset=17)
    shapes = [(2, S, D), (1, S, D), (2, S, D), (4, S, D)] if axis != -1 else \
        [(2, 5, D), (1, 9, D), (2, 5, D), (3, 1, D)]
    run_vs_ort(m, [{"x": randn(*s, scale=3.0) + 2.0} for s in shapes])


def test_layer_norm_refuses_mean_output():
    node = helper.make_node("LayerNormalization", ["x", "scale"], ["y", "mean"], axis=-1)
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", FLOAT, None)],
                          [helper.make_tensor_value_info("y", FLOAT, None),
                           helper.make_tensor_value_info("mean", FLOAT, None)],
                          [numpy_helper.from_array(randn(4), "scale")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    net = Network(build_program(m))
    with pytest.raises(ShapeInferenceError, match="Mean"):
        net.infer({"x": randn(2, 4)})


# ---------------------------------------------------------------- BatchNormalization
@pytest.mark.parametrize("opset,rank", [(9, 4), (15, 4), (15, 2), (14, 3)])
def test_batch_norm(opset, rank):
    C = 6
    inits = {"scale": randn(C), "bias": randn(C), "mean": randn(C),
             "var": np.abs(randn(C)) + 0.5}
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"],
                            epsilon=1e-3)
    m = make_model([node], [("x", FLOAT, rank)], inits=inits, opset=opset)
    shapes = [(2, C, 5, 4), (1, C, 3, 7), (2, C, 5, 4), (3, C, 1, 2)]
    run_vs_ort(m, x_feeds([s[:rank] for s in shapes]))


def test_batch_norm_refuses_training():
    C = 3
    inits = {"scale": randn(C), "bias": randn(C), "mean": randn(C), "var": np.abs(randn(C))}
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"],
                            training_mode=1)
    m = make_model([node], [("x", FLOAT, 4)], inits=inits, opset=15)
    net = Network(build_program(m))
    with pytest.raises(ShapeInferenceError, match="training_mode"):
        net.infer({"x": randn(1, C, 2, 2)})


# ---------------------------------------------------------------- LRN
def lrn_reference(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    """The ONNX formula (onnxruntime only implements odd sizes)."""
    C = x.shape[1]
    sq = np.zeros_like(x, dtype=np.float64)
    for c in range(C):
        lo, hi = max(0, c - (size - 1) // 2), min(C - 1, c + (size - 1 + 1) // 2)
        sq[:, c] = (x[:, lo:hi + 1].astype(np.float64) ** 2).sum(axis=1)
    return (x / (bias + alpha / size * sq) ** beta).astype(np.float32)


def test_lrn_odd_size():
    attrs = dict(alpha=1e-3, beta=0.75, bias=2.0)
    m = make_model([helper.make_node("LRN", ["x"], ["y"], size=5, **attrs)], [("x", FLOAT, 4)])
    run_vs_ort(m, x_feeds([(1, 7, 4, 5), (2, 3, 2, 2), (1, 7, 4, 5), (1, 10, 3, 1)], scale=4.0))


def test_lrn_even_size():
    attrs = dict(alpha=0.5, beta=0.6, bias=1.5)
    m = make_model([helper.make_node("LRN", ["x"], ["y"], size=4, **attrs)], [("x", FLOAT, 3)])
    net = Network(build_program(m))
    for s in [(1, 7, 5), (2, 3, 4), (1, 7, 5)]:
        x = randn(*s, scale=2.0)
        np.testing.assert_allclose(net.infer({"x": x})["y"], lrn_reference(x, 4, **attrs),
                                   rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- a tiny CNN
def test_tiny_cnn_chain():
    """Conv -> BN -> Relu -> MaxPool -> Conv (depthwise) -> LRN -> GAP -> Softmax."""
    C = 8
    inits = {"w1": randn(C, 3, 3, 3, scale=0.3), "b1": randn(C), "s": randn(C), "bb": randn(C),
             "m": randn(C), "v": np.abs(randn(C)) + 0.5, "w2": randn(C, 1, 3, 3, scale=0.3)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s", "bb", "m", "v"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "w2"], ["c2"], group=C, auto_pad="SAME_UPPER"),
        helper.make_node("LRN", ["c2"], ["l"], size=3),
        helper.make_node("GlobalAveragePool", ["l"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Softmax", ["f"], ["y"]),
    ]
    m = make_model(nodes, [("x", FLOAT, 4)], inits=inits, opset=13)
    run_vs_ort(m, x_feeds([(1, 3, 16, 16), (2, 3, 10, 14), (1, 3, 16, 16)]))
