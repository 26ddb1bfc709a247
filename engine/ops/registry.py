"""The op registry: one `OpDef` per ONNX op type, registered by the family modules of
engine/ops/ with `@register(name, **what the engine needs to know about the op)`. An op of
another domain (com.microsoft, engine/ops/ms/) is keyed `domain::type` (`op_key`) and says
how it runs as ONNX-domain nodes (`expand`).

An op says these things, all from the current input layouts (never from a previous run):
- `infer(node, ins, deps)`: output layouts; `deps` holds the host values of the inputs listed
  in `shape_deps` (the memory deps of the GPU plugin's preprocessing.md: Reshape's target,
  Slice's starts, ...);
- `kernels(node, ins, outs, deps)`: the `KernelCall`s of its shape-agnostic device impl;
- or `view=True` when its output is its first input's buffer under a new layout (no kernel);
- optionally `static(node, ins, outs, deps, consts)`: a `StaticVariant` for a static build of
  these shapes (None when it has none for them), `consts` the indices of constant inputs;
  `static_on`: the device kinds where that static build is worth making under `--impls auto`;
  `weights`: the input index holding weights (update_weights);
- optionally `decompose(node)`: the internal ops (`internal=True`) the device runs instead;
- how it fuses (engine/fusion.py): `fuse_expr`, `fusion_producer`, `prologue`;
- `checked`: the newest ONNX schema version its implementation was read against
  (engine/opsets.py);
- a domain op: `expand(node, ctx)`, the ONNX-domain nodes it is rewritten into at load
  (engine/domain_ops.py), before anything else sees the graph; its `infer` never runs.
Every op also runs as a host impl (onnx.reference, or engine/host_ops.py) inside shape
subgraphs and constant folding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

OPS: dict[str, "OpDef"] = {}

# the ONNX domain's names; ops of any other domain are keyed `domain::type`
ONNX_DOMAINS = ("", "ai.onnx")


def op_key(domain: str, op_type: str) -> str:
    """The registry key of an op: its type in the ONNX domain, `domain::type` in another
    (`com.microsoft::Attention`, as `dyncli inspect` names it)."""
    return op_type if domain in ONNX_DOMAINS else f"{domain}::{op_type}"


def domains() -> set[str]:
    """The non-ONNX domains the registry holds ops of (a model using another is refused)."""
    return {d.domain for d in OPS.values() if d.domain not in ONNX_DOMAINS}

# the schema version an op is taken as checked against when its register() names none (the
# opset the engine was first written for)
DEFAULT_CHECKED = 21


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
    # in_place_crop(node, ins, outs, deps) -> each output's element offset in input 0 when, for
    # these shapes, every output is one contiguous run of it (else None): the outputs become
    # slices of the input's buffer at run time (the plugin's runtime in-place crop)
    in_place_crop: Callable | None = None
    static: Callable | None = None     # StaticVariant for the current shapes (engine/kernels.py)
    # device kinds ("cpu", "gpu") where `static` is built in `--impls auto` (the GPU plugin's
    # dynamic_impl.md: static impls for the critical ops); measured per op where it registers
    static_on: frozenset = frozenset()
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
    # fusion (engine/fusion.py). fuse_expr: the C expression over a, b, c (float32) with which
    # the op runs inside another node's kernel, or a function of the node giving it; None: the
    # op is never fused into another. A binary one also runs in a consumer's prologue.
    fuse_expr: str | Callable | None = None
    # the op's kernel stores through the FUSED_OPS hook (cl/common.cl): it takes an epilogue
    fusion_producer: bool = False
    # the op's kernel reads input 0 through the PROLOGUE_OPS hook: the longest chain of binary
    # fusable ops it takes there (0: none)
    prologue: int = 0
    checked: int = DEFAULT_CHECKED     # newest schema version checked (engine/opsets.py)
    domain: str = ""                   # "" for ONNX; a domain op is keyed op_key(domain, name)
    # expand(node: onnx.NodeProto, ctx): writes a domain op's ONNX-domain nodes through ctx
    # (engine/domain_ops.py ExpandContext)
    expand: Callable | None = None
    # If / Loop: runs its subgraphs as instances of their own (engine/control_flow.py), its
    # outputs known only once they ran
    control: bool = False


def register(name: str, **kw):
    def deco(fn):
        OPS[op_key(kw.get("domain", ""), name)] = OpDef(name=name, infer=fn, **kw)
        return fn
    return deco


def register_expansion(domain: str, name: str, checked: int = 1):
    """Register `fn(node, ctx)` as how `domain::name` runs (`checked`: the domain's version of
    the op read)."""
    def deco(fn):
        OPS[op_key(domain, name)] = OpDef(name=name, infer=_expanded_at_load, domain=domain,
                                          expand=fn, checked=checked)
        return fn
    return deco


def _expanded_at_load(node, ins, deps):
    raise AssertionError(f"{node.op} is expanded at load and never inferred")


def supported_ops() -> list[str]:
    return sorted(k for k, v in OPS.items() if not v.internal)
