"""A plan (what one inference of the flow enqueued, asked and left) and the rules that say
when one may be recorded and replayed."""
from __future__ import annotations

from collections import Counter
from operator import is_not

import numpy as np


class Plan:
    __slots__ = ("key", "epoch", "of_iter", "launches", "kernels", "reallocs", "hosts", "counters",
                 "io_state", "touches", "image", "infos", "args", "arena_version", "args_version",
                 "leaves", "split", "rest", "base_no", "expands", "template_no", "compiled_from")

    def __init__(self, **kw):
        self.leaves = None      # what compiled.py's guard reads of the state it leaves, once
        # traced runs: the oldest plan base its replay's event stands for (its own; for a
        # repeat's plan, the flow's it names, if older), by the fast path's count of bases (the
        # reader keeps the last few); of a compiled inference, what its `plan replay` event
        # carries besides (the template its device nodes' events expand from, with its values,
        # or the flow a repeat stood for) and that template's number
        self.base_no, self.expands, self.template_no = 0, {}, None
        # (variant, its answer) of the compiled inference it was recorded from: a repeat after
        # its replay repeats that inference (CompiledPlans._repeat)
        self.compiled_from = None
        # the nodes' state it leaves, as (all but the device nodes' part, that part), put back
        # in that order (a state entry: `(object, its snapshot)`), and what of that part each
        # compiled variant after its replay puts back (compiled.rest_of)
        self.split, self.rest = None, {}
        for k, v in kw.items():
            setattr(self, k, v)


def put_back_args(queue, args) -> None:
    """Each kernel's recorded arguments, `(bound, kernel, buffers)`, set where the kernel holds
    others (a plan replay, a compiled inference); each bound kernel says what it holds."""
    for b, k, bufs in args:
        cur = b.arg_ids
        if cur is not bufs and (cur is None or any(map(is_not, bufs, cur))):
            k.set_args(*bufs)
            queue.args_version += 1
        b.arg_ids = bufs


def repeat_predictor_calls(buffers, calls, kept: bool = False, fixed: bool = False, key=None) -> None:
    """The flow's predictor calls of a plan, `(tensor, id, shape, its product, bits)` each, made
    again: in one call where the policy batches them (AdaptivePredictor.replay; `kept`: every
    buffer surely keeps, checked before (compiled.buffers_keep): their histories only, `key`
    the compiled variant that made them; `fixed`: `calls` is a whole plan's own list, the same
    at every replay of it)."""
    predictor, used = buffers.predictor, buffers.used_bytes
    batch = getattr(predictor, "replay", None)
    if batch is not None and fixed:
        predictor.replay_plan(calls, used)
    elif batch is not None and kept:
        predictor.observe_kept(calls, key)     # (the histories only: the tensors stand for buffers)
    elif batch is not None:
        batch([(t.state, name, shape, need, bits) for t, name, shape, need, bits in calls], used)
    else:
        for t, name, shape, _, bits in calls:
            t.state.realloc_if_needed(predictor, name, shape, bits, used)


def signature(feeds: dict, by_value: frozenset = frozenset()) -> tuple:
    """Input shapes and dtypes; the values too of the inputs shape inference reads."""
    return tuple((k, np.shape(v), np.asarray(v).dtype.str,
                  np.asarray(v).tobytes() if k in by_value else None) for k, v in sorted(feeds.items()))


def value_reads(inst):
    """The input positions whose host values `inst` reads: every input of a host impl (a
    Shape reads only the layout), the memory deps of shape inference otherwise."""
    return range(len(inst.inputs)) if inst.node.host and inst.node.op != "Shape" else inst.opdef.shape_deps


def input_array(value, by_value: bool) -> np.ndarray:
    """An input's host array, C-contiguous; a copy when shape inference reads its value, so
    that the value kept to tell the next one apart is not the caller's array refilled in place."""
    return np.array(value, order="C") if by_value else np.require(value, requirements="C")


def value_inputs(insts, graph_inputs) -> frozenset:
    """Graph inputs whose values decide shapes: read as a memory dep by a device node or by a
    host impl (a Shape node reads only the shape), directly or through views (a view, or a
    runtime skip, hands its input's host value on without a device read)."""
    names, views = set(), {}
    for inst in insts:
        for i in inst.family():
            names |= {i.inputs[k].name for k in value_reads(i)
                      if k < len(i.inputs) and i.inputs[k] is not None}
            if not i.node.host and (i.opdef.view or i.opdef.runtime_skip) and i.inputs and i.inputs[0] is not None:
                views.update((t.name, i.inputs[0].name) for t in i.outputs)
    todo = list(names)
    while todo:
        src = views.get(todo.pop())
        if src is not None and src not in names:
            names.add(src)
            todo.append(src)
    return frozenset(names & set(graph_inputs))


def blocker(insts, feedback: bool = False) -> str:
    """Why these nodes cannot replay plans ("" when they can): decode feedback moves buffers
    between inferences; shapes that depend on data."""
    if feedback:
        return "feedback"
    for inst in insts:
        for i in inst.family():
            if i.opdef.dynamic_output:
                return f"dynamic_output:{i.node.name}"
    return ""


# decisions that leave every resource as it was (the memory pool's own count covers buffers);
# a cache hit only moves its entry in the cache's LRU order, which a replay repeats (`touches`);
# a KV append writes within the room its buffer has
_FREE = ("update_shape.", "update_impl.keep", "update_impl.fallback", "update_impl.cache_hit",
         "update_weights.skip", "update_weights.cache_hit", "update_weights.reset", "realloc.reuse", "realloc.view",
         "realloc.external", "realloc.by_other", "realloc.empty", "set_args.", "execute.",
         "fusion.unfuse", "in_place_concat.apply", "kv_cache.append")


_GROWN = ("realloc.alloc", "realloc.from_pool")     # new buffers, for grown_only


def grown_only(insts, counters: Counter) -> bool:
    """This inference of the flow changed resources by giving tensors new buffers only (no
    build, switch, weights or device read): what an inference that takes its steady steps
    leaves otherwise unchanged."""
    return _decided_only(insts, counters, _FREE + _GROWN)


def resource_free(insts, counters: Counter) -> bool:
    """This inference of the flow changed no resource its replay would rely on."""
    return _decided_only(insts, counters, _FREE)


def _decided_only(insts, counters: Counter, allowed: tuple) -> bool:
    """No device read, no pending build, and every decision counted one of `allowed`."""
    if counters.get("device_reads"):
        return False
    for k in counters:
        if "." in k and not k.startswith(allowed) and not k.startswith("plan."):
            return False
    return not any(i.pending is not None for i in insts)
