"""Parallel builds ahead of an inference of new shapes (cold start, first-seen shapes).

A node's shape-agnostic impl is built the first time the node asks for it, in the flow's
critical path, one program after another. Before the first inference's flow runs, this walks
the program once on the input shapes of each new signature (pure shape inference: the nodes'
`layouts_for` and `dynamic_calls_for`, the host impls of shape subgraphs; nothing written to the
network's tensors or nodes' state but their memo tables, whose answers the flow then finds),
collects every (source, jit) the nodes will ask for, and starts their builds on a thread pool
(pyopencl releases the GIL while the driver compiles).
The flow then takes each finished program when its node asks (`ImplManager.dynamic`): the node
still records its `update_impl build`, marked `prebuilt`, not in the critical path.
The walk stops at the first shape that depends on device data (a dep computed on the device).

Size classes (GPUs): the dynamic kernels a node asks for depend on its sizes (GEMM tiles by
the grid's size, a GEMV for at most 4 rows, attention's one-row kernel for short queries), so a
length never seen before could need a program never built, built inside its inference (BERT on
the H200 under `dyncli bench`: the first 96 waited 9-12 ms for builds, then spent 24 ms in the
first launches of the new programs). The model's first inference therefore also walks the
program with each dynamic dim of its inputs set to each of SIZE_CLASS_DIMS in turn (the other
dims as fed), builds what those walks find, and waits for those builds at its end: every later
first-seen size finds its programs built. Each build also creates its kernels once on its
thread: NVIDIA's OpenCL loads a program at its first kernel object (1.2 ms), which would
otherwise happen in an inference.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyopencl as cl

from engine.kernels import compile_program, dynamic_key
from engine.layout import Layout, dtype_from_numpy
from engine.host_eval import host_outputs
from engine.memo import values_key


def _walk(insts, tensors, feeds: dict) -> list:
    """The kernel calls of every node up to the first data-dependent shape, or up to the
    first node whose shapes fail (the flow will report that one, with its context)."""
    calls: list = []
    try:
        _walk_into(insts, tensors, feeds, calls)
    except Exception:
        pass
    return calls


def _walk_into(insts, tensors, feeds: dict, calls: list) -> None:
    env = {}   # tensor name -> (layout, host value or None)
    for name, t in tensors.items():
        if t.constant:
            env[name] = (t.layout, t.host)
    for name, v in feeds.items():
        v = np.asarray(v)
        env[name] = (Layout(tuple(int(d) for d in v.shape), dtype_from_numpy(v.dtype)), v)
    for inst in insts:
        if any(t is not None and t.name not in env for t in inst.inputs):
            break
        if inst.node.host:
            args = [None if t is None else env[t.name][1] for t in inst.inputs]
            if inst.node.op != "Shape" and any(a is None for a, t in zip(args, inst.inputs) if t is not None):
                break
            ins = [None if t is None else env[t.name][0] for t in inst.inputs]
            for t, v in zip(inst.outputs, host_outputs(inst.node, ins, args)):
                env[t.name] = (Layout(tuple(int(d) for d in v.shape), dtype_from_numpy(v.dtype)), v)
            continue
        ins = [None if t is None else env[t.name][0] for t in inst.inputs]
        deps = {}
        for i in inst.opdef.shape_deps:
            if i < len(inst.inputs) and inst.inputs[i] is not None:
                deps[i] = env[inst.inputs[i].name][1]
        if any(v is None for v in deps.values()):
            break                          # computed on the device: known only when it runs
        key = values_key(deps) if deps else ()
        outs, _ = inst.layouts_for(ins, deps, key)    # remembered: the flow asks the same next
        if inst.kv_past is None and not inst.opdef.view:
            calls += inst.dynamic_calls_for(ins, outs, deps, key)
        for t, l in zip(inst.outputs, outs):
            env[t.name] = (l, None)


# the values each dynamic input dim takes in turn in the size-class walks
SIZE_CLASS_DIMS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def size_class_feeds(dim_names: dict, feeds: dict) -> list[dict]:
    """`feeds` with the dims of one dim name (an unnamed dynamic dim: its own) set to each of
    SIZE_CLASS_DIMS, one dict per (name, value) that changes a shape. Values are zeros that take
    no memory: a walk reads only shapes and the values of shape nodes."""
    places: dict = {}
    for name, names in dim_names.items():
        if name in feeds:
            for axis, d in enumerate(names):
                if not isinstance(d, int) and axis < np.ndim(feeds[name]):
                    places.setdefault(d or (name, axis), []).append((name, axis))
    out = []
    for where in places.values():
        for v in SIZE_CLASS_DIMS:
            f = dict(feeds)
            for name, axis in where:
                a = np.asarray(feeds[name])
                shape = list(a.shape)
                shape[axis] = v
                f[name] = np.broadcast_to(np.zeros((), a.dtype), shape)
            if any(np.shape(f[n]) != np.shape(feeds[n]) for n, _ in where):
                out.append(f)
    return out


def start_builds(impls, insts, tensors, feeds: dict, more=()) -> int:
    """Start the builds the first inference will need (and those the walks of `more`, other
    feeds, find: kept in impls.size_class_builds); returns how many the walk of `feeds` found
    (they start when at least two do, or with those of `more`: one build gains nothing from a
    thread)."""
    todo, extra = {}, {}
    for walk_feeds, into in [(feeds, todo)] + [(f, extra) for f in more]:
        for call in _walk(insts, tensors, walk_feeds):
            jit = call.jit + (("NUM_TENSORS", len(call.args)),)
            key = (call.source, jit)
            if dynamic_key(call.source, jit) not in impls.cache and key not in impls.prebuilt \
                    and key not in todo:
                into.setdefault(key, set()).add(call.kernel)
    found = len(todo)
    if found < 2 and not extra:
        return found
    pool = ThreadPoolExecutor(max_workers=impls.prebuild_workers, thread_name_prefix="prebuild")
    for (source, jit), kernels in list(todo.items()) + list(extra.items()):
        impls.prebuilt[(source, jit)] = pool.submit(_build_loaded, impls.ctx, source, jit, kernels)
        if (source, jit) in extra:
            impls.size_class_builds.append(impls.prebuilt[(source, jit)])
    pool.shutdown(wait=False)
    return found


def _build_loaded(ctx, source: str, jit: tuple, kernels) -> tuple:
    """compile_program, then a kernel object of each of `kernels` (dropped): the driver loads
    the program at the first one (NVIDIA: 1.2 ms), here rather than in an inference."""
    prg, ms = compile_program(ctx, source, jit)
    for name in sorted(kernels):
        cl.Kernel(prg, name)
    return prg, ms
