"""What a fused node carries and how its kernel applies it: `Fusion` (the ops fused into a node,
engine/fusion.py makes them), the FUSED_OPS / PROLOGUE_OPS hook JIT of cl/common.cl
(`fused_jit`, used by the kernels of fusing ops) and the run-time check that the fusion holds
for the current shapes (`fusion_valid`: the "Valid fusion?" step of the GPU plugin's
overall_flow.md). Imports no engine module: the ops, the fusion passes and the runtime all read it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from engine.kernels import KernelCall
from engine.layout import cl_type
from engine.ops.common import BroadcastError, broadcast


@dataclass
class FusedOp:
    node: object                 # the original node (run on its own when unfused)
    expr: str                    # C expression over a, b, c
    # per operand: ("v", k) value of step k (0 = producer) | ("t", name) an extra input |
    # ("c", (C literal, rank)) a one-value constant (engine/fusion.py _operands)
    operands: list


@dataclass
class Fusion:
    ops: list = field(default_factory=list)
    out: str = ""                # tensor the fused node writes (the last fused op's output)
    extra: list = field(default_factory=list)  # extra input tensors, in kernel-argument order
    # prologue fusion: the ops run before the node, on `base`, which replaces the node's input 0
    prologue: bool = False
    base: str = ""
    # subgraph fusion (engine/attention_fusion.py, engine/ln_gemv_fusion.py): the node is an
    # internal op standing for the nodes in `ops` (run as the unfused subgraph);
    # check(own input layouts, device kind) -> unfuse reason or ''
    subgraph: bool = False
    check: object = None
    # extra inputs that are not float32 (a Where's bool condition in an attention mask chain):
    # name -> dtype; the kernel reads them through pointers of their type, as floats
    types: dict = field(default_factory=dict)

    def names(self) -> list[str]:
        return [f.node.name for f in self.ops]

    @property
    def position(self) -> str:
        return "subgraph" if self.subgraph else "prologue" if self.prologue else "epilogue"


def fused_jit(f: Fusion, ref_t: int, first_extra_t: int, vector: bool = False) -> tuple:
    """JIT constants that define the hook of `f` for a kernel whose extra inputs start at tensor
    argument `first_extra_t` (see cl/common.cl). Epilogue: FUSED_OPS on the value stored to
    tensor argument `ref_t`, operands indexed by broadcasting against it. Prologue: PROLOGUE_OPS
    on values read from tensor argument `ref_t`, operands at the row offsets `ro[j] + pa * rs[j]`
    the kernel computed once per row (PROLOGUE_ROW: no broadcast arithmetic per read).
    `vector`: the kernel stores by vectors (FUSED_VW, CPU GEMMs): FUSED_VOPS_BODY too, the
    chain over vectors, where each op's expression is written for vectors as well.
    Kept on the fusion: a decode step asks again for every new length."""
    memo = f.__dict__.setdefault("_jit", {})
    key = (ref_t, first_extra_t, vector)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _fused_jit(f, ref_t, first_extra_t, vector)
    return hit


def _fused_jit(f: Fusion, ref_t: int, first_extra_t: int, vector: bool) -> tuple:
    lines = []
    for k, op in enumerate(f.ops, start=1):
        vals = []
        for kind, x in op.operands:
            if kind == "v":
                vals.append(f"v{x}")
            elif kind == "c":
                vals.append(x[0])
            else:
                j = f.extra.index(x)
                at = f"ro[{j}] + pa * rs[{j}]" if f.prologue else \
                    f"FUSED_OFF(si, {ref_t}, {first_extra_t + j}, o)"
                vals.append(f"(float)F{j}[{at}]" if x in f.types else f"F{j}[{at}]")
        decl = " ".join(f"const float {n} = {v};" for n, v in zip("abc", vals))
        expr = re.sub(r"\bTOUT\b", "float", op.expr)
        lines.append(f"float v{k}; {{ {decl} v{k} = {expr}; }}")
    lines.append(f"return v{len(f.ops)};")
    params = "".join(f", __global const {cl_type(f.types.get(x, 'f32'))}* F{j}" for j, x in enumerate(f.extra))
    # offsets are added where the kernel calls FUSED_OPS: T_OFF reads the runtime shape_info
    # in both dynamic and static builds (cl/common.cl)
    call = "".join(f", F{j} + T_OFF({first_extra_t + j})" for j in range(len(f.extra)))
    hook = "PROLOGUE" if f.prologue else "FUSED"
    jit = ((f"{hook}_OPS_BODY", " ".join(lines)), (f"{hook}_PARAMS", params), (f"{hook}_CALL", call))
    body = _vector_body(f, ref_t, first_extra_t) if vector and not f.prologue else None
    if body is not None:
        jit += (("FUSED_VOPS_BODY", body),)
    if f.prologue:
        jit += (("PROLOGUE_REF", ref_t), ("PROLOGUE_FIRST", first_extra_t),
                ("PROLOGUE_NUM", len(f.extra)))
    return jit


# Scalar expressions that are no vector expression as written: casts to a scalar type (Pow's
# (float)a), and erf_f32, which has a vector twin (cl/common.cl erf_v). Arithmetic, the
# ternary (a lane-wise select on vectors) and OpenCL's math builtins hold for vectors as they are.
_SCALAR_ONLY = re.compile(r"\((float|int|half|double|long|uint)\)|\bisnan\b|\bconvert_")
_VECTOR_TWINS = {"erf_f32(": "erf_v("}


def _vector_body(f: Fusion, ref_t: int, first_extra_t: int) -> str | None:
    """FUSED_VOPS_BODY of epilogue `f` over FVT vectors (cl/common.cl), None when an op's
    expression does not hold for vectors or an operand is no float32 tensor."""
    if f.types:
        return None
    lines = []
    for k, op in enumerate(f.ops, start=1):
        expr = re.sub(r"\bTOUT\b", "FVT", op.expr)
        for scalar, vec in _VECTOR_TWINS.items():
            expr = expr.replace(scalar, vec)
        if _SCALAR_ONLY.search(expr):
            return None
        vals = [f"v{x}" if kind == "v" else f"(FVT)({x[0]})" if kind == "c" else
                f"bcast_vload(si, {ref_t}, {first_extra_t + f.extra.index(x)}, F{f.extra.index(x)}, o)"
                for kind, x in op.operands]
        decl = " ".join(f"const FVT {n} = {v};" for n, v in zip("abc", vals))
        lines.append(f"FVT v{k}; {{ {decl} v{k} = {expr}; }}")
    lines.append(f"return v{len(f.ops)};")
    return " ".join(lines)


def with_fused_ops(calls: list, f: Fusion, first_input: int) -> list:
    """The kernel that writes the output also applies the fused ops of `f` (FUSED_OPS hook); for
    a prologue, the kernel that reads input 0 applies them on each read (PROLOGUE_OPS). The
    fused ops' extra inputs are the node's inputs from `first_input` on."""
    ref = ("in", 0) if f.prologue else ("out", 0)
    k = max(i for i, c in enumerate(calls) if ref in c.args)
    c = calls[k]
    first = len(c.args)
    extra = tuple(("in", first_input + j) for j in range(len(f.extra)))
    vector = any(key == "FUSED_VW" for key, _ in c.jit)   # a kernel that stores by vectors
    calls = list(calls)
    calls[k] = KernelCall(c.source, c.kernel, c.jit + fused_jit(f, c.args.index(ref), first, vector),
                          c.args + extra, c.params, c.gws, c.lws, c.dims, c.internal)
    return calls


def fusion_valid(f: Fusion, produced, layouts: dict, own=(), device: str = "gpu") -> str:
    """'' when the fused ops keep the layout of `produced` (the producer's output; for a
    prologue, its base value) for the current shapes, else why not. `layouts` maps extra tensor
    names to their current layouts. A subgraph fusion asks its own check (`own`: the node's
    input layouts; `device`: the device kind, whose kernels it may need)."""
    if f.check is not None:
        return f.check(own, device)
    shape = produced.shape
    if produced.dtype != "f32":
        return "dtype"
    for op in f.ops:
        if any(kind == "c" and x[1] > len(shape) for kind, x in op.operands):   # a [1, 1] on a row
            return "broadcast_grows_input" if f.prologue else "broadcast_grows_output"
        names = [x for kind, x in op.operands if kind == "t"]
        others = [layouts[x] for x in names]
        if any(l is None or l.dtype != f.types.get(x, "f32") for x, l in zip(names, others)):
            return "dtype"
        try:
            out = broadcast(shape, *[l.shape for l in others])
        except BroadcastError:
            return "broadcast_error"
        if tuple(out) != tuple(shape):
            return "broadcast_grows_input" if f.prologue else "broadcast_grows_output"
    return ""
