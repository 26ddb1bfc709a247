"""Errors of an inference in words a user can act on: which node failed, on which input
shapes, and what in the model limits them (host shape subgraphs, the GPU plugin's
overall_flow.md, fail in numpy, whose message names neither)."""
from __future__ import annotations

import numpy as np

from engine.ops.common import BroadcastError, ShapeInferenceError


class InferenceError(RuntimeError):
    """An inference could not run for these inputs; the message says why, in one line."""


def _shape_text(shape) -> str:
    return "x".join(str(d) for d in shape) if len(shape) else "scalar"


def _upstream_constants(inst, prog, depth: int = 4) -> list[tuple[str, tuple]]:
    """(name, dims) of the constants feeding the node, directly or through host shape nodes;
    not those it reads as values (a Reshape's shape: its length limits no dim)."""
    values = {inst.node.inputs[i] for i in inst.opdef.shape_deps if i < len(inst.node.inputs)}
    seen, out = set(values), []

    def walk(names, d):
        for n in names:
            if not n or n in seen:
                continue
            seen.add(n)
            if n in prog.constants:
                out.append((n, tuple(np.shape(prog.constants[n]))))
            elif d and n in prog.producers and prog.producers[n][0].host:
                walk(prog.producers[n][0].inputs, d - 1)
    walk(inst.node.inputs, depth)
    return out


def _numbers(values) -> set[int]:
    """Every dim of the inputs, and the entries of small integer inputs (shape values)."""
    nums = set()
    for v in values:
        if v is None:
            continue
        nums.update(int(d) for d in np.shape(v))
        a = np.asarray(v)
        if a.dtype.kind in "iu" and a.size <= 16:
            nums.update(int(x) for x in a.ravel())
    return nums


def limit_of(inst, buffers, shapes, nums) -> str:
    """'input_ids seq 264 exceeds a constant of 256 along that axis (embeddings.position_ids)'
    when a graph input dim is larger than a dim of a constant the failing node reads, and both
    show in the node's inputs (`shapes`; `nums`: their dims and small integer values); '' when
    nothing explains it."""
    dims = {int(d) for s in shapes if s is not None for d in s}
    prog = buffers.program
    # the graph inputs whose shape the node's shape subgraph reads come first
    read = {n.inputs[0] for n in prog.nodes if n.name in inst.node.shape_sources}
    found = []   # (input not read, other axis, text): the likeliest explanation sorts first
    for cname, cdims in _upstream_constants(inst, prog):
        for caxis, c in enumerate(cdims):
            if c <= 1 or c not in dims:   # 1 broadcasts: it limits nothing
                continue
            for iname, names in prog.input_dim_names.items():
                layout = buffers.tensors[iname].layout
                for axis, v in enumerate(layout.shape if layout is not None else ()):
                    if v > c and v in nums:
                        dim = names[axis] if axis < len(names) and isinstance(names[axis], str) \
                            else f"dim {axis}"
                        found.append((iname not in read, axis != caxis, f"{iname} {dim} {v} exceeds a constant of {c} "
                                                     f"along that axis ({cname})"))
    if found:
        return min(found)[2]
    return ""


class NodeShapeError(InferenceError, ShapeInferenceError):
    """A device node's shape inference refused its inputs: still the op's ShapeInferenceError
    to callers that catch that, in the user's words."""


def cannot_run(node, shapes, why: str, cls=InferenceError) -> InferenceError:
    """'node n (Op) cannot run on input shapes [1x8, 3]: why' (`shapes`: None where absent)."""
    text = ", ".join(_shape_text(s) if s is not None else "-" for s in shapes)
    return cls(f"node {node.name} ({node.op}) cannot run on input shapes [{text}]: {why}")


def _failure(inst, buffers, shapes, nums, exc: Exception, cls=InferenceError) -> InferenceError:
    own = (str(exc).splitlines() or ["failed"])[0]
    # an index past a table's end (a position past a decoder's table): numpy's words name the
    # index, the axis and the size; a dim of the constant it reads may be another axis's
    why = own if isinstance(exc, IndexError) else limit_of(inst, buffers, shapes, nums) or own
    return cannot_run(inst.node, shapes, why, cls)


def node_failure(inst, buffers, values, exc: Exception) -> InferenceError:
    """The error of host node `inst` failing on input `values` (host arrays, None where
    absent); `buffers` (engine/buffers.py) holds the program and the tensors' current layouts."""
    return _failure(inst, buffers, [None if v is None else np.shape(v) for v in values],
                    _numbers(values), exc)


def shape_failure(inst, buffers, in_layouts, deps: dict, exc: Exception) -> InferenceError:
    """The error of device node `inst` whose shape inference refused `in_layouts` (the op's
    ShapeInferenceError, or a dim numpy cannot hold); `deps`: the host values it read. Only
    shapes that do not broadcast are explained by a constant's dim (a Conv's kernel size, say,
    limits no input dim: the op's own words say more)."""
    shapes = [None if l is None else tuple(l.shape) for l in in_layouts]
    nums = {int(d) for s in shapes if s is not None for d in s} | _numbers(deps.values()) \
        if isinstance(exc, BroadcastError) else set()
    return _failure(inst, buffers, shapes, nums, exc, NodeShapeError)


def nbytes_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


class DeviceMemoryError(InferenceError):
    """A buffer the device cannot give."""


def too_large(nbytes: int, held: int, global_mem: int, max_alloc: int) -> str:
    """Why a buffer of `nbytes` cannot be had with `held` bytes already held ('' if it can)."""
    if nbytes > max_alloc:
        return (f"the device's largest buffer is {nbytes_text(max_alloc)} (max_mem_alloc_size; "
                f"{nbytes_text(global_mem)} in all, global_mem_size)")
    if held + nbytes > global_mem:
        return (f"{nbytes_text(held)} are held already and the device has {nbytes_text(global_mem)} "
                f"in all (global_mem_size)")
    return ""
