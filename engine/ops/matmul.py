"""MatMul (batched, broadcasting, 1-D operands) and Gemm, on one tiled kernel (cl/gemm.cl), or
split-K for few rows and a long K, and a register-blocked static variant."""
from __future__ import annotations

import numpy as np

from engine.kernels import KernelCall, StaticVariant, WeightsLayout, round_up
from engine.layout import Layout
from engine.ops import register
from engine.ops.common import ShapeInferenceError, broadcast

TS = 16
M_ALIGN = 8     # fake alignment of static GEMM rows (the GPU plugin's fully_connected does 8/16)


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


def gemm_call(node, a2, b2, batch, M, N, K, trans_a=0, trans_b=0, alpha=1.0, beta=1.0, bias=None):
    nb = int(np.prod(batch)) if batch else 1
    y_dims = tuple(batch) + (M, N)
    jit = (("TRANS_A", trans_a), ("TRANS_B", trans_b), ("HAS_BIAS", int(bias is not None)),
           ("ALPHA", f"{float(alpha)!r}f"), ("BETA", f"{float(beta)!r}f"), ("TS", TS),
           ("IMPL_TAG", node.op))
    args = (("in", 0), ("in", 1)) + ((("in", 2),) if bias is not None else ()) + (("out", 0),)
    dims = {0: a2, 1: b2, len(args) - 1: y_dims}
    if bias is not None:
        dims[2] = bias
    return KernelCall("gemm", "gemm_tiled", jit, args, params=(M, N, K, nb),
                      gws=(round_up(max(N, 1), TS), round_up(max(M, 1), TS), max(nb, 1)),
                      lws=(TS, TS, 1), dims=dims)


SPLITK_MAX_ROWS, SPLITK_MIN_K, SPLITK_CHUNK, SPLITK_MAX = 4, 512, 256, 16


def split_k(call: KernelCall) -> list[KernelCall]:
    """The tiled GEMM call, or for few rows and a long K the split-K pair (cl/gemm.cl) with its
    partial sums in an internal buffer [S, batch, M, N] (S splits of about SPLITK_CHUNK)."""
    M, N, K, nb = call.params
    if M > SPLITK_MAX_ROWS or K < SPLITK_MIN_K:
        return [call]
    s = min(SPLITK_MAX, K // SPLITK_CHUNK)
    tmp = Layout((s, nb, M, N), "f32")
    args = call.args + (("internal", 0),)
    dims = {**call.dims, len(call.args): tmp.shape}
    params, jit = call.params + (s,), call.jit
    return [KernelCall("gemm", "gemm_splitk_partial", jit, args, params, gws=(round_up(N, 64), M, nb * s),
                       lws=(64, 1, 1), dims=dims, internal=(tmp,)),
            KernelCall("gemm", "gemm_splitk_reduce", jit, args, params, gws=(nb * M * N,), dims=dims,
                       internal=(tmp,))]


def _matmul_call(node, ins):
    a2, b2, batch, _ = _mm_operands(ins[0].shape, ins[1].shape)
    call = gemm_call(node, a2, b2, batch, a2[-2], b2[-1], a2[-1])
    for i, l in enumerate(ins[:2]):
        # a padded operand (KV cache): the kernel walks batches with the buffer's dims; the
        # row pitch (last dim) must be the logical one
        if l.pad:
            if l.pad[-1] != l.shape[-1] or l.rank < 2:
                raise ShapeInferenceError(f"MatMul {node.name}: input {i} {l} is padded on its last dim")
            call.dims[i] = l.pad
    return call


def _matmul_kernels(node, ins, outs, deps):
    return split_k(_matmul_call(node, ins))


def static_gemm(call: KernelCall, b_const: bool) -> StaticVariant | None:
    """The static impl of a GEMM call: register-blocked (cl/gemm.cl gemm_rb) with M, N, K as
    constants. A 2-D B (a fully-connected layer) flattens A's batch into rows; rows are
    fake-aligned to M_ALIGN so nearby row counts share one build (the real M is a runtime
    parameter; padded rows are never stored). A constant B is reordered to [N/TN][K][TN]
    (update_weights); an activation B is read in place and needs N % TN == 0."""
    j = dict(call.jit)
    ta, tb = j["TRANS_A"], j["TRANS_B"]
    M, N, K, nb = call.params
    y_pos = len(call.args) - 1
    a_dims, b_dims, y_dims = call.dims[0], call.dims[1], call.dims[y_pos]
    bias = call.dims.get(2) if j["HAS_BIAS"] else None
    if len(b_dims) == 2 and not ta and len(a_dims) > 2:
        M, nb = M * nb, 1
        a_dims, y_dims = (M, K), (M, N)
    # a bias with a row dim pins M (the table's Y dims walk it)
    m_al = round_up(M, M_ALIGN) if bias is None or len(bias) < 2 or bias[-2] == 1 else M
    tm = 4 if m_al <= 32 else 8
    weights = None
    if b_const and len(b_dims) == 2:
        tn = 8 if N >= 8 else 4
        weights = WeightsLayout(f"gemm_b_blk{tn}", ((N + tn - 1) // tn, K, tn),
                                (("TN", tn), ("TRANS_B", tb)), (K, N), compatible=(N == tn and not tb))
    else:
        tn = next((t for t in (8, 4) if N % t == 0), None)
        if tn is None:
            return None
    dims = dict(call.dims)
    dims[0], dims[y_pos] = a_dims, y_dims
    table = dict(dims)
    table[0] = a_dims[:-2] + ((K, m_al) if ta else (m_al, K))
    table[y_pos] = y_dims[:-2] + (m_al, N)
    jit = call.jit + (("TM", tm), ("TN", tn), ("B_BLOCKED", int(weights is not None)))
    new = KernelCall("gemm", "gemm_rb", jit, call.args, params=(M, N, K, nb),
                     gws=((N + tn - 1) // tn, (m_al + tm - 1) // tm, max(nb, 1)), lws=None, dims=dims)
    return StaticVariant(new, table, (m_al, N, K, nb),
                         f"M{m_al}xN{N}xK{K} rb{tm}x{tn}" + (" blk" if weights else ""), weights)


def _gemm_static(tiled_call):
    def static(node, ins, outs, deps, consts):
        return static_gemm(tiled_call(node, ins), 1 in consts)
    return static


def _check_f32(node, ins):
    if any(l.dtype != "f32" for l in ins):
        raise ShapeInferenceError(f"{node.op} supports float32 only")


@register("MatMul", kernels=_matmul_kernels, static=_gemm_static(_matmul_call), weights=1,
          padded_ok=True)
def _matmul(node, ins, deps):
    _check_f32(node, ins)
    return [Layout(_mm_operands(ins[0].shape, ins[1].shape)[3], "f32")]


def _gemm_dims(node, ins):
    a, b = ins[0].shape, ins[1].shape
    ta, tb = node.attrs.get("transA", 0), node.attrs.get("transB", 0)
    M, K = (a[1], a[0]) if ta else (a[0], a[1])
    Kb, N = (b[1], b[0]) if tb else (b[0], b[1])
    if K != Kb:
        raise ShapeInferenceError(f"Gemm inner dims differ: {ins[0]} x {ins[1]}")
    return M, N, K, ta, tb


def _gemm_call(node, ins):
    M, N, K, ta, tb = _gemm_dims(node, ins)
    bias = ins[2].shape if len(ins) > 2 else None
    return gemm_call(node, ins[0].shape, ins[1].shape, (), M, N, K, ta, tb,
                     node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0), bias)


def _gemm_kernels(node, ins, outs, deps):
    return split_k(_gemm_call(node, ins))


@register("Gemm", kernels=_gemm_kernels, static=_gemm_static(_gemm_call), weights=1)
def _gemm(node, ins, deps):
    _check_f32(node, ins)
    M, N, K, _, _ = _gemm_dims(node, ins)
    if len(ins) > 2:
        broadcast(ins[2].shape, (M, N))
    return [Layout((M, N), "f32")]
