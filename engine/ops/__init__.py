"""The op registry: one `OpDef` per ONNX op type, defined in the family modules of this package.

An op says three things, all from the current input layouts (never from a previous run):
- `infer(node, ins, deps)`: output layouts; `deps` holds the host values of the inputs listed
  in `shape_deps` (the seed's memory deps: Reshape's target, Slice's starts, ...);
- `kernels(node, ins, outs, deps)`: the `KernelCall`s of its shape-agnostic device impl;
- or `view=True` when its output is its first input's buffer under a new layout (no kernel);
- optionally `static(node, ins, outs, deps, consts)`: a `StaticVariant` for a static build of
  these shapes (None when it has none for them), `consts` the indices of constant inputs;
  `weights`: the input index holding weights (update_weights);
- optionally `decompose(node)`: the internal ops (`internal=True`) the device runs instead.
Every op also runs as a host impl (onnx.reference) inside shape subgraphs and constant folding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

OPS: dict[str, "OpDef"] = {}


@dataclass
class OpDef:
    name: str
    infer: Callable
    kernels: Callable | None = None
    shape_deps: tuple = ()             # input indices whose values shape inference reads
    view: bool = False                 # output aliases input 0's buffer
    host_ok: bool = False              # may run on the host inside a shape subgraph
    dynamic_output: bool = False       # output shape depends on data (NonZero, ...)
    padded_ok: bool = False            # kernels read padded input layouts (Layout.pad)
    # runtime_skip(node, ins, outs, deps) -> True when, for these shapes, the output is the input
    # unchanged (a Transpose of unit dims, a no-op Slice/Expand): it becomes a view at run time
    runtime_skip: Callable | None = None
    static: Callable | None = None     # StaticVariant for the current shapes (engine/impls.py)
    weights: int | None = None         # input index of the weights (when constant)
    # decompose(node) -> [Node]: the primitives the device runs instead (program build, as the
    # GPU plugin's program builder splits NonZero into count_nonzero + gather_nonzero)
    decompose: Callable | None = None
    internal: bool = False             # made only by decompose: never accepted from a model
    # kernels (and static) take device="cpu" | "gpu": work-group shapes per device kind (GPUs: a
    # work-group per row with a local reduction; CPUs: a work-item per row, no barriers)
    per_device: bool = False
    # kernels read/write float16 tensors (engine/f16.py); other ops get f16 <-> f32 Casts
    f16: bool = False


def register(name: str, **kw):
    def deco(fn):
        OPS[name] = OpDef(name=name, infer=fn, **kw)
        return fn
    return deco


def supported_ops() -> list[str]:
    return sorted(k for k, v in OPS.items() if not v.internal)


# Importing the families fills OPS.
from engine.ops import eltwise, matmul, movement, shape_ops, conv, pool, norm, nonzero  # noqa: E402,F401
from engine.ops import attention  # noqa: E402,F401
from engine.ops import activation, logic, reduce, indexing, arrange, einsum, norm_stats  # noqa: E402,F401
from engine.ops import deconv, resize, group_norm, space_depth, topk, unique  # noqa: E402,F401
