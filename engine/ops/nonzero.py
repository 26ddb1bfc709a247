"""NonZero, run on the device the GPU plugin's way: the program splits it into two primitives.

- `count_nonzero` (node `<name>_count`): a kernel writes the number of nonzero elements into a
  one-element int64 tensor; its output layout never depends on data.
- `gather_nonzero` (keeps the node's name and output): its shape inference has the count as its
  only memory dep (`shape_deps=(1,)`), so the one device-to-host read for its shape is those
  8 bytes, not the input; then a kernel writes the [rank, count] int64 indices in row-major
  order of the nonzero elements, as ONNX does. Its output depends on data (`dynamic_output`):
  update_shape runs on every inference, even when its input layouts are unchanged.

A 0-D input gives [1, count] indices (all 0), as onnxruntime does. Inside a shape subgraph (host
values) or under constant folding NonZero stays one node, run by the host impl.
"""
from __future__ import annotations

from dataclasses import replace

from engine.kernels import KernelCall
from engine.layout import Layout, bits_type
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError

# One work-group runs each kernel (cl/nonzero.cl says why): its size, fixed so that one build
# serves every shape.
WG = 256


def _call(kernel, ins, params=()) -> KernelCall:
    # f16 is read as its bits: nonzero unless only the sign bit is set (-0.0)
    nz = (("NZ(v)", "(((v) & 0x7fff) != 0)"),) if ins[0].dtype == "f16" else ()
    return KernelCall("nonzero", kernel, (("T", bits_type(ins[0].dtype)), ("WG", WG),
                                          ("IMPL_TAG", kernel)) + nz,
                      args=(("in", 0), ("out", 0)), params=params, gws=(WG,), lws=(WG,))


def _rows(layout: Layout) -> int:
    return max(layout.rank, 1)


def _count_kernels(node, ins, outs, deps):
    return [_call("count_nonzero", ins)]


@register("count_nonzero", kernels=_count_kernels, internal=True, f16=True)
def _count(node, ins, deps):
    return [Layout((1,), "i64")]


def _gather_kernels(node, ins, outs, deps):
    # the count input is a shape dep only: the kernel learns it from the output dims
    return [_call("gather_nonzero", ins, params=(_rows(ins[0]),))]


@register("gather_nonzero", kernels=_gather_kernels, shape_deps=(1,), dynamic_output=True,
          internal=True, f16=True)
def _gather(node, ins, deps):
    count = int(deps[1].reshape(-1)[0])
    if not 0 <= count <= ins[0].count:
        raise ShapeInferenceError(f"count_nonzero gave {count} for {ins[0]}")
    return [Layout((_rows(ins[0]), count), "i64")]


def split_nonzero(node) -> list:
    """NonZero -> count_nonzero + gather_nonzero (the GPU plugin's CreateNonZeroOp)."""
    count = f"{node.outputs[0]}_count"
    return [replace(node, name=f"{node.name}_count", op="count_nonzero", outputs=[count]),
            replace(node, op="gather_nonzero", inputs=[node.inputs[0], count])]


@register("NonZero", checked=13, decompose=split_nonzero, dynamic_output=True, host_ok=True)
def _nonzero(node, ins, deps):
    # never reached on the device: the program runs count_nonzero + gather_nonzero instead
    raise ShapeInferenceError(f"NonZero node {node.name} was not split at program build")
