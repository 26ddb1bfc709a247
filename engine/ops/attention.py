"""`attention`: softmax(prologue(q @ k^T)) @ v in one kernel (cl/attention.cl), made only by the
program's attention fusion (engine/attention_fusion.py), never accepted from a model.

Inputs: the tensors q, k^T and v are read from, each viewed through the perm of the Transposes
the fusion absorbed (attr `perms`, None: as it is), giving q [b, h, s, dk], k^T [b, h, dk, l],
v [b, h, l, dv] (or all rank 3, [b, s, d]: one head); then the Softmax prologue's operands
(scale, mask), broadcast against the scores [b, h, s, l] as the unfused nodes would. The output
is [b, h, s, dv], or its transpose by `out_perm` (e.g. the heads merge). Batch dims of size 1
broadcast (stride 0). Every operand is read with the strides of its buffer (Layout.phys), so a
KV-cache buffer with room along its sequence axis is read in place (padded_ok).
"""
from __future__ import annotations

from functools import lru_cache

from engine.fused_ops import fused_jit
from engine.kernels import KernelCall
from engine.layout import Layout
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError, broadcast, contiguous_strides
from engine.symbolic import piecewise, tracing

# What fits: the key row of scores lives in private (CPU) or local (GPU) memory, the query row
# in local memory. Longer keys run the unfused subgraph (engine/attention_fusion.py: seq_too_long).
MAX_L = 512
MAX_D = 256
# GPU: one work-group of ATT_WG lanes per block of query rows of one (b, h); at most ATT_ROWS
# rows per block (k and v are read once per block). H100, kernel us (scripts/bench_attention.py,
# 12 heads, head dims 64 / 32), work-group 64 -> 256 lanes: decode s 1 l 128 21.1 -> 16.3
# / 15.7 -> 12.9, s 1 l 512 55.2 -> 33.6 / 32.7 -> 22.0; encoder s 128 (8 rows) 39.5 -> 27.7 /
# 24.0 -> 18.1. Rows per block by s (query_rows): s 8 one row 15.8 (8 rows 22.0), s 32 two
# 14.4 (eight 16.6), s 128 eight 27.7 (one 78.9).
ATT_WG = 256
ATT_ROWS = 8
# GPU, one query row per work-group (s <= 16; decode steps, s <= DEC_ROWS): attention_dec, a kernel built for
# the row's latency (float4 loads, no per-row arrays). False: attention_wg with one row. H200,
# kernel us (scripts/bench_attention.py, 12 heads, head dims 64 / 32), attention_wg 256 lanes ->
# attention_dec: s 1 l 128 15.2 -> 10.4 / 13.5 -> 10.2, s 1 l 512 32.5 -> 15.5 / 21.2 -> 12.1,
# s 8 l 128 15.7 -> 10.8; GPT-2-small decode, 64 tokens (scripts/decode_kernels.py): attention
# 0.212 -> 0.136 ms a step. Up to DEC_ROWS query rows only (a decode step, a short chunk): a
# node that changes kernels between two inferences runs its flow there (a steady step and a
# compiled plan keep the kernels bound), so a BERT over random lengths in 8..128 that took
# attention_dec up to 16 rows ran two flows (to it and back) for each of its 7% short lengths;
# attention_wg with one row costs 5 us more there (s 8 l 128, above).
DEC_KERNEL = True
DEC_ROWS = 4


def query_rows(s: int) -> int:
    """GPU query rows per work-group: a power of two near s / 16, 1 to ATT_ROWS (the figures
    above: few rows leave lanes idle on long keys; many rows on a short query waste the block)."""
    r = 1
    while r < ATT_ROWS and r * 16 < s:
        r *= 2
    return r


def _view(l: Layout, perm) -> tuple[tuple, tuple]:
    """(dims, element strides) of an operand as the chain sees it: `l` through `perm`; rank 3
    gets a head dim of 1; a batch dim of 1 gets stride 0 (broadcast)."""
    st = contiguous_strides(l.phys)
    p = perm if perm is not None else range(l.rank)
    dims, strides = [l.shape[i] for i in p], [st[i] for i in p]
    if l.rank == 3:
        dims.insert(1, 1)
        strides.insert(1, 0)
    strides = [0 if i < 2 and dims[i] == 1 else s for i, s in enumerate(strides)]
    return tuple(dims), tuple(strides)


def ranks_ok(node, ins) -> bool:
    rank = ins[0].rank
    return rank in (3, 4) and all(
        l.rank == rank and (p is None or len(p) == rank) for l, p in zip(ins[:3], node.attrs["perms"])) \
        and (node.attrs["out_perm"] is None or len(node.attrs["out_perm"]) == rank)


def geometry(node, ins) -> dict:
    """The chain's dims and strides for these operands (read-only: shared between callers).
    Shape inference, the fusion check and the kernel calls each ask for the same shapes in
    turn, and a decode step asks for new ones every token: the last few are kept."""
    f = _geometry.__wrapped__ if tracing() else _geometry    # a traced dim has no hash
    return f(node.name, node.attrs["perms"], node.attrs["out_perm"], *ins[:3])


@lru_cache(maxsize=64)
def _geometry(name, perms, out_perm, *ins) -> dict:
    (q, qs), (kt, kts), (v, vs) = (_view(l, p) for l, p in zip(ins, perms))
    if kt[2] != q[3] or v[2] != kt[3]:
        raise ShapeInferenceError(f"attention {name}: q {q}, k^T {kt}, v {v} do not chain")
    bh = broadcast(q[:2], kt[:2])
    rank = ins[0].rank
    y = broadcast(bh, v[:2]) + (q[2], v[3])
    y = y if rank == 4 else y[:1] + y[2:]
    op = out_perm
    out = tuple(y[i] for i in op) if op is not None else y
    # strides of y's (b, h, s, d) in the output buffer
    ost = contiguous_strides(out)
    yst = [ost[op.index(i)] for i in range(rank)] if op is not None else ost
    if rank == 3:
        yst.insert(1, 0)
    return {"bh": bh, "out_bh": broadcast(bh, v[:2]), "S": q[2], "L": kt[3], "Dk": q[3],
            "Dv": v[3], "out": out,
            # the scores as the unfused MatMul makes them (the prologue broadcasts against them)
            "scores": (bh if rank == 4 else bh[:1]) + (q[2], kt[3]),
            # (b, h, s|l, d) strides of q, k (from k^T's), v and y
            "strides": qs + (kts[0], kts[1], kts[3], kts[2]) + vs + tuple(yst)}


def _appended(node, ins, g) -> tuple:
    """KV append (engine/load_passes.kv_into_attention): the keys from P on are the new
    tensors (the last two inputs, in the caches' dim order): (P, their (b, h, l, d) strides)."""
    perms = node.attrs["perms"]
    _, kns = _view(ins[-2], perms[1])                 # k^T's view: (b, h, d, l)
    vn, vns = _view(ins[-1], perms[2])
    return (g["L"] - vn[2],) + (kns[0], kns[1], kns[3], kns[2]) + vns


def _kernels(node, ins, outs, deps, device="cpu", kv_append=False):
    g = geometry(node, ins)
    b, h = g["bh"]
    rows = b * h * g["S"]
    per = piecewise(query_rows, g["S"])     # a value of the traced function, not a guard per range
    st = g["strides"]
    params = st[:12] + (b, h, g["S"], g["L"], g["Dk"], g["Dv"], per) + st[12:]
    jit = (("MAX_L", MAX_L), ("MAX_D", MAX_D), ("IMPL_TAG", "attention"))
    if node.attrs.get("scale") is not None:      # q and k's scalar factors (torch.export's sdpa)
        jit += (("ATT_SCALE", f"{node.attrs['scale']!r}f"),)
    if node.attrs.get("nan_guard"):
        jit += (("NAN_GUARD", 1),)
    # tensor 4: the scores' dims only (q's buffer again, never read): the prologue's
    # broadcast reference
    args = (("in", 0), ("in", 1), ("in", 2), ("out", 0), ("in", 0))
    f = node.attrs["prologue"]
    if f is not None:
        jit += fused_jit(f, 4, len(args))
        args += tuple(("in", 3 + j) for j in range(len(f.extra)))
    if kv_append:      # the new keys and values: read from there, written into the caches
        jit += (("KV_APPEND", 1), ("KN_T", len(args)), ("VN_T", len(args) + 1))
        args += (("in", len(ins) - 2), ("in", len(ins) - 1))
        params += _appended(node, ins, g)
    dims = {4: g["scores"]}
    if device == "gpu":
        # one program holds both GPU kernels: a first query longer than DEC_ROWS after shorter
        # ones (or the reverse) finds its kernel built (a build of its own cost 0.55 s in the
        # inference on the H200)
        jit += (("ATTENTION_WG", ATT_WG), ("ATT_ROWS", ATT_ROWS), ("ATTENTION_DEC", 1),
                ("ATT_DEC_WG", ATT_WG), ("LANES_REDUCE", 1))
        if g["S"] <= DEC_ROWS and DEC_KERNEL:
            return [KernelCall("attention", "attention_dec", jit, args, params,
                               gws=(max(rows, 1) * ATT_WG,), lws=(ATT_WG,), dims=dims)]
        groups = b * h * ((g["S"] + per - 1) // per)
        return [KernelCall("attention", "attention_wg", jit, args, params,
                           gws=(max(groups, 1) * ATT_WG,), lws=(ATT_WG,), dims=dims)]
    return [KernelCall("attention", "attention_row", jit + (("ATTENTION_ROW", 1),), args, params,
                       gws=(max(rows, 1),), dims=dims)]


@register("attention", kernels=_kernels, internal=True, padded_ok=True, per_device=True)
def _attention(node, ins, deps):
    if not ranks_ok(node, ins):
        # unfused for these shapes (engine/attention_fusion.py): its nodes infer their own layouts
        return [Layout(ins[0].shape, "f32")]
    return [Layout(geometry(node, ins)["out"], "f32")]
