"""Helpers shared by the op families: broadcasting, axis normalisation, ONNX type codes."""
from __future__ import annotations

import re

import numpy as np
from onnx import TensorProto

from engine.kernels import KernelCall, MAX_RANK
from engine.layout import Layout, dtype_from_onnx, type_jit
from engine.symbolic import dim


class ShapeInferenceError(ValueError):
    pass


class BroadcastError(ShapeInferenceError):
    """Shapes that do not broadcast: a dim past what a constant allows, most often."""


def broadcast(*shapes) -> tuple:
    """numpy's broadcasting of dims, in plain Python: every new shape of a decode step asks for
    a few (np.broadcast_shapes costs 5-6 us a call, this under 1 for ranks <= 6)."""
    rank = max(map(len, shapes), default=0)
    out = [1] * rank
    for s in shapes:
        at = rank - len(s)
        for i, d in enumerate(s):
            d, o = dim(d), out[at + i]
            if d != o and d != 1:
                if o != 1:
                    raise BroadcastError(
                        "shapes " + ", ".join("x".join(map(str, s)) or "scalar" for s in shapes)
                        + " do not broadcast")
                out[at + i] = d
    return tuple(out)


def norm_axis(axis: int, rank: int) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise ShapeInferenceError(f"axis {axis} out of range for rank {rank}")
    return a


def onnx_dtype(code: int) -> str:
    dt = dtype_from_onnx(code)
    if dt is None:
        raise ShapeInferenceError(f"element type {TensorProto.DataType.Name(code)} is not supported")
    return dt


def contiguous_strides(shape) -> list[int]:
    strides, s = [], 1
    for d in reversed(shape):
        strides.append(s)
        s = s * dim(d)
    return strides[::-1]


def eltwise_call(node, ins: list[Layout], out: Layout, expr: str, dims: dict | None = None,
                 inputs: tuple | None = None) -> KernelCall:
    """One eltwise kernel computing `expr` over (a, b, c, d, e) = the node's inputs."""
    idx = tuple(range(len(ins))) if inputs is None else inputs
    n = len(idx)
    dims = dims or {}
    in_dims = [dims.get(k, ins[i].shape) for k, i in enumerate(idx)]
    flat = all(tuple(d) == tuple(out.shape) for d in in_dims)
    # the expression computes in the compute types (float for f16): TOUT there means TOUT_C
    expr = re.sub(r"\bTOUT\b", "TOUT_C", expr)
    jit = [("NUM_INPUTS", n), *type_jit("TOUT", out.dtype),
           ("OPERATION(a, b, c, d, e)", f"({expr})"), ("IMPL_TAG", node.op)]
    for k, i in enumerate(idx):
        jit += type_jit(f"T{k}", ins[i].dtype)
    # flat runs load and store 4 elements as vectors, except half (vload_half is scalar here)
    jit.append(("ELT_VEC", int("f16" not in [out.dtype] + [ins[i].dtype for i in idx])))
    return KernelCall("eltwise", "eltwise", tuple(jit),
                      args=tuple(("in", i) for i in idx) + (("out", 0),),
                      params=(1 if flat else 0,),
                      gws=(max((out.count + 3) // 4 if flat else out.count, 1),), dims=dims)


__all__ = ["ShapeInferenceError", "BroadcastError", "broadcast", "norm_axis", "onnx_dtype", "contiguous_strides",
           "eltwise_call", "MAX_RANK", "Layout"]
