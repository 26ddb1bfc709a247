"""MatMul (batched, broadcasting, 1-D operands) and Gemm on register-tiled kernels (cl/gemm.cl:
gemm_lm on GPUs, gemm_rb on CPUs), or split-K for few rows and a long K; static variants of
the same kernels."""
from __future__ import annotations

import math

import numpy as np

from engine.kernels import KernelCall, StaticVariant, WeightsLayout, round_up
from engine.layout import Layout
from engine.symbolic import piecewise, prod
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError, broadcast

M_ALIGN = 8     # fake alignment of static GEMM rows (the GPU plugin's fully_connected does 8/16)

# Kernel parameters per device kind and shape bucket, measured with
# scripts/bench_gemm.py (kernel time from OpenCL profiling events).
#
# GPU: cl/gemm.cl gemm_lm (2-level tiling through local memory), (WGX, WGY, RM, RN, BK): a
# work-group of WGX x WGY work-items, RM x RN outputs each, so a WGY*RM x WGX*RN block per
# work-group, K stepped by BK. The first tile whose grid has at least its min_blocks
# work-groups is taken: big tiles reuse more, but a grid of few waves idles SMs. From the sweep
# on the H100 (132 SMs; bench_gemm.py --sweep, us, best tile = 100%):
#   4096^3: 128x128 BK8 3065 (44.8 TF/s; cuBLAS 2661), 64x128 3335 (92%)
#   2048x1536x384: 64x128 67.9 (cuBLAS 62.4), 128x128 84 (81%), 64x64 85.7 (79%)
#   2048x3072x768: 64x128 235.5 (cuBLAS 222.8), 128x128 BK16 251 (94%)
#   2048x384x1536: 32x64 93.5 (cuBLAS 70.8), 64x128 104 (90%), 64x64 110.6 (85%)
#   512x768x768: 64x64 36.3 (cuBLAS 28.8), 32x32 37.2 (98%), 32x64 38.7 (94%), 64x128 55.5
#   128x1536x384: 32x64 17.6 (cuBLAS 28.4), 32x32 BK32 18.1 (97%), 64x128 31.1 (57%)
#   32x1536x384: 32x32 BK32 15.2 (cuBLAS 19.5), 32x64 17.2 (88%); 8x1536x384: 32x32 17.4
#   12 x 128x128x32 (attention): 32x64 7.1, 32x32 7.4 (97%)
GPU_TILES = [((16, 16, 8, 8, 8), 1000),    # 128x128
             ((16, 8, 8, 8, 16), 300),     # 64x128
             ((16, 16, 4, 4, 16), 300),    # 64x64
             ((16, 8, 4, 4, 16), 300),     # 32x64
             ((8, 8, 4, 4, 32), 0)]        # 32x32
# CPU: cl/gemm.cl gemm_rb, no local memory (PoCL serialises barriers), its grid rows first: a
# work-item computes TM rows x TN columns, TN / 16 vector loads of B along N per k (16 lanes;
# TN < 16: one of TN).
# PoCL, 2 shared cores (AVX-512), static impls (B reordered to [N/TN][K][TN]), the same process,
# alternating, load average 1.1-1.8:
# - BERT (MiniLM) 2 layers, summed GEMM kernel time, seq 128 / 32 (ms): 8x16 10.35 / 3.71,
#   12x32 8.77 / 3.34, 8x32 9.34 / 3.40, 12x16 9.60 / 3.70, 6x32 10.81, 4x64 11.91;
#   128x384x384 alone (us, min of 15): 8x16 149, 12x32 131, 8x32 130, 14x32 136, 4x64 132;
# - static impls of up to 8 rows take one 8-row block (same TN: the same reordered weights as
#   the larger row counts): 8x384x1536 8x32 56.3 us, 12x32 63.4, 8x16 53.6; 1x768x3072 8x32
#   230, 12x32 247, 8x16 195, 4x32 327. Shape-agnostic impls keep one tile for every M.
# (Before B was loaded as a plain vector dereference, vload16 calls made 8x16 the best at
# 3-5x these times, cl/gemm.cl.)
CPU_TILE = (12, 32)          # (TM, TN)
CPU_SMALL_M = 8              # static impls of at most this many rows: TM = CPU_SMALL_M


# Shape-agnostic impls (the first inferences, small GEMMs): PoCL generates a kernel's code at its
# first launch, in the inference's path; the README encoder's first inference with empty caches
# (3 gemm_rb variants): 12x32 tiles 11.5 s (1.6-4.9 s a variant), 8x16 4.4 s.
CPU_DYNAMIC_TILE = (8, 16)


def cpu_tile(M: int, static: bool = False) -> tuple:
    """(TM, TN) of gemm_rb for M rows (the table above)."""
    if not static:
        return CPU_DYNAMIC_TILE
    return (CPU_SMALL_M, CPU_TILE[1]) if M <= CPU_SMALL_M else CPU_TILE


# Tall-skinny (N <= 64, many rows, long K): 128x64 blocks, K split to fill the SMs. H100
# 4096x64x4096: 71.7 us (cuBLAS 61, CLBlast 226) against 121 with the table's 32x32, 91 with 32x64.
GPU_TILE_SKINNY = (16, 16, 8, 4, 16)


def gpu_tile(M: int, N: int, nb: int, K: int = 0) -> tuple:
    if N <= 64 and M >= 2048 and K >= 2048:   # measured at 4096x64x4096 only
        return GPU_TILE_SKINNY
    for t, min_blocks in GPU_TILES:
        wgx, wgy, rm, rn, _ = t
        if -(-M // (wgy * rm)) * -(-N // (wgx * rn)) * nb >= min_blocks:
            return t
    return GPU_TILES[-1][0]


def _mm_operands(a, b):
    """ONNX MatMul promotes 1-D operands (numpy matmul); returns 2-D+ shapes and output shape."""
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    if a2[-1] != b2[-2]:
        raise ShapeInferenceError(f"MatMul inner dims differ: {a} x {b}")
    batch = broadcast(a2[:-2], b2[:-2])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return a2, b2, batch, out


def gemm_call(node, a2, b2, batch, M, N, K, trans_a=0, trans_b=0, alpha=1.0, beta=1.0, bias=None,
              dev="gpu"):
    """The shape-agnostic GEMM of these shapes on a `dev` kind device: gemm_lm on GPUs (its
    tile from the shape bucket), gemm_rb on CPUs."""
    nb = prod(batch) if batch else 1
    y_dims = tuple(batch) + (M, N)
    jit = (("TRANS_A", trans_a), ("TRANS_B", trans_b), ("HAS_BIAS", int(bias is not None)),
           ("ALPHA", f"{float(alpha)!r}f"), ("BETA", f"{float(beta)!r}f"), ("IMPL_TAG", node.op))
    args = (("in", 0), ("in", 1)) + ((("in", 2),) if bias is not None else ()) + (("out", 0),)
    dims = {0: a2, 1: b2, len(args) - 1: y_dims}
    if bias is not None:
        dims[2] = bias
    if dev == "cpu":
        tm, tn = cpu_tile(M)
        jit += (("TM", tm), ("TN", tn), ("FUSED_VW", min(tn, 16)), ("B_BLOCKED", 0))
        return KernelCall("gemm", "gemm_rb", jit, args, params=(M, N, K, nb),
                          gws=(-(-max(M, 1) // tm), -(-max(N, 1) // tn), max(nb, 1)), dims=dims)
    wgx, wgy, rm, rn, bk = gpu_tile(M, N, nb, K)
    jit += (("WGX", wgx), ("WGY", wgy), ("RM", rm), ("RN", rn), ("BK", bk))
    return KernelCall("gemm", "gemm_lm", jit, args, params=(M, N, K, nb),
                      gws=(-(-max(N, 1) // (wgx * rn)) * wgx, -(-max(M, 1) // (wgy * rm)) * wgy,
                           max(nb, 1)),
                      lws=(wgx, wgy, 1), dims=dims)


# GEMV split-K (GPUs; M <= SPLITK_MAX_ROWS): K in S = min(SPLITK_MAX, K // SPLITK_CHUNK) parts.
# H100, partial + reduce kernel time, chunk 256 (max 16) / 128 / 64 (max 64): 1x4096x4096
# 121 / 72 / 52 us (1.28 TB/s; cuBLAS 24 us), 4x4096x4096 150 / 85 / 58 us (cuBLAS 66),
# 1x4096x11008 134 / 105 / 104 us (1.73 TB/s; cuBLAS 62), 1x3072x768 60 / 35 / 24 us (cuBLAS 14-19).
SPLITK_MAX_ROWS, SPLITK_MIN_K, SPLITK_CHUNK, SPLITK_MAX = 4, 512, 64, 64
SPLITK_DEVICES = ("gpu",)
# gemm_lm split-K (GPUs): a grid of fewer than LM_SPLIT_BLOCKS work-groups with K >= LM_SPLIT_MIN_K
# splits K in up to LM_SPLIT_MAX parts of >= LM_SPLIT_CHUNK rows, towards 2 work-groups per SM.
# H100, off / on: 8x768x3072 87 / 24 us (cuBLAS 19), 32x384x1536 43 / 22 (cuBLAS 25),
# 128x384x1536 43 / 23 (cuBLAS 17), 32x768x3072 80 / 23 (cuBLAS 24); 264 blocks: no better.
LM_SPLIT_BLOCKS, LM_SPLIT_MIN_K, LM_SPLIT_CHUNK, LM_SPLIT_MAX = 132, 1024, 256, 8


def lm_splits(blocks: int, K: int) -> int:
    """gemm_lm's K parts for a grid of `blocks` work-groups: towards 2 per SM, at most
    LM_SPLIT_MAX, each at least LM_SPLIT_CHUNK rows of K."""
    return min(LM_SPLIT_MAX, -(-2 * LM_SPLIT_BLOCKS // blocks), K // LM_SPLIT_CHUNK)


def split_k(call: KernelCall, dev: str = "gpu") -> list[KernelCall]:
    """The GEMM call, or split-K: the partial kernel (gemm_splitk_partial for a GEMV of at most
    SPLITK_MAX_ROWS rows and a long K, gemm_lm with LM_SPLIT for a tiled grid too small for the
    device), then gemm_splitk_reduce, the partial sums in an internal buffer [S, batch, M, N].
    GPUs only: on PoCL (2 cores) 1x384x1536 took 499 us split-K, 81 us in gemm_rb."""
    M, N, K, nb = call.params
    if dev not in SPLITK_DEVICES:
        return [call]
    if M <= SPLITK_MAX_ROWS and K >= SPLITK_MIN_K:
        s, chunk = min(SPLITK_MAX, K // SPLITK_CHUNK), 0
        jit = call.jit
        partial = dict(kernel="gemm_splitk_partial", gws=(round_up(-(-N // 4), 64), 1, nb * s), lws=(64, 1, 1))
    elif call.kernel == "gemm_lm" and K >= LM_SPLIT_MIN_K:
        j = dict(call.jit)
        bm, bn = j["WGY"] * j["RM"], j["WGX"] * j["RN"]
        blocks = -(-M // bm) * -(-N // bn) * nb
        if blocks >= LM_SPLIT_BLOCKS:
            return [call]
        s = piecewise(lm_splits, blocks, K)   # a value of a traced plan, not a guard per range
        chunk = round_up(-(-K // s), j["BK"])
        s = -(-K // chunk)
        jit = call.jit + (("LM_SPLIT", 1),)
        partial = dict(kernel="gemm_lm", gws=call.gws[:2] + (nb * s,), lws=call.lws)
    else:
        return [call]
    tmp = Layout((s, nb, M, N), "f32")
    args = call.args + (("internal", 0),)
    dims = {**call.dims, len(call.args): tmp.shape}
    params = call.params + (s, chunk)
    return [KernelCall("gemm", partial["kernel"], jit, args, params, gws=partial["gws"],
                       lws=partial["lws"], dims=dims, internal=(tmp,)),
            KernelCall("gemm", "gemm_splitk_reduce", jit, args, params, gws=(nb * M * N,), dims=dims,
                       internal=(tmp,))]


# GEMV (GPUs): R = batch x M <= GEMV_MAX_ROWS rows times a B with no batch dims (a
# weight) run on cl/gemm.cl gemv (B [K, N]: work-groups of WX x KY work-items, 4 columns each,
# K in KY slices) or gemv_t (TRANS_B, B [N, K]: WK lanes along K per column, NC columns per
# work-group); U quads of K rows per work-item and step; the build computes R's bucket of rows
# (1, 2 or 4). A tile with a split target G splits K in S parts of at least GEMV_MIN_CHUNK rows
# until the grid has G work-groups (partial sums in an internal buffer [S, R, N], then
# gemm_splitk_reduce); G = 0: one kernel.
GEMV_DEVICES = ("gpu",)
GEMV_MAX_ROWS = 4
GEMV_MIN_CHUNK = 64
# Measured on the H100 (scripts/bench_gemv.py --sweep, 2026-11-24, the final sweep, in the call
# that measured cuBLAS beside it): kernel time from profiling events, the L2 flushed before each
# run ("cold") / the GPU idle between runs ("warm", what `dyncli bench --kernel` measures), us,
# and the weight's TB/s cold:
# - an empty kernel's event reads 6.7 us on an idle GPU, 3.1 us behind other work, and a split's
#   reduce kernel 4.9 us: no tile below splits K (the split's best, 128 columns split towards
#   264 work-groups: 1x3072x768 15.2 cold, 1x4096x4096 39.6, 1x4096x11008 77.4);
# - N < 8192: 32 columns, 64 slices (512 work-items), U 4; in brackets 32 columns x 32 slices /
#   128 columns with K split towards 264 work-groups: 1x2304x768 9.1 / 8.7 (9.6 / 16.2 split), 1x768x768 7.0 / 8.8 (7.9 / 11.6), 1x3072x768
#   9.9 / 9.5 (10.4 / 15.2), 1x768x3072 13.1 / 12.7 (17.6 / 16.6), 1x4096x4096 36.8 / 31.9 =
#   1.82 TB/s (42.0 / 39.6), 1x4096x11008 75.0 / 71.3 = 2.40 TB/s (89.3 / 77.4), 4x3072x768 11.4
#   (12.4 / 17.0), 4x4096x4096 41.6 (49.4 / 47.8); 16 columns x 64 slices: 0.2 us faster
#   (1x768x768) to 2.0 us slower (1x4096x11008);
# - N >= 8192 (LM heads, LLaMA MLP up): U 1, 256 work-items, the widest columns that give at
#   least 256 work-groups: 1x11008x4096 32 columns 72.8 / 65.9 = 2.48 TB/s (64: 77.9, U 4:
#   82.8), 1x32000x4096 64 columns 182.5 / 177.1 = 2.87 TB/s (128: 185.4, U 4: 190.9),
#   1x50257x768 128 columns 65.4 / 59.3 = 2.36 TB/s (64: 70.1, 32: 74.1);
# - gemv_t: 32 lanes x 8 columns, U 2, one kernel: t1x3072x768 9.1, t1x768x3072 12.4 (split
#   3 ways: 14.4), t1x4096x4096 36.2 (U 1: 39.0).
# - H200, GPT-2-small decode, summed kernel time by GEMV (scripts/decode_kernels.py --by-size,
#   two rounds alternating in one call, the stores spread over the work-group): weights of at
#   most GEMV_SMALL elements (GPT-2's 768x768 .. 768x3072) on 16 columns x 64 slices rather than
#   32 x 64: 0.850 -> 0.818 and 0.737 -> 0.724 ms a step (each of its GEMV shapes 2-7% faster).
# - H200, session 20 (--sweep --flush read: the L2 holds clean lines, as a decode step's
#   previous GEMV leaves it; cold us): below 8192 columns and above GEMV_SMALL, 16 columns x 64
#   slices with U 2 rather than 32 x 64 with U 4: 1x4096x4096 21.3 against 22.6, 4x4096x4096
#   25.1 against 27.1, 1x4096x11008 49.0 (32 x 64, U 2: 48.0) against 52.2; a small weight at
#   least twice as tall as wide on 128 slices: 1x768x3072 9.0 against 11.0.
GEMV_T_TILE = (32, 8, 2, 0)          # (WK, NC, U, G)
GEMV_SMALL = 1 << 22


def gemv_tile(N: int, K: int) -> tuple:
    """(WX, KY, U, G) of gemv for a weight [K, N] (the table above). KY >= GEMV_MAX_ROWS, a
    power of two: work-item y of slice 0 stores row y after the slices' tree reduction."""
    if N >= 8192:
        wx = next(w for w in (32, 16, 8) if N // (4 * w) >= 256)
        return (wx, 256 // wx, 1, 0)
    if N * K <= GEMV_SMALL:
        return (4, 128, 4, 0) if K >= 2 * N else (4, 64, 4, 0)
    return (4, 64, 2, 0)


def gemv_rows(R: int) -> int:
    """The rows a build computes for R rows: 1, 2 or 4 (3 computes a repeated 4th)."""
    return 1 if R == 1 else 2 if R == 2 else 4


def no_gemv(call: KernelCall, dev: str = "gpu") -> str:
    """Why a GEMM call takes no GEMV ('' when it does): a device kind outside GEMV_DEVICES,
    more than GEMV_MAX_ROWS rows, a B with batch dims."""
    M, N, K, nb = call.params
    if dev not in GEMV_DEVICES:
        return "device_kind"
    if M * nb > GEMV_MAX_ROWS:
        return "too_many_rows"
    return "batched_weight" if math.prod(call.dims[1][:-2]) != 1 else ""


def gemv(call: KernelCall, dev: str = "gpu") -> list[KernelCall] | None:
    """The GEMV kernels of a GEMM call of at most GEMV_MAX_ROWS rows whose B has no batch dims,
    on a `dev` kind device in GEMV_DEVICES; None otherwise."""
    if no_gemv(call, dev):
        return None
    M, N, K, nb = call.params
    base = tuple((k, v) for k, v in call.jit if k not in TILE_KEYS) + (("GV_ROWS", gemv_rows(M * nb)),)
    if dict(call.jit)["TRANS_B"]:
        wk, nc, u, target = GEMV_T_TILE
        kernel, lws, cols = "gemv_t", (wk, nc, 1), nc
        jit = base + (("GVT_WK", wk), ("GVT_NC", nc), ("GV_U", u))
    else:
        wx, ky, u, target = gemv_tile(N, K)
        kernel, lws, cols = "gemv", (wx, ky, 1), 4 * wx
        jit = base + (("GV_WX", wx), ("GV_KY", ky), ("GV_U", u))
    groups = -(-max(N, 1) // cols)
    s = max(1, min(-(-target // groups), K // GEMV_MIN_CHUNK))
    chunk = round_up(-(-max(K, 1) // s), 4)
    s = -(-max(K, 1) // chunk)
    gws, params = (groups * lws[0], lws[1], s), (M, N, K, nb, s, chunk)
    if s == 1:
        return [KernelCall("gemm", kernel, jit, call.args, params, gws=gws, lws=lws, dims=call.dims)]
    jit += (("GV_SPLIT", 1),)
    tmp = Layout((s, nb, M, N), "f32")
    args = call.args + (("internal", 0),)
    dims = {**call.dims, len(call.args): tmp.shape}
    return [KernelCall("gemm", kernel, jit, args, params, gws=gws, lws=lws, dims=dims, internal=(tmp,)),
            KernelCall("gemm", "gemm_splitk_reduce", jit, args, params, gws=(nb * M * N,), dims=dims,
                       internal=(tmp,))]


def gemm_kernels(call: KernelCall, dev: str = "gpu") -> list[KernelCall]:
    """The kernels of a GEMM call: the GEMV, else the call or its split-K."""
    return gemv(call, dev) or split_k(call, dev)


def matmul_call(node, ins, dev="gpu"):
    a2, b2, batch, _ = _mm_operands(ins[0].shape, ins[1].shape)
    call = gemm_call(node, a2, b2, batch, a2[-2], b2[-1], a2[-1], dev=dev)
    for i, l in enumerate(ins[:2]):
        # a padded operand (KV cache): the kernel walks batches with the buffer's dims; the
        # row pitch (last dim) must be the logical one
        if l.pad:
            if l.pad[-1] != l.shape[-1] or l.rank < 2:
                raise ShapeInferenceError(f"MatMul {node.name}: input {i} {l} is padded on its last dim")
            call.dims[i] = l.pad
    return call


def _matmul_kernels(node, ins, outs, deps, device="gpu"):
    return gemm_kernels(matmul_call(node, ins, device), device)


TILE_KEYS = ("TM", "TN", "FUSED_VW", "B_BLOCKED", "WGX", "WGY", "RM", "RN", "BK")


def static_gemm(call: KernelCall, b_const: bool, dev: str = "gpu") -> StaticVariant | None:
    """The static impl of a GEMM call, M, N, K as constants. A 2-D B (a fully-connected layer)
    flattens A's batch into rows; rows are fake-aligned to M_ALIGN so nearby row counts share
    one build (the real M is a runtime parameter; padded rows are never stored).
    GPUs: the dynamic call's gemm_lm with its tile. CPUs: gemm_rb; a constant B is reordered to
    [N/TN][K][TN] (update_weights); an activation B is read in place and needs N % TN == 0."""
    j = dict(call.jit)
    ta, tb = j["TRANS_A"], j["TRANS_B"]
    M, N, K, nb = call.params
    y_pos = call.args.index(("out", 0))      # a split GEMM's other outputs follow it
    a_dims, b_dims, y_dims = call.dims[0], call.dims[1], call.dims[y_pos]
    bias = call.dims.get(2) if j["HAS_BIAS"] else None
    if len(b_dims) == 2 and not ta and len(a_dims) > 2:
        M, nb = M * nb, 1
        a_dims, y_dims = (M, K), (M, N)
    # a bias with a row dim pins M (the table's Y dims walk it)
    m_al = round_up(M, M_ALIGN) if bias is None or len(bias) < 2 or bias[-2] == 1 else M
    dims = dict(call.dims)
    dims[0], dims[y_pos] = a_dims, y_dims
    table = dict(dims)
    table[0] = a_dims[:-2] + ((K, m_al) if ta else (m_al, K))
    table[y_pos] = y_dims[:-2] + (m_al, N)
    base = tuple((k, v) for k, v in call.jit if k not in TILE_KEYS)
    if dev != "cpu":
        wgx, wgy, rm, rn, bk = gpu_tile(M, N, nb, K)
        jit = base + (("WGX", wgx), ("WGY", wgy), ("RM", rm), ("RN", rn), ("BK", bk))
        new = KernelCall("gemm", "gemm_lm", jit, call.args, params=(M, N, K, nb),
                         gws=(-(-N // (wgx * rn)) * wgx, -(-M // (wgy * rm)) * wgy, max(nb, 1)),
                         lws=(wgx, wgy, 1), dims=dims)
        return StaticVariant(new, table, (m_al, N, K, nb),
                             f"M{m_al}xN{N}xK{K} lm{wgy * rm}x{wgx * rn}")
    tm, tile_n = cpu_tile(M, static=True)
    weights = None
    if b_const and len(b_dims) == 2:
        tn = tile_n if N >= 16 else 4      # zero-padded past N
        weights = WeightsLayout(f"gemm_b_blk{tn}", ((N + tn - 1) // tn, K, tn),
                                (("TN", tn), ("TRANS_B", tb)), (K, N), compatible=(N == tn and not tb))
    else:
        tn = next((t for t in (tile_n, 16, 8, 4) if N % t == 0), None)
        if tn is None:
            return None
    jit = base + (("TM", tm), ("TN", tn), ("FUSED_VW", min(tn, 16)), ("B_BLOCKED", int(weights is not None)))
    new = KernelCall("gemm", "gemm_rb", jit, call.args, params=(M, N, K, nb),
                     gws=((m_al + tm - 1) // tm, (N + tn - 1) // tn, max(nb, 1)), lws=None, dims=dims)
    return StaticVariant(new, table, (m_al, N, K, nb),
                         f"M{m_al}xN{N}xK{K} rb{tm}x{tn}" + (" blk" if weights else ""), weights)


def _gemm_static(tiled_call):
    def static(node, ins, outs, deps, consts, device="gpu"):
        return static_gemm(tiled_call(node, ins, device), 1 in consts, device)
    return static


def _check_f32(node, ins):
    if any(l.dtype != "f32" for l in ins):
        raise ShapeInferenceError(f"{node.op} supports float32 only")


# static_on (scripts/bench_impls.py: geometric mean of dynamic / static kernel time over the
# example models' shapes, > 1: static faster): PoCL CPU (2 shared cores, --repeat 15) MatMul
# 23.9 (2.8..70.9), Gemm 25.5; NVIDIA H200 (--repeat 50 --large) MatMul 0.41 (0.27..1.12), Gemm
# 0.52: the register-blocked static GEMM loses to the dynamic tiled kernel there. The
# register-tiled GEMMs (scripts/bench_gemm.py --impl both, dynamic / static us): PoCL CPU
# (gemm_rb 8x16; static reorders B) 128x384x384 228 / 137, 128x1536x384 1114 / 723,
# 128x384x1536 1132 / 748, 32x1536x384 312 / 229, 12x128x32x128 92 / 81: static still wins;
# H100 (gemm_lm, same tile) 4096^3 3041 / 3117, 2048x1536x384 64 / 67, 512x3072x768 83 / 85,
# and the static build has no split-K (8x768x3072 23 / 113): GPUs keep the dynamic GEMM.
@register("MatMul", checked=13, kernels=_matmul_kernels, static=_gemm_static(matmul_call), weights=1,
          padded_ok=True, per_device=True, static_on=frozenset({"cpu"}), fusion_producer=True)
def _matmul(node, ins, deps):
    _check_f32(node, ins)
    return [Layout(_mm_operands(ins[0].shape, ins[1].shape)[3], "f32")]


def _split_call(node, ins, dev="gpu"):
    """gemm_split (engine/packed_projections.py): x [.., M, K] times the packed weight [K, N]
    plus the packed bias [N], the N columns written to `parts` outputs of N / parts columns
    each (cl/gemm.cl SPLIT_N; Y's shape_info dims are the packed [.., M, N]). Never a GEMV or
    split-K: their kernels store one output."""
    a2, b2, batch, _ = _mm_operands(ins[0].shape, ins[1].shape)
    c = gemm_call(node, a2, b2, batch, a2[-2], b2[-1], a2[-1], bias=ins[2].shape, dev=dev)
    parts = node.attrs["parts"]
    return KernelCall(c.source, c.kernel, c.jit + (("SPLIT_N", parts),),
                      c.args + tuple(("out", k) for k in range(1, parts)), c.params, c.gws, c.lws,
                      c.dims, c.internal)


def _split_kernels(node, ins, outs, deps, device="gpu"):
    return [_split_call(node, ins, device)]


# static_on: MatMul's figures (the same kernels)
@register("gemm_split", kernels=_split_kernels, static=_gemm_static(_split_call), weights=1, internal=True,
          per_device=True, static_on=frozenset({"cpu"}))
def _gemm_split(node, ins, deps):
    _check_f32(node, ins)
    parts = node.attrs["parts"]
    out = _mm_operands(ins[0].shape, ins[1].shape)[3]
    if out[-1] % parts:
        raise ShapeInferenceError(f"{node.name}: {out[-1]} columns do not split in {parts}")
    return [Layout(out[:-1] + (out[-1] // parts,), "f32") for _ in range(parts)]


def _gemm_dims(node, ins):
    a, b = ins[0].shape, ins[1].shape
    ta, tb = node.attrs.get("transA", 0), node.attrs.get("transB", 0)
    M, K = (a[1], a[0]) if ta else (a[0], a[1])
    Kb, N = (b[1], b[0]) if tb else (b[0], b[1])
    if K != Kb:
        raise ShapeInferenceError(f"Gemm inner dims differ: {ins[0]} x {ins[1]}")
    return M, N, K, ta, tb


def _gemm_call(node, ins, dev="gpu"):
    M, N, K, ta, tb = _gemm_dims(node, ins)
    bias = ins[2].shape if len(ins) > 2 else None
    return gemm_call(node, ins[0].shape, ins[1].shape, (), M, N, K, ta, tb,
                     node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0), bias, dev)


def _gemm_kernels(node, ins, outs, deps, device="gpu"):
    return gemm_kernels(_gemm_call(node, ins, device), device)


@register("Gemm", checked=13, kernels=_gemm_kernels, static=_gemm_static(_gemm_call), weights=1, per_device=True,
          static_on=frozenset({"cpu"}), fusion_producer=True)   # static_on: MatMul's figures
def _gemm(node, ins, deps):
    _check_f32(node, ins)
    M, N, K, _, _ = _gemm_dims(node, ins)
    if len(ins) > 2:
        broadcast(ins[2].shape, (M, N))
    return [Layout((M, N), "f32")]
