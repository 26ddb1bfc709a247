"""Unique (flattened, or along an `axis`) on the device, split like NonZero (engine/ops/nonzero.py):

- `count_unique` (node `<name>_count`): a kernel writes the number of distinct values into a
  one-element int64 tensor;
- `gather_unique` (keeps the node's name and outputs Y, indices, inverse_indices, counts): its
  shape inference reads only that count (`shape_deps=(1,)`, 8 bytes from the device), and it
  is `dynamic_output`: update_shape runs on every inference. Its kernels (cl/unique.cl) mark
  first occurrences into an internal buffer, then scatter each distinct value to its slot.

`sorted=1` (default) orders the values (with an axis: the slices, lexicographically)
ascending, `sorted=0` by first occurrence, as onnxruntime does. Omitted optional outputs are
still written (to tensors of their own).
"""
from __future__ import annotations

from dataclasses import replace

from engine.kernels import KernelCall
from engine.layout import Layout, type_jit
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError, norm_axis

WG = 256


def _view(node, ins):
    """(A, inner, axis): the items compared are the A slices along the axis (without an axis,
    the n elements of the flattened input)."""
    x = ins[0]
    if x.dtype not in ("f32", "f16", "i64", "i32"):
        raise ShapeInferenceError(f"Unique {node.name}: element type {x.dtype} is not supported")
    if x.count >= 2**31:
        raise ShapeInferenceError(f"Unique {node.name}: input {x} too large")
    if node.attrs.get("axis") is None:
        return x.count, 1, None
    axis = norm_axis(int(node.attrs["axis"]), x.rank)
    inner = 1
    for d in x.shape[axis + 1:]:
        inner *= d
    return x.shape[axis], inner, axis


def _jit(node, ins, tag):
    return (*type_jit("T", ins[0].dtype), ("SORTED", int(node.attrs.get("sorted", 1))),
            ("WG", WG), ("IMPL_TAG", tag))


def _count_kernels(node, ins, outs, deps):
    a, inner, _ = _view(node, ins)
    return [KernelCall("unique", "count_unique", _jit(node, ins, "count_unique"),
                       (("in", 0), ("out", 0)), params=(a, inner), gws=(WG,), lws=(WG,))]


@register("count_unique", kernels=_count_kernels, internal=True, f16=True)
def _count(node, ins, deps):
    _view(node, ins)
    return [Layout((1,), "i64")]


def _gather_kernels(node, ins, outs, deps):
    a, inner, _ = _view(node, ins)
    mark = (Layout((a,), "i32"),)
    jit = _jit(node, ins, "gather_unique")
    return [KernelCall("unique", "mark_first", jit, (("in", 0), ("internal", 0)),
                       params=(a, inner), gws=(a,), internal=mark),
            KernelCall("unique", "scatter_unique", jit,
                       (("in", 0), ("internal", 0)) + tuple(("out", k) for k in range(4)),
                       params=(a, inner), gws=(a,), internal=mark)]


@register("gather_unique", kernels=_gather_kernels, shape_deps=(1,), dynamic_output=True,
          internal=True, f16=True)
def _gather(node, ins, deps):
    a, _, axis = _view(node, ins)
    u = int(deps[1].reshape(-1)[0])
    if not (0 < u <= a or u == a == 0):
        raise ShapeInferenceError(f"count_unique gave {u} for {ins[0]}")
    x = ins[0]
    y = (u,) if axis is None else tuple(u if d == axis else n for d, n in enumerate(x.shape))
    return [Layout(y, x.dtype), Layout((u,), "i64"), Layout((a,), "i64"), Layout((u,), "i64")]


def split_unique(node) -> list:
    """Unique -> count_unique + gather_unique; omitted outputs get names of their own."""
    count = f"{node.outputs[0]}_count"
    outs = list(node.outputs) + [""] * (4 - len(node.outputs))
    outs = [o or f"{node.name}::unused{k}" for k, o in enumerate(outs)]
    return [replace(node, name=f"{node.name}_count", op="count_unique", outputs=[count]),
            replace(node, op="gather_unique", inputs=[node.inputs[0], count], outputs=outs)]


# checked 11: Unique-28 is not checked yet (a model that picks it runs with the warning)
@register("Unique", checked=11, decompose=split_unique, dynamic_output=True)
def _unique(node, ins, deps):
    raise ShapeInferenceError(f"Unique node {node.name} was not split at program build")
