"""Program-time fusion of elementwise chains into their producer or consumer
(prepare_primitive_fusing).

What each op contributes is on its OpDef (engine/ops/registry.py): `fusion_producer` (its
kernel stores through the FUSED_OPS hook of cl/common.cl: MatMul, Gemm, Conv, elementwise),
`fuse_expr` (the C expression it runs with inside another node's kernel), `prologue` (its
kernel reads input 0 through the PROLOGUE_OPS hook: Softmax, LayerNormalization).

A producer absorbs the f32 fusable nodes that follow it, e.g. MatMul + Add + Erf-GELU,
Conv + BatchNormalization + Relu, Add + Relu. The fused nodes' extra inputs become extra kernel
arguments; their intermediate tensors are never materialised. At run time the fusion holds only
while every fused op keeps the producer's output shape (the "Valid fusion?" step of the GPU
plugin's overall_flow.md, engine/fused_ops.py): when a broadcast would grow it, the node runs its
unfused subgraph for that inference (primitive_inst).

LayerNormalization takes a prologue too: the residual add before it (x + r, and the bias add
before that) is applied on its reads, so x + r is never materialised. The chain is not taken when
its base comes from a producer that is no elementwise op (MatMul/Gemm/Conv): that kernel's
epilogue writes x + r at no extra launch.
A link whose output is used elsewhere (a graph output, another reader) ends the chain: the fused
kernel writes only the normalised output.

Prologue fusion goes the other way: the short chain of binary eltwise ops that feeds a Softmax
(attention's `Softmax(scores * scale + mask)`) is applied by the Softmax kernel on every read of
its input (PROLOGUE_OPS hook), so the masked scores are never materialised. It holds while the
chain's broadcasts keep the shape of the chain's base value (the scores).

Last, a LayerNormalization read only by a MatMul by a constant weight runs inside that MatMul's
GEMV for a decode step's rows (engine/ln_gemv_fusion.py), the MatMul's epilogue with it.
"""
from __future__ import annotations

import numpy as np

from engine.attention_fusion import fuse_attention
from engine.ln_gemv_fusion import fuse_ln_gemv
# fused_jit and fusion_valid are engine/fused_ops.py's; named here too for engine/primitive_inst.py
from engine.fused_ops import FusedOp, Fusion, fused_jit, fusion_valid  # noqa: F401
from engine.ops import OPS


def _fuse_expr(n):
    """The C expression of fusable node `n` (None: its op never fuses into another node)."""
    e = OPS[n.op].fuse_expr
    return e(n) if callable(e) else e


def _epilogue_takes_residual(op: str) -> bool:
    """A producer that is no elementwise op (MatMul, Gemm, Conv): a LayerNormalization leaves
    the residual add to its epilogue."""
    d = OPS[op]
    return d.fusion_producer and d.fuse_expr is None


def fuse(prog, attention: bool = True) -> int:
    """Mark fusions on `prog`: producer.fusion = Fusion, fused nodes get `fused_into`. Returns the
    number of nodes fused away. Prologues first: the chain feeding a Softmax goes into the
    Softmax rather than into the chain's producer (it would only add the scale there); then
    attention (QK^T, scale, mask, Softmax, x V) becomes one internal op (engine/attention_fusion.py);
    epilogues next, and last LayerNormalization + MatMul (engine/ln_gemv_fusion.py)."""
    fused = _fuse_prologues(prog)
    if attention:
        fused += fuse_attention(prog)
    for p in prog.nodes:
        if p.host or p.fused_into is not None or not p.opdef.fusion_producer or _rows_by_length(prog, p):
            continue
        if len([o for o in p.outputs if o]) != 1 or p.outputs[0] in prog.outputs:
            continue
        if not _f32(prog, p):
            continue
        if p.op == "MatMul" and not _rank2_operands(prog, p):
            continue
        f = _grow(prog, p)
        if f.ops:
            p.fusion = f
            for op in f.ops:
                op.node.fused_into = p
            fused += len(f.ops)
    return fused + fuse_ln_gemv(prog)


def _f32(prog, n) -> bool:
    """The node writes float32 as far as type inference tells (fused ops compute and store
    float32: a float16 chain runs unfused; engine/f16.py)."""
    return all(prog.dtypes.get(o, "f32") == "f32" for o in n.outputs if o)


def _rank2_operands(prog, p) -> bool:
    """MatMul with a 1-D operand drops a dim of the kernel's output: not fused."""
    for i in p.inputs[:2]:
        c = prog.constants.get(i)
        if c is not None and c.ndim < 2:
            return False
        if i in prog.inputs and len(prog.inputs[i].shape) < 2:
            return False
    return True


def _available_before(prog, name: str, p) -> bool:
    """Values the fused kernel can read when the producer runs."""
    if name in prog.constants or name in prog.inputs:
        return True
    src = prog.producers.get(name)
    if src is None or src[0].index >= p.index:
        return False
    # a value some earlier kernel writes: a node's own output, or the last value of a fused
    # chain (GPT-2's residual stream: the MLP's down projection adds the attention block's
    # output, itself the end of the output projection's epilogue)
    host = src[0].fused_into
    return host is None or (host.fusion.out == name and host.index < p.index)


def _grow(prog, p) -> Fusion:
    """Add users of the group's values while they qualify, then keep the longest prefix whose
    intermediate values are used only inside the group."""
    values = {p.outputs[0]: 0}
    order = []
    while True:
        cand = None
        for v in values:
            for u in prog.users.get(v, []):
                if u in order or u.host or u.opdef.fuse_expr is None or u.fused_into is not None \
                        or not _f32(prog, u):
                    continue
                if len([o for o in u.outputs if o]) != 1:
                    continue
                ins = [i for i in u.inputs if i]
                if u.op == "Where":
                    continue      # its bool condition: only in a Softmax's prologue (a mask)
                if u.op == "BatchNormalization":
                    if ins[0] not in values or not all(i in prog.constants for i in ins[1:5]) \
                            or p.op != "Conv":
                        continue
                elif not all(i in values or _available_before(prog, i, p) for i in ins):
                    continue
                if cand is None or u.index < cand.index:
                    cand = u
        if cand is None:
            break
        order.append(cand)
        values[cand.outputs[0]] = len(order)

    # longest valid prefix: every value but the last is used only by group members
    while order:
        members = set(map(id, order))
        inner = [p.outputs[0]] + [n.outputs[0] for n in order[:-1]]
        if all(v not in prog.outputs and all(id(u) in members for u in prog.users.get(v, []))
               for v in inner):
            break
        order.pop()
    if not order:
        return Fusion()

    f = Fusion(out=order[-1].outputs[0])
    step = {p.outputs[0]: 0}
    for n in order:
        if n.op == "BatchNormalization":
            operands = _operands(prog, step, n.inputs[:1]) + _operands(prog, step, _bn_constants(prog, n, p))
        else:
            operands = _operands(prog, step, n.inputs)
        _append(f, step, n, _fuse_expr(n), operands)
    return f


def _operands(prog, step: dict, names) -> list:
    """("v", k) for the value of step k of the group (0: the producer's output or the prologue's
    base), ("c", (C literal, rank)) for a one-value float32 constant, written into the kernel
    (a GELU's four scalars, an attention's scale: each a load and a broadcast offset
    otherwise, one after another in the chain), ("t", name) for a tensor the fused kernel reads
    as an extra input."""
    out = []
    for i in filter(None, names):
        c = prog.constants.get(i)
        if i in step:
            out.append(("v", step[i]))
        elif c is not None and c.dtype == np.float32 and c.size == 1:
            out.append(("c", (c_literal(float(c.reshape(-1)[0])), c.ndim)))
        else:
            out.append(("t", i))
    return out


def c_literal(v: float) -> str:
    """`v` (a float32 value) as an OpenCL C float literal, exactly."""
    if np.isnan(v):
        return "NAN"
    if np.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return f"({str(np.float32(v))}f)"      # (numpy: the shortest digits that read back as this float32)


_POWERS = {"(2.0f)": "(a * a)", "(3.0f)": "(a * a * a)"}


def _append(f: Fusion, step: dict, n, expr: str, operands: list) -> None:
    for kind, name in operands:
        if kind == "t" and name not in f.extra:
            f.extra.append(name)
    if n.op == "Pow" and operands[1][0] == "c":
        # a square or a cube as onnxruntime takes them: products, not powf (the exponent
        # stays an operand: its rank still decides whether the chain fuses)
        expr = _POWERS.get(operands[1][1][0], expr)
    f.ops.append(FusedOp(n, expr, operands))
    step[n.outputs[0]] = len(f.ops)


def fusion_map(prog) -> dict:
    """{node: {"position": "epilogue" | "prologue", "ops": [fused node names]}} for the trace
    header: which nodes run inside which kernel."""
    return {n.name: {"position": n.fusion.position, "ops": n.fusion.names()}
            for n in prog.nodes if n.fusion is not None}


def _fuse_prologues(prog) -> int:
    fused = 0
    for c in prog.nodes:
        if not c.opdef.prologue or c.host or c.fused_into is not None:
            continue
        chain, base = _prologue_chain(prog, c)
        src = prog.producers.get(base)
        if c.op == "LayerNormalization" and src and _epilogue_takes_residual(src[0].op) and \
                all(_available_before(prog, i, src[0]) for n in chain[:1] for i in n.inputs if i and i != base):
            continue      # the producer's epilogue takes the add (an embedding's Gather may not)
        if not chain:
            continue
        f = Fusion(out=c.outputs[0], prologue=True, base=base)
        step = {base: 0}
        for n in chain:
            _append(f, step, n, _fuse_expr(n), _operands(prog, step, n.inputs))
            n.fused_into = c
        f.types = {n.inputs[0]: "bool" for n in chain if n.op == "Where"}   # ONNX: always bool
        c.fusion = f
        fused += len(chain)
    return fused


def _prologue_chain(prog, c) -> tuple[list, str]:
    """The binary fusable nodes (two inputs, a `fuse_expr`) feeding `c`'s input 0, base value
    first, and that base value; at most `c`'s OpDef `prologue` of them.
    Each link's output is used only by the next link (or `c`) and is no graph output. A link
    continues through the operand most likely to be the data (e.g. the scores, not the mask)."""
    chain, cur, user = [], c.inputs[0] if c.inputs else "", c
    while len(chain) < c.opdef.prologue:
        src = prog.producers.get(cur)
        n = src[0] if src else None
        if n is None or n.opdef.fuse_expr is None or n.host or n.fused_into is not None or \
                not _f32(prog, n):
            break
        if len([o for o in n.outputs if o]) != 1 or cur in prog.outputs or \
                {id(u) for u in prog.users.get(cur, [])} != {id(user)}:
            break
        ins = [i for i in n.inputs if i]
        # binary; or a Where (a mask chain: Where(masked, finfo.min, scores)), its bool
        # condition read through its own type
        where = n.op == "Where" and len(ins) == 3 and ins[0] not in prog.constants
        if not (len(ins) == 2 or where) or any(prog.constants[i].dtype != np.float32
                                               for i in ins[where:] if i in prog.constants):
            break   # e.g. Pow with an int exponent: the kernel reads f32 operands only
        chain.insert(0, n)
        # a Softmax's data is the scores (a MatMul's output), even when the mask is computed
        # later in the graph (the TorchScript exporter's Add(scores, Where(mask, 0, -inf)))
        cur, user = max(ins[where:], key=lambda i: (c.op == "Softmax" and _op_of(prog, i) == "MatMul",
                                                    _data_rank(prog, i))), n
    return chain, cur


def _op_of(prog, name: str) -> str | None:
    src = prog.producers.get(name)
    return src[0].op if src else None


def _data_rank(prog, name: str) -> int:
    """Which operand of a link is the data: the output of the latest device node; constants and
    host shape math (a scale computed from Shape) rank lowest, graph inputs next."""
    if name in prog.inputs:
        return -1
    src = prog.producers.get(name)
    if src is None or src[0].host or _rows_by_length(prog, src[0]):
        return -2
    return src[0].index


def embedding_rows(prog, n) -> bool:
    """A Gather of rows of a float table (a constant of two or more dims): data, which runs
    on the device even when its indices are host shape math (engine/program.py); a float
    vector, such as a Resize's scales, stays shape math."""
    t = prog.constants.get(n.inputs[0]) if n.op == "Gather" and n.inputs else None
    return t is not None and t.dtype.kind == "f" and t.ndim >= 2


def _rows_by_length(prog, n) -> bool:
    """Embedding rows by host shape math (a BERT's position embeddings by positions made from
    the length): the output has none of the batch's dims, so a fused chain based on it would
    grow by broadcast on a batch change. It is an operand of the chain based on the other
    value."""
    src = prog.producers.get(n.inputs[1]) if len(n.inputs) > 1 else None
    return embedding_rows(prog, n) and src is not None and src[0].host


def _bn_constants(prog, n, conv) -> list[str]:
    """BatchNormalization (inference) as y = x * k + c per channel: k, c as [C, 1, 1] constants
    ([C, 1] after a 1-D Conv, whose weight is [OC, C/group, K])."""
    w = prog.constants.get(conv.inputs[1]) if len(conv.inputs) > 1 else None
    spatial = w.ndim - 2 if w is not None else 2
    scale, bias, mean, var = (prog.constants[i].astype(np.float64) for i in n.inputs[1:5])
    k = scale / np.sqrt(var + float(n.attrs.get("epsilon", 1e-5)))
    c = bias - mean * k
    names = [f"{n.name}::k", f"{n.name}::c"]
    for name, v in zip(names, (k, c)):
        prog.constants[name] = v.astype(np.float32).reshape(-1, *[1] * spatial)
    return names
