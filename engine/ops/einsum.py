"""Einsum. The contractions exporters emit (attention's 'bhqd,bhkd->bhqk', 'bij,bjk->bik': two
operands, one contracted letter, one free letter each, the rest batch letters) run on the GEMM
kernel, with strided copies (Transpose) into internal buffers where an operand's or the
result's letter order is not the matrix one, for float32. Every other equation (diagonals, sums,
1 or 3 operands, other types) runs on one contraction loop (cl/einsum.cl)."""
from __future__ import annotations

from engine.kernels import KernelCall
from engine.layout import Layout, cl_type
from engine.ops.registry import register
from engine.ops.activation import NUMERIC
from engine.ops.common import ShapeInferenceError, contiguous_strides
from engine.ops.matmul import gemm_call
from engine.ops.movement import copy_call

MAX_LETTERS = 8


def parse(node, ins):
    """(terms per operand, output term, letter -> extent), '...' expanded to capital letters."""
    eq = node.attrs.get("equation", "").replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ins):
        raise ShapeInferenceError(f"Einsum {node.name}: equation {eq!r} has {len(terms)} operands, "
                                  f"the node {len(ins)}")
    ell = 0
    for t, l in zip(terms, ins):
        if "..." in t:
            ell = max(ell, l.rank - (len(t) - 3))
    ell_letters = "ABCDEFGH"[:ell]   # right-aligned: operands with fewer broadcast dims take the last
    full = []
    for t, l in zip(terms, ins):
        if "..." in t:
            n = l.rank - (len(t) - 3)
            t = t.replace("...", ell_letters[ell - n:])
        if len(t) != l.rank:
            raise ShapeInferenceError(f"Einsum {node.name}: term {t!r} for input {l}")
        full.append(t)
    if not arrow:   # implicit output: letters seen once, alphabetically, after the ellipsis
        once = sorted(c for c in set("".join(full)) if "".join(full).count(c) == 1 and c.islower())
        out = ell_letters + "".join(once)
    else:
        out = out.replace("...", ell_letters)
    ext = {}
    for t, l in zip(full, ins):
        for c, d in zip(t, l.shape):
            if ext.get(c, 1) == 1:
                ext[c] = d
            elif d != 1 and d != ext[c]:
                raise ShapeInferenceError(f"Einsum {node.name}: letter {c!r} is {ext[c]} and {d}")
    if any(c not in ext for c in out) or len(set(out)) != len(out):
        raise ShapeInferenceError(f"Einsum {node.name}: bad output term {out!r}")
    return full, out, ext


def _matmul_plan(full, out):
    """(batch, m, k, n) letters when the equation is a batched matrix product, else None."""
    if len(full) != 2:
        return None
    a, b = full
    if len(set(a)) != len(a) or len(set(b)) != len(b):
        return None
    k = [c for c in a if c in b and c not in out]
    m = [c for c in a if c not in b]
    n = [c for c in b if c not in a]
    batch = [c for c in out if c in a and c in b]
    if len(k) != 1 or len(m) != 1 or len(n) != 1 or set(m + n + batch) != set(out) \
            or len(a) != len(batch) + 2 or len(b) != len(batch) + 2:
        return None
    return batch, m[0], k[0], n[0]


def _transposed(node, l, term, want, src, dst):
    """A copy of `l` (letters `term`) into letter order `want`, or None when already in it."""
    if term == want:
        return None
    perm = [term.index(c) for c in want]
    st = contiguous_strides(l.shape)
    shape = tuple(l.shape[p] for p in perm)
    return copy_call(node, l.dtype, shape, [st[p] for p in perm], 0, contiguous_strides(shape), 0,
                     src=src, dst=dst)


def _gemm_kernels(node, ins, plan, full, out_term):
    batch, m, k, n = plan
    a_want, b_want = "".join(batch) + m + k, "".join(batch) + k + n
    c_term = "".join(batch) + m + n
    internal, calls = [], []

    def scratch(dims):
        internal.append(Layout(tuple(dims), "f32"))
        return ("internal", len(internal) - 1)

    a_ref, b_ref = ("in", 0), ("in", 1)
    a_dims = tuple(ins[0].shape[full[0].index(c)] for c in a_want)
    b_dims = tuple(ins[1].shape[full[1].index(c)] for c in b_want)
    if full[0] != a_want:
        a_ref = scratch(a_dims)
        calls.append(_transposed(node, ins[0], full[0], a_want, ("in", 0), a_ref))
    if full[1] != b_want:
        b_ref = scratch(b_dims)
        calls.append(_transposed(node, ins[1], full[1], b_want, ("in", 1), b_ref))
    c_dims = tuple(max(a_dims[i], b_dims[i]) for i in range(len(batch))) + (a_dims[-2], b_dims[-1])
    c_ref = ("out", 0) if c_term == out_term else scratch(c_dims)
    g = gemm_call(node, a_dims, b_dims, c_dims[:-2], a_dims[-2], b_dims[-1], a_dims[-1])
    g.args = (a_ref, b_ref, c_ref)
    calls.append(g)
    if c_ref != ("out", 0):
        calls.append(_transposed(node, Layout(c_dims, "f32"), c_term, out_term, c_ref, ("out", 0)))
    for c in calls:
        c.internal = tuple(internal)
    return calls


def _einsum_kernels(node, ins, outs, deps):
    full, out, ext = parse(node, ins)
    plan = _matmul_plan(full, out)
    if plan is not None and all(l.dtype == "f32" for l in ins) and all(l.count for l in ins):
        return _gemm_kernels(node, ins, plan, full, out)
    summed = [c for c in dict.fromkeys("".join(full)) if c not in out]
    letters = list(out) + summed
    if len(letters) > MAX_LETTERS or len(ins) > 3:
        raise ShapeInferenceError(f"Einsum {node.name}: more than {MAX_LETTERS} letters or 3 operands")
    strides = []
    for t, l in zip(full, ins):
        st = contiguous_strides(l.shape)
        row = [0] * MAX_LETTERS
        for c, s, d in zip(t, st, l.shape):
            if d != 1:   # a broadcast dim (size 1) stays at index 0
                row[letters.index(c)] += s
        strides += row
    strides += [0] * (MAX_LETTERS * (3 - len(ins)))
    extents = [ext[c] for c in letters] + [1] * (MAX_LETTERS - len(letters))
    dt = outs[0].dtype
    tacc = "double" if dt == "f64" else "float" if dt in ("f32", "f16") else cl_type(dt)
    jit = (("T", cl_type(dt)), ("TACC", tacc), ("NUM_OPS", len(ins)), ("IMPL_TAG", "Einsum"))
    args = tuple(("in", i) for i in range(len(ins))) + (("out", 0),)
    return [KernelCall("einsum", "einsum", jit, args,
                       params=(len(letters), len(out), *extents, *strides), gws=(max(outs[0].count, 1),))]


@register("Einsum", checked=28, kernels=_einsum_kernels, host_ok=True)
def _einsum(node, ins, deps):
    dts = {l.dtype for l in ins}
    if len(dts) != 1 or not dts <= set(NUMERIC):
        raise ShapeInferenceError(f"Einsum {node.name}: inputs of types {sorted(dts)}")
    full, out, ext = parse(node, ins)
    return [Layout(tuple(ext[c] for c in out), ins[0].dtype)]
