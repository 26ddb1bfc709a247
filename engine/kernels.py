"""Kernel sources, program builds and the shape_info buffer layout (seed 003).

A `KernelCall` is what an op asks the engine to enqueue: which source and kernel, the JIT
constants that make it (op, dtypes, attributes: never shapes, so one build serves every shape),
the tensor arguments, the op's integer parameters and the work sizes. The engine prepends the
JIT constants as `#define` lines, builds once per (source, jit) and lets pyopencl's on-disk
binary cache serve later runs.
"""
from __future__ import annotations

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
    args: tuple                      # tensor refs: ("in", i) | ("out", i)
    params: tuple = ()               # op integer params, appended to shape_info
    gws: tuple = (1,)
    lws: tuple | None = None
    dims: dict = field(default_factory=dict)  # arg position -> dims to use instead of the layout's


@dataclass
class Impl:
    """A compiled program for one (source, jit): the dynamic (shape-agnostic) impl of a node."""
    name: str
    kind: str                        # "dynamic" | "static"
    program: cl.Program
    compile_ms: float


def load_source(name: str) -> str:
    return (resources.files("cl") / f"{name}.cl").read_text()


def jit_header(jit: tuple, dynamic: bool = True) -> str:
    lines = [f"#define IS_DYNAMIC {1 if dynamic else 0}"]
    lines += [f"#define {k} {v}" for k, v in jit]
    return "\n".join(lines) + "\n"


def impl_name(source: str, jit: tuple) -> str:
    d = dict(jit)
    tag = d.get("IMPL_TAG", "")
    return f"{source}{':' + str(tag) if tag else ''}{'+fused' if 'FUSED_OPS_BODY' in d else ''}"


def build_program(ctx: cl.Context, source: str, jit: tuple, dynamic: bool = True) -> tuple[cl.Program, float]:
    src = jit_header(jit, dynamic) + load_source("common") + load_source(source)
    t0 = time.perf_counter()
    prg = cl.Program(ctx, src).build()
    return prg, (time.perf_counter() - t0) * 1e3


def align_dims(shape) -> list[int]:
    if len(shape) > MAX_RANK:
        raise ValueError(f"rank {len(shape)} tensors are not supported (max {MAX_RANK})")
    return [1] * (MAX_RANK - len(shape)) + [int(d) for d in shape]


def compose_shape_info(blocks: list[tuple[int, tuple]], params: tuple) -> np.ndarray:
    """blocks: (offset, dims) per tensor argument, in argument order."""
    vals = []
    for off, dims in blocks:
        vals.append(int(off))
        vals.extend(align_dims(dims))
    vals.extend(int(p) for p in params)
    return np.asarray(vals, dtype=np.int32)


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m
