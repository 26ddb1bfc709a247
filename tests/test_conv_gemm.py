"""The GPU conv kernel (cl/conv_gemm.cl conv_lm: an implicit GEMM on local-memory tiles, with
its K split and conv_split_reduce) against onnxruntime, run on the suite's device (PoCL in CI):
the engine is told it runs on a GPU. Each case forces one tile of engine/ops/conv_gemm.py
(every tile is covered) and a K split or none, over shape sequences on one Network that cross
the tile: ragged channels and pixel counts, strides, dilations, asymmetric pads, groups, batch
> 1, 1x1 windows (the flat pixel walk), 1-D convs; dynamic impls over the whole sequence and
static ones (weights reordered to BM-blocks) over its first shape; fused BN + residual + Relu."""
import numpy as np
import pytest
from onnx import helper

from engine.ops import conv_gemm
from tests.test_conv_tiled import RNG, _model, _run, _use_kind, bn_residual_relu, conv_model, feeds

TILES = [t for t, _ in conv_gemm.TILES]


def _force(monkeypatch, tile, split):
    """Every geometry gets `tile`; split: K in parts of at most 64 taps (short K in tests)."""
    monkeypatch.setattr(conv_gemm, "TILES", [(tile, 0)])
    monkeypatch.setattr(conv_gemm, "SPLIT_BLOCKS", 1 << 30 if split else 0)
    monkeypatch.setattr(conv_gemm, "SPLIT_MIN_K", 40)
    monkeypatch.setattr(conv_gemm, "SPLIT_CHUNK", 16)


def _bm(tile):
    return tile[1] * tile[2]


# name: (C, OC ("bm" stands for the tile's BM), kernel, attrs, bias, sequence of (N, H, W))
CASES = {
    "pointwise_bm+3": (19, "bm+3", (1, 1), {}, True, [(1, 9, 13), (2, 6, 7), (1, 1, 3)]),
    "pointwise_aligned_hw": (24, "bm", (1, 1), {}, False, [(1, 8, 12), (3, 4, 4)]),
    "k3_p1": (12, 20, (3, 3), dict(pads=[1, 1, 1, 1]), True, [(1, 11, 17), (2, 7, 6), (1, 1, 1)]),
    "k3_s2_dil2_asym": (5, 17, (3, 3), dict(strides=[2, 2], dilations=[2, 1], pads=[2, 0, 1, 2]),
                        True, [(1, 17, 23), (2, 9, 8)]),
    "k7_s2_p3": (3, 16, (7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3]), False, [(1, 23, 29), (1, 9, 9)]),
    "pointwise_s2": (16, 18, (1, 1), dict(strides=[2, 2]), True, [(1, 13, 17), (2, 6, 6)]),
    "group2_k3": (10, 36, (3, 3), dict(group=2, pads=[1, 1, 1, 1]), True, [(1, 9, 11), (2, 5, 4)]),
    "group2_bm_aligned": (8, "2*bm", (1, 1), dict(group=2), False, [(1, 7, 9)]),
}


# every case on the tile small grids take (32x64, the last with a min_blocks of 0); the others
# (128x128, 64x128, and 32x32: BK 32, several loads per work-item) on the cases that cross what
# a tile changes, its loads and K steps (a cold build of each case and tile costs 2 to 4 s on
# PoCL): the flat pixel walk with output channels past a BM-block (and a 1-pixel image), the
# gathered walk with strides, dilation and asymmetric pads (K = 45: a partial step of every BK,
# split too), groups with BM-aligned channels (the blocked static weights per group)
DEFAULT = next(ti for ti, (t, min_blocks) in enumerate(conv_gemm.TILES) if min_blocks == 0)
BIG = ("pointwise_bm+3", "k3_s2_dil2_asym", "group2_bm_aligned")
TILE_CASES = [(c, ti) for ti, t in enumerate(TILES) for c in CASES if ti == DEFAULT or c in BIG]


# (K = 24 of the aligned pointwise case never splits: not asked to)
SPLIT_CASES = [(c, ti, split) for c, ti in TILE_CASES for split in (False, True)
               if not (split and c.startswith("pointwise_aligned"))]


@pytest.mark.parametrize("case,ti,split", SPLIT_CASES)
def test_conv_lm(device, monkeypatch, case, ti, split):
    tile = TILES[ti]
    _use_kind(monkeypatch, "gpu", lm=True)
    _force(monkeypatch, tile, split)
    C, OC, k, attrs, bias, hws = CASES[case]
    if isinstance(OC, str):
        OC = eval(OC, {"bm": _bm(tile)})
    model = conv_model(C, OC, k, attrs, bias)
    kk = C // attrs.get("group", 1) * k[0] * k[1]
    want_split = split and kk >= 40
    for impls, seq in (("dynamic", hws), ("static", hws[:1])):
        inst = _run(model, feeds(C, seq), device, impls)
        kernels = [b.call.kernel for b in inst.bound]
        if impls == "dynamic" or not want_split:
            assert kernels == (["conv_lm", "conv_split_reduce"] if want_split else ["conv_lm"]), kernels
        name = inst.bound[0].impl.name
        assert name.startswith("conv_gemm:Conv"), name
        if impls == "static" and not want_split:
            assert "/static[" in name, name
            group = attrs.get("group", 1)
            assert (" blk" in name) == (group == 1 or (OC // group) % _bm(tile) == 0), name


@pytest.mark.parametrize("split", [False, True], ids=["one", "split"])
def test_conv_lm_fused_bn_residual_relu(device, monkeypatch, split):
    """Relu(BN(Conv(x)) * 0.5 + x) through conv_lm's epilogue and conv_split_reduce's, on both
    pixel walks (1x1 flat, 3x3 gathered), dynamic and static."""
    _use_kind(monkeypatch, "gpu", lm=True)
    _force(monkeypatch, TILES[-1], split)
    C = 48
    for k, pads in (((1, 1), [0, 0, 0, 0]), ((3, 3), [1, 1, 1, 1])):
        m = bn_residual_relu(C, k, pads)
        for impls, seq in (("dynamic", [(1, 11, 13), (2, 8, 8)]), ("static", [(1, 5, 19)])):
            inst = _run(m, feeds(C, seq), device, impls)
            assert inst.node.fusion is not None and len(inst.node.fusion.ops) == 4
            assert inst.bound[-1].impl.name.startswith("conv_gemm:Conv+fused"), inst.bound[-1].impl.name


def test_conv_lm_1d_fused(device, monkeypatch):
    """Relu(BN(Conv1d(x)) + cb), a 1-D conv ([N, C, L], a unit height) with stride, dilation
    and pads: the [OC, 1] operands index the rank-3 output through conv_lm's epilogue and
    conv_split_reduce's."""
    _use_kind(monkeypatch, "gpu", lm=True)
    C, OC, K = 20, 33, 3
    inits = {"w": RNG.standard_normal((OC, C, K)) / np.sqrt(C * K), "s": RNG.standard_normal(OC),
             "bb": RNG.standard_normal(OC), "m": RNG.standard_normal(OC),
             "v": np.abs(RNG.standard_normal(OC)) + 0.5, "cb": RNG.standard_normal((OC, 1))}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2], dilations=[2], pads=[2, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["bn"]),
             helper.make_node("Add", ["bn", "cb"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    m = _model(nodes, inits, x_dims=("n", "c", "l"))
    seq = [{"x": RNG.standard_normal((n, C, L)).astype(np.float32)} for n, L in [(1, 37), (2, 9)]]
    for split in (False, True):
        _force(monkeypatch, TILES[-1], split)
        inst = _run(m, seq, device, "dynamic")
        assert [b.call.kernel for b in inst.bound] == \
            (["conv_lm", "conv_split_reduce"] if split else ["conv_lm"])
        assert inst.bound[-1].impl.name.startswith("conv_gemm:Conv+fused")
