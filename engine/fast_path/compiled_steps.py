"""Compiled steps: a partial plan's dirty device nodes (partial.py; a decode step's KV appends
and attentions) as one function of the input dims, so that the KV length is a parameter of
one plan instead of a walk of the dirty nodes at every step (compiled.py's compiled flow over
a partial plan; tinygrad's JIT with its bound `start_pos`, gpt-fast's static-cache replay).

When a partial replay ran its dirty device nodes by their steady steps (steady.py) and changed
no resource, `record` traces those nodes again on symbolic dims (engine/symbolic.py Session):
the graph inputs' layouts, a fed-back KV cache's room included (one function serves every
length within every room), and the dirty host nodes' outputs they read are the parameters;
the clean nodes' outputs are what they were in the base. Out come the dirty kernels' work
sizes and shape_info, the predictor calls, the live bytes, the layouts the graph's outputs take
and those the clean nodes read (the boundary), the KV bytes appended; each is checked against
the partial replay it was traced from, and every choice an op made is a guard. The dirty host
nodes' integer shape math (a cache's Shape, the Gather of its length...) is traced with them
(host_values.py) where every host parameter of the function comes from such math.

`run`, for a partial replay: the function, the dirty host nodes' values it computed (set where
each node's flow would have computed them; the others run their flow), or first the dirty host
nodes' flow where none is traced, with partial.run's checks. When its guards hold, the boundary is the base's, every dirty node would take its
steady step (the same kernels bound, its inputs moved, the cache fed back its own buffer) and
every buffer surely keeps (predictors.surely_keeps; a KV append within its room keeps whatever
the policy says), the inference writes the shape_info image, enqueues the base's blocks with
the dirty kernels between them, makes the policy's calls in one go and counts what the partial
replay would have. The dirty nodes' state is put back lazily (compiled.Pending). Otherwise the
partial replay goes on as before, its host nodes already run. A variant holds the resources
of the epoch it was bound in and is bound again, without a new trace, by the next partial
replay that could have built it (a KV cache grown into a new room), with the variants of the
same kernels; variants are kept by the dirty nodes and the boundary, so the partial plan of a
new decode (a new base) binds them too. A traced run binds only the variant of the replay
that traced or found it, with a template of its events (step_events.py), and its host nodes
run their flow (their events are written as they happen).
"""
from __future__ import annotations

import operator
from collections import Counter

import numpy as np

from engine.accounting import preparing_trace
from engine.fast_path import steady, step_events
from engine.fast_path.compiled import (Pending, agrees, answer_sources, answers_of, buffers_keep, check,
                                       compiled_image, image_blocks, keys_left, trace_node, upload_host_params,
                                       write_image)
from engine.fast_path.host_values import apply_hosts, host_part, trace_hosts
from engine.fast_path.partial import DIRTY, SEG, holds
from engine.fast_path.plans import put_back_args, repeat_predictor_calls
from engine.layout import Layout
from engine.ops.common import norm_axis
from engine.symbolic import Escape, Session, args_of, concrete, structure
from traces.schema import TEMPLATE_BASES_KEPT

MAX_VARIANTS = 8      # an attention's tiles by KV length may split the lengths into ranges
MAX_REFUSALS = 2      # traces of one partial plan refused before it is no longer tried


class Steps:
    """One traced variant: `fn(*dims)` -> (kernels, image values, predictor calls, live bytes,
    immediate layouts, node keys, boundary layouts, KV bytes appended, its variables) or None;
    `state`: (object, attribute, symbolic value) the dirty nodes leave. The rest is what the
    epoch it is bound in holds."""
    __slots__ = ("fn", "source", "state", "setter", "session", "put_backs", "structure", "kernel_ids", "device", "kv", "image",
                 "immediate", "bounds", "keep", "per_node",
                 # the dirty host nodes computed by the function (None: they all run their flow
                 # first): (node, a Shape?, [(output, shape, dtype)], checks); what they count;
                 # the host nodes that run their flow after them
                 "hosts", "host_counts", "run_hosts",
                 # the partial plan it is bound to: its blocks, what they write, its boundary
                 "plan", "order", "written", "boundary",
                 "epoch", "changes", "snapshot", "args", "touches", "counters",
                 # traced runs (step_events.py): the moving fields of the dirty nodes' events;
                 # the base bound from (its iteration, the fast path's base count then) and
                 # the variables its template names
                 "moving", "base", "variables")


class Dirty:
    """A partial plan's dirty nodes as compiled steps see them. `key`: the nodes and the
    boundary, which the partial plans of later decodes (a new prompt, a new base) share with
    this one: they share its traced variants too."""
    __slots__ = ("hosts", "device", "steps", "host_params", "boundary", "key")

    def __init__(self, plan):
        dirty = [s for s in plan.steps if s[0] == DIRTY]
        self.hosts = [(s[1], s[2]) for s in dirty if s[1].node.host]
        self.device = [s[1] for s in dirty if not s[1].node.host]
        self.steps = [s[3] for s in dirty if not s[1].node.host]
        host = {id(t) for i, _ in self.hosts for t in i.outputs}
        self.host_params = list({id(t): t for i in self.device for t in i.inputs
                                 if t is not None and id(t) in host}.values())
        # (tensor, layout) a dirty device node writes and a clean node reads, as in the base
        self.boundary = [(t, layout) for s in dirty if not s[1].node.host for t, layout, *_ in s[2]]
        self.key = (tuple(map(id, self.device)), tuple(id(t) for t, _ in self.boundary),
                    tuple(id(i) for i, _ in self.hosts))


class CompiledSteps:
    def __init__(self, fast):
        self.fast = fast
        tensors = fast.buffers.tensors
        self.inputs = [tensors[n] for n in fast.program.inputs]
        self.table: dict = {}           # Dirty.key -> traced variants
        self.refusals: dict = {}        # Dirty.key -> traces refused
        self.last: dict = {}            # Dirty.key -> the variant that ran last
        self.built = 0                  # functions traced
        self.runs = 0                   # inferences they served
        self.why_not = ""               # why the last build was refused (for reading)
        self.last_values = None         # traced runs: (base iteration, values) of the last step

    def summary(self) -> dict:
        return {"built": self.built, "runs": self.runs, "refused": self.why_not}

    def _dims(self, d: Dirty) -> tuple:
        """(the structure of the parameters' layouts (a padded cache or not), their dims)"""
        layouts = [t.layout for t in self.inputs + d.host_params]
        return structure(layouts, ()), args_of(layouts, ())

    # ---- a partial replay ------------------------------------------------------------------
    def run(self, plan) -> tuple[bool, frozenset]:
        """Try the compiled steps of `plan` for the inputs just set: (done, the host nodes that
        ran)."""
        fast = self.fast
        d = plan.dirty
        memory = fast.buffers.memory
        variants = self.table.get(d.key) if d is not None else None
        if not variants or not any(c.plan is plan and c.epoch == fast.epoch and c.changes == memory.changes
                                   for c in variants):
            return False, frozenset()
        ran = frozenset(i for i, _ in d.hosts)
        if variants[0].hosts is None:
            for k, (inst, checks) in enumerate(d.hosts):     # the shape subgraph: the flow's own steps
                inst.execute()
                if not holds(checks, fast.buffers):
                    return False, frozenset(i for i, _ in d.hosts[:k + 1])
        struct, dims = self._dims(d)
        traced = fast.decisions.traced
        last = self.last.get(d.key)     # the variant that served the last step serves most
        for c in (variants if last is None else (last, *(v for v in variants if v is not last))):
            if c.plan is not plan or c.epoch != fast.epoch or c.changes != memory.changes or \
                    c.structure != struct or (traced and fast.templates - c.base[1] >= TEMPLATE_BASES_KEPT):
                continue
            got = _call(c, dims)
            if got is None:
                continue
            if c.hosts is not None:
                if not apply_hosts(c, got[8], fast.decisions.counters):
                    return False, frozenset()   # nothing done: the partial replay runs them
                if memory.changes != c.changes or not all(holds(h[-1], fast.buffers) for h in c.hosts) or \
                        not all(holds(checks, fast.buffers) for _, checks in c.run_hosts):
                    return False, ran
            if self._apply(plan, d, c, got):
                self.runs += 1
                self.last[d.key] = c
                if traced:              # what the trace writes of it (step_events.py)
                    self.last_values = step_events.values(c, got[-1])
                return True, ran
            return False, ran
        return False, ran if variants[0].hosts is None else frozenset()

    def _apply(self, plan, d: Dirty, c: Steps, got: tuple) -> bool:
        fast = self.fast
        kernels, images, calls, live, layouts, keys, boundary, copied, _, env = got
        if boundary != c.boundary or not _steady_from(fast, c, keys):
            return False
        buffers, queue = fast.buffers, fast.queue
        if not buffers_keep(buffers, [calls[k] for k in c.keep], d.host_params):
            return False
        # from here on the inference is the compiled one
        upload_host_params(buffers, d.host_params)
        for t, l in zip(c.immediate, layouts):     # (their versions move with `written`)
            t.layout = l
            t.host = None
        if queue.args_version != c.args[0]:
            put_back_args(queue, c.args[1])
            c.args = (queue.args_version, c.args[1])
        write_image(queue.arena, c, images)
        seq, at = [], 0
        for item in c.order:                   # the base's blocks, the dirty kernels between
            if item.__class__ is int:
                seq += kernels[at:at + item]
                at += item
            else:
                seq += item
        queue.launches += seq
        queue.flush()
        for t in c.written:
            t.version += 1
            t.dev_version = t.version
            t.host = None
        for cache, key in c.touches:
            cache.get(key)
        repeat_predictor_calls(buffers, calls)
        counters = fast.decisions.counters
        counts, blocks_live = plan.seg_sums
        counters.update(counts)
        counters.update(c.counters)
        if c.kv:
            counters["kv_bytes_copied"] += copied
        buffers.memory.note_many(blocks_live)
        buffers.memory.note_many(live)
        fast.restore = Pending(c, env, keys)
        return True

    # ---- after a partial replay of steady steps --------------------------------------------
    def record(self, plan, members: int, counted: Counter, launches, reallocs, touches, log=None,
               iteration: int = -1) -> dict | None:
        """After a partial replay that changed no resource: when every dirty device node took
        its steady step, bind the variant whose guards hold, tracing one if none does. In a
        traced run (`log`: the replay's events) only that variant, when its template holds
        (step_events.py): returns the template, which the replay's infer_end carries."""
        fast = self.fast
        if plan.dirty is None:
            plan.dirty = Dirty(plan)
        d = plan.dirty
        if members != len(d.device):
            return None
        struct, dims = self._dims(d)
        ids = _kernel_ids(d.device)
        variants = self.table.setdefault(d.key, [])
        c, got = self._variant(d, variants, struct, dims, ids, launches, reallocs, log)
        if c is None:
            return None
        tpl = None
        if log is not None:            # (the caller counts the base)
            with preparing_trace(fast.decisions.trace):
                bound = step_events.attach(c, log, got[-1], iteration, fast.templates + 1)
            if bound is None:          # a refused trace: dropped, counted with the others
                variants.remove(c)
                if self.last.get(d.key) is c:
                    del self.last[d.key]
                self.why_not = step_events.REFUSED
                self.refusals[d.key] = self.refusals.get(d.key, 0) + 1
                return None
            tpl, counted = bound
        self._release(fast)
        # the variants of other ranges of the same kernels and structure (the step that fills
        # a cache's room exactly) leave the same state and decisions: bound with it, where no
        # trace needs a template of its own
        for v in variants:
            if v is c or (log is None and v.kernel_ids == ids and v.structure == struct):
                if v.plan is not plan:
                    _to_plan(v, plan, d)
                _bind(fast, v, self.inputs, counted, got[7], launches, touches)
        return tpl

    def _variant(self, d: Dirty, variants: list, struct, dims, ids, launches, reallocs, log) -> tuple:
        """(the variant whose guards hold for the partial replay just run, traced if none does,
        its answer), or (None, None) when its trace is refused."""
        c, got = None, None
        for v in variants:
            if v.kernel_ids == ids and v.structure == struct:
                got = _call(v, dims)
                if got is not None:
                    c = v
                    break
        if c is not None and not _agrees(self.fast, c, got, launches, reallocs):
            variants.remove(c)          # it holds something of another base: traced again
            self.last.pop(d.key, None)
            c = None
        if c is not None:
            return c, got
        if self.refusals.get(d.key, 0) >= MAX_REFUSALS:
            return None, None
        try:
            # the variants of a key compute their host nodes alike (run() relies on it)
            # (a traced run writes the host nodes' events: they run their flow)
            c = _build(self.fast, d, self.inputs, launches, reallocs, False if log is not None else
                       variants[0].hosts is not None if variants else None, log)
            got = _call(c, dims)
            check(got is not None, None, "its own dims")
        except Exception as e:          # an Escape, or an op's Python a Sym cannot follow
            self.why_not = f"{type(e).__name__}: {e}"
            self.refusals[d.key] = self.refusals.get(d.key, 0) + 1
            return None, None
        c.kernel_ids, c.structure = ids, struct
        self.built += 1
        if len(variants) >= MAX_VARIANTS:
            if variants.pop(0) is self.last.get(d.key):
                del self.last[d.key]
        variants.append(c)
        return c, got

    def _release(self, fast) -> None:
        """Variants bound in an earlier epoch let go of its buffers (their arguments and the
        nodes' state hold them): the device memory the pool gave back is really free."""
        for variants in self.table.values():
            for v in variants:
                if v.epoch != fast.epoch and v.snapshot is not None:
                    v.args = v.snapshot = v.touches = None
                    v.epoch = -1


def _agrees(fast, c: Steps, got: tuple, launches, reallocs) -> bool:
    """Whether a variant traced before (another epoch, another partial plan) answers for the
    partial replay just run what it did (compiled.agrees), the host values too: a variant
    bakes in the clean nodes' layouts and the constants of its base."""
    if not agrees(fast, c, got, launches, reallocs):
        return False
    if c.hosts is not None:
        for (_, _, outs, _), flat in zip(c.hosts, got[8]):
            for (t, shape, dtype), f in zip(outs, flat):
                if not np.array_equal(np.array(f, dtype).reshape(shape), t.host):
                    return False
    return True


def _call(c: Steps, dims) -> tuple | None:
    try:
        return c.fn(*dims)
    except ArithmeticError:
        return None


def _kernel_ids(device) -> tuple:
    return tuple(id(b) for i in device for b in i.bound)


def _steady_from(fast, c: Steps, keys: tuple) -> bool:
    """Whether every dirty node takes its steady step from the state the last inference left:
    the same kernels bound, nothing skipped or done by another node, its inputs moved, and each
    KV cache fed back its own buffer with the room the node holds."""
    r = fast.restore
    if r.__class__ is Pending:
        if r.c.__class__ is not Steps:
            return False
        ids, prev = r.c.kernel_ids, r.keys
    elif r is not None:
        return False
    else:
        prev = keys_left(c.device)
        if prev is None:
            return False
        ids = _kernel_ids(c.device)
    for inst in c.kv:
        past, out = inst.inputs[0], inst.outputs[0]
        if out.buf is None or past.buf is not out.buf or past.offset != out.offset or \
                past.layout.phys != inst.kv_pad:
            return False
    return ids == c.kernel_ids and len(prev) == len(keys) and None not in prev and \
        not any(map(operator.eq, keys, prev))


def _build(fast, d: Dirty, inputs: list, launches, reallocs, sym_hosts: bool | None, log) -> Steps:
    """Trace the dirty device nodes of the partial replay just run (module docstring), and its
    dirty host nodes' integer math where it can (`sym_hosts`: None where it can, True: must,
    False: never); in a traced run (`log`: its events), its events' moving fields too."""
    host_valued = {id(t) for t in inputs} | {id(t) for i in fast.insts if i.node.host for t in i.outputs}
    for inst, _ in d.hosts:
        if any(t is not None and not t.constant and id(t) not in host_valued for t in inst.inputs):
            raise Escape(f"host node {inst.node.name} reads a device tensor")
    s = Session()
    sym, state, per_bound, answers = {}, [], {}, {}
    host_views, keys, kv, copied = [], [], [], []
    with s:
        for t in inputs + d.host_params:
            sym[id(t)] = s.layout(t.layout, share=True)
        hosts = trace_hosts(fast, d, sym) if sym_hosts is not False else None
        if sym_hosts and hosts is None:
            raise Escape("the host nodes are not symbolic for these dims")
        for inst, step in zip(d.device, d.steps):
            if step is steady.kv_append:
                in_l = _trace_kv(inst, sym, state, copied)
                kv.append(inst)
            else:
                in_l = trace_node(inst, step, sym, state, per_bound, host_valued, host_views, answers)
            keys.append(tuple(args_of(in_l, ())))
        if host_views:
            raise Escape("a dirty view of a host value")
        names = {t.name for i in d.device for t in list(i.outputs) + i.internals}
        kernels, calls, live_names, live_vals, immediate = answers_of(fast, launches, reallocs, per_bound,
                                                                      sym, names)
        image = image_blocks(fast, launches, per_bound)
        boundary = d.boundary
        for t, layout in boundary:
            check(concrete(sym[id(t)]) == layout, None, f"the boundary layout of {t.name}")
        moving = step_events.symbolic(d.device, state, log) if log is not None else None
        returns = _returns(s, sym, kernels, image, calls, live_names, live_vals, immediate, keys, boundary,
                           copied, hosts)
        fn, src = s.function("compiled_steps", returns)
    c = Steps()
    c.fn, c.source, c.state, c.device, c.kv = fn, src, state, d.device, kv
    c.setter, c.session, c.put_backs = None, s, 0     # (compiled.set_state)
    c.image = compiled_image(image)
    c.immediate = immediate
    c.bounds = [b for i in d.device for b in i.bound]
    kv_outs = {id(i.outputs[0]) for i in kv}
    c.keep = [k for k, (t, *_) in enumerate(calls) if id(t) not in kv_outs]
    owner = {id(b): k for k, i in enumerate(d.device) for b in i.bound}
    per = Counter(owner[id(b)] for b, *_ in launches)
    c.per_node = [per[k] for k in range(len(d.device))]
    c.plan, c.epoch, c.changes, c.snapshot, c.args, c.touches = None, -1, -1, None, None, None
    c.moving, c.base, c.variables = moving, None, None
    host_part(c, hosts)
    return c


def _returns(s: Session, sym, kernels, image, calls, live_names, live_vals, immediate, keys, boundary,
             copied, hosts) -> str:
    """The generated function's return value (Steps' tuple), as source."""
    n = s.named
    parts = answer_sources(s, sym, kernels, image, calls, live_names, live_vals, immediate, keys)
    return "(" + ", ".join(parts + [
        "(" + "".join(n(sym[id(t)]) + ", " for t, _ in boundary) + ")",
        n(sum(copied)),
        "(" + "".join("(" + "".join("(" + "".join(n(x) + ", " for x in v.ravel()) + "), " for v in vals)
                      + "), " for _, vals in (hosts[0] if hosts else ())) + ")",
        "locals()"]) + ")"


def _to_plan(c: Steps, plan, d: Dirty) -> None:
    """Bind a variant to a partial plan: its blocks with the dirty kernels between them, the
    tensors the inference writes, the boundary layouts its clean nodes read, its host nodes'
    checks (a variant traced under another plan of the same nodes keeps none of that one's)."""
    c.plan = plan
    per = iter(c.per_node)
    c.order = []
    for s in plan.steps:
        if s[0] == SEG:
            c.order.append(s[1])
        elif not s[1].node.host:
            n = next(per)
            if n:
                c.order.append(n)
    c.written = [t for i in d.device for t in i.outputs] + [t for s in plan.steps if s[0] == SEG for t in s[6]]
    c.boundary = tuple(layout for _, layout in d.boundary)
    if c.hosts is not None:             # the host nodes' checks against this plan's base
        checks = {id(i): ch for i, ch in d.hosts}
        c.hosts = [(i, shape, outs, checks[id(i)]) for i, shape, outs, _ in c.hosts]
        c.run_hosts = [(i, checks[id(i)]) for i, _ in c.run_hosts]


def _trace_kv(inst, sym, state, copied) -> list:
    """A KV append's steady step on symbolic layouts (steady.kv_append): the room it holds is
    the past's padding, a parameter, so the function serves every room."""
    in_l = [sym.get(id(t), t.layout) for t in inst.inputs]
    past, new = in_l
    out_layouts, unfuse = inst.infer_layouts(in_l, {})
    if unfuse:
        raise Escape(f"{inst.node.name}: fusion invalid")
    l = out_layouts[0]
    shape, held = l.shape, past.phys
    axis = norm_axis(inst.node.attrs["axis"], len(shape))
    fits = len(held) == len(shape) and shape[axis] <= held[axis] and \
        all(h == x for i, (h, x) in enumerate(zip(held, shape)) if i != axis)
    check(fits, inst, "its room")
    out = inst.outputs[0]
    padded = Layout(shape, l.dtype, pad=held if held != shape else None)
    check(concrete(padded) == out.layout, inst, "an output layout")
    sym[id(out)] = padded
    state += [(out, "layout", padded), (inst, "in_layouts", in_l)]
    copied.append(new.nbytes)
    return in_l


def _bind(fast, c: Steps, inputs: list, counted: Counter, copied: int, launches, touches) -> None:
    """The epoch's resources: arguments, the dirty nodes' state, the cache touches and the
    decisions' counters of the partial replay just run."""
    c.epoch, c.changes = fast.epoch, fast.buffers.memory.changes
    c.counters = Counter(counted)
    if c.kv:
        c.counters["kv_bytes_copied"] -= copied       # counted from the function's
    c.touches = list(touches)
    c.args = (-1, [(b, k, args) for b, k, _, _, args, _ in launches if b is not None])
    skip = {id(t) for t in c.immediate} | {id(t) for t in inputs}
    snap = []
    for inst in c.device:
        snap += inst.snapshot()
        snap += [(t, t.snapshot()) for t in inst.outputs if id(t) not in skip]
    c.snapshot = snap
