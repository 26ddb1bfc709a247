"""Attention as one kernel (program-level fusion, after the Softmax prologues).

    MatMul([q * c1], [Transpose(k) * c2]) -> [scale, mask: the Softmax's prologue]
    -> Softmax(axis -1) [-> Where(IsNaN(p), 0, p)] -> MatMul(probs, v) [-> Transpose]

becomes one internal `attention` node (engine/ops/attention.py, cl/attention.cl) reading q, k, v
and the prologue's operands: the scores and probabilities are never written to global memory.
Transposes feeding q, k^T and v (the heads split [0, 2, 1, 3], k's [0, 1, 3, 2]) and the one
after the context (the heads merge) are absorbed when nothing else reads their outputs: the
kernel reads and writes with the strides they imply (and with a padded KV-cache layout's).
torch.export writes scaled_dot_product_attention so: q and k^T each multiplied by sqrt(scale)
(scalar constants, folded into one factor applied to the dot products: attr `scale`), and the
probabilities guarded against rows whose every score is -inf (attr `nan_guard`: such a row's
context is 0, as the Where makes it; a NaN or +inf score too). The replaced nodes keep
`fused_into` = the attention node and run as its unfused subgraph (the Softmax with its own
prologue) for shapes the kernel does not take: key sequence longer than what fits
(`seq_too_long`), head size too large, ranks other than 3 or 4 ([b, s, d] is one head), a
Softmax not over the keys, or a prologue broadcast that grows the scores.
"""
from __future__ import annotations

from engine.fused_ops import FusedOp, Fusion, fusion_valid
from engine.graph import Node, link
from engine.layout import Layout
from engine.ops.attention import MAX_D, MAX_L, geometry, ranks_ok


def fuse_attention(prog) -> int:
    """Mark attention chains on `prog` (a new internal node per chain); returns the number of
    nodes fused away."""
    found = [m for m in (_match(prog, sm) for sm in prog.nodes) if m]
    for m in found:
        f = m["softmax"].fusion
        extra = list(f.extra) if f is not None else []
        last = max(m["nodes"], key=lambda n: n.index)
        node = Node(f"{m['softmax'].name}_attention", "attention", m["sources"] + extra, [m["out"]],
                    {"perms": m["perms"], "out_perm": m["out_perm"], "prologue": f,
                     "axis": _axis(m["softmax"]), "scale": m["scale"], "nan_guard": m["nan_guard"]},
                    last.proto, last.opset)
        replaced = sorted(m["nodes"], key=lambda n: n.index)   # the unfused subgraph's order
        node.fusion = Fusion(ops=[FusedOp(n, "", []) for n in replaced], out=m["out"],
                             subgraph=True, check=lambda own, device, n=node: check(n, own))
        for n in replaced:
            n.fused_into = node
        prog.nodes.insert(prog.nodes.index(last) + 1, node)
    if found:
        link(prog)
    return sum(len(m["nodes"]) for m in found)


def _axis(sm) -> int:
    return int(sm.attrs.get("axis", -1 if sm.opset >= 13 else 1))


def _only_user(prog, name: str, user) -> bool:
    return name not in prog.outputs and [id(u) for u in prog.users.get(name, [])] == [id(user)]


def _transposes(prog, name: str, user, nodes: list):
    """Walk back from operand `name` of `user` through Transposes read by nothing else: (the
    tensor the kernel reads, the perm that views it as the operand, None: as it is). The
    Transposes walked are appended to `nodes`."""
    perm = None
    while True:
        src = prog.producers.get(name)
        t = src[0] if src else None
        if t is None or t.op != "Transpose" or t.host or t.fused_into is not None or \
                "perm" not in t.attrs or not _only_user(prog, name, user):
            return name, perm
        p = [int(a) for a in t.attrs["perm"]]
        perm = tuple(p) if perm is None else tuple(p[i] for i in perm)
        nodes.append(t)
        name, user = t.inputs[0], t


def _scalar(prog, name):
    """The value of a float32 scalar constant (one element, rank <= 1: broadcasting it changes
    no shape of the rank 3 or 4 chain), else None."""
    v = prog.constants.get(name)
    ok = v is not None and v.size == 1 and v.ndim <= 1 and v.dtype == "float32"
    return float(v.reshape(-1)[0]) if ok else None


def _scaled(prog, name: str, user, nodes: list):
    """Walk back from operand `name` of `user` through one Mul by a scalar constant read by
    nothing else: (the other operand, the Mul as its user, the factor: 1.0 without one)."""
    src = prog.producers.get(name)
    mul = src[0] if src else None
    if mul is None or mul.op != "Mul" or mul.host or mul.fused_into is not None or \
            mul.fusion is not None or not _only_user(prog, name, user):
        return name, user, 1.0
    for i in (0, 1):
        c = _scalar(prog, mul.inputs[1 - i])
        if c is not None and mul.inputs[i] not in prog.constants:
            nodes.append(mul)
            return mul.inputs[i], mul, c
    return name, user, 1.0


def _nan_guard(prog, probs: str, nodes: list) -> str:
    """Where(IsNaN(p), 0, p) reading the probabilities `probs` (and nothing else reading them):
    the guard's output, its nodes appended to `nodes`; else `probs`."""
    users = prog.users.get(probs, [])
    isnan = next((u for u in users if u.op == "IsNaN"), None)
    where = next((u for u in users if u.op == "Where"), None)
    if len(users) != 2 or isnan is None or where is None or probs in prog.outputs or \
            any(n.host or n.fused_into is not None or n.fusion is not None for n in (isnan, where)):
        return probs
    if where.inputs[0] != isnan.outputs[0] or where.inputs[2] != probs or \
            _scalar(prog, where.inputs[1]) != 0.0 or not _only_user(prog, isnan.outputs[0], where):
        return probs
    nodes += [isnan, where]
    return where.outputs[0]


def _match(prog, sm) -> dict | None:
    """The attention chain around Softmax `sm`: its nodes, the tensors the kernel reads (q, k^T,
    v before any Transposes it absorbs) with their perms, and its output (after the context's
    Transpose, e.g. the heads merge [0, 2, 1, 3], when that is the context's only reader)."""
    if sm.op != "Softmax" or sm.host or sm.fused_into is not None:
        return None
    if _axis(sm) not in (-1, 2, 3):
        return None                      # the last axis: checked against the rank at run time
    f = sm.fusion
    base = f.base if f is not None else sm.inputs[0]
    first = f.ops[0].node if f is not None else sm
    src = prog.producers.get(base)
    mm = src[0] if src else None
    if mm is None or mm.op != "MatMul" or mm.host or mm.fused_into is not None or \
            mm.fusion is not None or not _only_user(prog, base, first):
        return None
    guard_nodes = []
    probs = _nan_guard(prog, sm.outputs[0], guard_nodes)
    users = prog.users.get(probs, [])
    mm2 = users[0] if len(users) == 1 else None
    if mm2 is None or mm2.op != "MatMul" or mm2.host or mm2.fused_into is not None or \
            mm2.fusion is not None or probs in prog.outputs or mm2.inputs[0] != probs or \
            mm2.inputs[1] == probs:
        return None
    nodes = [mm, sm, mm2] + guard_nodes
    sources, perms, scale = [], [], 1.0
    for k, (name, user) in enumerate(((mm.inputs[0], mm), (mm.inputs[1], mm), (mm2.inputs[1], mm2))):
        if k < 2:                        # q * c1, k^T * c2
            name, user, c = _scaled(prog, name, user, nodes)
            scale *= c
        t, p = _transposes(prog, name, user, nodes)
        sources.append(t)
        perms.append(p)
    out, out_perm = mm2.outputs[0], None
    users = prog.users.get(out, [])
    t = users[0] if len(users) == 1 else None
    if t is not None and t.op == "Transpose" and not t.host and t.fused_into is None and \
            "perm" in t.attrs and out not in prog.outputs:
        out, out_perm = t.outputs[0], tuple(int(a) for a in t.attrs["perm"])
        nodes.append(t)
    return {"softmax": sm, "nodes": nodes, "sources": sources, "perms": tuple(perms),
            "out": out, "out_perm": out_perm, "scale": None if scale == 1.0 else scale,
            "nan_guard": bool(guard_nodes)}


def check(node, own) -> str:
    """Why the attention kernel cannot run these shapes ('' when it can)."""
    if any(l is None or l.dtype != "f32" for l in own[:3]):
        return "dtype"      # (the prologue's operands: fusion_valid below, by their types)
    if not ranks_ok(node, own):
        return "rank"
    if node.attrs["axis"] not in (-1, own[0].rank - 1):
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
