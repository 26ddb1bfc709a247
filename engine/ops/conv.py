"""Conv (2-D, NCHW; 1-D, NCL, runs as 2-D with a unit height): on GPUs an implicit GEMM on
local-memory tiles (cl/conv_gemm.cl, engine/ops/conv_gemm.py) for convs with at least
LM_MIN_OCG output channels per group; a register-tiled implicit GEMM (cl/conv_tiled.cl) for the
others with enough output channels per group (every such conv on CPUs), a direct
register-blocked kernel (cl/conv.cl) for the rest (depthwise, a few channels per group).

Strides, dilations, the presence of a bias and the tiles are JIT constants (attributes and the
weight's shape, constant for a model); the pads (computed from the input shape for auto_pad
SAME_*), the blocking and the output sizes go through shape_info, so one build serves every
input shape. The static impl reorders the weights to [ceil(OC/TM), ICg*KH*KW, TM] blocks
(update_weights), so one k step reads one contiguous TM-vector of weights.
"""
from __future__ import annotations

from engine.device import device_kind
from engine.kernels import KernelCall, StaticVariant, WeightsLayout
from engine.layout import Layout
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError
from engine.ops.conv_gemm import LM_MIN_OCG, lm_calls, lm_static

PW = 8          # output pixels along x per work-item (float8 accumulators)

# cl/conv_tiled.cl tiles per device kind and pixel walk ("flat": 1x1 stride 1 over the
# flattened image; "rows": any other window, pixels within a row): (TM output channels, TP
# output pixels) per work-item. CPU, by scripts/bench_conv.py-style static kernel times on PoCL
# (2 shared Zen 5 cores, geomean GFLOP/s over 64->256 56x56, 512->1000 13x13, 1024->256 14x14,
# 64->64 56x56 1x1; two rounds): flat (16, 16) 165 / 152, (8, 16) 137 / 135, (4, 16) 100 / 100,
# (16, 8) 90 / 93. Rows (64->256 1x1, 256 14x14 3x3, 128 28x28 3x3, 512->1000 1x1, 256->512
# 1x1 s2): (16, 8) 75, (8, 16) 62 (ragged rows and stride 2 lose), (8, 8) 49, (16, 4) 33;
# 3x3 pad 1 at 56/28/14/7 and the 7x7 s2 stem: (16, 8) 72, (16, 16) 44, (8, 8) 27, (32, 8) 23.
# GPU: convs of at least LM_MIN_OCG output channels per group run on cl/conv_gemm.cl instead
# (H100, scripts/bench_conv_peers.py, 2026-11-25: resnet50's 53 convs summed 18198 us here with
# (8, 4), 1132 us there); (8, 4), 32 accumulators per work-item in work-groups of 64-128
# (_tiled_call), stays for 4..15 channels per group, which none of the measured models has.
TILES = {"cpu": {"flat": (16, 16), "rows": (16, 8)}, "gpu": {"flat": (8, 4), "rows": (8, 4)}}
# Fewer output channels per group than this (depthwise): the direct kernel (cl/conv.cl).
TILED_MIN_OCG = 4


def _ints(node, name, n, default):
    v = node.attrs.get(name)
    if v is None:
        return [default] * n
    v = [int(x) for x in v]
    if len(v) != n:
        raise ShapeInferenceError(f"{node.op} {node.name}: {name}={v} must have {n} values")
    return v


def spatial_out(node, in_sizes, kernel, strides, dilations, ceil_mode=False):
    """ONNX output sizes and begin pads of a pooling/conv window over `in_sizes` (any rank).
    Returns (out_sizes, pads_begin, pads_end)."""
    n = len(in_sizes)
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if any(s < 1 for s in strides):
        raise ShapeInferenceError(f"{node.op} {node.name}: strides {strides} must be >= 1")
    if any(d < 1 for d in dilations):
        raise ShapeInferenceError(f"{node.op} {node.name}: dilations {dilations} must be >= 1")
    if any(k < 1 for k in kernel):
        raise ShapeInferenceError(f"{node.op} {node.name}: kernel {kernel} must be >= 1")
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    outs, pb, pe = [], [], []
    if auto_pad in ("NOTSET", ""):
        pads = _ints(node, "pads", 2 * n, 0)
        if any(p < 0 for p in pads):
            raise ShapeInferenceError(f"{node.op} {node.name}: negative pads {pads}")
        for i in range(n):
            b, e = pads[i], pads[i + n]
            span = in_sizes[i] + b + e - eff[i]
            if span < 0:
                raise ShapeInferenceError(
                    f"{node.op} {node.name}: window {eff[i]} larger than padded input "
                    f"{in_sizes[i] + b + e} (input spatial {tuple(in_sizes)})")
            o = (span + strides[i] - 1) // strides[i] + 1 if ceil_mode else span // strides[i] + 1
            # ceil_mode: the last window must start inside the input or the begin pad
            if ceil_mode and (o - 1) * strides[i] >= in_sizes[i] + b:
                o -= 1
            outs.append(o)
            pb.append(b)
            pe.append(e)
    elif auto_pad == "VALID":
        for i in range(n):
            span = in_sizes[i] - eff[i]
            if span < 0:
                raise ShapeInferenceError(
                    f"{node.op} {node.name}: window {eff[i]} larger than input {tuple(in_sizes)}")
            o = (span + strides[i] - 1) // strides[i] + 1 if ceil_mode else span // strides[i] + 1
            outs.append(o)
            pb.append(0)
            pe.append(0)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(n):
            o = (in_sizes[i] + strides[i] - 1) // strides[i]
            total = max(0, (o - 1) * strides[i] + eff[i] - in_sizes[i])
            small = total // 2
            b = small if auto_pad == "SAME_UPPER" else total - small
            outs.append(o)
            pb.append(b)
            pe.append(total - b)
    else:
        raise ShapeInferenceError(f"{node.op} {node.name}: unknown auto_pad {auto_pad!r}")
    return outs, pb, pe


def _conv_geometry(node, ins):
    """The window geometry of a 2-D Conv, or of a 1-D one ([N, C, L]) seen as 2-D with a unit
    height ([N, C, 1, L], weights [OC, C/group, 1, K]): `one_d` says which."""
    if len(ins) < 2 or ins[0] is None or ins[1] is None:
        raise ShapeInferenceError(f"Conv {node.name}: needs X and W")
    x, w = ins[0], ins[1]
    if x.rank not in (3, 4):
        raise ShapeInferenceError(f"Conv {node.name}: only 1-D (NCL) and 2-D (NCHW) convolution "
                                  f"are supported, got input {x}")
    one_d = x.rank == 3
    if w.rank != x.rank:
        raise ShapeInferenceError(f"Conv {node.name}: weight {w} must be "
                                  f"{'[OC, C/group, K]' if one_d else '[OC, C/group, KH, KW]'}")
    if any(l is not None and l.dtype != "f32" for l in ins):
        raise ShapeInferenceError(f"Conv {node.name}: float32 only")
    N, C, H, W = (x.shape[0], x.shape[1], 1, x.shape[2]) if one_d else x.shape
    OC, ICg, KH, KW = (w.shape[0], w.shape[1], 1, w.shape[2]) if one_d else w.shape
    group = int(node.attrs.get("group", 1))
    if group < 1 or C % group or OC % group or C // group != ICg:
        raise ShapeInferenceError(
            f"Conv {node.name}: input {x} and weight {w} do not match group={group}")
    ks = node.attrs.get("kernel_shape")
    if ks is not None and [int(k) for k in ks] != list(w.shape[2:]):
        raise ShapeInferenceError(f"Conv {node.name}: kernel_shape {list(ks)} != weight {w}")
    if len(ins) > 2 and ins[2] is not None and tuple(ins[2].shape) != (OC,):
        raise ShapeInferenceError(f"Conv {node.name}: bias {ins[2]} must be [{OC}]")
    nsp = x.rank - 2
    strides = _ints(node, "strides", nsp, 1)
    dil = _ints(node, "dilations", nsp, 1)
    outs, pb, pe = spatial_out(node, x.shape[2:], w.shape[2:], strides, dil)
    if one_d:   # the unit height: stride, dilation 1, no pads
        strides, dil, outs, pb = [1] + strides, [1] + dil, [1] + outs, [0] + pb
    OH, OW = outs
    return dict(N=N, C=C, H=H, W=W, OC=OC, ICg=ICg, KH=KH, KW=KW, group=group,
                strides=strides, dil=dil, OH=OH, OW=OW, pads=pb, one_d=one_d)


def _dims_2d(g, args, weights=True) -> dict:
    """A 1-D conv's tensors as the kernels see them: X, (W,) Y with a unit height."""
    if not g["one_d"]:
        return {}
    dims = {0: (g["N"], g["C"], 1, g["W"]), len(args) - 1: (g["N"], g["OC"], 1, g["OW"])}
    if weights:
        dims[1] = (g["OC"], g["ICg"], 1, g["KW"])
    return dims


def _ocb(ocg: int) -> int:
    # Channel blocking from the weight's shape (a constant for real models): depthwise convs
    # get one channel per work-item, wide layers 16 (16 float8 accumulators).
    if ocg >= 16:
        return 16
    if ocg >= 8:
        return 8
    if ocg >= 4:
        return 4
    return 1


def _lm_dims(g, has_bias: bool) -> dict:
    return _dims_2d(g, (None,) * (3 + has_bias), weights=False)


def _conv_kernels(node, ins, outs, deps, pw=PW):
    g = _conv_geometry(node, ins)
    has_bias = len(ins) > 2 and ins[2] is not None
    kind = device_kind()
    if kind == "gpu" and g["OC"] // g["group"] >= LM_MIN_OCG:
        return lm_calls(g, has_bias, _lm_dims(g, has_bias))
    if g["OC"] // g["group"] >= TILED_MIN_OCG:
        return [_tiled_call(g, has_bias, kind)]
    ocg = g["OC"] // g["group"]
    ocb = _ocb(ocg)
    bpg = (ocg + ocb - 1) // ocb
    jit = (("OCB", ocb), ("PW", pw), ("SY", g["strides"][0]), ("SX", g["strides"][1]),
           ("DY", g["dil"][0]), ("DX", g["dil"][1]), ("HAS_BIAS", int(has_bias)),
           ("IMPL_TAG", "Conv"))
    args = (("in", 0), ("in", 1)) + ((("in", 2),) if has_bias else ()) + (("out", 0),)
    oh, ow, dims = g["OH"], g["OW"], _dims_2d(g, args)
    if g["one_d"]:
        # [N, OC, L] seen as [N, OC, 1, L]: fused operands (rank <= 3) take coordinates
        # (0, n, c, x) (cl/conv.cl OUT_COORDS)
        jit += (("CONV1D", 1), ("FUSED_COORDS", 1))
    elif (g["KH"], g["KW"]) == (1, 1) and g["strides"] == [1, 1] and g["pads"] == [0, 0] \
            and (oh, ow) == (g["H"], g["W"]):
        # pointwise: the image is one row of H*W pixels (x-blocks cross rows, no ragged tails)
        oh, ow = 1, oh * ow
        dims = {0: (g["N"], g["C"], 1, ow), len(args) - 1: (g["N"], g["OC"], 1, ow)}
    else:
        jit += (("FUSED_COORDS", 1),)   # fused operands indexed by (n, c, y, x): no divisions
    xb = (ow + pw - 1) // pw
    params = (g["pads"][0], g["pads"][1], ocg, bpg, xb)
    return [KernelCall("conv", "conv2d", jit, args, params=params,
                       gws=(max(oh * xb, 1), g["group"] * bpg, max(g["N"], 1)), dims=dims)]


def _pointwise(g) -> bool:
    """A 1x1 window, stride 1, no pads: output pixel p reads input pixel p, so the tiled kernel
    walks pixels over the flattened image (no ragged row tails)."""
    return (g["KH"], g["KW"]) == (1, 1) and g["pads"] == [0, 0] and g["strides"] == [1, 1] and \
        (g["OH"], g["OW"]) == (g["H"], g["W"])


def _pow2_at_least(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def conv_tiles(g, kind: str) -> tuple[int, int]:
    return TILES[kind]["rows" if not _pointwise(g) else "flat"]


def _tiled_call(g, has_bias: bool, kind: str, blocked: bool = False) -> KernelCall:
    tm, tp = conv_tiles(g, kind)
    ocg = g["OC"] // g["group"]
    bpg = (ocg + tm - 1) // tm
    rows = not _pointwise(g)
    if rows:
        xb = (g["OW"] + tp - 1) // tp
        gws0 = g["OH"] * xb
    else:
        xb = gws0 = (g["OH"] * g["OW"] + tp - 1) // tp
    jit = (("TM", tm), ("TP", tp), ("SY", g["strides"][0]), ("SX", g["strides"][1]),
           ("DY", g["dil"][0]), ("DX", g["dil"][1]), ("HAS_BIAS", int(has_bias)),
           ("W_BLOCKED", int(blocked)), ("ROWS", int(rows)), ("FUSED_COORDS", 1),
           ("IMPL_TAG", "Conv"))
    if g["one_d"]:   # see _conv_kernels
        jit += (("CONV1D", 1),)
    args = (("in", 0), ("in", 1)) + ((("in", 2),) if has_bias else ()) + (("out", 0),)
    params = (g["pads"][0], g["pads"][1], ocg, bpg, xb, g["ICg"], g["KH"], g["KW"])
    gws = (max(gws0, 1), g["group"] * bpg, max(g["N"], 1))
    lws = None   # CPUs: the runtime's choice
    if kind == "gpu":
        # 64..128 work-items: pixels along dim 0 (coalesced loads), channel blocks along dim 1
        l0 = min(64, _pow2_at_least(gws[0]))
        lws = (l0, min(max(128 // l0, 1), _pow2_at_least(gws[1])), 1)
        gws = tuple((x + l - 1) // l * l for x, l in zip(gws, lws))
    # the weights' dims are not read (PARAMs; W_BLOCKED reorders them)
    return KernelCall("conv_tiled", "conv_tiled", jit, args, params=params, gws=gws, lws=lws,
                      dims=_dims_2d(g, args, weights=False))


def _static_pw(ow: int) -> int:
    """Pixels per work-item for a known output width: the fewest wasted lanes, widest first
    (16 measured slower than 8 on PoCL CPU: scripts/bench_impls.py)."""
    return min((8, 4), key=lambda p: ((ow + p - 1) // p * p - ow, -p))


def _conv_static(node, ins, outs, deps, consts):
    """Static Conv: the same kernel with every dim constant (loop bounds fold, the tap loops
    unroll) and the pixel blocking fitted to the output width. Weights keep their layout."""
    g = _conv_geometry(node, ins)
    ocg = g["OC"] // g["group"]
    has_bias = len(ins) > 2 and ins[2] is not None
    if device_kind() == "gpu" and ocg >= LM_MIN_OCG:
        return lm_static(g, has_bias, _lm_dims(g, has_bias), outs[0].shape)
    if ocg >= TILED_MIN_OCG:
        kind = device_kind()
        tm = conv_tiles(g, kind)[0]
        blocked = g["group"] == 1 or ocg % tm == 0
        call = _tiled_call(g, len(ins) > 2 and ins[2] is not None, kind, blocked)
        kk = g["ICg"] * g["KH"] * g["KW"]
        wl = None
        if blocked:
            # cl/reorder.cl's GEMM B reorder: W [OC, KK] is B^T [N=OC, K=KK]
            wl = WeightsLayout(f"conv_w_blk{tm}", ((g["OC"] + tm - 1) // tm, kk, tm),
                               (("TN", tm), ("TRANS_B", 1)), (kk, g["OC"]))
        return StaticVariant(call, {}, call.params, f"{'x'.join(map(str, outs[0].shape))} "
                             f"tm{tm}tp{dict(call.jit)['TP']}{' blk' if blocked else ''}", wl)
    call = _conv_kernels(node, ins, outs, deps)[0]
    ow = dict(call.dims).get(len(call.args) - 1, outs[0].shape)[3]
    pw = _static_pw(ow)
    if pw != PW:
        call = _conv_kernels(node, ins, outs, deps, pw)[0]
    return StaticVariant(call, {}, call.params, f"{'x'.join(map(str, outs[0].shape))} pw{pw}")


# static_on (scripts/bench_impls.py, dynamic / static kernel time, > 1: static faster): PoCL CPU
# (2 shared cores, --repeat 15) 1.44 (1.13..1.96 with PW=8; PW=16 lost: 0.97); NVIDIA H200
# (--repeat 50 --large) 1.30 (0.89..3.87)
@register("Conv", checked=22, kernels=_conv_kernels, static=_conv_static, weights=1,
          static_on=frozenset({"cpu", "gpu"}), fusion_producer=True)
def _conv(node, ins, deps):
    g = _conv_geometry(node, ins)
    if g["one_d"]:
        return [Layout((g["N"], g["OC"], g["OW"]), "f32")]
    return [Layout((g["N"], g["OC"], g["OH"], g["OW"]), "f32")]
