"""CastLike: Cast to the element type of its second input (exporters write it where a
constant must follow an input's type), on Cast's kernel (engine/ops/eltwise.py)."""
from __future__ import annotations

from dataclasses import replace

from engine.layout import Layout
from engine.ops.registry import OPS, register

_CAST = OPS["Cast"]


def _kernels(node, ins, outs, deps):
    # only the value is read: the target's data never reaches the kernel
    return _CAST.kernels(replace(node, inputs=node.inputs[:1]), ins[:1], outs, deps)


# saturate only matters for float8 targets, which are not device types
@register("CastLike", checked=25, kernels=_kernels, host_ok=True, f16=True, padded_ok=True)
def _cast_like(node, ins, deps):
    return [Layout(ins[0].shape, ins[1].dtype)]
