"""Host impls beside onnx.reference (engine/program.py Node.run_host).

REPLACED: classes handed to every ReferenceEvaluator, for ops where the reference is wrong.
- GatherElements: onnx.reference's falls back, when `np.choose` refuses an axis of more than 32
  entries, to a path that only handles one index per row (BERT's token_type_ids buffer, 512
  entries gathered by position ids, is such a case).

FAST: plain numpy for the small shape-math ops exporters emit around every dynamic dim (torch
export's decoders run ~25 of them per layer on a changed past length). A ReferenceEvaluator
call costs tens of microseconds of checks and bookkeeping per node; these cost a few. Each
returns None for a case it does not take (run_host then asks onnx.reference), and
tests/test_host_ops.py holds each to onnx.reference's outputs, dtype included.
"""
from __future__ import annotations

import numpy as np
from onnx import numpy_helper
from onnx.reference.op_run import OpRun


class GatherElements(OpRun):
    op_domain = ""

    def _run(self, data, indices, axis=None):
        axis = int(axis or 0) % data.ndim
        idx = np.where(indices < 0, indices + data.shape[axis], indices)
        return (np.take_along_axis(data, idx.astype(np.int64), axis=axis),)


REPLACED = [GatherElements]

FAST = {}


def _fast(*ops):
    def deco(fn):
        for op in ops:
            FAST[op] = fn
        return fn
    return deco


def _axes(node, vals, k):
    """Axes from input k (opset 13+) or the `axes` attribute (None: absent)."""
    if len(vals) > k and vals[k] is not None:
        return [int(a) for a in np.asarray(vals[k]).reshape(-1)]
    a = node.attrs.get("axes")
    return None if a is None else [int(x) for x in a]


@_fast("Unsqueeze")
def _unsqueeze(node, x, *rest):
    axes = _axes(node, (x, *rest), 1)
    rank = x.ndim + len(axes)
    return [np.reshape(x, _inserted(x.shape, sorted(a % rank for a in axes)))]


def _inserted(shape, axes):
    s = list(shape)
    for a in axes:
        s.insert(a, 1)
    return s


@_fast("Squeeze")
def _squeeze(node, x, *rest):
    axes = _axes(node, (x, *rest), 1)
    return [np.squeeze(x, axis=None if axes is None else tuple(a % x.ndim for a in axes))]


@_fast("Concat")
def _concat(node, *xs):
    return [np.concatenate(xs, axis=int(node.attrs["axis"]))]


@_fast("Gather")
def _gather(node, data, idx):
    return [np.take(data, idx, axis=int(node.attrs.get("axis", 0)))]


@_fast("Slice")
def _slice(node, x, starts=None, ends=None, axes=None, steps=None):
    if node.opset < 10:
        return None
    starts, ends = np.asarray(starts).reshape(-1), np.asarray(ends).reshape(-1)
    axes = range(len(starts)) if axes is None else np.asarray(axes).reshape(-1)
    steps = np.ones(len(starts), np.int64) if steps is None else np.asarray(steps).reshape(-1)
    sl = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        sl[int(a) % x.ndim] = slice(int(s), int(e), int(st))   # Python clamps as ONNX does
    return [x[tuple(sl)]]


_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Equal": np.equal,
           "Less": np.less, "LessOrEqual": np.less_equal, "Greater": np.greater,
           "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or}


@_fast(*_BINARY)
def _binary(node, a, b):
    if a.dtype != b.dtype or a.dtype.kind not in "biu":   # float math: the reference's rounding
        return None
    out = _BINARY[node.op](a, b)
    if node.op in _WRAPS and a.size + b.size <= _EXACT_MAX:
        _no_wrap(node, a, b, out)
    return [out if out.dtype == np.bool_ else out.astype(a.dtype)]


_WRAPS = {"Add": "+", "Sub": "-", "Mul": "*"}
_EXACT_MAX = 64     # shape math holds a few values; a larger integer tensor is data


def _no_wrap(node, a, b, out) -> None:
    """numpy's integer math wraps silently: a dim past int64 would become a small or negative
    one and fail later, or not at all, far from its cause. Python's ints are exact."""
    if a.dtype.kind == "i" and a.size and b.size:
        # the operands' largest magnitudes bound the result: shape math (small dims) never gets
        # near the limit, and this check costs a fifth of the exact one (a decode step's
        # position math runs it every step)
        ha = max(int(a.max()), -int(a.min()))
        hb = max(int(b.max()), -int(b.min()))
        if (ha * hb if node.op == "Mul" else ha + hb) <= np.iinfo(a.dtype).max:
            return
    exact = _BINARY[node.op](a.astype(object), b.astype(object))
    bad = np.flatnonzero(np.broadcast_to(exact != out, np.shape(out)))
    if bad.size:
        i = np.unravel_index(bad[0], np.shape(out))
        x, y = np.broadcast_to(a, np.shape(out))[i], np.broadcast_to(b, np.shape(out))[i]
        raise OverflowError(f"{x} {_WRAPS[node.op]} {y} is past {a.dtype} "
                            f"({np.iinfo(a.dtype).min}..{np.iinfo(a.dtype).max})")


@_fast("Max", "Min")
def _max_min(node, *xs):
    if len({x.dtype for x in xs}) != 1 or xs[0].dtype.kind not in "iu":
        return None
    f = np.maximum if node.op == "Max" else np.minimum
    out = xs[0]
    for x in xs[1:]:
        out = f(out, x)
    return [np.asarray(out)]


@_fast("Not")
def _not(node, x):
    return [np.logical_not(x)]


@_fast("Where")
def _where(node, c, a, b):
    return [np.where(c, a, b).astype(a.dtype)] if a.dtype == b.dtype else None


@_fast("Range")
def _range(node, start, limit, delta):
    if start.dtype.kind not in "iu":
        return None
    return [np.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype)]


@_fast("Expand")
def _expand(node, x, shape):
    return [np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(int(d) for d in shape))).copy()]


@_fast("Reshape")
def _reshape(node, x, shape):
    if node.opset < 5:
        return None
    shape = [int(d) for d in shape]
    if not node.attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [np.reshape(x, shape)]


@_fast("ConstantOfShape")
def _constant_of_shape(node, shape):
    v = node.attrs.get("value")
    v = np.zeros(1, np.float32) if v is None else numpy_helper.to_array(v)
    return [np.full(tuple(int(d) for d in shape), v.reshape(-1)[0], dtype=v.dtype)]


@_fast("Cast")
def _cast(node, x):
    from onnx import helper
    to = helper.tensor_dtype_to_np_dtype(int(node.attrs["to"]))
    if x.dtype.kind not in "biu" or to.kind not in "biu":   # float casts: the reference's rules
        return None
    return [x.astype(to)]


@_fast("Trilu")
def _trilu(node, x, k=None):
    """A causal mask's triangle (decoders build one from the past length every step)."""
    if x.ndim < 2:
        return None
    k = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    return [np.triu(x, k) if node.attrs.get("upper", 1) else np.tril(x, k)]


@_fast("Identity")
def _identity(node, x):
    return [x]
