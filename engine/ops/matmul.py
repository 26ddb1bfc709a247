"""MatMul (batched, broadcasting, 1-D operands) and Gemm, on one tiled kernel (cl/gemm.cl)."""
from __future__ import annotations

import numpy as np

from engine.kernels import KernelCall, round_up
from engine.layout import Layout
from engine.ops import register
from engine.ops.common import ShapeInferenceError, broadcast

TS = 16


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


def _matmul_kernels(node, ins, outs, deps):
    a2, b2, batch, _ = _mm_operands(ins[0].shape, ins[1].shape)
    call = gemm_call(node, a2, b2, batch, a2[-2], b2[-1], a2[-1])
    for i, l in enumerate(ins[:2]):
        # a padded operand (KV cache): the kernel walks batches with the buffer's dims; the
        # row pitch (last dim) must be the logical one
        if l.pad:
            if l.pad[-1] != l.shape[-1] or l.rank < 2:
                raise ShapeInferenceError(f"MatMul {node.name}: input {i} {l} is padded on its last dim")
            call.dims[i] = l.pad
    return [call]


def _check_f32(node, ins):
    if any(l.dtype != "f32" for l in ins):
        raise ShapeInferenceError(f"{node.op} supports float32 only")


@register("MatMul", kernels=_matmul_kernels, padded_ok=True)
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


def _gemm_kernels(node, ins, outs, deps):
    M, N, K, ta, tb = _gemm_dims(node, ins)
    bias = ins[2].shape if len(ins) > 2 else None
    return [gemm_call(node, ins[0].shape, ins[1].shape, (), M, N, K, ta, tb,
                      node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0), bias)]


@register("Gemm", kernels=_gemm_kernels)
def _gemm(node, ins, deps):
    _check_f32(node, ins)
    M, N, K, _, _ = _gemm_dims(node, ins)
    if len(ins) > 2:
        broadcast(ins[2].shape, (M, N))
    return [Layout((M, N), "f32")]
