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

Each build also creates its kernels once on its thread: NVIDIA's OpenCL loads a program at its
first kernel object (1.2 ms), which would otherwise happen in the inference.
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


def start_builds(impls, insts, tensors, feeds: dict) -> int:
    """Start the builds the first inference will need; returns how many it found (started
    when at least two: one build gains nothing from a thread)."""
    todo = {}
    for call in _walk(insts, tensors, feeds):
        jit = call.jit + (("NUM_TENSORS", len(call.args)),)
        if dynamic_key(call.source, jit) not in impls.cache and (call.source, jit) not in impls.prebuilt:
            todo.setdefault((call.source, jit), set()).add(call.kernel)
    if len(todo) < 2:
        return len(todo)
    pool = ThreadPoolExecutor(max_workers=impls.prebuild_workers, thread_name_prefix="prebuild")
    for (source, jit), kernels in todo.items():
        impls.prebuilt[(source, jit)] = pool.submit(_build_loaded, impls.ctx, source, jit, kernels, impls.optimize)
    pool.shutdown(wait=False)
    return len(todo)


def _build_loaded(ctx, source: str, jit: tuple, kernels, optimize: bool) -> tuple:
    """compile_program, then a kernel object of each of `kernels` (dropped): the driver loads
    the program at the first one (NVIDIA: 1.2 ms), here rather than in an inference."""
    prg, ms = compile_program(ctx, source, jit, optimize=optimize)
    for name in sorted(kernels):
        cl.Kernel(prg, name)
    return prg, ms
