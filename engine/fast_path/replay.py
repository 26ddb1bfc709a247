"""FastPath: records an inference of the flow as the plan of its transition and replays it
(the package's docstring says when and why)."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from engine.device_queue import Observer
from engine.fast_path import compiled, compiled_steps, partial, shape_fns, steady
from engine.fast_path.plans import (Plan, blocker, grown_only, input_array, put_back_args,
                                    repeat_predictor_calls, resource_free, signature)
from engine.layout import dtype_from_numpy
from engine.memo import Memo
from traces.schema import PLAN_BASES_KEPT, TEMPLATE_BASES_KEPT

# counters that are measurements or the fast path's own, not the flow's decisions
NOT_DECISIONS = frozenset({"latency_ms", "compile_ms", "compile_ms_critical", "plan.replay",
                           "plan.replay.same_signature", "plan.replay.transition",
                           "plan.partial", "plan.compiled"})

__all__ = ["COMPILE_MODES", "FastPath", "NOT_DECISIONS", "signature"]

_IMPL_CHANGES = ("update_impl.switch", "update_impl.build", "update_weights.")
# counters a repeat of a compiled inference measures itself (the network, after the nodes)
_MEASURED = frozenset({"peak_bytes", "live_bytes_lower_bound"})
# what a flow that only skipped does not count (a repeat's counts are learned from one)
_NOT_SKIPS = ("update_impl", "update_weights", "realloc.alloc", "realloc.reuse", "realloc.from_pool",
              "set_args.set", "fusion", "in_place_concat", "execute.unfused")
# what is compiled: nothing, a partial plan's dirty steps (a decode step), or whole plans too
COMPILE_MODES = ("off", "partial", "all")
SEEN_KEPT = 1024


class FastPath(Observer):
    def __init__(self, program, insts, buffers, queue, decisions, by_value: frozenset, read_after=(),
                 feedback: bool = False, compile_plans: str = "partial"):
        if compile_plans not in COMPILE_MODES:
            raise ValueError(f"compile_plans must be one of {', '.join(COMPILE_MODES)}, not {compile_plans!r}")
        self.program, self.insts, self.buffers, self.queue, self.decisions = program, insts, buffers, queue, decisions
        # why whole-inference plans cannot be recorded ("" when they can); partial plans can
        self.blocker = blocker(insts, feedback)
        self.by_value = by_value       # graph inputs whose values decide shapes (value_inputs)
        self.plans = Memo(PLAN_BASES_KEPT)   # (previous signature, signature) -> Plan
        self.epoch = 0                 # inferences of the flow that changed a resource
        # transitions the flow ran once in this epoch, the latest SEEN_KEPT: a run of many
        # lengths meets up to their square of them, each holding its own two signatures
        self.seen = Memo(SEEN_KEPT)
        self.last_sig = None
        # the replayed plan (or compiled inference: compiled.Pending) whose node state is not
        # put back yet
        self.restore: Plan | compiled.Pending | None = None
        self.put_back_plan: Plan | None = None
        self.late: Plan | None = None  # the whole plan whose device nodes' part waits (_put_back)
        self.recording = None          # (previous signature, signature, memory changes)
        self._launches: list | None = None
        self._reallocs: list | None = None
        self._touches: list | None = None
        # partial replay (engine/fast_path/partial.py): the plan the nodes are current with
        self.attribution = partial.Attribution(insts)
        self.current: partial.PartialPlan | None = None
        self._partial: partial.PartialPlan | None = None   # the one this inference runs
        self._steady: steady.SteadyRun | None = None       # its dirty nodes' steady steps
        self.steady_steps = [steady.applier(i) for i in insts]
        self._traced_ahead = False
        # compiled shape functions of the steady steps' templates (shape_fns.py)
        self.shape_fns = shape_fns.ShapeFns()
        self._changed: frozenset = frozenset()
        self._fed: frozenset = frozenset()
        self.bases = self.templates = 0    # plan bases written, those with a template (readers keep the last few)
        # compiled plans (`compile_plans`: "off", "partial" or "all"): a partial plan's dirty
        # steps (compiled_steps.py: a decode step) by default; whole plans (compiled.py) when
        # asked (the command line's default: dyncli/defaults.py)
        self.compiled = compiled.CompiledPlans(self) if compile_plans == "all" and not self.blocker \
            and not by_value else None
        self.steps = compiled_steps.CompiledSteps(self) if compile_plans != "off" else None
        self._steps_ran = False        # this partial replay was a compiled one
        self._template = None          # the template of a compiled plan bound now (traced runs)
        self._ran = 0                  # compiled.CompiledPlans.run's answer for this inference
        self._repeated = None          # the variant this flow repeats the inference of (_learn_repeat)
        self._entry: dict = {}         # the counters when its nodes began
        self._learned = None           # the variant this flow's repeat counts were learned for
        self._all_steady = False       # every device node of this flow took a steady step
        self._open = False             # an inference began and has not ended (it raised)
        self._tensor_roles(program, insts, buffers.tensors, read_after)

    def _tensor_roles(self, program, insts, tensors, read_after) -> None:
        """The tensors and nodes an inference's recording and replay treat apart."""
        # graph outputs a host impl computes (shape subgraphs) keep their host value; every
        # other output is read back from its buffer
        host = {t.name for i in insts if i.node.host for t in i.outputs}
        self.device_outputs = [o for o in program.outputs if o not in host]
        # host values that device kernels read: a replay makes sure the device holds its own
        self.host_args = list({t.name: t for inst in insts for i in inst.family()
                               if not i.node.host for t in i.inputs
                               if t is not None and t.name in host}.values())
        self.all_insts = [i for inst in insts for i in inst.family()]
        self._unfused_writes = {id(t) for inst in insts for m in inst.family()[1:] for t in m.outputs}
        # graph inputs and outputs, and what is read after an inference (`read_after`: the
        # index checks' data and indices): their state is put back at once (outputs are read,
        # callers ask for the shapes), the rest lazily
        self.io_tensors = {tensors[n] for n in list(program.inputs) + program.outputs} | set(read_after)
        # a whole plan's state of the device nodes and their outputs but the graph's: the part
        # a compiled inference after its replay mostly sets itself (_put_back)
        self._device_part = {id(x) for i in insts if not i.node.host
                             for x in [i] + [t for t in i.outputs if t not in self.io_tensors]}

    # ---- the observer: what the flow enqueues and asks the predictor --------------------
    def launched(self, bound, kernel, gws, lws) -> None:
        if self._launches is not None:
            self._launches.append((bound, kernel, gws, lws, bound and bound.arg_ids,
                                   bound and bound.info))

    def predicted(self, tensor, shape, bits) -> None:
        if self._reallocs is not None:
            self._reallocs.append((tensor, shape, bits))

    def touched(self, cache, key) -> None:
        if self._touches is not None:
            self._touches.append((cache, key))

    # ---- around an inference of the flow ------------------------------------------------
    def input_changes(self, feeds: dict, fed_back: dict, free: frozenset = frozenset()) -> frozenset:
        """The graph inputs the coming inference changes, as (name, "layout") and, for those
        shape inference reads, (name, "value"). A layout change counts as both (every reader
        runs the flow then); a value change alone leaves the readers of the data clean, so a
        base recorded for one does not serve a layout change. Inputs in `free` are not looked
        at (a partial plan whose base changed their layout allows any change of them)."""
        tensors, out = self.buffers.tensors, set()
        for name in self.program.inputs:
            if name in free:
                continue
            t = tensors[name]
            v = feeds.get(name)
            if name in fed_back:
                layout = tensors[fed_back[name]].layout != t.layout
                # a fed-back shape value changes by value too (its host value, when the caller
                # gives it, is what shape inference reads; without it the flow reads the device)
                value = name in self.by_value and (v is None or not np.array_equal(t.host, v))
            elif v is None:
                continue
            else:
                l = t.layout
                layout = l is None or l.shape != np.shape(v) or \
                    l.dtype != dtype_from_numpy(np.asarray(v).dtype)
                value = name in self.by_value and not np.array_equal(t.host, v)
            if layout:
                out.add((name, "layout"))
            if layout or value:
                out.add((name, "value"))
        return frozenset(out)

    def partial_for(self, feeds: dict, fed_back: dict) -> "partial.PartialPlan | None":
        """The partial plan the coming inference may run, if any (partial.py says when)."""
        p, r = self.current, self.restore
        if p is None or (r is not None and not (r.__class__ is compiled.Pending and
                                                getattr(r.c, "plan", None) is p)) or \
                p.fed != frozenset(fed_back) or \
                self.bases - p.base_no >= PLAN_BASES_KEPT:   # a reader no longer holds its base
            return None
        return p if self.input_changes(feeds, fed_back, p.free) <= p.changed else None

    def begin_flow(self, sig, feeds: dict, fed_back: dict, plan=None) -> None:
        """Put the nodes' state back if plans ran since the flow last did; log what this
        inference enqueues, asks the predictor and decides (`plan`: the partial plan it runs,
        which records nothing)."""
        if self.restore.__class__ is not compiled.Pending:   # (no partial plan follows one)
            # a compiled inference's state waits for run_flow; so does a whole plan's device
            # nodes' part where a compiled inference may follow (it sets most of it again)
            self._put_back(defer=plan is None and self.compiled is not None)
        self._open = True
        self._learned = None           # (an inference that raised while recording left one)
        self.recording = (self.last_sig, sig, self.buffers.memory.changes)
        self._partial, self._steps_ran = plan, False
        if plan is not None and self.steps is not None:    # what compiled steps are traced from
            self._launches, self._reallocs, self._touches = [], [], []
            if self.decisions.traced:  # (and the events a traced run's template names)
                self.decisions.log = []
        if plan is None:
            self._changed, self._fed = self.input_changes(feeds, fed_back), frozenset(fed_back)
            self._launches, self._reallocs, self._touches = [], [], []
            self.decisions.log = []

    def _put_back(self, defer: bool = False) -> None:
        """The nodes' state as the last inference left it, before the flow reads it. `defer`:
        of a whole plan, all but its device nodes' part (Plan.split), which waits in `late`
        until the flow needs it; a compiled inference puts back only what its own state does
        not set (compiled.rest_of: 275-427 us of the BERT's inference after a replay on an H200
        host, the whole state put back)."""
        r, self.restore = self.restore, None
        self.put_back_late()
        # a whole plan's state, put back for this inference (compiled.py reads what it leaves)
        self.put_back_plan = r if r.__class__ is Plan else None
        if r.__class__ is compiled.Pending:
            r.put_back()
        elif r is not None and defer:
            _restore(r.split[0])
            self.late = r
        elif r is not None:
            _restore(r.split[0])
            _restore(r.split[1])

    def put_back_late(self) -> None:
        """The device nodes' part of a whole plan's state, where it waits (`late`)."""
        late, self.late = self.late, None
        if late is not None:
            _restore(late.split[1])

    def run_flow(self, prebuild) -> None:
        """The nodes' part of an inference of the flow: its compiled plan (compiled.py) where
        one holds, else each node's steady step (steady.py) where it holds (its shapes moved and
        nothing else did), else its flow. `prebuild(bound)`: the impl manager's walk of the new
        signature (ImplManager.prebuild), made before the flow, only counted when a compiled
        plan served."""
        run = self._steady = steady.SteadyRun(self.decisions, self.shape_fns)
        ran = self._ran = self.compiled.run() if self.compiled is not None else 0
        if ran != 1:
            # (a repeat of the compiled inference before, or of the one the plan replayed
            # before was recorded from: what the flow counts, learned)
            self._repeated = self.compiled.repeatable()[0] if self.compiled is not None and \
                self.recording[0] == self.recording[1] else None
            self._entry = dict(self.decisions.counters)    # (the inputs' decisions, counted before)
            self._put_back()
        prebuild(ran == 1)
        if ran == 1:
            self.decisions.counters["plan.compiled"] = 1
            return
        steady_only = True
        try:
            for inst, step in zip(self.insts, self.steady_steps):
                if ran and inst.node.host:
                    continue           # run before the compiled plan was tried
                if step is None or not step(inst, run):
                    inst.execute()
                    steady_only &= inst.node.host
        finally:
            run.finish()
        self._all_steady = steady_only

    def trace_ahead(self) -> None:
        """After the first inference of the flow, its kernels sent to the device: trace the
        shape functions of every node a steady step may serve (steady.trace_ahead), so that the
        second signature does not pay for them."""
        if self._traced_ahead:
            return
        self._traced_ahead = True
        self.queue.flush()
        steady.trace_ahead(self.insts, self.steady_steps, self.shape_fns)

    def run_partial(self) -> int | None:
        """The nodes' part of the inference begun with a partial plan (partial.run), its
        dirty nodes' steady steps (steady.py) where they hold."""
        run = self._steady = steady.SteadyRun(self.decisions, self.shape_fns)
        done, hosts_done = self.steps.run(self._partial) if self.steps is not None else (False, frozenset())
        self._steps_ran = done
        if done:
            self.decisions.counters["plan.compiled"] = 1
            return None
        self._put_back()
        return partial.run(self._partial, self.queue, self.decisions.counters, self.buffers, run, hosts_done)

    def end_flow(self, counters: Counter, iteration: int, upto: int | None = None) -> dict:
        """After the flow's inference, or a partial replay (`upto`: partial.run's answer):
        trace the partial replay or the compiled inference; record whole and partial plans
        from a flow where it allows, bind compiled ones. Returns what the inference's infer_end
        carries of it (plan_base, clean_nodes, template). The inference stays open (`_open`)
        until its outputs are read (`ended`): it records while the device runs the kernels, and
        a read that fails must not leave a plan of it in use."""
        p = self._partial
        traced = self.decisions.traced
        if p is not None:
            counters["plan.partial"] = 1
            # a compiled step's events: its base's, with `values` (step_events.py)
            stepped = dict(zip(("template_of", "values"), self.steps.last_values)) \
                if self._steps_ran and traced else {}
            self.decisions.trace.event("plan", "", "", "partial", "diverged" if upto is not None else "",
                                       of_iter=p.of_iter, kernels=p.kernels,
                                       upto=len(p.clean_nodes) if upto is None else upto,
                                       steady=self._steady.members, **stepped)
        elif self._ran == 1 and traced and self.compiled.repeat_of_iter is not None:
            # a repeat: the node events of the flow it learned from (the inputs' are in the file)
            self.decisions.trace.event("plan", "", "", "repeat", "same_signature", of_iter=self.compiled.repeat_of_iter,
                                       kernels=counters.get("kernels", 0))
        elif self._ran == 1 and traced and self.compiled.last_values is not None:
            base, values = self.compiled.last_values
            written = self.compiled.written    # (a growth: those nodes' events are in the file)
            self.decisions.trace.event("plan", "", "", "compiled", of_iter=base, template_of=base, values=values,
                                       **({"written": written} if written else {}))
        self._template = None
        based = self._ran == 1 and traced and self.compiled.last_values is None and \
            self.compiled.repeat_of_iter is None
        clean = self._record(counters, iteration, upto is not None)
        learned, self._learned = self._learned, None
        if based:                      # its events are in the file: the template's base
            self._template, self.compiled.template = self.compiled.template, None
        if clean is None and self._template is None:
            return {}
        self.bases += 1                # a base of plan events (the reader keeps the last few)
        if traced and learned is not None:    # a traced repeat of its variant stands for it
            learned.repeat_of = (iteration, self.bases)
        out = {"plan_base": True}
        if clean:
            out["clean_nodes"] = clean
        if self._template is not None:
            self.templates += 1
            out["template"] = self._template
        return out

    def ended(self) -> None:
        """The inference's outputs are read: what it recorded may serve."""
        self._open = False

    def _record(self, counters: Counter, iteration: int, diverged: bool) -> list | None:
        """The node names of the clean nodes of the partial plan recorded ([] when only a
        whole plan was), or None when this inference records neither; the template of the
        compiled plan or steps bound in a traced run goes to `_template`."""
        prev, sig, mem = self.recording
        launches, reallocs, log, touches = self._launches, self._reallocs, self.decisions.log, self._touches
        self._launches = self._reallocs = self._touches = self.decisions.log = None
        traced = self.decisions.traced
        self.last_sig = sig
        # (compiled steps change nothing but what the memory pool counts: they check it first)
        changed = self.buffers.memory.changes != mem or \
            (not self._steps_ran and not resource_free(self.insts, counters))
        if self._partial is not None:
            self._record_partial(counters, iteration, diverged, changed, launches, reallocs, touches,
                                 log if traced else None)
            return None
        self.current = None
        ran, self._ran = self._ran, 0
        if ran == 1:
            return self._record_compiled(prev, sig, iteration, counters, changed, traced)
        if self._repeated is not None and not changed and ran == 0:
            self._learn_repeat(self._repeated, counters)
        if not changed and self.compiled is not None and self._all_steady and prev is not None:
            self._template = self.compiled.record(self._steady.counted, launches, reallocs, touches,
                                                  log if traced else None, iteration)
        if self.compiled is not None:      # what a compiled inference next reads of it (compiled._left)
            self.compiled.left = (iteration, compiled.state_left(self))
        ahead = False                      # the model's first inference: its plan traced now
        if ran == 0 and not counters.get("device_reads"):
            if prev is None:
                ahead = self.compiled is not None
            else:                          # node by node
                self.current = partial.build(self.attribution, log, launches, self.buffers.memory.live(),
                                             set(self.program.outputs), iteration, self._changed, self._fed)
        clean = None
        if self.current is not None:
            self.current.base_no = self.bases + 1      # (end_flow counts it)
            clean = self.current.clean_nodes
        if changed:
            self._new_epoch()
        if ahead:                          # (in the epoch the first inference leaves)
            self.compiled.build_ahead(launches, reallocs, log if traced else None)
        if changed:
            # new buffers only (a length past their room), every device node steady: the
            # compiled plans bound before serve the next inference on the new ones
            if self.compiled is not None and self._all_steady and ran != 1 and \
                    prev is not None and grown_only(self.insts, counters):
                self.compiled.rebind(launches, touches)
            return clean
        # A repeated signature is recorded at once; a transition only when the flow runs it a
        # second time in this epoch: a policy that reallocates often (the plugin's reclaim)
        # would otherwise pay for recording plans that never live to be replayed.
        if self.blocker or (prev != sig and (prev, sig) not in self.seen):
            self.seen.put((prev, sig), None)
            return clean
        self.plans.put((prev, sig), self._whole_plan(prev, sig, iteration, counters, launches, reallocs, touches))
        return clean or []

    def _record_compiled(self, prev, sig, iteration: int, counters: Counter, changed: bool, traced: bool):
        """_record after a compiled inference: [] when it records its transition's plan."""
        if changed:                    # it moved buffers (growth.py): its plans follow them
            self._new_epoch()
            self.compiled.rebind_grown()
            return None
        if not self._records_compiled(prev, sig, traced):
            return None
        plan = self._plan_of_compiled(prev, sig, iteration, counters)
        if traced:
            self._expansion(plan)
        self.plans.put((prev, sig), plan)
        return []

    def _expansion(self, plan: Plan) -> None:
        """What the `plan replay` event of a plan recorded from a traced compiled inference
        carries besides its base (whose events in the file are its inputs' and host nodes'):
        the template and values its device nodes' events expand from, or for a repeat
        (`plan repeat`) the flow whose node events it stands for; and how old a base or
        template a reader must still hold for it (Plan.base_no, template_no)."""
        cp = self.compiled
        c = cp.last[0]
        if cp.repeat_of_iter is not None:
            plan.expands = {"repeat_of": cp.repeat_of_iter}
            plan.base_no = min(plan.base_no, c.repeat_of[1])
        elif cp.last_values is not None:
            base, values = cp.last_values
            plan.expands = {"template_of": base, "values": values}
            plan.template_no = c.base[1]

    def _record_partial(self, counters, iteration, diverged, changed, launches, reallocs, touches, log) -> None:
        """After a partial replay: bind its compiled steps (a traced run's template goes to
        `_template`)."""
        if self.steps is not None and not self._steps_ran and not diverged and not changed and \
                not counters.get("device_reads"):
            self._template = self.steps.record(self._partial, self._steady.members, self._steady.counted,
                                               launches, reallocs, touches, log, iteration)
        # a dirty node that switched impls may only repeat from now on: the next flow
        # records a plan with fewer dirty nodes (a compiled step kept every kernel bound)
        if diverged or (not self._steps_ran and any(k.startswith(_IMPL_CHANGES) for k in counters)):
            self.current = None
        self._partial = None
        if changed:
            self._new_epoch()

    def _learn_repeat(self, c, counters: Counter) -> None:
        """What the flow counted repeating a compiled inference of variant `c`, every node
        skipping (less what the inputs counted before the nodes ran): what `c`'s repeats count
        from then on (CompiledPlans._repeat); never where two such flows counted differently,
        or where a node did more than skip."""
        entry = self._entry
        got = Counter({k: v - entry.get(k, 0) for k, v in counters.items()
                       if k not in NOT_DECISIONS and k not in _MEASURED and not (k in entry and v == entry[k])})
        if got.get("update_shape.infer") or any(k.startswith(_NOT_SKIPS) for k in got):
            return
        c.repeat_counts = got if c.repeat_counts is None or c.repeat_counts == got else False
        self._learned = c if c.repeat_counts else None

    def _records_compiled(self, prev, sig, traced: bool) -> bool:
        """Whether a compiled inference is recorded as its transition's plan: the second time
        the transition is met, while the transitions met in this epoch fit the plans kept (a run
        of many lengths meets more, each once in a while: its plans would be dropped before
        their next use); a repeated signature at once, as the flow's. (In a traced run a replay
        stands for the inference's events in the file and what its own plan event stood for:
        _expansion.)"""
        if prev == sig:
            return True
        if (prev, sig) not in self.seen or len(self.seen) > PLAN_BASES_KEPT:
            self.seen.put((prev, sig), None)
            return False
        return True

    def _whole_plan(self, prev, sig, iteration, counters, launches, reallocs, touches) -> Plan:
        """The plan of the transition (prev, sig) from what the inference just run launched,
        asked the predictor and left the nodes in."""
        # the nodes the inference ran: not the unfused subgraphs of nodes that ran fused, left
        # as the flow leaves them (put back as they were when recorded, a later unfused run of
        # theirs would decide from a state the flow never left them in), nor what they write
        # (_unfused_writes)
        ran = [m for i in self.insts for m in _ran(i)]
        mine = {id(t) for i in ran for t in i.outputs}
        # (split: the device nodes' part apart, _put_back)
        early, late = [], []
        for i in ran:
            (late if id(i) in self._device_part else early).extend(i.snapshot())
        # (not the constants: their buffers only change by an upload, a memory change that
        # ends the plan's epoch; a third of a BERT's tensors)
        for t in self.buffers.tensors.values():
            if not t.constant and (id(t) in mine or id(t) not in self._unfused_writes):
                (late if id(t) in self._device_part else early).append((t, t.snapshot()))
        return Plan(
            key=(prev, sig), epoch=self.epoch, of_iter=iteration, base_no=self.bases + 1, launches=launches,
            kernels=[(k, g, l) for _, k, g, l, _, _ in launches],
            # the flow's predictor calls: (tensor, id, shape, its product, bits)
            reallocs=[(t, t.name, s, math.prod(s), bits) for t, s, bits in
                      ((t, tuple(map(int, shape)), bits) for t, shape, bits in reallocs)],
            hosts=[(t, t.host) for t in self.host_args if t.buf is not None and t.dev_src is t.host],
            counters=Counter(counters), split=(early, late),
            io_state=[e for e in early + late if e[0] in self.io_tensors], touches=touches,
            image=self.queue.arena.image([(b.slot, info) for b, _, _, _, _, info in launches
                                          if b is not None and info is not None and b.slot is not None]),
            infos=[(b, info) for b, _, _, _, _, info in launches if b is not None],
            args=[(b, k, args) for b, k, _, _, args, _ in launches if b is not None],
            arena_version=-1, args_version=-1,
            # (read as the flow ended: _record)
            leaves=None if self.compiled is None else (self.compiled.left[1],))

    def _plan_of_compiled(self, prev, sig, iteration, counters: Counter) -> Plan:
        """The plan of the transition (prev, sig) from the compiled inference just run: what its
        function answered (launches, image, predictor calls) and, for its state, a snapshot of
        what its own put back does not cover (the host nodes, the graph inputs and the tensors
        the inference set at once), then that put back (compiled.Pending): not a snapshot of
        every node and tensor taken at record time (3.3-3.8 ms of a BERT inference on an H200
        host, the second time a transition came). The snapshot goes first: taken before the
        inference's own put back, it may hold what that put back sets as it was before. Not the
        unfused subgraphs' nodes: the inference ran none of them, so its replays leave them as
        the flow would (put back as they were when recorded, a later unfused run of theirs would
        decide from a state the flow never left them in)."""
        c, got = self.compiled.last
        kernels, images, calls, keys, env = got[0], got[1], got[2], got[5], got[6]
        hosts = self.compiled.host_insts
        live = [e for i in hosts for e in i.snapshot()]
        tensors = {id(t): t for i in hosts for t in i.outputs}
        tensors.update((id(t), t) for t in c.immediate)
        tensors.update((id(dst), dst) for dst, _ in c.host_views)
        tensors.update((id(t), t) for t in self.compiled.inputs)
        live += [(t, t.snapshot()) for t in tensors.values() if not t.constant]
        counters = Counter(counters)       # a replay of it is no compiled inference
        del counters["plan.compiled"]
        repeat = prev == sig               # (CompiledPlans._repeat: no predictor call, no cache hit)
        pending = compiled.Pending(c, env, keys)
        return Plan(
            key=(prev, sig), epoch=self.epoch, of_iter=iteration, base_no=self.bases + 1, launches=kernels,
            kernels=kernels,
            reallocs=[] if repeat else [(t, t.name, s, math.prod(s), bits) for t, s, bits in
                                        ((t, tuple(map(int, shape)), bits) for t, _, shape, _, bits in calls)],
            hosts=[(t, t.host) for t in self.host_args if t.buf is not None and t.dev_src is t.host],
            counters=counters, split=(live, [(pending, None)]),
            io_state=[(t, t.snapshot()) for t in self.io_tensors if not t.constant],
            touches=[] if repeat else c.touches,
            # (the compiled inference left its bound kernels with no shape_info array: write_image)
            image=compiled.image_of(c, images), infos=[(b, None) for b in c.bounds],
            args=c.args[1], arena_version=-1, args_version=-1, leaves=((c.kernel_ids, keys),),
            compiled_from=(c, got))

    def _new_epoch(self) -> None:
        self.epoch += 1
        self.plans.clear()
        self.seen.clear()
        # (read only in the inference that put it back: dropped now, a plan of the epoch ended
        # is freed here, not by the next inference's _put_back, 126-186 us of a BERT's plan)
        self.put_back_plan = None

    # ---- the replay ---------------------------------------------------------------------
    def find(self, sig) -> Plan | None:
        if self._open:
            # the last inference raised midway: its nodes, buffers and predictor calls are as
            # no plan recorded them, so no plan (whole or partial) may be used before the flow
            # records new ones
            self._open = False
            self._new_epoch()
            self.current, self.last_sig = None, None
        if self.blocker:
            return None
        plan = self.plans.get((self.last_sig, sig))
        if plan is None or plan.epoch != self.epoch:
            return None
        if self.decisions.traced and (self.bases - plan.base_no >= PLAN_BASES_KEPT or (
                plan.template_no is not None and self.templates - plan.template_no >= TEMPLATE_BASES_KEPT)):
            return None                # a reader no longer holds what its event stands for
        return plan

    def replay(self, plan: Plan, feeds: dict, want: list) -> dict:
        """Upload the inputs, put back each kernel's arguments and shape_info where they
        differ, enqueue, make the flow's predictor calls, read the outputs."""
        queue, tensors = self.queue, self.buffers.tensors
        self._open = True
        _restore(plan.io_state)
        for name, value in feeds.items():
            t = tensors[name]
            value = input_array(value, name in self.by_value)
            t.host = value
            t.version += 1
            t.dev_version = t.version
            if value.nbytes:
                queue.write(t.buf, value)
        for t, arr in plan.hosts:      # shape-subgraph values of this signature on the device
            if t.dev_src is not arr and arr.nbytes:
                queue.write(t.buf, arr)
                t.dev_src = arr
        # the kernels' shape_info and arguments, unless nothing wrote a slot or set an argument
        # since this plan last put back its own (the same signature again); each bound
        # kernel keeps saying what its slot holds and what its arguments are (info, arg_ids)
        arena = queue.arena
        if plan.arena_version != arena.version:
            arena.write_image(plan.image)
            for b, info in plan.infos:
                b.info = info
            plan.arena_version = arena.version
        if plan.args_version != queue.args_version:
            put_back_args(queue, plan.args)
            plan.args_version = queue.args_version
        # one shape_info write before the kernels: a write behind them would wait for them
        arena.flush(queue.write)
        queue.enqueue(plan.kernels)
        for cache, key in plan.touches:        # the flow's cache hits, in the LRU orders too
            cache.get(key)
        repeat_predictor_calls(self.buffers, plan.reallocs, fixed=True)   # the same calls as the flow's
        queue.read_status()
        for name in want:
            if name in self.device_outputs:
                queue.read_to_host(tensors[name])
        self.last_sig = plan.key[1]
        self.restore = plan
        self._open = False
        self.current = None            # the nodes are left as another inference left them
        return {name: tensors[name].host for name in want}


def _ran(inst) -> list:
    """`inst` and, where it ran unfused in the inference just run, its unfused subgraph's nodes
    (theirs in turn where they did)."""
    if not inst.unfuse_reason:
        return [inst]
    return [inst] + [m for u in inst.unfused for m in _ran(u)]


def _restore(state: list) -> None:
    for obj, values in state:
        obj.restore(values)
