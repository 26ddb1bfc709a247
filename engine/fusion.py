"""Program-time fusion of elementwise chains into their producer or consumer
(prepare_primitive_fusing).

A producer whose kernel stores through the FUSED_OPS hook (cl/common.cl: MatMul, Gemm, Conv,
elementwise) absorbs the f32 elementwise nodes that follow it, e.g. MatMul + Add + Erf-GELU,
Conv + BatchNormalization + Relu, Add + Relu. The fused nodes' extra inputs become extra kernel
arguments; their intermediate tensors are never materialised. At run time the fusion holds only
while every fused op keeps the producer's output shape (seed 002's "Valid fusion?"): when a
broadcast would grow it, the node runs its unfused subgraph for that inference (primitive_inst).

LayerNormalization takes a prologue too: the residual add before it (x + r, and the bias add
before that) is applied on its reads, so x + r is never materialised. The chain is not taken when
its base comes from a MatMul/Gemm/Conv: that kernel's epilogue writes x + r at no extra launch.
A link whose output is used elsewhere (a graph output, another reader) ends the chain: the fused
kernel writes only the normalised output.

Prologue fusion goes the other way: the short chain of binary eltwise ops that feeds a Softmax
(attention's `Softmax(scores * scale + mask)`) is applied by the Softmax kernel on every read of
its input (PROLOGUE_OPS hook), so the masked scores are never materialised. It holds while the
chain's broadcasts keep the shape of the chain's base value (the scores).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from engine.ops.activation import gelu_expr
from engine.ops.common import broadcast
from engine.ops.eltwise import BINARY, UNARY

# Ops that may be fused into a producer, with their C expression over a, b (or a function of
# the node giving it: Gelu's depends on its `approximate`; exporters at opset 20 emit Gelu).
FUSABLE = {**BINARY, **UNARY, "BatchNormalization": "a * b + c",
           "Gelu": lambda n: gelu_expr(n, "f32", 1)}
PRODUCERS = {"MatMul", "Gemm", "Conv", *BINARY, *UNARY}
# Consumers whose kernel reads its input 0 through the PROLOGUE_OPS hook, and the longest chain
# of binary eltwise ops they take (attention needs two: scale and mask).
PROLOGUE_CONSUMERS = {"Softmax", "LayerNormalization"}
MAX_PROLOGUE_OPS = 3
# a LayerNormalization leaves the chain to these producers (their epilogue takes it)
EPILOGUE_FIRST = {"MatMul", "Gemm", "Conv"}


@dataclass
class FusedOp:
    node: object                 # the original node (run on its own when unfused)
    expr: str                    # C expression over a, b, c
    operands: list               # per operand: ("v", k) value of step k (0 = producer) | ("t", name)


@dataclass
class Fusion:
    ops: list = field(default_factory=list)
    out: str = ""                # tensor the fused node writes (the last fused op's output)
    extra: list = field(default_factory=list)  # extra input tensors, in kernel-argument order
    # prologue fusion: the ops run before the node, on `base`, which replaces the node's input 0
    prologue: bool = False
    base: str = ""
    # subgraph fusion (engine/attention_fusion.py): the node is an internal op standing for the nodes
    # in `ops` (run as the unfused subgraph); check(own input layouts) -> unfuse reason or ''
    subgraph: bool = False
    check: object = None

    def names(self) -> list[str]:
        return [f.node.name for f in self.ops]

    @property
    def position(self) -> str:
        return "subgraph" if self.subgraph else "prologue" if self.prologue else "epilogue"


def fuse(prog, attention: bool = True) -> int:
    """Mark fusions on `prog`: producer.fusion = Fusion, fused nodes get `fused_into`. Returns the
    number of nodes fused away. Prologues first: the chain feeding a Softmax goes into the
    Softmax rather than into the chain's producer (it would only add the scale there); then
    attention (QK^T, scale, mask, Softmax, x V) becomes one internal op (engine/attention_fusion.py)."""
    fused = _fuse_prologues(prog)
    if attention:
        from engine.attention_fusion import fuse_attention
        fused += fuse_attention(prog)
    for p in prog.nodes:
        if p.host or p.fused_into is not None or p.op not in PRODUCERS:
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
    return fused


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
    return src is not None and src[0].index < p.index and src[0].fused_into is None


def _grow(prog, p) -> Fusion:
    """Add users of the group's values while they qualify, then keep the longest prefix whose
    intermediate values are used only inside the group."""
    values = {p.outputs[0]: 0}
    order = []
    while True:
        cand = None
        for v in values:
            for u in prog.users.get(v, []):
                if u in order or u.host or u.op not in FUSABLE or u.fused_into is not None \
                        or not _f32(prog, u):
                    continue
                if len([o for o in u.outputs if o]) != 1:
                    continue
                ins = [i for i in u.inputs if i]
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
            operands = _operands(step, n.inputs[:1]) + _operands(step, _bn_constants(prog, n, p))
        else:
            operands = _operands(step, n.inputs)
        expr = FUSABLE[n.op]
        _append(f, step, n, expr(n) if callable(expr) else expr, operands)
    return f


def _operands(step: dict, names) -> list:
    """("v", k) for the value of step k of the group (0: the producer's output or the prologue's
    base), ("t", name) for a tensor the fused kernel reads as an extra input."""
    return [("v", step[i]) if i in step else ("t", i) for i in names if i]


def _append(f: Fusion, step: dict, n, expr: str, operands: list) -> None:
    for kind, name in operands:
        if kind == "t" and name not in f.extra:
            f.extra.append(name)
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
        if c.op not in PROLOGUE_CONSUMERS or c.host or c.fused_into is not None:
            continue
        chain, base = _prologue_chain(prog, c)
        src = prog.producers.get(base)
        if c.op == "LayerNormalization" and src and src[0].op in EPILOGUE_FIRST:
            continue
        if not chain:
            continue
        f = Fusion(out=c.outputs[0], prologue=True, base=base)
        step = {base: 0}
        for n in chain:
            _append(f, step, n, BINARY[n.op], _operands(step, n.inputs))
            n.fused_into = c
        c.fusion = f
        fused += len(chain)
    return fused


def _prologue_chain(prog, c) -> tuple[list, str]:
    """The binary eltwise nodes feeding `c`'s input 0, base value first, and that base value.
    Each link's output is used only by the next link (or `c`) and is no graph output. A link
    continues through the operand most likely to be the data (e.g. the scores, not the mask)."""
    chain, cur, user = [], c.inputs[0] if c.inputs else "", c
    while len(chain) < MAX_PROLOGUE_OPS:
        src = prog.producers.get(cur)
        n = src[0] if src else None
        if n is None or n.op not in BINARY or n.host or n.fused_into is not None or not _f32(prog, n):
            break
        if len([o for o in n.outputs if o]) != 1 or cur in prog.outputs or \
                {id(u) for u in prog.users.get(cur, [])} != {id(user)}:
            break
        ins = [i for i in n.inputs if i]
        if len(ins) != 2 or any(prog.constants[i].dtype != np.float32
                                for i in ins if i in prog.constants):
            break   # e.g. Pow with an int exponent: the kernel reads f32 operands only
        chain.insert(0, n)
        # a Softmax's data is the scores (a MatMul's output), even when the mask is computed
        # later in the graph (the TorchScript exporter's Add(scores, Where(mask, 0, -inf)))
        cur, user = max(ins, key=lambda i: (c.op == "Softmax" and _op_of(prog, i) == "MatMul",
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
    if src is None or src[0].host:
        return -2
    return src[0].index


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


def fused_jit(f: Fusion, ref_t: int, first_extra_t: int) -> tuple:
    """JIT constants that define the hook of `f` for a kernel whose extra inputs start at tensor
    argument `first_extra_t` (see cl/common.cl). Epilogue: FUSED_OPS on the value stored to
    tensor argument `ref_t`, operands indexed by broadcasting against it. Prologue: PROLOGUE_OPS
    on values read from tensor argument `ref_t`, operands at the row offsets `ro[j] + pa * rs[j]`
    the kernel computed once per row (PROLOGUE_ROW: no broadcast arithmetic per read)."""
    lines = []
    for k, op in enumerate(f.ops, start=1):
        vals = []
        for kind, x in op.operands:
            if kind == "v":
                vals.append(f"v{x}")
            else:
                j = f.extra.index(x)
                at = f"ro[{j}] + pa * rs[{j}]" if f.prologue else \
                    f"FUSED_OFF(si, {ref_t}, {first_extra_t + j}, o)"
                vals.append(f"F{j}[{at}]")
        decl = " ".join(f"const float {n} = {v};" for n, v in zip("abc", vals))
        expr = re.sub(r"\bTOUT\b", "float", op.expr)
        lines.append(f"float v{k}; {{ {decl} v{k} = {expr}; }}")
    lines.append(f"return v{len(f.ops)};")
    params = "".join(f", __global const float* F{j}" for j in range(len(f.extra)))
    # offsets are added where the kernel calls FUSED_OPS: T_OFF reads the runtime shape_info
    # in both dynamic and static builds (cl/common.cl)
    call = "".join(f", F{j} + T_OFF({first_extra_t + j})" for j in range(len(f.extra)))
    hook = "PROLOGUE" if f.prologue else "FUSED"
    jit = ((f"{hook}_OPS_BODY", " ".join(lines)), (f"{hook}_PARAMS", params), (f"{hook}_CALL", call))
    if f.prologue:
        jit += (("PROLOGUE_REF", ref_t), ("PROLOGUE_FIRST", first_extra_t),
                ("PROLOGUE_NUM", len(f.extra)))
    return jit


def fusion_valid(f: Fusion, produced, layouts: dict, own=()) -> str:
    """'' when the fused ops keep the layout of `produced` (the producer's output; for a
    prologue, its base value) for the current shapes, else why not. `layouts` maps extra tensor
    names to their current layouts. A subgraph fusion asks its own check (`own`: the node's
    input layouts)."""
    if f.check is not None:
        return f.check(own)
    shape = produced.shape
    if produced.dtype != "f32":
        return "dtype"
    for op in f.ops:
        others = [layouts[x] for kind, x in op.operands if kind == "t"]
        if any(l is None or l.dtype != "f32" for l in others):
            return "dtype"
        try:
            out = broadcast(shape, *[l.shape for l in others])
        except Exception:
            return "broadcast_error"
        if tuple(out) != tuple(shape):
            return "broadcast_grows_input" if f.prologue else "broadcast_grows_output"
    return ""
