"""LayerNormalization into the GEMV that reads it (program-level fusion, after the epilogues).

    LayerNormalization(x, gamma, beta) -> MatMul(., W) [-> the MatMul's epilogue]

becomes one internal `ln_gemv` node (engine/ops/ln_gemv.py) reading x, W, gamma, beta and the
epilogue's operands: a decode step's GEMV normalises the rows it reads (GPT-2's ln_1 -> c_attn,
ln_2 -> c_fc, ln_f -> lm_head), and the LayerNormalization's kernel and its output disappear.
Taken when the LayerNormalization's only reader is the MatMul's A, W is a 2-D float32 constant
and the LayerNormalization has no prologue of its own (its residual add stays in the producer's
epilogue, engine/fusion.py). The two nodes keep `fused_into` = the new node and run as its
unfused subgraph (the LayerNormalization, then the MatMul with its epilogue) for shapes the
GEMV does not take: a device kind without GEMV kernels, more rows than GEMV_MAX_ROWS (a
prompt), a normalisation over more than the last axis, gamma or beta not one value per column
of the row, or an epilogue broadcast that grows the output (engine/ops/matmul.py no_gemv).
"""
from __future__ import annotations

import numpy as np

from engine.fused_ops import FusedOp, Fusion, fusion_valid
from engine.graph import Node, link
from engine.layout import Layout
from engine.ops.common import norm_axis
from engine.ops.ln_gemv import EPILOGUE_INPUT, call
from engine.ops.matmul import no_gemv


def fuse_ln_gemv(prog) -> int:
    """Mark LayerNormalization -> MatMul pairs on `prog` (a new internal node per pair);
    returns the number of nodes fused away."""
    found = [(ln, mm) for ln, mm in ((n, _reader(prog, n)) for n in prog.nodes) if mm is not None]
    for ln, mm in found:
        epi = mm.fusion
        out = epi.out if epi is not None else mm.outputs[0]
        beta = ln.inputs[2] if len(ln.inputs) > 2 else ""
        node = Node(f"{mm.name}_ln", "ln_gemv",
                    [ln.inputs[0], mm.inputs[1], ln.inputs[1], beta] + (list(epi.extra) if epi else []),
                    [out], {"axis": int(ln.attrs.get("axis", -1)), "epsilon": float(ln.attrs.get("epsilon", 1e-5)),
                            "epilogue": epi}, mm.proto, mm.opset)
        node.fusion = Fusion(ops=[FusedOp(ln, "", []), FusedOp(mm, "", [])], out=out, subgraph=True,
                             check=lambda own, device, n=node: check(n, own, device))
        ln.fused_into = mm.fused_into = node
        prog.nodes.insert(prog.nodes.index(mm) + 1, node)
    if found:
        link(prog)
    return 2 * len(found)


def _reader(prog, ln):
    """The MatMul that LayerNormalization `ln` can run inside, or None."""
    if ln.op != "LayerNormalization" or ln.host or ln.fused_into is not None or ln.fusion is not None:
        return None
    y = ln.outputs[0]
    users = prog.users.get(y, [])
    if any(o for o in ln.outputs[1:]) or y in prog.outputs or len(users) != 1 or \
            prog.dtypes.get(y, "f32") != "f32":
        return None
    mm = users[0]
    w = prog.constants.get(mm.inputs[1]) if mm.op == "MatMul" else None
    if w is None or mm.host or mm.fused_into is not None or mm.inputs[0] != y or \
            w.ndim != 2 or w.dtype != np.float32:
        return None
    return mm


def check(node, own, device) -> str:
    """Why the GEMV cannot normalise its rows for these shapes on a `device` kind device ('' when
    it can)."""
    x, w, gamma, beta = own[0], own[1], own[2], own[3] if len(own) > 3 else None
    if any(l is not None and l.dtype != "f32" for l in (x, gamma, beta)):
        return "dtype"
    if x.rank == 0 or norm_axis(node.attrs["axis"], x.rank) != x.rank - 1:
        return "norm_not_last_axis"
    if any(l is not None and l.count != x.shape[-1] for l in (gamma, beta)):
        return "norm_scale_broadcast"        # the kernel reads one value per column of the row
    reason = no_gemv(call(node, own), device)
    if reason:
        return reason
    epi = node.attrs["epilogue"]
    if epi is not None:
        out = Layout(node.opdef.infer(node, own, {})[0].shape, "f32")
        return fusion_valid(epi, out, dict(zip(epi.extra, own[EPILOGUE_INPUT:])))
    return ""
