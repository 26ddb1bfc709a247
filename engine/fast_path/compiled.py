"""Compiled plans: a whole inference of steady steps as one function of the input dims, made
once and called for every new signature of the same structure (the compiled flow; TVM Relax's
shape functions composed over a program, tinygrad's JIT with bound variables).

When an inference of the flow changed no resource and every device node took its steady step
(steady.py: its input layouts moved, nothing else did), any new input dims under which every
op makes the same choices lead to the same decisions with other numbers. `build` traces that
inference again on symbolic dims (engine/symbolic.py Session): each device node's op Python in
order, one node's output layouts the next one's inputs, so that every launch's work sizes and
shape_info block, every buffer requirement the preallocation policy is asked about, every live
byte count and every layout become expressions of the input dims, and every choice an op made
(a tile by size, a broadcast, a fusion's validity) a guard. Each value is checked against what
the flow did; any difference and nothing is compiled. One function comes out, `fn` (the
guards, then what the inference needs, with its variables); the nodes' state the flow reads
when it next runs stays symbolic and is set lazily from those variables, as plan replays put
theirs back (`Pending`).

An inference of the flow whose inputs have a compiled structure computes its host nodes (the
shape subgraph: one generated function of the inputs' dims, host_values.HostFn, where its ops
are symbolic math; else the flow's own steps), calls `fn`, and when the guards hold, no resource
changed and every buffer surely keeps (the policies' reuse without reclaim, whatever their
history: predictors.surely_keeps) it writes the shape_info image, enqueues the kernels, makes
the policy's calls in one go and counts the decisions the compiled inference made. Otherwise the
flow goes on node by node after the host nodes. A compiled plan holds resources of the epoch it
was bound in (arguments, the nodes' state snapshot) and is bound again, without a new trace, by
the next inference of the flow that could have built it. A run traces and binds its plan right
after the model's first inference (`build_ahead`), so that the second length is compiled
already; a length past the buffers is compiled too (growth.py). A traced run writes a compiled
inference as one `plan compiled` event, which the reader expands from the template of the
inference that bound it (step_events.py): the first compiled inference, which writes its nodes'
events (`_write_base`), or a flow. `Network(compile_plans="all")`, the command line's
default (dyncli/defaults.py has the figure). A choice an op makes by size that only picks
values (the attention's rows per block, gemm_lm's K splits) is a value of the function
(symbolic.piecewise), not a guard: one trace serves the MiniLM BERT's lengths 8..128; a guard
that fails (another batch, a kernel switched) traces another variant (docs/performance.md,
sessions 13, 16 and 17).
"""
from __future__ import annotations

import operator

import numpy as np

from engine.accounting import preparing_trace
from engine.bound_kernel import work_sizes
from engine.fast_path import growth, steady, step_events
from engine.fast_path.host_values import host_fn
from engine.fast_path.plans import put_back_args, repeat_predictor_calls
from engine.fast_path.shape_fns import op_answer
from engine.kernels import shape_info_values
from engine.predictors import surely_keeps
from engine.symbolic import Escape, Session, Sym, args_of, check, concrete, prod, structure, substitute
from traces.schema import PLAN_BASES_KEPT, TEMPLATE_BASES_KEPT

MAX_VARIANTS = 16     # guards a choice by size still makes (a batch of 1, a kernel by length) split the inputs
# traces of one input structure refused before it is no longer tried (a model whose host
# nodes read device tensors would otherwise pay for a trace at every inference of the flow)
MAX_REFUSALS = 2


class Compiled:
    """One traced structure: `fn(*dims)` -> (kernels, image values, predictor calls, live
    bytes, immediate layouts, node keys, its variables) or None; `state`: (object, attribute,
    symbolic value) the flow leaves. The rest is what the epoch it is bound in holds."""
    __slots__ = ("fn", "source", "state", "setter", "session", "put_backs", "host_structure", "kernel_ids",
                 "image", "counters", "epoch", "snapshot", "args", "touches",
                 "host_views", "immediate", "io_snapshot", "bounds", "device",
                 # traced runs (step_events.py): the moving fields of the device nodes' events,
                 # the base it was bound from (its iteration, the fast path's base count then)
                 # and the variables its template names
                 "moving", "base", "variables",
                 # what an inference of its steady steps counts (steady.counts_of_steady); the
                 # device nodes' steps; what the flow counts repeating one (None: not seen yet;
                 # False: two repeats counted differently: CompiledPlans._repeat); in a traced
                 # run, (iteration, base number) of the flow whose events a repeat stands for
                 "steady_counts", "steps", "repeat_counts", "repeat_of",
                 # what a growth reads of it: its calls by node (growth.calls_by_node), its
                 # kernels' argument tensors (growth.table: made where it is bound); the
                 # tensors growths moved since its snapshot was last read (growth.rebound)
                 "calls_by_node", "growth_table", "moved")


class Pending:
    """The nodes' state a compiled inference left, put back before the flow next reads it;
    `keys`: each device node's input dims it left."""
    __slots__ = ("c", "env", "keys")

    def __init__(self, c: Compiled, env: dict, keys: tuple):
        self.c, self.env, self.keys = c, env, keys

    def put_back(self) -> None:
        self._snapshot_back()
        set_state(self.c, self.env)

    def _snapshot_back(self) -> None:
        c = self.c      # (a compiled step's variant, compiled_steps.Steps, never grows)
        for obj, values in growth.snapshot_of(c) if c.__class__ is Compiled else c.snapshot:
            obj.restore(values)

    def restore(self, _values) -> None:
        """As a state entry (the device nodes' part of a plan recorded from it: Plan.split)."""
        self.put_back()


def set_state(c, env: dict) -> None:
    """Each (object, attribute) of a variant's `state` set to its value for `env`: substituted
    the first time, by a generated setter from the second on (Session.setter: a few hundred
    values a whole plan; its compile costs about what twenty substitutions do, so a variant
    put back once does not pay it)."""
    if c.setter is None:
        c.put_backs += 1
        if c.put_backs < 2:
            for obj, attr, v in c.state:
                setattr(obj, attr, substitute(v, env))
            return
        c.setter, c.session = c.session.setter(c.state), None
    c.setter(env)


class CompiledPlans:
    def __init__(self, fast):
        self.fast = fast
        tensors = fast.buffers.tensors
        self.inputs = [tensors[n] for n in fast.program.inputs]
        self.host_params = _host_params(fast)   # the graph's: fixed for the network
        self.host_insts = [i for i in fast.insts if i.node.host]    # (in the flow's order)
        self.device_insts = [i for i in fast.insts if not i.node.host]
        self.table: dict = {}           # structure of the inputs' layouts -> [Compiled]
        self.built = 0                  # functions traced
        self.runs = 0                   # inferences they served
        self.repeats = 0                # of those, repeated signatures (_repeat)
        self.why_not = ""               # why the last build was refused (for reading)
        self.refusals: dict = {}        # input structure -> builds refused
        self.last = None                # (Compiled, its answer) of the last compiled inference
        self.last_values = None         # traced runs: (base iteration, values) of the last one
        self.repeat_of_iter = None      # traced runs: the flow whose events a repeat just served stands for
        self.counts_differ = 0          # flows that bound a plan and counted other than its steady_counts
        # (the plan bound after the first inference, that inference, each device node's input
        # dims it left): what _steady_from checks at the next inference, found there
        self.ahead = None
        # (iteration, _left's answer) of the state a flow or a compiled growth left, read as it
        # ended (replay.FastPath._record; _apply)
        self.left = None
        self.moved: set = set()         # the tensors the last compiled growth moved (ids)
        self.written: list = []         # traced: the nodes whose events it wrote (growth.grow)
        self.template = None            # traced: the template the last compiled inference based
        # structure of the inputs' layouts -> the shape subgraph's function (None: its flow)
        self.host_fns: dict = {}

    def summary(self) -> dict:
        return {"built": self.built, "runs": self.runs, "refused": self.why_not}

    def _key(self) -> tuple:
        return structure([t.layout for t in self.inputs], ())

    def _dims(self) -> tuple:
        """(the structure of the host values' layouts, the arguments of a variant's function)."""
        layouts = [t.layout for t in self.host_params]
        return structure(layouts, ()), args_of([t.layout for t in self.inputs] + layouts, ())

    # ---- an inference ----------------------------------------------------------------------
    def run(self) -> int:
        """Try the compiled plan for the inputs just set. 0: none applies (nothing done);
        1: done; 2: the host nodes ran, the flow goes on from the device nodes."""
        fast = self.fast
        self.repeat_of_iter = None
        if fast.recording[0] == fast.recording[1]:
            return self._repeat()               # a repeated signature
        key = self._key()
        cands = self.table.get(key)
        if not cands or not any(c.epoch == fast.epoch for c in cands):
            return 0
        traced = fast.decisions.traced
        self._run_hosts(key, traced)
        moved = fast.buffers.memory.changes != fast.recording[2]     # an input took a new buffer
        host_structure, dims = self._dims()
        for c in cands:
            if c.epoch != fast.epoch or c.host_structure != host_structure or \
                    (traced and c.base is not None and fast.templates - c.base[1] >= TEMPLATE_BASES_KEPT):
                continue
            try:
                got = c.fn(*dims)
            except ArithmeticError:            # a division by a dim that is now 0
                got = None
            if got is not None and self._apply(c, got, moved):
                self.runs += 1
                if traced and c.base is None:      # the first one: the template's base
                    self.last_values, self.template = None, self._write_base(c, got)
                elif traced:            # what the trace writes of it (step_events.py)
                    self.last_values = step_events.values(c, got[-1])
                return 1
        return 2

    def _repeat(self) -> int:
        """A repeated signature right after a compiled inference whose state stands (put back
        lazily, nothing changed since), or after the replay of a plan recorded from one: its
        launches again, counted as the flow counts such a repeat, every node skipping
        (`Compiled.repeat_counts`, learned from the first flow that repeated an inference of the
        variant: replay.FastPath._learn_repeat); its plan is recorded at once, as the flow's
        would be. In a traced run it stands for the events of the flow it learned from
        (`Compiled.repeat_of`: a `plan repeat` event, which the reader expands into that flow's
        node events; they name no dim) while the reader holds them. 0 otherwise (the flow runs
        and records it): a static build the flow would take now, a buffer taken by an input.
        The flow's repeat costs 4.3-5.5 ms on an H200 host, its recording included."""
        fast = self.fast
        c, got = self.repeatable()
        # (after a replay the device nodes' state is the plan's, put back later: its pending
        # builds are none, so the live ones checked here can only refuse a repeat)
        if c is None or not c.repeat_counts or c.epoch != fast.epoch or \
                fast.buffers.memory.changes != fast.recording[2] or \
                any(i.pending is not None for i in self.device_insts):
            return 0
        traced = fast.decisions.traced
        if traced and (c.repeat_of is None or fast.bases - c.repeat_of[1] >= PLAN_BASES_KEPT):
            return 0
        for t in c.immediate:           # (read after it: written again, as the flow's launches say)
            t.version += 1
            t.dev_version, t.host = t.version, None
        queue = fast.queue
        queue.arena.flush(queue.write)
        queue.enqueue(got[0])
        fast.buffers.memory.note_many(got[3])
        fast.decisions.counters.update(c.repeat_counts)
        self.repeats += 1
        self.last = (c, got)            # (what its plan is recorded from)
        if traced:
            self.repeat_of_iter = c.repeat_of[0]
        return 1

    def repeatable(self) -> tuple:
        """(variant, its answer) of the compiled inference whose state the nodes stand in (put
        back lazily): the last one, or the one the plan replayed by the last inference was
        recorded from (its device nodes' part deferred for this one: FastPath.late); (None,
        None) where neither."""
        c = self.standing()
        if c is not None:
            return c, self.last[1]
        fast = self.fast
        p = fast.put_back_plan
        if p is not None and p is fast.late and p.compiled_from is not None and p.epoch == fast.epoch:
            return p.compiled_from
        return None, None

    def standing(self) -> Compiled | None:
        """The variant of the last compiled inference where its state is the nodes' still (the
        last inference: put back lazily, `fast.restore` its Pending), else None."""
        r = self.fast.restore
        if self.last is None or r.__class__ is not Pending or r.env is not self.last[1][-1]:
            return None
        return self.last[0]

    def _run_hosts(self, key, traced: bool) -> None:
        """The shape subgraph: its function (host_values.HostFn) where one was made for these
        inputs' structure and it holds, else the flow's own steps. In a traced run the nodes'
        events are those of the path the function stands for (run_host computing every node:
        a Shape whose value changed), written as their flow writes them."""
        h = self.host_fns.get(key)
        decisions = self.fast.decisions
        if h is None or not h.apply(args_of([t.layout for t in self.inputs], ()), self.host_insts[0].rt,
                                    decisions.counters):
            for inst in self.host_insts:
                inst.execute()
        elif traced:                    # (counted by apply)
            for inst in self.host_insts:
                inst.host_computed(decisions.write)

    def _add(self, key, c: Compiled, ids: tuple) -> None:
        """A variant just traced, of inputs of structure `key` and these kernels; the shape
        subgraph's function for that structure made with the first (from the values the flow
        just computed)."""
        c.kernel_ids = ids
        self.built += 1
        cands = self.table.setdefault(key, [])
        if len(cands) >= MAX_VARIANTS:
            cands.pop(0)
        cands.append(c)
        if key not in self.host_fns:
            self.host_fns[key] = host_fn(self.host_insts, self.inputs)

    def _write_base(self, c: Compiled, got: tuple) -> dict | None:
        """A traced run's first compiled inference of variant `c` (bound after the first
        inference: no template yet): its device nodes' events written as their steady steps
        write them, and the variant's template attached to them, so that later compiled
        inferences are one `plan compiled` event each. Returns the template (for infer_end),
        or None when it does not hold (the variant is dropped; the inference stands). Its time
        is the trace's part (accounting.preparing_trace)."""
        fast = self.fast
        decisions = fast.decisions
        with preparing_trace(decisions.trace):
            fast.restore.put_back()         # the nodes' layouts, for the events' fields
            fast.restore = None
            for inst, step in zip(c.device, c.steps):
                steady.write_events(decisions, inst, step)
            bound = step_events.attach(c, decisions.log, got[-1], decisions.trace.iter, fast.templates + 1)
        if bound is None:               # dropped, counted with the refused traces
            key = self._key()
            self.table[key].remove(c)
            self.why_not = step_events.REFUSED
            self.refusals[key] = self.refusals.get(key, 0) + 1
            return None
        tpl, counters = bound
        if counters != c.steady_counts:
            self.counts_differ += 1
        return tpl

    def _apply(self, c: Compiled, got: tuple, moved: bool) -> bool:
        """The compiled inference, when the state allows it (else False, nothing changed), also
        where buffers move (`moved`: an input's did; growth.py)."""
        fast = self.fast
        kernels, images, calls, live, layouts, keys, env = got
        if not _steady_from(fast, c, keys):
            return False
        buffers, queue = fast.buffers, fast.queue
        keep = not moved and buffers_keep(buffers, calls, self.host_params)
        if not keep and c.base is None and fast.decisions.traced:
            return False                # (its template is made by an inference that keeps)
        if not keep and not all(call[3] for call in calls):
            return False                # an empty buffer: the flow asks the policy nothing
        self.written = []
        # from here on the inference is the compiled one
        late, fast.late = fast.late, None
        if late is not None:            # (what its own state does not set)
            for obj, values in rest_of(late, c):
                obj.restore(values)
        if keep:
            upload_host_params(buffers, self.host_params)
            fresh = ()
        else:           # uploaded by their readers in the growth (a buffer may grow)
            fresh = [(t, t.host, t.version) for t in self.host_params
                     if t.host is not None and t.dev_version != t.version]
        _set_at_once(c, layouts)
        if queue.args_version != c.args[0]:
            put_back_args(queue, c.args[1])
            c.args = (queue.args_version, c.args[1])
        write_image(queue.arena, c, images)
        if keep:
            counters = c.counters
            fast.restore = Pending(c, env, keys)
        else:
            counters = self._grow(c, calls, Pending(c, env, keys), fresh)
        queue.arena.flush(queue.write)
        queue.enqueue(kernels)
        for cache, key in c.touches:            # the flow's cache hits, in the LRU orders too
            cache.get(key)
        if keep:
            # (buffers_keep said so); the grouping kept with the function, which holds no
            # buffers (a dropped variant's arguments are not kept alive by the policy)
            repeat_predictor_calls(buffers, calls, kept=True, key=c.fn)
        buffers.memory.note_many(live)
        fast.decisions.counters.update(counters)
        self.last = (c, got)
        return True

    def _grow(self, c: Compiled, calls, pending: Pending, fresh: list):
        """The flow's resource decisions of a compiled inference whose buffers do not all keep
        (growth.py), `fresh`: (host value, its value, its version) of those newer on the host.
        Returns the inference's counters."""
        fast = self.fast
        # what may have moved: the inputs, the views of them, the host values
        may = self.inputs + [dst for dst, _ in c.host_views] + [t for t, _, _ in fresh]
        counted = not fast.decisions.traced and growth.counted(c, may)
        if counted:         # the nodes' state waits, as a compiled inference's does
            fast.restore = pending
        else:               # (a traced one's nodes' events read the whole state)
            pending.put_back()
            fast.restore = None
        for t, value, version in fresh:
            t.host, t.version = value, version
        if counted:
            counters, self.moved = growth.grow_counted(fast, c, calls, may)
        else:
            counters, self.moved, self.written = growth.grow(fast, c, calls, may)
        self.left = (fast.decisions.trace.iter, (c.kernel_ids, pending.keys))    # (_left)
        return counters

    def rebind_grown(self) -> None:
        """After a compiled inference that moved buffers (growth.py), in the epoch it leaves:
        the variants of its kernels bound to them, as rebind does after a flow that grew them
        (their other resources and the nodes' other state are as they were: growth.rebound)."""
        c = self.last[0]
        for v in self.table.get(self._key(), ()):
            if v.counters is not None and v.kernel_ids == c.kernel_ids and v.host_structure == c.host_structure \
                    and v.epoch == self.fast.epoch - 1:
                growth.rebound(v, self.fast.epoch, self.moved)

    # ---- after an inference of the flow ----------------------------------------------------
    def record(self, counters, launches, reallocs, touches, log=None, iteration: int = -1) -> dict | None:
        """After an inference of the flow that changed no resource and whose device nodes all
        took steady steps: bind the compiled plan of its structure to this epoch, tracing it
        first if no variant's guards hold for these dims, and its variants of the same kernels
        (another batch, say) with it. In a traced run (`log`: the inference's events) that
        variant when its template holds (step_events.py), and the siblings whose templates held
        when they were bound first (their bases' events, with the capacities of the buffers
        bound now): returns the template, which the inference's infer_end carries."""
        fast = self.fast
        key = self._key()
        if self.refusals.get(key, 0) >= MAX_REFUSALS:
            return None
        cands = self.table.setdefault(key, [])
        host_structure, dims = self._dims()
        ids = _kernel_ids(fast)
        c, got = None, None
        for v in list(cands):
            if v.kernel_ids == ids and v.host_structure == host_structure:
                got = v.fn(*dims)
                if got is not None:
                    c = v
                    break
        if c is None:
            try:
                c = _build(fast, self.host_params, launches, reallocs, log)
                got = c.fn(*dims)
                check(got is not None, None, "its own dims")
            except Exception as e:      # an Escape, or an op's Python a Sym cannot follow
                self.why_not = f"{type(e).__name__}: {e}"
                self.refusals[key] = self.refusals.get(key, 0) + 1
                return None
            self._add(key, c, ids)
        tpl = None
        if log is not None:            # (the caller counts the base)
            with preparing_trace(fast.decisions.trace):
                bound = step_events.attach(c, log, got[-1], iteration, fast.templates + 1)
            if bound is None:          # a refused trace: dropped, counted with the others
                cands.remove(c)
                self.why_not = step_events.REFUSED
                self.refusals[key] = self.refusals.get(key, 0) + 1
                return None
            tpl, counters = bound      # (a traced step writes some decisions one by one)
        if counters != c.steady_counts:    # what build_ahead binds with is not what the flow counted
            self.counts_differ += 1
            if log is None:
                # a one-off of this flow (a node whose arguments an unfused run had changed
                # sets them back): its counts would be repeated by every compiled inference, so
                # the next flow of steady steps binds instead
                return None
        for v in cands:
            if v is c:
                _bind(fast, v, self.host_params, counters, launches, touches)
            elif v.kernel_ids == ids and v.host_structure == host_structure and \
                    (log is None or v.base is not None):
                # a traced run's sibling expands to its own base's events: its own counts
                _bind(fast, v, self.host_params, counters if log is None else v.counters, launches, touches)
        return tpl

    def build_ahead(self, launches, reallocs, log=None) -> None:
        """After the model's first inference, in the epoch it leaves: trace its plan now and
        bind it with what an inference of steady steps counts (steady.counts_of_steady), so
        that the second length is compiled already: the first inference is no steady one
        (kernels built, buffers taken), so its own counters do not serve; every later inference
        of the flow that binds a plan checks those counts against its own (`counts_differ`). In
        a traced run (`log`: the first inference's events, which name the fields that move) the
        first compiled inference writes its nodes' events and is its template's base
        (`_write_base`). A trace refused here is not counted."""
        fast = self.fast
        if self.table.get(self._key()):
            return                      # (a run the flow took again after an inference raised)
        try:
            c = _build(fast, self.host_params, launches, reallocs, log)
            got = c.fn(*self._dims()[1])
            check(got is not None, None, "its own dims")
        except Exception as e:      # an Escape, or an op's Python a Sym cannot follow
            self.why_not = f"{type(e).__name__}: {e}"
            return
        self._add(self._key(), c, _kernel_ids(fast))
        _bind(fast, c, self.host_params, c.steady_counts, launches, ())
        # its setter now, inside the model's first inference (10-25 ms, against 3-8 ms for each
        # put-back by substitution: the flow after a compiled inference, a growth), what its
        # first growth reads besides, and the policy's grouping of its calls (the first
        # inference's buffers each have a history of their own: merging those that agree is
        # the second length's to do otherwise)
        c.setter = c.session.setter(c.state)
        c.session = None
        growth.calls_by_node(c, got[2])
        group_ahead = getattr(fast.buffers.predictor, "group_ahead", None)
        if group_ahead is not None:
            group_ahead(got[2], c.fn)
        # and the state this inference leaves, as a Pending holds it (_steady_from)
        keys = keys_left(c.device)
        if keys is not None:
            self.ahead = (c, fast.decisions.trace.iter, keys)

    def rebind(self, launches, touches) -> None:
        """After an inference of the flow whose device nodes all took steady steps and whose
        only resource changes were new buffers: the variants of its structure and kernels bound
        to them, with the decisions they were bound with (a steady inference's, which keeps
        every buffer), so the next length need not run the flow to bind them."""
        fast = self.fast
        ids = _kernel_ids(fast)
        host_structure = structure([t.layout for t in self.host_params], ())
        for v in self.table.get(self._key(), ()):
            if v.counters is not None and v.kernel_ids == ids and v.host_structure == host_structure:
                _bind(fast, v, self.host_params, v.counters, launches, touches)


def agrees(fast, c, got: tuple, launches, reallocs) -> bool:
    """Whether a variant (a plan or steps) traced from another inference answers for the one just
    run what it did: the launches, their shape_info, the predictor calls, the live bytes, the
    outputs' layouts (what _build checks a new trace against)."""
    kernels, images, calls, live, layouts = got[:5]
    now = fast.buffers.memory.live()
    if _sizes(kernels) != _sizes((k, g, lw) for _, k, g, lw, _, _ in launches) or \
            [(t, tuple(map(int, sh)), bits) for t, sh, bits in reallocs] != \
            [(t, tuple(sh), bits) for t, _, sh, _, bits in calls] or \
            any(now.get(name) != n for name, n in live.items()) or \
            list(layouts) != [t.layout for t in c.immediate]:
        return False
    infos = {}
    for b, *_, info in launches:
        if b is not None and info is not None and b.slot is not None:
            infos.setdefault(id(b.slot.chunk), {})[id(b)] = info
    for (chunk, _, base, var, _, _, _), vals in zip(c.image, images):
        v = base.copy()
        v[var] = vals
        seen = list(infos.get(id(chunk), {}).values())
        if not seen or not np.array_equal(v, np.concatenate(seen)):
            return False
    return True


def _sizes(kernels) -> list:
    return [(k, tuple(g), tuple(lw) if lw else None) for k, g, lw in kernels]


def buffers_keep(buffers, calls, host_params) -> bool:
    """Whether a compiled inference changes no buffer: every predictor call `(tensor, id,
    shape, need, bits)` surely keeps its buffer, every new host value fits its buffer."""
    predictor = buffers.predictor
    for t, name, _, need, _ in calls:
        if not t.capacity or not surely_keeps(predictor, t.state, need, name):
            return False
    return not any(t.host is not None and t.dev_version != t.version and t.capacity < t.host.nbytes
                   for t in host_params)


def upload_host_params(buffers, host_params) -> None:
    """The host values device kernels read, uploaded where the device holds an older one."""
    for t in host_params:
        if t.host is not None and t.dev_version != t.version:
            buffers.upload(t)


def _set_at_once(c: Compiled, layouts: tuple) -> None:
    """What a compiled inference sets of its tensors at once: the graph's outputs (their
    `layouts`, read after it), the views of host values (they share their buffers)."""
    for t, values in c.io_snapshot:
        t.restore(values)
    for t, l in zip(c.immediate, layouts):
        t.layout = l
        t.host = None
    for dst, src in c.host_views:
        dst.buf, dst.offset = src.buf, src.offset
        dst.host = None if src.host is None else src.host.reshape(dst.layout.shape)
        dst.version, dst.dev_version = src.version, src.dev_version


def _steady_from(fast, c: Compiled, keys: tuple) -> bool:
    """Whether the state the last inference left is one from which every device node takes
    its steady step: the same kernels bound, nothing skipped or done by another node, every
    node's input layouts moved."""
    r, ahead = fast.restore, fast.compiled.ahead
    if r.__class__ is Pending:
        ids, prev = r.c.kernel_ids, r.keys
    elif r is None and ahead is not None and ahead[0] is c and ahead[1] == fast.decisions.trace.iter - 1:
        ids, prev = c.kernel_ids, ahead[2]    # the state the model's first inference left
    else:
        left = _left(fast)
        if left is None:
            return False
        ids, prev = left
    return ids == c.kernel_ids and len(prev) == len(keys) and None not in prev and \
        not any(map(operator.eq, keys, prev))


def _left(fast) -> tuple | None:
    """(kernel ids, node keys) of the state the flow or a whole plan left, None where a node
    was skipped, done by another or run in place. Read when that inference ends, while the
    device runs its kernels (state_left: 156-224 us of the BERT's next inference on an H200
    host otherwise): a whole plan's with its recording (its state never changes), a flow's
    (`CompiledPlans.left`) in end_flow; here only where neither was."""
    plan = fast.put_back_plan if fast.restore is None else None
    if plan is not None and plan.leaves is not None:
        return plan.leaves[0]
    flow = fast.compiled.left
    if plan is None and flow is not None and flow[0] == fast.decisions.trace.iter - 1:
        return flow[1]
    fast.put_back_late()
    left = state_left(fast)
    if plan is not None:
        plan.leaves = (left,)
    return left


def rest_of(plan, c: Compiled) -> list:
    """The entries of `plan`'s device nodes' part (Plan.split) that variant `c`'s own state does
    not set (its snapshot's objects; a compiled plan's put back of the same kernels': the same
    objects and attributes), once per plan and variant: put back before `c`'s inference, where
    a replay of `plan` came before it."""
    got = plan.rest.get(id(c))
    if got is None or got[0] is not c:
        covered = {id(obj) for obj, _ in c.snapshot}
        got = plan.rest[id(c)] = (c, [e for e in plan.split[1] if id(e[0]) not in covered and not (
            e[0].__class__ is Pending and e[0].c.kernel_ids == c.kernel_ids)])
    return got[1]


def state_left(fast) -> tuple | None:
    """_left's answer for the nodes' state now."""
    keys = keys_left(fast.compiled.device_insts)
    return None if keys is None else (_kernel_ids(fast), keys)


def compiled_image(image: list) -> list:
    """image_blocks' blocks as write_image takes them: (chunk, word indices, the values with 0
    where they are symbolic, the positions of those, slots, byte span)."""
    out = []
    for (chunk, idx, slots, lo, hi), vals in image:
        var = [k for k, v in enumerate(vals) if v.__class__ is Sym]
        base = np.asarray([0 if v.__class__ is Sym else int(v) for v in vals], np.int32)
        out.append((chunk, idx, base, np.asarray(var, np.intp), slots, lo, hi))
    return out


def image_of(c: Compiled, images: tuple) -> list:
    """Variant `c`'s shape_info image for its function's image values, as
    ShapeInfoArena.write_image takes it."""
    image = []
    for (chunk, idx, base, var, slots, lo, hi), vals in zip(c.image, images):
        v = base.copy()
        v[var] = vals
        image.append((chunk, idx, v, slots, lo, hi))
    return image


def write_image(arena, c: Compiled, images: tuple) -> None:
    arena.write_image(image_of(c, images))
    for b in c.bounds:          # their slots hold what no array of theirs says: the flow rewrites
        b.info = None


def _kernel_ids(fast) -> tuple:
    return tuple(id(b) for i in fast.insts for b in i.bound)


def keys_left(device) -> list | None:
    """node_keys of the state the last inference left, None where a node was skipped, done by
    another or run in place (no steady step follows)."""
    if any(i.skip_now or i.shape_done_by_other or i.in_place_now for i in device):
        return None
    return node_keys(device)


def node_keys(device) -> list:
    """Each device node's input dims as its state says (None: it has not run)."""
    return [None if i.in_layouts is None else tuple(args_of(i.in_layouts, ())) for i in device]


def _host_params(fast) -> list:
    """Host nodes' outputs that device nodes read (their layouts are parameters too)."""
    host = {id(t) for i in fast.insts if i.node.host for t in i.outputs}
    out, seen = [], set()
    for i in fast.insts:
        if not i.node.host:
            for t in i.inputs:
                if t is not None and id(t) in host and id(t) not in seen:
                    seen.add(id(t))
                    out.append(t)
    return out


def _build(fast, host_params, launches, reallocs, log=None) -> Compiled:
    """Trace the inference just run (module docstring); Escape when it cannot be compiled. In a
    traced run (`log`: its events), its events' moving fields too."""
    insts, steps, tensors = fast.insts, fast.steady_steps, fast.buffers.tensors
    inputs = [tensors[n] for n in fast.program.inputs]
    if fast.by_value:
        raise Escape("shape inference reads input values")
    host_valued = {id(t) for t in inputs} | {id(t) for i in insts if i.node.host for t in i.outputs}
    for inst in insts:
        if inst.node.host and any(t is not None and not t.constant and id(t) not in host_valued
                                  for t in inst.inputs):
            raise Escape(f"host node {inst.node.name} reads a device tensor")
    s = Session()
    sym: dict = {}                      # id(tensor) -> symbolic layout
    state: list = []                    # (object, attribute, value) the flow left
    per_bound: dict = {}                # id(bound kernel) -> (gws, lws, shape_info values)
    host_views = []
    device, keys, device_steps = [], [], []     # device nodes; their input dims; their steps
    answers: dict = {}                  # a class's answer for symbolic inputs
    with s:
        for t in inputs + host_params:
            sym[id(t)] = s.layout(t.layout)
        for inst, step in zip(insts, steps):
            if not inst.node.host:
                in_l = trace_node(inst, step, sym, state, per_bound, host_valued, host_views, answers)
                device.append(inst)
                device_steps.append(step)
                keys.append(tuple(args_of(in_l, ())))
        kernels, calls, live_names, live_vals, immediate = answers_of(fast, launches, reallocs, per_bound, sym)
        # a view of a host value takes it reshaped to its own layout: set at once too
        immediate += [dst for dst, _ in host_views if id(dst) in sym and dst not in immediate]
        image = image_blocks(fast, launches, per_bound)
        moving = step_events.symbolic(device, state, log) if log is not None else None
        parts = answer_sources(s, sym, kernels, image, calls, live_names, live_vals, immediate, keys)
        fn, src = s.function("compiled_plan", "(" + ", ".join(parts + ["locals()"]) + ")")
    c = Compiled()
    c.fn, c.source, c.state, c.setter, c.session, c.put_backs = fn, src, state, None, s, 0
    c.moving, c.base, c.variables, c.counters, c.steps = moving, None, None, None, device_steps
    c.repeat_counts = c.repeat_of = c.calls_by_node = c.growth_table = c.moved = None
    owned = {id(t) for i in device for t in list(i.outputs) + i.internals}
    c.steady_counts = steady.counts_of_steady(device, device_steps,
                                              sum(id(t) in owned for t, *_ in calls))
    # bound by _bind (record or rebind); until then no epoch serves it
    c.epoch, c.snapshot, c.args, c.touches, c.io_snapshot = -1, None, None, None, None
    c.host_structure = structure([t.layout for t in host_params], ())
    c.image = compiled_image(image)
    c.immediate = immediate
    c.host_views = host_views
    c.bounds = [b for i in insts for b in i.bound]
    c.device = device
    return c


def answer_sources(s: Session, sym, kernels, image, calls, live_names, live_vals, immediate, keys) -> list:
    """Source of what a generated function returns (answers_of's, symbolic): the launches, the
    shape_info image's symbolic values, the predictor calls, the live bytes, the immediate
    layouts, each device node's input dims."""
    n = s.named
    return [
        "[" + ", ".join(f"({s.const(k)}, {n(g)}, {n(l)})" for k, g, l in kernels) + "]",
        "(" + "".join(s.source(tuple(v for v in vals if v.__class__ is Sym)) + ", " for _, vals in image) + ")",
        "[" + ", ".join(f"({s.const(t)}, {name!r}, {n(shape)}, {n(need)}, {bits})"
                        for t, name, shape, need, bits in calls) + "]",
        "dict(zip(" + s.const(live_names) + ", (" + "".join(n(v) + ", " for v in live_vals) + ")))",
        "(" + "".join(n(sym[id(t)]) + ", " for t in immediate) + ")",
        "(" + "".join(n(k) + ", " for k in keys) + ")"]


def answers_of(fast, launches, reallocs, per_bound, sym, only=None) -> tuple:
    """What `fn` returns, symbolic, each checked against what the flow did: the launches, the
    predictor calls, the live bytes (by name; `only`: of these names), the tensors whose
    layouts are set at once."""
    kernels = []
    for b, kernel, gws, lws, _, info in launches:
        got = per_bound.get(id(b)) if b is not None else None
        check(got is not None, None, "a launch of no steady kernel")
        check(concrete(got[0]) == tuple(gws) and concrete(got[1]) == (tuple(lws) if lws else lws),
               None, "a launch's work sizes")
        if info is not None:
            check(np.array_equal(np.asarray(concrete(got[2])), info), None, "a shape_info block")
        kernels.append((kernel, got[0], got[1]))
    calls = []
    for t, shape, bits in reallocs:
        l = sym.get(id(t))
        check(l is not None and concrete(l.shape) == tuple(map(int, shape)), None,
               f"a buffer requirement of {t.name}")
        calls.append((t, t.name, l.shape, prod(l.shape), bits))
    by_name = {t.name: t for i in fast.insts for t in list(i.outputs) + i.internals}
    graph_inputs = set(fast.program.inputs)
    live_names, live_vals = [], []
    for name, nbytes in fast.buffers.memory.live().items():
        if name in graph_inputs or (only is not None and name not in only):
            continue                        # set_input notes them
        t = by_name.get(name)
        l = sym.get(id(t)) if t is not None else None
        check(l is not None and concrete(l.nbytes) == nbytes, None, f"the live bytes of {name}")
        live_names.append(name)
        live_vals.append(l.nbytes)
    immediate = [t for t in fast.io_tensors if id(t) in sym and t.name not in graph_inputs]
    return kernels, calls, live_names, live_vals, immediate


def trace_node(inst, step, sym, state, per_bound, host_valued, host_views, answers) -> list:
    """One device node of `_build`'s trace: its op's answer on the symbolic input layouts
    (once per class of nodes and symbolic inputs: `answers`), its kernels' work sizes and
    shape_info values, the state it leaves. Returns its symbolic input layouts."""
    if step is not steady.kernel_step and step is not steady.view_step:
        raise Escape(f"{inst.node.name} takes no steady step")
    for i in inst.opdef.shape_deps:
        t = inst.inputs[i] if i < len(inst.inputs) else None
        if t is not None and not t.constant:
            raise Escape(f"{inst.node.name} reads shape values that are not constants")
    in_l = [None if t is None else sym.get(id(t), t.layout) for t in inst.inputs]
    key = (inst.shape_class, inst.deps_key, step, tuple(map(_sym_key, in_l))) \
        if inst.shape_class is not None else None
    got = answers.get(key) if key is not None else None
    if got is None:
        got = op_answer(inst, in_l, inst.deps, None, step is steady.kernel_step)
        if key is not None:
            answers[key] = got
    out, unfuse, calls = got
    if unfuse:
        raise Escape(f"{inst.node.name}: fusion invalid")
    for t, l in zip(inst.outputs, out):
        check(concrete(l) == t.layout, inst, "an output layout")
        sym[id(t)] = l
        state.append((t, "layout", l))
    state.append((inst, "in_layouts", in_l))
    if step is steady.view_step:
        if id(inst.inputs[0]) in host_valued:
            host_valued.add(id(inst.outputs[0]))
            host_views.append((inst.outputs[0], inst.inputs[0]))
        return in_l
    check(calls is not None and len(calls) == len(inst.bound), inst, "its kernel calls")
    internal = next((c.internal for c in calls if c.internal), ())
    state.append((inst, "internal_layouts", internal))
    for k, l in enumerate(internal):
        t = inst.internals[k]
        sym[id(t)] = l
        state.append((t, "layout", l))
    for call, b in zip(calls, inst.bound):
        # the same impl (kernel_step's check): what picks it becomes guards. Its arguments in
        # the same order too: the variant binds the tensors the node is bound to now (its
        # growth table included), and an op whose order depended on a dim would have met it
        # as a guard in this trace
        rec = b.call
        check(call.kernel == rec.kernel and call.source == rec.source and
               call.args == rec.args and call.jit == rec.jit, inst, "its impl")
        gws, lws = work_sizes(call, b.cpu)
        blocks = [(t.offset, call.dims.get(p, sym.get(id(t), t.layout).shape))
                  for p, t in enumerate(b.tensors)]
        per_bound[id(b)] = (gws, lws, shape_info_values(blocks, call.params))
        state += [(b, "call", call), (b, "gws", gws), (b, "lws", lws)]
    return in_l


def _sym_key(l) -> tuple | None:
    """A symbolic layout as a key: its dims' variables (a Sym has no hash)."""
    if l is None:
        return None
    return (tuple(d.name if d.__class__ is Sym else d for d in l.shape), l.dtype, l.format,
            None if l.pad is None else tuple(d.name if d.__class__ is Sym else d for d in l.pad))


def image_blocks(fast, launches, per_bound) -> list:
    """The launches' shape_info blocks by arena chunk: ((chunk, word indices, slots, byte span),
    values) each, the values symbolic where they move with the dims."""
    by_chunk: dict = {}
    seen = set()
    for b, _, _, _, _, info in launches:
        if b is None or info is None or b.slot is None or id(b) in seen:
            continue
        seen.add(id(b))
        by_chunk.setdefault(id(b.slot.chunk), (b.slot.chunk, []))[1].append((b.slot, per_bound[id(b)][2]))
    out = []
    for chunk, items in by_chunk.values():
        idx = np.concatenate([np.arange(sl.at // 4, sl.at // 4 + len(v)) for sl, v in items])
        vals = [x for _, v in items for x in v]
        lo = min(sl.at for sl, _ in items)
        hi = max(sl.at + 4 * len(v) for sl, v in items)
        out.append(((chunk, idx, [sl for sl, _ in items], lo, hi), vals))
    return out


def _bind(fast, c: Compiled, host_params, counters, launches, touches) -> None:
    """The epoch's resources: arguments, the nodes' state (their shapes the function's), the
    cache touches and the decisions' counters of the inference just run."""
    c.epoch = fast.epoch
    c.counters = counters
    c.touches = list(touches)
    c.args = (-1, [(b, k, args) for b, k, _, _, args, _ in launches if b is not None])
    skip = {id(t) for t in c.immediate} | {id(t) for t in host_params} | \
        {id(dst) for dst, _ in c.host_views} | {id(fast.buffers.tensors[n]) for n in fast.program.inputs}
    snap = []
    for inst in fast.insts:
        if inst.node.host:
            continue
        snap += inst.snapshot()
        snap += [(t, t.snapshot()) for t in inst.outputs if id(t) not in skip]
    c.snapshot, c.moved = snap, None
    c.io_snapshot = [(t, t.snapshot()) for t in c.immediate]
    c.growth_table = growth.table(c)
