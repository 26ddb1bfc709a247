"""Partial replay: a new signature whose changed inputs reach only some nodes runs the flow for
those nodes alone; every other node repeats, as one recorded block, what it did in an earlier
inference of the flow (its kernels, its decisions).

Why it is exact. A node whose input layouts, host values and buffers are what they were in
the recorded inference, and whose own state is what that inference left, makes the same
decisions again (`update_shape skip`, `set_args skip`, `execute enqueue`...) and enqueues the
same kernel objects with the same arguments and shape_info. So a plan keeps, for the recorded
inference F (the base): which nodes only repeated (clean) and which did work (dirty: shapes
inferred, host values computed, a KV append, a build pending, an in-place concat group), the
clean nodes' launches and decisions in blocks between the dirty ones, and the state of every
tensor a dirty node writes and a clean node reads (the boundary).

A later inference may use the plan while (1) the nodes are as F or a partial replay of F left
them (the plan is `current`), and (2) its changed inputs are among those that changed in F
(a decode step: the KV length of every past, one plan for every step; the same input
signature again: nothing changes). It runs the dirty nodes' flow in order with the clean
blocks between them; after each dirty node, its boundary tensors must be as in F. When one is
not (the new shapes reached further than in F), every node from there on runs the flow: the
flow is always the reference, the plan only skips what provably repeats.

Resource changes made by dirty nodes (a KV buffer that grows, a scratch buffer reallocated, a
static impl switched in) leave the plan usable: clean nodes do not see them, and a boundary
buffer that moved sends the rest of the inference through the flow.
"""
from __future__ import annotations

from collections import Counter

from engine.decisions import count
from engine.fast_path import steady
from engine.fast_path.plans import value_reads

# decisions of a node that only repeats what it did (kind, action) -> reasons (None: any)
_CLEAN = {("update_shape", "skip"): {"shape_unchanged", "static_output", "shape_of_unchanged",
                                     "shape_of_subgraph_unchanged"},
          ("set_args", "skip"): None, ("execute", "enqueue"): None, ("realloc", "view"): None,
          ("execute", "skip"): {"view", "runtime_skip", "in_place_crop"}, ("fusion", "unfuse"): None}

# a recorded inference whose clean nodes are fewer than this share is not worth a plan
MIN_CLEAN_SHARE = 0.5

SEG, DIRTY = 0, 1


class PartialPlan:
    __slots__ = ("of_iter", "changed", "fed", "steps", "clean_nodes", "kernels", "base_no", "seg_sums",
                 "dirty", "free")

    def __init__(self, **kw):
        self.dirty = None               # its dirty nodes as compiled steps see them (compiled_steps.py)
        for k, v in kw.items():
            setattr(self, k, v)
        # inputs whose layout changed in the base: any change of them is among `changed`
        self.free = frozenset(name for name, what in self.changed if what == "layout")


def _clean_events(events) -> bool:
    for _, kind, action, reason, _ in events:
        reasons = _CLEAN.get((kind, action), False)
        if reasons is False or (reasons is not None and reason not in reasons):
            return False
    return True


def _hands_on_host(inst) -> bool:
    """A view (or runtime skip, or in-place crop) of a host value hands the value on without a
    device read: its readers see a new value even when no layout changed, so it runs the flow
    each time."""
    return not inst.node.host and (inst.opdef.view or inst.skip_now or inst.crop_at is not None) and \
        bool(inst.inputs) and \
        inst.inputs[0] is not None and inst.inputs[0].host is not None


def _reads_value(inst, t) -> bool:
    """Whether `inst` (or its unfused subgraph) reads `t`'s value on the host: a host impl
    (a Shape reads only the layout) or shape inference (a memory dep)."""
    return any(k < len(m.inputs) and m.inputs[k] is t for m in inst.family() for k in value_reads(m))


class Attribution:
    """Which top-level node a decision or a launch of the flow belongs to (a fused node's
    unfused subgraph counts as the node), and who reads each tensor. Fixed per network."""

    def __init__(self, insts):
        self.insts = insts
        self.by_name = {m.node.name: k for k, inst in enumerate(insts) for m in inst.family()}
        self.readers: dict = {}
        for k, inst in enumerate(insts):
            for m in inst.family():
                for t in m.inputs:
                    if t is not None:
                        self.readers.setdefault(t.name, set()).add(k)
        # nodes that always run the flow: their work is shared with others or every step
        self.always_dirty = {k for k, inst in enumerate(insts)
                             if inst.kv_past is not None or inst.concat_user is not None
                             or inst.in_place_producers is not None}
        # decisions name their node: nodes that share a name (ONNX does not enforce unique
        # names; an unnamed node is named op_index) cannot tell theirs apart
        # (a fused node's unfused subgraph may repeat its own name: that one is no clash)
        named = Counter(name for inst in insts for name in {m.node.name for m in inst.family()})
        self.always_dirty |= {k for k, inst in enumerate(insts)
                              if any(named[m.node.name] > 1 for m in inst.family())}


def build(attr: Attribution, log: list, launches: list, live: dict, outputs: set,
          of_iter: int, changed: frozenset, fed: frozenset) -> PartialPlan | None:
    """The partial plan of the inference of the flow just recorded (its decision `log`, its
    `launches` with their BoundKernels, the memory it noted `live`), or None when too few of
    its nodes only repeated."""
    insts = attr.insts
    n = len(insts)
    events = [[] for _ in range(n)]
    for e in log:
        k = attr.by_name.get(e[0])
        if k is not None:
            events[k].append(e)
    clean = [k not in attr.always_dirty and _clean_events(events[k])
             and all(m.pending is None and not _hands_on_host(m) for m in insts[k].family())
             for k in range(n)]
    if sum(clean) < MIN_CLEAN_SHARE * n:
        return None
    owner = {id(b): k for k, inst in enumerate(insts) for m in inst.family() for b in m.bound}
    per_node = [[] for _ in range(n)]
    for b, kernel, gws, lws, _, _ in launches:
        k = owner.get(id(b)) if b is not None else None
        if k is not None and clean[k]:
            per_node[k].append((kernel, gws, lws))
    steps, names, seg = [], [], None
    for k, inst in enumerate(insts):
        fam = inst.family()
        if clean[k]:
            if seg is None:
                seg = [SEG, [], Counter(), 0, [], {}, []]
                steps.append(seg)
            seg[1] += per_node[k]
            for _, kind, action, reason, fields in events[k]:
                count(seg[2], kind, action, reason, fields)
            names += [m.node.name for m in fam]
            seg[3] = len(names)
            seg[4].append(inst)
            for m in fam:
                for t in m.outputs + m.internals:
                    if t.name in live:
                        seg[5][t.name] = live[t.name]
                    if t.name in outputs and not m.node.host:
                        seg[6].append(t)
            continue
        seg = None
        # a host node's value is read by identity (it keeps its array when the value repeats:
        # a new one is uploaded into the same buffer before its readers run, as their
        # set_arguments would); a device node's output is new data every time, read through
        # its buffer
        checks = [(t, t.layout, t.buf, t.offset, t.host if inst.node.host else None,
                   any(clean[r] and _reads_value(insts[r], t) for r in attr.readers.get(t.name, ())))
                  for t in inst.outputs if any(clean[r] for r in attr.readers.get(t.name, ()))]
        steps.append((DIRTY, inst, checks, steady.applier(inst)))
    steps = [(SEG, s[1], dict(s[2]), s[3], s[4], s[5], s[6]) if s[0] == SEG else s for s in steps]
    return PartialPlan(of_iter=of_iter, changed=changed, fed=fed, steps=steps, clean_nodes=names,
                       kernels=sum(len(s[1]) for s in steps if s[0] == SEG),
                       seg_sums=_seg_sums(steps, len(steps)))


def _seg_sums(steps, upto: int) -> tuple[dict, dict]:
    """The clean blocks among steps[:upto], summed: their decisions and what they note live
    (MemoryPool.note_many; no dirty node notes a clean node's tensor), added once per run."""
    counts, live = Counter(), {}
    for s in steps[:upto]:
        if s[0] == SEG:
            counts.update(s[2])
            live.update(s[5])
    return dict(counts), live


def run(plan: PartialPlan, queue, counters: Counter, buffers, fast: "steady.SteadyRun",
        hosts_done: frozenset = frozenset()) -> int | None:
    """Run the dirty nodes between the clean blocks (a dirty node's steady step, steady.py,
    where it holds; else its flow; `hosts_done`: host nodes that ran already). Returns None when
    every block repeated, else how many of `plan.clean_nodes` had their decisions repeated
    before a boundary tensor differed from the base's (every node after it then ran the flow)."""
    try:
        return _run(plan, queue, counters, buffers, fast, hosts_done)
    finally:
        fast.finish()


def holds(checks, buffers) -> bool:
    """Whether a dirty node's outputs that clean nodes read are as in the base; a new host
    value read as data goes into the same buffer on the way."""
    for t, layout, buf, offset, host, by_value in checks:
        # a new host value (a host node keeps its array while the value repeats) that a
        # clean node reads as a value (shape inference, a host impl) is a new input to it
        new_value = host is not None and t.host is not host
        if new_value and t.layout == layout and not by_value:
            buffers.device_buffer(t)          # the new value, into the same buffer
        if t.layout != layout or t.buf is not buf or t.offset != offset or (new_value and by_value):
            return False
    return True


def _run(plan: PartialPlan, queue, counters: Counter, buffers, fast, hosts_done: frozenset) -> int | None:
    applied = 0
    steps, memory = plan.steps, buffers.memory
    for at, step in enumerate(steps):
        if step[0] == SEG:
            _, launches, _, names, _, _, outs = step
            queue.launches += launches
            if len(queue.launches) >= queue.flush_every:
                queue.flush()
            for t in outs:             # read back at the end: the kernel writes a new value
                t.version += 1
                t.dev_version = t.version
                t.host = None
            applied = names
            continue
        inst, checks, compiled = step[1], step[2], step[3]
        if inst in hosts_done:
            pass
        elif compiled is None or not compiled(inst, fast):
            inst.execute()
        if not holds(checks, buffers):
            _add_blocks(_seg_sums(steps, at), counters, memory)
            _flow_from(steps, at + 1, hosts_done)
            return applied
    _add_blocks(plan.seg_sums, counters, memory)     # every block repeated: once
    return None


def _add_blocks(sums: tuple, counters: Counter, memory) -> None:
    counts, live = sums
    counters.update(counts)
    memory.note_many(live)


def _flow_from(steps, at: int, hosts_done: frozenset) -> None:
    """Every node from step `at` on runs the flow (a boundary differed from the base's), but
    the host nodes that ran already."""
    for step in steps[at:]:
        if step[0] == SEG:
            for inst in step[4]:
                inst.execute()
        elif step[1] not in hosts_done:
            step[1].execute()
