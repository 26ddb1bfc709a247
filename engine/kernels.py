"""Kernel sources, program builds and the shape_info buffer layout (the GPU plugin's
dynamic_impl.md).

A `KernelCall` is what an op asks the engine to enqueue: which source and kernel, the JIT
constants that make it (op, dtypes, attributes: never shapes, so one build serves every shape),
the tensor arguments, the op's integer parameters and the work sizes. The engine prepends the
JIT constants as `#define` lines, builds once per (source, jit) and lets pyopencl's on-disk
binary cache serve later runs.
"""
from __future__ import annotations

import os

import time
from dataclasses import dataclass, field
from importlib import resources

import numpy as np
import pyopencl as cl

MAX_RANK = 6  # must match cl/common.cl


@dataclass
class KernelCall:
    source: str                      # cl/<source>.cl
    kernel: str                      # kernel function name
    jit: tuple                       # ((name, value), ...) shape-independent
    # tensor refs: ("in", i) | ("out", i) | ("internal", k) | ("flag", 0) (the index flags' slot)
    args: tuple
    params: tuple = ()               # op integer params, appended to shape_info
    gws: tuple = (1,)
    lws: tuple | None = None
    dims: dict = field(default_factory=dict)  # arg position -> dims to use instead of the layout's
    # layouts of the node's internal buffers (scratch) for these shapes, ("internal", k) in args;
    # every call of a node that uses them declares the same tuple
    internal: tuple = ()


@dataclass
class Impl:
    """A compiled program: a node's dynamic (shape-agnostic) impl, or a static one built for
    one ImplParams."""
    name: str
    kind: str                        # "dynamic" | "static"
    program: cl.Program
    compile_ms: float
    nbytes: int = 0                  # host bytes it holds (program_bytes)
    evicted: bool = False            # the impl cache let it go (nodes keep no spare kernel of it)


# Host bytes a built program holds on a CPU OpenCL runtime: its JIT-compiled code and the
# compiler's module, which BINARY_SIZES (the IR: tens of KiB) does not show. Measured as the
# growth of the process per cached static impl over a soak run (scripts/soak.py, the example
# encoder; the same run with --impl-cache-capacity 20 stays flat): Intel's CPU runtime about
# 4 MiB, PoCL about 1.2 MiB. An unknown CPU runtime is taken as the larger.
CPU_PROGRAM_BYTES = {"intel": 4 << 20, "portable computing language": 1200 << 10}


def program_bytes(program: cl.Program, device: cl.Device) -> int:
    """Host bytes `program` holds: a CPU runtime's measured figure, or (a GPU's code lives in
    the driver) the binary's size. A CPU device's binary is never asked for: PoCL generates it
    on that query (3.7 s of the README encoder's first inference with empty caches, 0.6 s of
    each later static switch), and its IR is far below the measured figure anyway."""
    if device.type & cl.device_type.CPU:
        name = device.platform.name.lower()
        return next((v for k, v in CPU_PROGRAM_BYTES.items() if k in name), max(CPU_PROGRAM_BYTES.values()))
    return sum(program.get_info(cl.program_info.BINARY_SIZES))


@dataclass(frozen=True)
class ImplParams:
    """The impl cache key (the GPU plugin's kernel_impl_params): op, kernel source, the whole JIT
    (attributes, tile choices, fused ops) and, for static impls, every tensor argument's dims
    (fake-aligned where the op says so) and the op's integer params. Dynamic impls have no
    shapes: one build serves them all. Tensor offsets are never part of a key (static kernels
    read them at run time, cl/common.cl)."""
    kind: str                        # "dynamic" | "static"
    op: str
    source: str
    jit: tuple
    shapes: tuple | None = None      # per tensor argument: dims
    params: tuple = ()

    def table(self) -> str:
        """SHAPE_INFO_INIT of a static build (offsets 0: read at run time)."""
        info = compose_shape_info([(0, d) for d in self.shapes], self.params)
        return "{" + ",".join(str(int(v)) for v in info) + "}"


def dynamic_key(source: str, jit: tuple) -> ImplParams:
    """The impl cache key of a shape-agnostic impl (`jit` with NUM_TENSORS)."""
    return ImplParams("dynamic", dict(jit).get("IMPL_TAG", source), source, jit)


@dataclass(frozen=True)
class WeightsLayout:
    """A weight layout a static impl wants (update_weights): `name` and `shape` say what the
    reordered copy is; `jit` configures cl/reorder.cl; `compatible` when the original buffer
    already holds exactly this layout (reinterpret, no reorder)."""
    name: str
    shape: tuple
    jit: tuple
    params: tuple
    compatible: bool = False


@dataclass
class StaticVariant:
    """What an op offers for a static build of its current shapes: the call to enqueue (real
    dims and params, used for the runtime shape_info and work sizes), the shapes and params the
    build bakes in (fake-aligned), a tag for its name and the weight layout it wants (None:
    the original one)."""
    call: KernelCall
    table_dims: dict                 # arg position -> dims baked in; others: the call's dims
    table_params: tuple
    tag: str
    weights: WeightsLayout | None = None


def load_source(name: str) -> str:
    return (resources.files("cl") / f"{name}.cl").read_text()


def jit_header(jit: tuple, dynamic: bool = True) -> str:
    lines = [f"#define IS_DYNAMIC {1 if dynamic else 0}"]
    lines += [f"#define {k} {v}" for k, v in jit]
    return "\n".join(lines) + "\n"


def impl_name(source: str, jit: tuple) -> str:
    d = dict(jit)
    tag = d.get("IMPL_TAG", "")
    return f"{source}{':' + str(tag) if tag else ''}{'+fused' if 'FUSED_OPS_BODY' in d else ''}" \
        f"{'+prologue' if 'PROLOGUE_OPS_BODY' in d else ''}"


def build_options() -> list[str]:
    """OpenCL's `-w` (no compiler warnings: PoCL prints "N warnings generated." on stderr and
    pyopencl a CompilerWarning per build) unless DYNCLI_KERNEL_WARNINGS is set (`dyncli --debug`)."""
    return [] if os.environ.get("DYNCLI_KERNEL_WARNINGS") else ["-w"]


# Sources whose float divisions must be correctly rounded (OpenCL allows 2.5 ulp otherwise):
# quantization divides by the scale before rounding to an integer, where one ulp moves a tie
# (cl/quant.cl); onnxruntime's CPU kernels divide correctly rounded.
EXACT_DIVISION = {"quant"}


def compile_program(ctx: cl.Context, source: str, jit: tuple, dynamic: bool = True,
                    optimize: bool = True) -> tuple[cl.Program, float]:
    """Static builds (dynamic=False) need SHAPE_INFO_INIT among the JIT constants. `optimize`
    False: the compiler's optimizations off (ImplManager.optimize: a GPU kind's kernels on a
    CPU device)."""
    src = jit_header(jit, dynamic) + load_source("common") + load_source(source)
    options = build_options() + (["-cl-fp32-correctly-rounded-divide-sqrt"] if source in EXACT_DIVISION else []) + \
        ([] if optimize else ["-cl-opt-disable"])
    t0 = time.perf_counter()
    prg = cl.Program(ctx, src).build(options=options)
    return prg, (time.perf_counter() - t0) * 1e3


def shape_info_values(blocks: list[tuple[int, tuple]], params: tuple) -> list:
    """The shape_info block's values: per tensor argument (blocks: (offset, dims), in argument
    order) its offset and its dims aligned to MAX_RANK, then the kernel's parameters. Dims may
    be symbolic (engine/symbolic.py: a compiled plan's trace)."""
    vals = []
    for off, dims in blocks:
        if len(dims) > MAX_RANK:
            raise ValueError(f"rank {len(dims)} tensors are not supported (max {MAX_RANK})")
        vals.append(off)
        vals += [1] * (MAX_RANK - len(dims))
        vals += dims
    vals += params
    return vals


def compose_shape_info(blocks: list[tuple[int, tuple]], params: tuple) -> np.ndarray:
    """blocks: (offset, dims) per tensor argument, in argument order."""
    return np.asarray([int(v) for v in shape_info_values(blocks, params)], dtype=np.int32)


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m
