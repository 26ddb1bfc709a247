"""Attention as one kernel (program-level fusion, after the Softmax prologues).

    MatMul(q, Transpose(k)) -> [scale, mask: the Softmax's prologue] -> Softmax(axis -1)
    -> MatMul(probs, v)

becomes one internal `attention` node (engine/ops/attention.py, cl/attention.cl) reading q, k, v
and the prologue's operands: the scores and probabilities are never written to global memory.
The Transpose of k (perm [0, 1, 3, 2], or [0, 2, 1] for rank 3) is absorbed when the MatMul is its only reader (the
kernel reads k with the strides of its layout; a padded KV-cache layout too). The replaced
nodes keep `fused_into` = the attention node and run as its unfused subgraph (the Softmax with
its own prologue) for shapes the kernel does not take: key sequence longer than what fits
(`seq_too_long`), head size too large, ranks other than 3 or 4 ([b, s, d] is one head), or a
prologue broadcast that grows the scores.
"""
from __future__ import annotations

from engine.fusion import FusedOp, Fusion, fusion_valid
from engine.layout import Layout
from engine.program import Node, _link


def fuse_attention(prog) -> int:
    """Mark attention chains on `prog` (a new internal node per chain); returns the number of
    nodes fused away."""
    found = []
    for sm in prog.nodes:
        chain = _match(prog, sm)
        if chain:
            found.append(chain)
    for tr, mm, sm, mm2 in found:
        f = sm.fusion
        k = tr.inputs[0] if tr is not None else mm.inputs[1]
        extra = list(f.extra) if f is not None else []
        name = f"{sm.name}_attention"
        node = Node(name, "attention", [mm.inputs[0], k, mm2.inputs[1]] + extra,
                    [mm2.outputs[0]], {"k_transposed": int(tr is not None), "prologue": f,
                                       "axis": int(sm.attrs.get("axis", -1 if sm.opset >= 13 else 1))},
                    mm2.proto, mm2.opset)
        replaced = [n for n in (tr, mm, sm, mm2) if n is not None]
        node.fusion = Fusion(ops=[FusedOp(n, "", []) for n in replaced], out=mm2.outputs[0],
                             subgraph=True, check=lambda own, n=node: check(n, own))
        for n in replaced:
            n.fused_into = node
        prog.nodes.insert(prog.nodes.index(mm2) + 1, node)
    if found:
        _link(prog)
    return sum(3 if tr is None else 4 for tr, _, _, _ in found)


def _only_user(prog, name: str, user) -> bool:
    return name not in prog.outputs and [id(u) for u in prog.users.get(name, [])] == [id(user)]


def _match(prog, sm):
    """(Transpose of k or None, scores MatMul, Softmax, context MatMul) or None."""
    if sm.op != "Softmax" or sm.host or sm.fused_into is not None:
        return None
    if int(sm.attrs.get("axis", -1 if sm.opset >= 13 else 1)) not in (-1, 2, 3):
        return None                      # the last axis: checked against the rank at run time
    f = sm.fusion
    base = f.base if f is not None else sm.inputs[0]
    first = f.ops[0].node if f is not None else sm
    src = prog.producers.get(base)
    mm = src[0] if src else None
    if mm is None or mm.op != "MatMul" or mm.host or mm.fused_into is not None or \
            mm.fusion is not None or not _only_user(prog, base, first):
        return None
    probs = sm.outputs[0]
    users = prog.users.get(probs, [])
    mm2 = users[0] if len(users) == 1 else None
    if mm2 is None or mm2.op != "MatMul" or mm2.host or mm2.fused_into is not None or \
            mm2.fusion is not None or probs in prog.outputs or mm2.inputs[0] != probs or \
            mm2.inputs[1] == probs:
        return None
    src = prog.producers.get(mm.inputs[1])
    tr = src[0] if src else None
    if tr is None or tr.op != "Transpose" or tr.host or tr.fused_into is not None or \
            list(tr.attrs.get("perm", [])) not in ([0, 1, 3, 2], [0, 2, 1]) or \
            not _only_user(prog, mm.inputs[1], mm):
        tr = None                        # k^T is read as it is
    return tr, mm, sm, mm2


def check(node, own) -> str:
    """Why the attention kernel cannot run these shapes ('' when it can)."""
    from engine.ops.attention import MAX_D, MAX_L, geometry
    if any(l is None or l.dtype != "f32" for l in own):
        return "dtype"
    rank = own[0].rank
    if rank not in (3, 4) or any(l.rank != rank for l in own[1:3]):
        return "rank"
    if node.attrs["axis"] not in (-1, rank - 1):
        return "softmax_axis"            # not over the keys
    g = geometry(node, own)
    if g["L"] == 0:
        return "empty_keys"
    if g["L"] > MAX_L:
        return "seq_too_long"
    if g["Dk"] > MAX_D or g["Dv"] > MAX_D:
        return "head_too_large"
    if g["out_bh"] != g["bh"]:
        return "broadcast_grows_scores"   # v's batch beyond the scores': rows would repeat
    f = node.attrs["prologue"]
    if f is not None:
        scores = Layout(g["scores"], "f32")
        return fusion_valid(f, scores, dict(zip(f.extra, own[3:])))
    return ""
