"""GPU convs as an implicit GEMM on local-memory tiles (cl/conv_gemm.cl conv_lm): the calls of
a geometry (engine/ops/conv.py _conv_geometry), its tile, its K split, and the static variant
with the weights reordered to BM-blocks.

Rows of the GEMM are a group's output channels, columns an image's output pixels, K the taps
(ICg * KH * KW). The window (KH, KW, strides, dilations) is a JIT constant (the weight's shape
and the attributes: constant for a model); the pads, channel counts and groups go through
shape_info, so one build serves every input shape.
"""
from __future__ import annotations

from engine.kernels import KernelCall, StaticVariant, WeightsLayout, round_up
from engine.layout import Layout

# (WGX, WGY, RM, RN, BK): a work-group of WGX x WGY work-items computes WGY*RM output channels x
# WGX*RN pixels (gemm_lm's tiles, engine/ops/matmul.py). The first tile whose grid has at
# least min_blocks work-groups is taken. H100, scripts/bench_conv_peers.py --sweep, 2026-11-25,
# kernel us summed over resnet50's 53 convs at 1x3x224x224 (K split as SPLIT_* below), each
# tile everywhere: 128x128 1830, 64x128 1462, 64x64 1185, 32x64 1132, 32x32 1229 (cuDNN through
# torch in the same run: 1800 eager, 1442 from a CUDA graph); squeezenet's late 1x1 and 3x3
# layers the same way (256->48 13x13: 35.1 / 26.1 / 19.8 / 15.0 / 18.1). The bigger tiles are
# kept for grids of many blocks by gemm_lm's figures (128x128 at 4096^3: 44.8 TF/s, 64x128 92%
# of it). At batch 8 (same script, --batch 8 --sweep, every 2nd resnet50 geometry) this table
# still takes 32x64 everywhere: 2177 us (cuDNN 1920 eager, 1844 graph); the best tile per
# geometry would give about 1830 (128x128 split for 256->256 14x14 3x3: 82.8 vs 117.7; 64x128
# for the 7x7 stem: 72.3 vs 94.8; 32x64 for the 7x7 layers), with no rule on the grid's size
# alone that picks them: left for a per-geometry cost model.
TILES = [((16, 16, 8, 8, 8), 2000),   # 128 x 128
         ((16, 8, 8, 8, 16), 1000),   # 64 x 128
         ((16, 8, 4, 4, 16), 0),      # 32 x 64
         ((8, 8, 4, 4, 32), 0)]       # 32 x 32 (tests: a BK of 32)
# K split: a grid of fewer than SPLIT_BLOCKS work-groups with K >= SPLIT_MIN_K splits K in up to
# SPLIT_MAX parts of at least SPLIT_CHUNK taps, towards 2 * SPLIT_BLOCKS work-groups. H100, same
# run, the tiles then chosen, split / not: resnet50's convs 1225 / 2403 us; the split won on
# all 12 geometries it applied to (512->512 7x7 3x3: 35.6 / 184.0; 1024->256 14x14 1x1: 23.7 /
# 47.0; 512->2048 7x7 1x1, the least: 21.3 / 26.2).
SPLIT_BLOCKS, SPLIT_MIN_K, SPLIT_CHUNK, SPLIT_MAX = 132, 512, 128, 8
# Output channels per group below this: the register-tiled kernel (a 32-channel tile would
# idle half of it or more); not measured: the models measured have 16 or more, or depthwise.
LM_MIN_OCG = 16


def _pixels(g) -> int:
    return g["OH"] * g["OW"]


def lm_tile(g) -> tuple:
    ocg, p, z = g["OC"] // g["group"], _pixels(g), g["N"] * g["group"]
    for t, min_blocks in TILES:
        wgx, wgy, rm, rn, _ = t
        if -(-ocg // (wgy * rm)) * -(-p // (wgx * rn)) * z >= min_blocks:
            return t
    return TILES[-1][0]


def lm_split(g, tile) -> tuple[int, int]:
    """(S, taps per split): K in S parts when the grid is small and K long; (1, K) otherwise."""
    wgx, wgy, rm, rn, bk = tile
    kk = g["ICg"] * g["KH"] * g["KW"]
    blocks = -(-(g["OC"] // g["group"]) // (wgy * rm)) * -(-_pixels(g) // (wgx * rn)) * g["N"] * g["group"]
    if blocks >= SPLIT_BLOCKS or kk < SPLIT_MIN_K:
        return 1, round_up(max(kk, 1), bk)
    s = min(SPLIT_MAX, -(-2 * SPLIT_BLOCKS // blocks), kk // SPLIT_CHUNK)
    chunk = round_up(-(-kk // s), bk)
    return -(-kk // chunk), chunk


def pointwise(g) -> bool:
    """A 1x1 window, stride 1, no pads: X' is X itself ([ICg, H*W] per image and group)."""
    return (g["KH"], g["KW"]) == (1, 1) and g["pads"] == [0, 0] and g["strides"] == [1, 1] and \
        (g["OH"], g["OW"]) == (g["H"], g["W"])


def lm_calls(g, has_bias: bool, dims: dict, blocked: bool = False, tile=None, split=None) -> list:
    """conv_lm's calls for geometry g: one kernel, or with a K split the partial sums and
    conv_split_reduce. `dims`: the 2-D view of a 1-D conv's tensors (conv.py _dims_2d)."""
    tile = tile or lm_tile(g)
    s, chunk = split or lm_split(g, tile)
    wgx, wgy, rm, rn, bk = tile
    ocg = g["OC"] // g["group"]
    jit = (("WGX", wgx), ("WGY", wgy), ("RM", rm), ("RN", rn), ("BK", bk),
           ("KH", g["KH"]), ("KW", g["KW"]), ("SY", g["strides"][0]), ("SX", g["strides"][1]),
           ("DY", g["dil"][0]), ("DX", g["dil"][1]), ("HAS_BIAS", int(has_bias)),
           ("W_BLOCKED", int(blocked)), ("FLAT", int(pointwise(g))), ("CONV_SPLIT", int(s > 1)),
           ("FUSED_COORDS", 1), ("IMPL_TAG", "Conv"))
    if g["one_d"]:
        jit += (("CONV1D", 1),)
    args = (("in", 0), ("in", 1)) + ((("in", 2),) if has_bias else ()) + (("out", 0),)
    params = (g["pads"][0], g["pads"][1], ocg, g["ICg"], g["group"], s, chunk)
    gws = (-(-max(_pixels(g), 1) // (wgx * rn)) * wgx, -(-ocg // (wgy * rm)) * wgy,
           max(s * g["N"] * g["group"], 1))
    main = KernelCall("conv_gemm", "conv_lm", jit, args, params, gws=gws, lws=(wgx, wgy, 1), dims=dims)
    if s == 1:
        return [main]
    tmp = Layout((s, g["N"], g["OC"], _pixels(g)), "f32")
    args += (("internal", 0),)
    dims = {**dims, len(args) - 1: tmp.shape}
    return [KernelCall("conv_gemm", "conv_lm", jit, args, params, gws=gws, lws=(wgx, wgy, 1),
                       dims=dims, internal=(tmp,)),
            KernelCall("conv_gemm", "conv_split_reduce", jit, args, params,
                       gws=(max(g["N"] * g["OC"] * _pixels(g), 1),), dims=dims, internal=(tmp,))]


def lm_static(g, has_bias: bool, dims: dict, shape: tuple) -> StaticVariant | None:
    """The static variant: conv_lm with every dim a constant and the weights reordered to
    [ceil(OC/BM), ICg*KH*KW, BM] (one contiguous A tile per k step), when a BM-block starts
    every group (group == 1 or OCg % BM == 0). None with a K split (two kernels: the static
    variant is one call; the shape-agnostic impl stays)."""
    tile = lm_tile(g)
    if lm_split(g, tile)[0] > 1:
        return None
    bm = tile[1] * tile[2]
    ocg = g["OC"] // g["group"]
    blocked = g["group"] == 1 or ocg % bm == 0
    call = lm_calls(g, has_bias, dims, blocked, tile)[0]
    kk = g["ICg"] * g["KH"] * g["KW"]
    wl = None
    if blocked:
        # cl/reorder.cl's GEMM B reorder: W [OC, KK] is B^T [N=OC, K=KK]
        wl = WeightsLayout(f"conv_w_blk{bm}", ((g["OC"] + bm - 1) // bm, kk, bm),
                           (("TN", bm), ("TRANS_B", 1)), (kk, g["OC"]))
    return StaticVariant(call, {}, call.params, f"{'x'.join(map(str, shape))} "
                         f"lm{bm}x{tile[0] * tile[3]}{' blk' if blocked else ''}", wl)
