"""A compiled inference whose buffers do not all keep (a length past their room, an input or
a host value that took a new buffer): the plan's launches stand, the resources move. Rather
than walk every node through the flow, it makes the flow's own resource decisions where they
can differ and re-binds the arguments that name a moved buffer, so that plans survive the
resource change (the plugin's flow sets a node's arguments again only when its impl or memory
changed: overall_flow.md).

The policy sees every call up front (predictors.growth_decisions: the adaptive policy observes
each shared history once and works out a growth once for the buffers that share it). Then,
node by node in the flow's order:
- a buffer the policy keeps is left alone (in a traced run its reuse is written where its
  node's events are); every other gets the policy's decision where the flow asks for it (the
  memory used then: the 90% rule), carried out as the flow's `_realloc` does
  (Buffers.take_for: a pooled buffer or a new one, counted and traced as the flow does);
- a view takes its input's buffer again (the flow's view_input);
- a kernel node that owns a moved buffer sets its arguments as the flow's realloc_if_needed
  path does (`set_arguments(True)`); one that reads a moved buffer, or a host value newer on
  the host than on the device, binds them as the flow's steady step does (the upload, `set_args
  set` when a buffer changed); the shape_info blocks are the image's already.
What the compiled inference counts is its plan's (all reuses, no arguments set) with those
decisions in place of the ones they replace. Its variants then hold the new buffers: their
arguments and the moved tensors' buffers in their snapshots (`rebound`).

An untraced growth (`grow_counted`) reads no node's state: the calls name each buffer's
requirement, the variant's table (`table`, made where it is bound) each kernel's argument
tensors, and it changes only what a growth moves (buffers and the arguments naming them),
so the nodes' state stays waiting (compiled.Pending) as after a compiled inference that kept
its buffers. That needs every kernel's tensors at offset 0 (buffers of their own, views of
them, inputs): the image's shape_info blocks then stay true. Otherwise, and in a traced run,
the state is put back first and each node binds its arguments itself (`grow`); a traced one
writes the events of the nodes that own or read a moved buffer, as their steady steps would
(the template's realloc events are reuses), the `plan compiled` event names them (`written`)
and the reader expands the template for the others.
"""
from __future__ import annotations

from collections import Counter

from engine.fast_path import steady
from engine.predictors import growth_decisions


def grow(fast, c, calls, inputs) -> tuple:
    """The resource decisions of compiled inference `c` whose predictor calls are `calls`
    (module docstring), made on the nodes' state put back; returns the counters of the
    inference (the plan's, adjusted), the tensors that may have moved (ids) and, in a traced
    run, the nodes whose events it wrote. `inputs`: the tensors whose buffers may have moved
    before it (the graph inputs when set, their views, host values uploaded by their first
    reader here)."""
    decisions = fast.decisions
    # the flow's log of this inference is not read after a growth (replay._record): its
    # decisions are counted, or written to the trace, not logged
    log, decisions.log = decisions.log, None
    try:
        return _grow(fast, c, calls, inputs)
    finally:
        decisions.log = log


def _grow(fast, c, calls, inputs) -> tuple:
    buffers, traced = fast.buffers, fast.decisions.traced
    policy = growth_decisions(buffers.predictor, calls)
    per_node, labels = c.calls_by_node or calls_by_node(c, calls)
    moved = {id(t) for t in inputs}       # their readers look (bind_arguments sees what changed)
    # the plan's decisions replaced: reuses, arguments skipped; and arguments set instead
    reuses = skips = sets = 0
    written = []
    for k, (inst, step) in enumerate(zip(c.device, c.steps)):
        if step is steady.view_step:     # its input's buffer, as the flow's view_input
            _view(inst, moved)
            continue
        mine_k = per_node.get(k, ())
        # (the flow reuses only a buffer it holds: carry_out)
        asked = [j for j in mine_k if not (policy.keeps(j) and calls[j][0].capacity)]
        if not asked and not any(id(t) in moved or (t.host is not None and t.dev_version != t.version)
                                 for b in inst.bound for t in b.tensors):
            continue                     # nothing of its own moves, nothing it reads did
        if traced:                       # its events are written, not expanded from the template
            steady.write_head(fast.decisions, inst)
            written.append(inst.node.name)
        grown = False
        for j in mine_k if traced else asked:
            t = calls[j][0]
            # its own decision instead of the plan's reuse; a traced run's reuse is written and
            # counted by _rec, where the plan's counters hold it too
            realloced = inst.carry_out(t, policy.decide(j, buffers.used_bytes), None if traced else _counted,
                                       labels[j])
            if realloced:
                moved.add(id(t))
                grown = True
            reuses += realloced or traced
        did = _set_arguments(fast.decisions, inst, grown)
        skips += grown or did
        sets += did and not grown
    policy.finish()
    return _counters(c, reuses, skips, sets), moved, written


def grow_counted(fast, c, calls, inputs) -> tuple:
    """`grow` of an untraced inference whose variant's table holds (module docstring): the
    same decisions and counters, made without the nodes' state. Returns (counters, moved).
    Where it raises midway (a buffer the device cannot give), the variant's snapshot takes the
    buffers moved so far when it is next read, as after a whole growth (`rebound`): the nodes'
    state put back then names the buffers the memory pool says they hold."""
    moved = {id(t) for t in inputs}
    try:
        return _grow_counted(fast, c, calls, moved), moved
    except BaseException:
        _note_moved(c, moved)
        raise


def _grow_counted(fast, c, calls, moved: set) -> Counter:
    buffers, queue = fast.buffers, fast.queue
    count_many = fast.decisions.count_many
    policy = growth_decisions(buffers.predictor, calls)
    keeps, decide, memory = policy.keeps, policy.decide, buffers.memory
    per_node = (c.calls_by_node or calls_by_node(c, calls))[0]
    reuses = sets = 0
    for k, (inst, kernels) in enumerate(c.growth_table):
        if kernels is None:
            _view(inst, moved)
            continue
        grown = False
        for j in per_node.get(k, ()):
            t, _, _, need, bits = calls[j]
            if keeps(j) and t.capacity:
                continue
            d = decide(j, memory.used_bytes)
            if d.action == "reuse" and t.capacity:   # (carry_out's reuse)
                continue
            moved.add(id(t))            # (before: one the device cannot give has moved too)
            nbytes, how, _ = buffers.take_for(t, d, need, bits // 8)
            count_many(1, "realloc", how, "reclaim" if d.reclaimed else "", bytes=nbytes)
            grown = True
            reuses += 1
        did = False
        for b, tensors in kernels:
            held = new = b.arg_ids
            for pos, t in tensors:
                if t.host is not None and t.dev_version != t.version:
                    buf = buffers.device_buffer(t)   # (its reader uploads it, as the flow's)
                elif id(t) in moved:
                    buf = t.buf
                else:
                    continue
                if buf is not new[pos]:
                    if new is held:
                        new = list(held)
                    new[pos] = buf
            # a node that owns a moved buffer sets them all (set_arguments(True))
            if grown or new is not held:
                b.kernel.set_args(*new)
                b.arg_ids = new
                queue.args_version += 1
                did = True
        sets += grown or did
    policy.finish()
    return _counters(c, reuses, sets, sets)


def table(c) -> list | None:
    """(device node, its kernels or None for a view) of variant `c`, each kernel as (bound
    kernel, (argument position, tensor) of its tensors but the constants, whose buffers a growth
    never moves), from the nodes' state it is bound in; None where one of those tensors is not
    at offset 0 (grow_counted cannot serve it)."""
    out = []
    for inst, step in zip(c.device, c.steps):
        if step is steady.view_step:
            out.append((inst, None))
            continue
        kernels = []
        for b in inst.bound:
            if b.tensors is None or b.offsets is None:
                return None
            # (positions after the shape_info slot's)
            mine = tuple((k, t) for k, t in enumerate(b.tensors, 1) if not t.constant)
            if any(b.offsets[k - 1] for k, _ in mine):
                return None
            kernels.append((b, mine))
        out.append((inst, kernels))
    return out


def counted(c, inputs) -> bool:
    """Whether an untraced growth of `c` may be `grow_counted`: its table holds and the tensors
    that moved before it are at offset 0, none empty (a kernel binds an empty one to the
    network's dummy buffer: Buffers.device_buffer)."""
    return c.growth_table is not None and not any(t.offset or not t.layout.count for t in inputs)


def _view(inst, moved: set) -> None:
    """A view takes its input's buffer again, as the flow's view_input."""
    out = inst.outputs[0]
    was = out.buf, out.offset
    inst.view_input()
    if (out.buf, out.offset) != was:
        moved.add(id(out))


def _counters(c, reuses: int, skips: int, sets: int) -> Counter:
    """The plan's counters with `reuses` reuses and `skips` skipped arguments replaced by the
    growth's decisions (counted where they were made), `sets` arguments set."""
    less = _times(steady._REUSE, reuses) + _times(steady._SET_ARGS[False], skips)
    return c.counters - less + _times(steady._SET_ARGS[True], sets)


def snapshot_of(c) -> list:
    """Variant `c`'s snapshot with the buffers of the tensors growths moved since it was last
    read: theirs now (until the flow next takes a snapshot, only a growth moves a buffer of
    its epoch, and a growth that reads the snapshot reads it first)."""
    moved = c.moved
    if moved is not None:
        c.snapshot = [(obj, obj.moved_into(v)) if id(obj) in moved else (obj, v) for obj, v in c.snapshot]
        c.moved = None
    return c.snapshot


def _note_moved(c, moved: set) -> None:
    """Tensors (ids) whose buffers moved, for `snapshot_of` to patch into `c`'s snapshot."""
    c.moved = moved if c.moved is None else c.moved | moved


def calls_by_node(c, calls) -> tuple:
    """({device node's index: its predictor calls' indices}, each call's realloc label) of
    variant `c`, kept (`Compiled.calls_by_node`): its function's calls name the same tensors
    in the same order at every inference. Made when it is built (CompiledPlans.build_ahead)
    or at its first growth."""
    mine = {id(t): (k, label) for k, inst in enumerate(c.device) for t, label in steady.owned_buffers(inst)}
    per_node: dict = {}
    for j, call in enumerate(calls):
        per_node.setdefault(mine[id(call[0])][0], []).append(j)
    c.calls_by_node = per_node, [mine[id(call[0])][1] for call in calls]
    return c.calls_by_node


def _times(events: tuple, n: int) -> Counter:
    """What `n` decisions of a path (steady.py's events) count."""
    return Counter({k: v * n for k, v in steady._path_counts(events).items()}) if n else Counter()


def _set_arguments(decisions, inst, grown: bool) -> bool:
    """The rest of the steady step of a node that owns (`grown`) or reads a moved buffer: its
    arguments set as the flow's realloc_if_needed path (set_arguments(True)) or bind_arguments
    would, its events in a traced run. Whether a node that reads a moved buffer set any."""
    did = False
    if grown:
        inst._rec("set_args", "set" if inst.bind_arguments(True, _kept(inst), image=True) else "skip")
    else:
        did = inst.bind_arguments(False, _kept(inst), image=True)
        if decisions.traced:
            decisions.write("set_args", "set" if did else "skip", "", inst.node)
    if decisions.traced:
        decisions.write("execute", "enqueue", "", inst.node, kernels=len(inst.bound))
    return did


def _kept(inst) -> list:
    """Each kernel's argument tensors are the ones bound: a growth moves their buffers (the
    state put back holds the tensors its kernels were bound to)."""
    return [True] * len(inst.bound)


def _counted() -> None:
    """A `realloc reuse` the plan's counters already hold."""


def rebound(c, epoch: int, moved: set) -> None:
    """Variant `c` bound to the buffers a growth left (CompiledPlans.rebind_grown): in `epoch`,
    each kernel's arguments as set now, the moved tensors' buffers in its snapshot when it is
    next read (`snapshot_of`: a growth changes nothing else of the nodes, an untraced one has
    not put their state back, and the next inference after one seldom reads it: 0.3 ms of
    the BERT's growth on an H200 host)."""
    c.epoch = epoch
    c.args = (-1, [(b, k, b.arg_ids) for b, k, _ in c.args[1]])
    _note_moved(c, moved)
    c.io_snapshot = [(t, t.snapshot()) for t, _ in c.io_snapshot]
