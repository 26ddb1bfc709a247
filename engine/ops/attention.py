"""`attention`: softmax(prologue(q @ k^T)) @ v in one kernel (cl/attention.cl), made only by the
program's attention fusion (engine/attention.py), never accepted from a model.

Inputs: q [b, h, s, dk], k ([b, h, l, dk] when the Transpose was absorbed, attr k_transposed=1;
else k^T [b, h, dk, l]), v [b, h, l, dv] (or all rank 3, [b, s, d]: one head), then the Softmax prologue's operands (scale, mask),
broadcast against the scores [b, h, s, l] as the unfused nodes would. Batch dims of size 1
broadcast (stride 0). Every operand is read with the strides of its buffer (Layout.phys), so a
KV-cache buffer with room along its sequence axis is read in place (padded_ok).
"""
from __future__ import annotations

from engine.fusion import fused_jit
from engine.kernels import KernelCall
from engine.layout import Layout
from engine.ops import register
from engine.ops.common import ShapeInferenceError, broadcast, contiguous_strides

# What fits: the key row of scores lives in private (CPU) or local (GPU) memory, the query row
# in local memory. Longer keys run the unfused subgraph (engine/attention.py: seq_too_long).
MAX_L = 512
MAX_D = 256
ATT_WG = 64     # GPU: one work-group per block of query rows of one (b, h)
ATT_ROWS = 8    # GPU: query rows per work-group at most (k and v are read once per block)


def _as4(l: Layout) -> Layout:
    """A rank-3 operand [b, s, d] is one head: [b, 1, s, d]."""
    if l.rank == 4:
        return l
    ins = lambda d: (d[0], 1) + tuple(d[1:])   # noqa: E731
    return Layout(ins(l.shape), l.dtype, pad=ins(l.pad) if l.pad else None)


def geometry(node, ins) -> dict:
    q, k, v = (_as4(l) for l in ins[:3])
    kt = node.attrs["k_transposed"]
    dk2, l = (k.shape[3], k.shape[2]) if kt else (k.shape[2], k.shape[3])
    if dk2 != q.shape[3] or v.shape[2] != l:
        raise ShapeInferenceError(f"attention {node.name}: q {q}, k {k}, v {v} do not chain")
    bh = broadcast(q.shape[:2], k.shape[:2])
    out_bh = broadcast(bh, v.shape[:2])
    return {"bh": bh, "out_bh": out_bh, "S": q.shape[2], "L": l, "Dk": q.shape[3],
            "Dv": v.shape[3],
            # the scores as the unfused MatMul makes them (the prologue broadcasts against them)
            "scores": (bh if ins[0].rank == 4 else bh[:1]) + (q.shape[2], l)}


def _strides(l: Layout, seq: int, d: int) -> tuple:
    """(b, h, seq, d) element strides of a rank-4 operand; 0 along a broadcast batch dim."""
    st = contiguous_strides(l.phys)
    return (st[0] if l.shape[0] != 1 else 0, st[1] if l.shape[1] != 1 else 0, st[seq], st[d])


def _kernels(node, ins, outs, deps, device="cpu"):
    g = geometry(node, ins)
    q, k, v = (_as4(l) for l in ins[:3])
    kt = node.attrs["k_transposed"]
    b, h = g["bh"]
    rows = b * h * g["S"]
    per = min(ATT_ROWS, 1 << max(g["S"] - 1, 0).bit_length())   # a power of two, not past S
    params = _strides(q, 2, 3) + _strides(k, 2 if kt else 3, 3 if kt else 2) + _strides(v, 2, 3) + \
        (b, h, g["S"], g["L"], g["Dk"], g["Dv"], per)
    jit = (("MAX_L", MAX_L), ("MAX_D", MAX_D), ("IMPL_TAG", "attention"))
    # tensor 4: the scores' dims only (q's buffer again, never read): the prologue's
    # broadcast reference
    args = (("in", 0), ("in", 1), ("in", 2), ("out", 0), ("in", 0))
    f = node.attrs["prologue"]
    if f is not None:
        jit += fused_jit(f, 4, len(args))
        args += tuple(("in", 3 + j) for j in range(len(f.extra)))
    dims = {4: g["scores"]}
    if device == "gpu":
        groups = b * h * ((g["S"] + per - 1) // per)
        return [KernelCall("attention", "attention_wg",
                           jit + (("ATTENTION_WG", ATT_WG), ("ATT_ROWS", ATT_ROWS)), args, params,
                           gws=(max(groups, 1) * ATT_WG,), lws=(ATT_WG,), dims=dims)]
    return [KernelCall("attention", "attention_row", jit + (("ATTENTION_ROW", 1),), args, params,
                       gws=(max(rows, 1),), dims=dims)]


@register("attention", kernels=_kernels, internal=True, padded_ok=True, per_device=True)
def _attention(node, ins, deps):
    rank = ins[0].rank
    if rank not in (3, 4) or any(l.rank != rank for l in ins[1:3]):
        # unfused for these shapes (engine/attention.py): its nodes infer their own layouts
        return [Layout(ins[0].shape[:-1] + ins[2].shape[-1:], "f32")]
    g = geometry(node, ins)
    bh = g["out_bh"] if rank == 4 else g["out_bh"][:1]
    return [Layout(bh + (g["S"], g["Dv"]), "f32")]
