"""Data movement: views (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout), strided
copies (Transpose, Slice, Expand, Concat) and Gather."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from engine.kernels import KernelCall, MAX_RANK
from engine.layout import Layout, bits_type, cl_type, type_jit
from engine.symbolic import prod
from engine.ops.registry import register
from engine.ops.common import (ShapeInferenceError, broadcast, contiguous_strides, eltwise_call,
                               norm_axis)


def _pad(vals, fill):
    vals = list(vals)
    return [fill] * (MAX_RANK - len(vals)) + vals


def copy_call(node, dtype, iter_shape, src_strides, src_off, dst_strides, dst_off,
              src=("in", 0), dst=("out", 0), convert: tuple = ()) -> KernelCall:
    """Copy the region `iter_shape` from src to dst with the given element strides/offsets.
    `convert`: (destination dtype, C expression of the stored value over v) for a converting
    copy (Cast), else the values move as they are."""
    params = tuple(_pad(src_strides, 0)) + (src_off,) + tuple(_pad(dst_strides, 0)) + (dst_off,)
    count = prod(iter_shape)
    jit = ((*type_jit("TS", dtype), *type_jit("TD", convert[0]), ("CONVERT(v)", convert[1]))
           if convert else (("T", bits_type(dtype)),))
    return KernelCall("movement", "copy_strided", jit + (("IMPL_TAG", node.op),),
                      args=(src, dst), params=params, gws=(max(count, 1),),
                      dims={1: tuple(iter_shape)})


# ---- views -------------------------------------------------------------------------------
def _view(name, deps=(), host_ok=True, **kw):
    return register(name, view=True, shape_deps=deps, host_ok=host_ok, **kw)


@_view("Reshape", checked=25, deps=(1,))
def _reshape(node, ins, deps):
    shape = [int(v) for v in deps[1]]
    src = ins[0].shape
    allow_zero = node.attrs.get("allowzero", 0)
    out = [src[i] if (d == 0 and not allow_zero) else d for i, d in enumerate(shape)]
    if out.count(-1) > 1:
        raise ShapeInferenceError("Reshape target has more than one -1")
    known = prod([d for d in out if d != -1])
    total = ins[0].count
    if -1 in out:
        if known == 0 or total % known:
            raise ShapeInferenceError(f"cannot reshape {total} elements to {shape}: {total} is not "
                                      f"a multiple of {known}")
        out[out.index(-1)] = total // known
    if prod(out) != total:
        raise ShapeInferenceError(f"cannot reshape {total} elements to {shape}: that holds "
                                  f"{prod(out)}")
    return [Layout(tuple(out), ins[0].dtype)]


@_view("Flatten", checked=25)
def _flatten(node, ins, deps):
    s = ins[0].shape
    axis = node.attrs.get("axis", 1)
    axis = axis + len(s) if axis < 0 else axis
    return [Layout((prod(s[:axis]), prod(s[axis:])), ins[0].dtype)]


def _axes(node, deps, idx=1):
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    if idx in deps and deps[idx] is not None:
        return [int(a) for a in np.asarray(deps[idx]).reshape(-1)]   # a scalar: one axis
    return None


@_view("Squeeze", checked=25, deps=(1,))
def _squeeze(node, ins, deps):
    s = ins[0].shape
    axes = _axes(node, deps)
    if axes is None:
        axes = [i for i, d in enumerate(s) if d == 1]
    axes = {norm_axis(a, len(s)) for a in axes}
    if any(s[a] != 1 for a in axes):
        raise ShapeInferenceError(f"Squeeze of a dim that is not 1 in {ins[0]}")
    return [Layout(tuple(d for i, d in enumerate(s) if i not in axes), ins[0].dtype)]


@_view("Unsqueeze", checked=25, deps=(1,))
def _unsqueeze(node, ins, deps):
    s = list(ins[0].shape)
    axes = _axes(node, deps)
    rank = len(s) + len(axes)
    for a in sorted(norm_axis(a, rank) for a in axes):
        s.insert(a, 1)
    return [Layout(tuple(s), ins[0].dtype)]


@_view("Identity", checked=25)
def _identity(node, ins, deps):
    return [Layout(ins[0].shape, ins[0].dtype)]


def _dropout_check(node, deps):
    # training_mode (opset 12+ input) with a ratio drops at random: not an inference
    t, r = deps.get(2), deps.get(1)
    ratio = 0.5 if r is None else float(r.reshape(-1)[0])
    if t is not None and bool(t.reshape(-1)[0]) and ratio != 0:
        raise ShapeInferenceError(f"Dropout {node.name}: training_mode=1 is not supported")


def split_dropout(node) -> list:
    """A Dropout whose mask is read (engine/program.py drops an unread one): the data output
    stays a view, the mask comes from `dropout_mask`."""
    if len(node.outputs) < 2 or not node.outputs[1]:
        return [node]
    return [replace(node, outputs=[node.outputs[0]]),
            replace(node, name=f"{node.name}_mask", op="dropout_mask", outputs=[node.outputs[1]])]


@register("Dropout", checked=22, view=True, shape_deps=(1, 2), host_ok=True, decompose=split_dropout)
def _dropout(node, ins, deps):
    # Inference (or a ratio of 0): output = input, a view. The mask output, when read, is
    # dropout_mask's (split at program build).
    _dropout_check(node, deps)
    return [Layout(ins[0].shape, ins[0].dtype)]


def _mask_kernels(node, ins, outs, deps):
    return [eltwise_call(node, [], outs[0], "(TOUT)1", inputs=())]


# nothing is dropped: the mask is all true (f16: the kernel never reads the data)
@register("dropout_mask", kernels=_mask_kernels, shape_deps=(1, 2), internal=True, f16=True)
def _dropout_mask(node, ins, deps):
    _dropout_check(node, deps)
    if node.opset < 12:
        # before Dropout-12 the mask's values in inference are not stated: onnxruntime writes
        # zeros (false), ONNX's reference true; Dropout-7's mask has the data's type
        raise ShapeInferenceError(f"Dropout {node.name}: the mask output of Dropout before "
                                  f"opset 12 is not supported (onnxruntime and ONNX's reference "
                                  f"disagree on its values)")
    return [Layout(ins[0].shape, "bool")]


# ---- strided copies ----------------------------------------------------------------------
# CPU Transposes copy by rows of the innermost dim (cl/movement.cl copy_rows), whatever its
# length: a row of one element costs what copy_strided's element does, and one kernel for
# every shape keeps a decode loop's k^T (rows: the past length) from switching impls as it
# grows. PoCL, BERT (MiniLM) 2 layers, q's heads split in each layer ([1, s, 12, 32]: rows of
# 32), summed kernel time, same process alternating, load ~3: seq 128 1.70 ms by elements,
# 0.060 by rows (a static build by elements: 1.02, by rows: 0.048); seq 32 0.420 / 0.016 ms.
# Shape-agnostic impls only: a static build would add little.
def by_rows(call: KernelCall) -> KernelCall:
    """copy_call's call as copy_rows: a work-item per row of the region's last dim."""
    w = max(call.dims[1][-1], 1) if call.dims[1] else 1
    count = prod(call.dims[1])
    return replace(call, kernel="copy_rows", jit=call.jit + (("COPY_ROWS", 1),), gws=(max(count // w, 1),))


def _transpose_kernels(node, ins, outs, deps, device="gpu"):
    src = ins[0].shape
    perm = node.attrs.get("perm", list(range(len(src)))[::-1])
    st = contiguous_strides(ins[0].phys)
    call = copy_call(node, ins[0].dtype, outs[0].shape, [st[p] for p in perm], 0,
                     contiguous_strides(outs[0].shape), 0)
    return [by_rows(call) if device == "cpu" else call]


def _transpose_keeps_order(node, ins, outs, deps) -> bool:
    """Moving only dims of size 1 leaves the memory order as it is."""
    s = ins[0].shape
    perm = node.attrs.get("perm", list(range(len(s)))[::-1])
    moved = [p for p in perm if s[p] != 1]
    return moved == sorted(moved)


def _same_shape(node, ins, outs, deps) -> bool:
    return tuple(ins[0].shape) == tuple(outs[0].shape)


@register("Transpose", checked=25, f16=True, kernels=_transpose_kernels, padded_ok=True,
          runtime_skip=_transpose_keeps_order, host_ok=True, per_device=True)
def _transpose(node, ins, deps):
    s = ins[0].shape
    perm = node.attrs.get("perm", list(range(len(s)))[::-1])
    if sorted(perm) != list(range(len(s))):
        raise ShapeInferenceError(f"bad perm {perm} for {ins[0]}")
    return [Layout(tuple(s[p] for p in perm), ins[0].dtype)]


def _concat_kernels(node, ins, outs, deps):
    axis = norm_axis(node.attrs["axis"], outs[0].rank)
    ost = contiguous_strides(outs[0].shape)
    calls, pos = [], 0
    for i, l in enumerate(ins):
        if l.count:
            calls.append(copy_call(node, l.dtype, l.shape, contiguous_strides(l.phys), 0,
                                   ost, pos * ost[axis], src=("in", i)))
        pos += l.shape[axis]
    return calls


@register("Concat", checked=13, f16=True, kernels=_concat_kernels, padded_ok=True, host_ok=True)
def _concat(node, ins, deps):
    rank = ins[0].rank
    axis = norm_axis(node.attrs["axis"], rank)
    out = list(ins[0].shape)
    for l in ins[1:]:
        if l.rank != rank or any(l.shape[d] != out[d] for d in range(rank) if d != axis):
            raise ShapeInferenceError(f"Concat inputs {ins[0]} and {l} differ off axis {axis}")
        out[axis] += l.shape[axis]
    return [Layout(tuple(out), ins[0].dtype)]


def _slice_params(node, ins, deps):
    """Per-dim (start, step) and the output shape, numpy semantics (opset 1 attrs or 10+ inputs)."""
    shape = ins[0].shape
    if "starts" in node.attrs:  # opset < 10
        starts, ends = node.attrs["starts"], node.attrs["ends"]
        axes, steps = node.attrs.get("axes"), None
    else:
        starts, ends = [int(v) for v in deps[1]], [int(v) for v in deps[2]]
        axes = [int(v) for v in deps[3]] if deps.get(3) is not None else None
        steps = [int(v) for v in deps[4]] if deps.get(4) is not None else None
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    start = [0] * len(shape)
    step = [1] * len(shape)
    out = list(shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis(a, len(shape))
        if st == 0:
            raise ShapeInferenceError("Slice step 0")
        rng = range(shape[a])[slice(s, e, st)]
        start[a], step[a], out[a] = (rng.start if len(rng) else 0), st, len(rng)
    return start, step, tuple(out)


def _slice_kernels(node, ins, outs, deps):
    start, step, out = _slice_params(node, ins, deps)
    st = contiguous_strides(ins[0].phys)
    off = sum(a * b for a, b in zip(start, st))
    return [copy_call(node, ins[0].dtype, out, [a * b for a, b in zip(st, step)], off,
                      contiguous_strides(out), 0)]


def _slice_is_identity(node, ins, outs, deps) -> bool:
    start, step, out = _slice_params(node, ins, deps)
    return tuple(out) == tuple(ins[0].shape) and not any(start) and all(x == 1 for x in step)


def _slice_in_place(node, ins, outs, deps):
    """The slice's offset when it is one contiguous run of the input: every dim before its first
    dim over 1 is 1, every dim after that one whole, unit steps where a dim is over 1 (a decode
    step's row of a position table, a KV window along the outermost axis)."""
    start, step, out = _slice_params(node, ins, deps)
    shape = ins[0].shape
    k = next((i for i, o in enumerate(out) if o > 1), len(out) - 1)
    if any(o != d for o, d in zip(out[k + 1:], shape[k + 1:])) or \
            any(st != 1 for st, o in zip(step, out) if o > 1):
        return None
    return (sum(a * b for a, b in zip(start, contiguous_strides(shape))),)


@register("Slice", checked=13, f16=True, kernels=_slice_kernels, padded_ok=True, runtime_skip=_slice_is_identity,
          in_place_crop=_slice_in_place, shape_deps=(1, 2, 3, 4), host_ok=True)
def _slice(node, ins, deps):
    return [Layout(_slice_params(node, ins, deps)[2], ins[0].dtype)]


def _expand_kernels(node, ins, outs, deps):
    out = outs[0].shape
    src = (1,) * (len(out) - ins[0].rank) + tuple(ins[0].shape)
    st = contiguous_strides((1,) * (len(out) - ins[0].rank) + tuple(ins[0].phys))
    return [copy_call(node, ins[0].dtype, out, [0 if d == 1 else s for d, s in zip(src, st)], 0,
                      contiguous_strides(out), 0)]


@register("Expand", checked=13, f16=True, kernels=_expand_kernels, padded_ok=True, runtime_skip=_same_shape, shape_deps=(1,), host_ok=True)
def _expand(node, ins, deps):
    return [Layout(broadcast(ins[0].shape, tuple(int(v) for v in deps[1])), ins[0].dtype)]


def _gather_kernels(node, ins, outs, deps):
    data, idx = ins[0], ins[1]
    axis = norm_axis(node.attrs.get("axis", 0), data.rank)
    outer = prod(data.shape[:axis])
    inner = prod(data.shape[axis + 1:])
    return [KernelCall("gather", "gather",
                       (("T", bits_type(data.dtype)), ("TIDX", cl_type(idx.dtype)), ("IMPL_TAG", "Gather")),
                       args=(("in", 0), ("in", 1), ("out", 0), ("flag", 0)),   # engine/index_flags.py
                       params=(outer, data.shape[axis], inner, idx.count), gws=(max(outs[0].count, 1),))]


@register("Gather", checked=13, f16=True, kernels=_gather_kernels, host_ok=True, fusion_producer=True)
def _gather(node, ins, deps):
    data, idx = ins
    axis = norm_axis(node.attrs.get("axis", 0), data.rank)
    if idx.dtype not in ("i64", "i32"):
        raise ShapeInferenceError("Gather indices must be int64 or int32")
    return [Layout(data.shape[:axis] + idx.shape + data.shape[axis + 1:], data.dtype)]
