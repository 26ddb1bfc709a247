"""FastPath: records an inference of the flow as the plan of its transition and replays it
(the package's docstring says when and why)."""
from __future__ import annotations

from collections import Counter

import numpy as np

from engine.device_queue import Observer
from engine.fast_path.plans import Plan, blocker, resource_free, signature, value_inputs
from engine.memo import Memo
from traces.schema import PLAN_BASES_KEPT

# counters that are measurements or the fast path's own, not the flow's decisions
NOT_DECISIONS = frozenset({"latency_ms", "compile_ms", "compile_ms_critical", "plan.replay",
                           "plan.replay.same_signature", "plan.replay.transition"})

__all__ = ["FastPath", "NOT_DECISIONS", "signature"]


class FastPath(Observer):
    def __init__(self, program, insts, buffers, queue, read_after=(), feedback: bool = False):
        self.program, self.insts, self.buffers, self.queue = program, insts, buffers, queue
        self.blocker = blocker(insts, feedback)
        self.by_value = value_inputs(insts, program.inputs)
        self.plans = Memo(PLAN_BASES_KEPT)   # (previous signature, signature) -> Plan
        self.epoch = 0                 # inferences of the flow that changed a resource
        self.seen: set = set()         # transitions the flow ran once in this epoch
        self.last_sig = None
        self.restore: Plan | None = None   # the replayed plan whose node state is not put back
        self.recording = None          # (previous signature, signature, memory changes)
        self._launches: list | None = None
        self._reallocs: list | None = None
        tensors = buffers.tensors
        # graph outputs a host impl computes (shape subgraphs) keep their host value; every
        # other output is read back from its buffer
        host = {t.name for i in insts if i.node.host for t in i.outputs}
        self.device_outputs = [o for o in program.outputs if o not in host]
        # host values that device kernels read: a replay makes sure the device holds its own
        self.host_args = list({t.name: t for inst in insts for i in inst.family()
                               if not i.node.host for t in i.inputs
                               if t is not None and t.name in host}.values())
        self.all_insts = [i for inst in insts for i in inst.family()]
        # graph inputs and outputs, and what is read after an inference (`read_after`: the
        # index checks' data and indices): their state is put back at once (outputs are read,
        # callers ask for the shapes), the rest lazily
        self.io_tensors = {tensors[n] for n in list(program.inputs) + program.outputs} | set(read_after)

    # ---- the observer: what the flow enqueues and asks the predictor --------------------
    def launched(self, bound, kernel, gws, lws) -> None:
        if self._launches is not None:
            self._launches.append((bound, kernel, gws, lws, bound and bound.arg_ids,
                                   bound and bound.info))

    def predicted(self, tensor, shape, bits) -> None:
        if self._reallocs is not None:
            self._reallocs.append((tensor, shape, bits))

    # ---- around an inference of the flow ------------------------------------------------
    def begin_flow(self, sig) -> None:
        """Put the nodes' state back if plans ran since the flow last did; log what this
        inference enqueues and asks the predictor."""
        if self.restore is not None:
            _restore(self.restore.state)
            self.restore = None
        self.recording = (self.last_sig, sig, self.buffers.memory.changes)
        self._launches, self._reallocs = [], []

    def end_flow(self, counters: Counter, iteration: int) -> bool:
        """After the flow's inference: record it as its transition's plan when it changed no
        resource; True when recorded (the trace marks the inference as a plan base)."""
        prev, sig, mem = self.recording
        launches, reallocs = self._launches, self._reallocs
        self._launches = self._reallocs = None
        self.last_sig = sig
        if self.buffers.memory.changes != mem or not resource_free(self.insts, counters):
            self.epoch += 1
            self.plans.clear()
            self.seen.clear()
            return False
        # A repeated signature is recorded at once; a transition only when the flow runs it a
        # second time in this epoch: a policy that reallocates often (the plugin's reclaim)
        # would otherwise pay for recording plans that never live to be replayed.
        if prev != sig and (prev, sig) not in self.seen:
            self.seen.add((prev, sig))
            return False
        state = [entry for i in self.all_insts for entry in i.snapshot()]
        state += [(t, t.snapshot()) for t in self.buffers.tensors.values()]
        self.plans.put((prev, sig), Plan(
            key=(prev, sig), epoch=self.epoch, of_iter=iteration, launches=launches,
            kernels=[(k, g, l) for _, k, g, l, _, _ in launches], reallocs=reallocs,
            hosts=[(t, t.host) for t in self.host_args if t.buf is not None and t.dev_src is t.host],
            counters=Counter(counters), state=state,
            io_state=[e for e in state if e[0] in self.io_tensors]))
        return True

    # ---- the replay ---------------------------------------------------------------------
    def find(self, sig) -> Plan | None:
        plan = self.plans.get((self.last_sig, sig))
        return plan if plan is not None and plan.epoch == self.epoch else None

    def replay(self, plan: Plan, feeds: dict, want: list) -> dict:
        """Upload the inputs, put back each kernel's arguments and shape_info where they
        differ, enqueue, make the flow's predictor calls, read the outputs."""
        queue, tensors = self.queue, self.buffers.tensors
        _restore(plan.io_state)
        for name, value in feeds.items():
            t = tensors[name]
            value = np.require(value, requirements="C")
            t.host = value
            t.version += 1
            t.dev_version = t.version
            if value.nbytes:
                queue.write(t.buf, value)
        for t, arr in plan.hosts:      # shape-subgraph values of this signature on the device
            if t.dev_src is not arr and arr.nbytes:
                queue.write(t.buf, arr)
                t.dev_src = arr
        for b, k, g, l, args, info in plan.launches:
            if b is None:
                continue
            if b.info is not info:
                b.slot.write(info)
                b.info = info
            if b.arg_ids is not args and (b.arg_ids is None or
                                          any(x is not y for x, y in zip(args, b.arg_ids))):
                k.set_args(*args)
                b.arg_ids = args
        queue.arena.flush(queue.cl_queue, queue.keep)
        queue.enqueue(plan.kernels)
        used = self.buffers.used_bytes
        predictor = self.buffers.predictor
        for t, shape, bits in plan.reallocs:   # the same predictor calls as the flow's
            t.state.realloc_if_needed(predictor, t.name, shape, bits, used)
        for name in want:
            if name in self.device_outputs:
                queue.read_to_host(tensors[name])
        self.last_sig = plan.key[1]
        self.restore = plan
        return {name: tensors[name].host for name in want}


def _restore(state: list) -> None:
    for obj, values in state:
        obj.restore(values)
