"""Conv kernels against onnxruntime over geometries that cross the tiles of cl/conv_tiled.cl
(TM output channels x TP pixels per work-item: 16 x 8 on CPUs, 8 x 4 on GPUs, both run here):
channel counts around the tile and prime, odd and prime images, strides, pads, dilations,
groups, depthwise (the direct kernel), 1x1 / 3x3 / 7x7 windows; one Network per case over a
sequence of shapes, with the shape-agnostic (dynamic) impls and with the static ones (weights
reordered to TM-blocks); and fused epilogues (BatchNormalization, residual Add, Relu). 1-D convs
([N, C, L], run as 2-D with a unit height) through every kernel and epilogue.
(1x1 stride-1 convs walk the flattened image with their own tiles: 16 x 16 on CPUs.)"""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine import Network, build_program
from engine import device as device_mod
from engine.ops import conv as conv_mod
from tests.conftest import run_vs_ort

FLOAT = TensorProto.FLOAT
RNG = np.random.default_rng(12)


def _model(nodes, inits, opset=13, x_dims=("n", "c", "h", "w")):
    x = helper.make_tensor_value_info("x", FLOAT, list(x_dims))
    y = helper.make_tensor_value_info("y", FLOAT, None)
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()]
    g = helper.make_graph(nodes, "t", [x], [y], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def conv_model(C, OC, k, attrs, bias=True):
    group = attrs.get("group", 1)
    inits = {"w": RNG.standard_normal((OC, C // group, *k)) / np.sqrt(C // group * k[0] * k[1])}
    ins = ["x", "w"]
    if bias:
        inits["b"] = RNG.standard_normal(OC)
        ins.append("b")
    return _model([helper.make_node("Conv", ins, ["y"], kernel_shape=list(k), **attrs)], inits)


def feeds(C, hws):
    return [{"x": RNG.standard_normal((n, C, h, w)).astype(np.float32)} for n, h, w in hws]


def _use_kind(monkeypatch, kind, lm=False):
    """Make the conv's kernel calls with the CPU or the GPU tiles and work-groups (a choice of
    kernel call only: both run on this device). On GPUs the convs with many channels per group
    run on cl/conv_gemm.cl (tests/test_conv_gemm.py); lm=False keeps every one on the kernels
    tested here."""
    monkeypatch.setitem(device_mod._kind, "last", kind)
    if not lm:
        monkeypatch.setattr(conv_mod, "LM_MIN_OCG", 1 << 30)


def _run(model, seq, device, impls):
    net = Network(build_program(model), device, impls=impls)
    run_vs_ort(model, seq, device, rtol=1e-4, atol=2e-5, net=net, check_nonconstant=False)
    return next(i for i in net.insts if i.node.op == "Conv")


# name: (C, OC, kernel, attrs, bias, sequence of (N, H, W)); "tm" stands for the tile's TM
CASES = {
    "pointwise_tm+1": (17, "tm+1", (1, 1), {}, True, [(1, 13, 13), (2, 8, 16), (1, 1, 3), (1, 13, 13)]),
    "pointwise_c1_tm-1": (1, "tm-1", (1, 1), {}, False, [(1, 9, 7), (3, 5, 5)]),
    "pointwise_s2_prime": (16, 31, (1, 1), dict(strides=[2, 2]), True, [(1, 13, 17), (2, 9, 9), (1, 28, 28)]),
    "k3_pad1_tm": (7, "tm", (3, 3), dict(pads=[1, 1, 1, 1]), True, [(1, 11, 17), (2, 8, 8), (1, 14, 14), (1, 3, 2)]),
    "k3_s2_pad1": (5, 16, (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]), False, [(1, 17, 23), (1, 14, 14)]),
    "k3_dil2": (3, 17, (3, 3), dict(dilations=[2, 2], pads=[2, 2, 2, 2]), True, [(1, 13, 19), (2, 7, 9)]),
    "k7_s2_p3": (3, 16, (7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3]), True, [(1, 23, 29), (1, 17, 17)]),
    "k53_s21_asym": (4, 9, (5, 3), dict(strides=[2, 1], pads=[0, 1, 2, 1]), True, [(1, 11, 13), (2, 9, 8)]),
    "group2_unaligned": (8, 40, (3, 3), dict(group=2, pads=[1, 1, 1, 1]), True, [(1, 9, 11), (2, 6, 5)]),
    "group4_aligned": (16, 64, (1, 1), dict(group=4), True, [(1, 7, 9), (1, 5, 5)]),
    "depthwise": (13, 13, (3, 3), dict(group=13, pads=[1, 1, 1, 1]), True, [(1, 11, 9), (2, 7, 7)]),
    "depthwise_x2_s2": (6, 12, (3, 3), dict(group=6, strides=[2, 2], pads=[1, 1, 1, 1]), False, [(1, 13, 13)]),
    "same_upper_s2": (3, 8, (3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2]), True, [(1, 9, 12), (1, 16, 5)]),
}


# the GPU tiles on a subset (build time)
GPU_CASES = ["pointwise_tm+1", "k3_pad1_tm", "k3_s2_pad1", "k53_s21_asym", "group2_unaligned"]


@pytest.mark.parametrize("kind,case", [("cpu", c) for c in CASES] + [("gpu", c) for c in GPU_CASES])
def test_conv_tiles(device, monkeypatch, kind, case):
    """Dynamic impls over the whole shape sequence, static impls over its first two shapes."""
    _use_kind(monkeypatch, kind)
    C, OC, k, attrs, bias, hws = CASES[case]
    flat = k == (1, 1) and not attrs
    tm = conv_mod.TILES[kind]["flat" if flat else "rows"][0]
    if isinstance(OC, str):
        OC = eval(OC, {"tm": tm})
    model = conv_model(C, OC, k, attrs, bias)
    group = attrs.get("group", 1)
    ocg = OC // group
    tiled = ocg >= conv_mod.TILED_MIN_OCG
    for impls, seq in (("dynamic", hws), ("static", hws[:2])):
        inst = _run(model, feeds(C, seq), device, impls)
        name = inst.bound[0].impl.name
        assert name.startswith("conv_tiled" if tiled else "conv:"), name
        if impls == "static":
            assert "/static[" in name, name
            blocked = tiled and (group == 1 or ocg % tm == 0)
            assert (" blk" in name) == blocked, name
            assert (inst.weights_override is not None) == blocked


def bn_residual_relu(C: int, k: tuple, pads: list):
    """Relu(BN(Conv(x)) * 0.5 + x), C channels in and out, kernel k."""
    inits = {"w": RNG.standard_normal((C, C, *k)) / np.sqrt(C * k[0] * k[1]),
             "s": RNG.standard_normal(C), "bb": RNG.standard_normal(C),
             "m": RNG.standard_normal(C), "v": np.abs(RNG.standard_normal(C)) + 0.5,
             "half": np.array(0.5)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=pads),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["bn"]),
             helper.make_node("Mul", ["bn", "half"], ["h"]),
             helper.make_node("Add", ["h", "x"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    return _model(nodes, inits)


@pytest.mark.parametrize("kind,impls", [("cpu", "dynamic"), ("cpu", "static"), ("gpu", "static")])
def test_conv_fused_bn_residual_relu(device, monkeypatch, kind, impls):
    """Relu(BN(Conv(x)) * 0.5 + x): per-channel, scalar and full-shape operands in the epilogue,
    on both pixel walks (1x1 flattened, 3x3 rows)."""
    _use_kind(monkeypatch, kind)
    C = 17
    for k, pads in (((1, 1), [0, 0, 0, 0]), ((3, 3), [1, 1, 1, 1])):
        m = bn_residual_relu(C, k, pads)
        inst = _run(m, feeds(C, [(1, 11, 13), (2, 8, 8), (1, 5, 19)]), device, impls)
        assert inst.node.fusion is not None and len(inst.node.fusion.ops) == 4
        assert inst.bound[0].impl.name.startswith("conv_tiled:Conv+fused"), inst.bound[0].impl.name


def test_conv_fused_depthwise(device):
    """The direct kernel's epilogue (depthwise): BN + Relu, dynamic and static."""
    C = 12
    inits = {"w": RNG.standard_normal((C, 1, 3, 3)) / 3, "s": RNG.standard_normal(C),
             "bb": RNG.standard_normal(C), "m": RNG.standard_normal(C),
             "v": np.abs(RNG.standard_normal(C)) + 0.5}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=C, pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["y"])]
    m = _model(nodes, inits)
    for impls in ("dynamic", "static"):
        inst = _run(m, feeds(C, [(1, 13, 11), (2, 9, 9)]), device, impls)
        assert inst.bound[0].impl.name.startswith("conv:Conv+fused"), inst.bound[0].impl.name


# 1-D: name: (C, OC, K, attrs, static too); the kernel each takes: tiled rows, tiled flat (1x1),
# direct (depthwise). Few cases: a cold build of a fused tiled conv takes ~14 s on PoCL.
CASES_1D = {
    "k5_s2_dil2_asym": (4, 17, 5, dict(strides=[2], dilations=[2], pads=[3, 1]), True),
    "pointwise": (17, 17, 1, {}, False),
    "depthwise_same_upper": (6, 6, 4, dict(group=6, auto_pad="SAME_UPPER", strides=[2]), True),
}


@pytest.mark.parametrize("case", CASES_1D)
def test_conv_1d_fused(device, monkeypatch, case):
    """Relu(BN(Conv1d(x)) + cb): the [OC, 1] BN constants and the [OC, 1] operand index the
    rank-3 output through the epilogue; dynamic impls over lengths that change (a tiny one
    among them), static ones over two for a tiled and a direct case (builds cost). The CPU
    kind's kernels, on any device (a GPU's would take conv_gemm for the many-channel ones)."""
    _use_kind(monkeypatch, "cpu")
    C, OC, K, attrs, static = CASES_1D[case]
    group = attrs.get("group", 1)
    inits = {"w": RNG.standard_normal((OC, C // group, K)) / np.sqrt(C // group * K),
             "s": RNG.standard_normal(OC), "bb": RNG.standard_normal(OC),
             "m": RNG.standard_normal(OC), "v": np.abs(RNG.standard_normal(OC)) + 0.5,
             "cb": RNG.standard_normal((OC, 1))}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], **attrs),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["bn"]),
             helper.make_node("Add", ["bn", "cb"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    m = _model(nodes, inits, x_dims=("n", "c", "l"))
    seq = [{"x": RNG.standard_normal((n, C, L)).astype(np.float32)}
           for n, L in [(1, 37), (2, 16), (1, 1 if K == 1 else 5), (3, 29), (1, 37)]]
    tiled = OC // group >= conv_mod.TILED_MIN_OCG
    for impls, sq in (("dynamic", seq), ("static", seq[:2])) if static else (("dynamic", seq),):
        inst = _run(m, sq, device, impls)
        assert inst.node.fusion is not None and len(inst.node.fusion.ops) == 3
        name = inst.bound[0].impl.name
        assert name.startswith("conv_tiled:Conv+fused" if tiled else "conv:Conv+fused"), name
        assert inst.unfuse_reason == ""
