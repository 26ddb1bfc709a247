"""The fast path: plan replay (a decision beyond the seeds).

The per-node flow (primitive_inst.py) is the reference and makes every decision. Its decisions
for an inference depend on three things: the nodes' state after the previous inference (their
input layouts, deps, bound kernels, fusion validity: a function of the previous input
signature), the resources (buffers and their capacities, impl and weights caches, pending
builds) and the new inputs. An inference of the flow that changed no resource (no buffer made,
freed or shared, no build, switch or eviction, no weights decision, nothing pending, no shape
read from the device) is recorded as the plan of its transition (previous signature ->
signature): the kernels it enqueued with their arguments and shape_info, the predictor calls
it made and the nodes' state it left. While no inference of the flow has changed a resource
since (the `epoch`), the same transition makes exactly the same decisions, so the fast path
replays the plan instead of walking the nodes: it puts back each kernel's arguments and
shape_info where they differ, makes the same predictor calls (their history is what later
allocations predict from), enqueues, and reads the outputs. The nodes' state is put back
lazily, before the flow next runs. `same_signature` (the signature repeats) is the common case;
`transition` covers a sequence that cycles through known shapes.

A replay stands for the decisions of the inference it was recorded from: its counters are that
inference's, and the trace holds one `plan replay` event with `of_iter`, which the trace reader
expands into that inference's decision events (traces/reader.py). `Network(fast_path=False)`
(`--no-fast-path`) turns it off; the tests run sequences both ways and compare outputs and
decisions per inference.

Not used when the program's shapes depend on data (NonZero's dynamic output) or decode feedback
moves buffers between inferences (--feedback). A policy that reallocates often (the plugin's
reclaim of buffers 10x too large) bumps the epoch often and leaves little to replay:
`--predictor adaptive` keeps buffers across shrinks.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pyopencl as cl

from engine.memo import Memo
from traces.schema import PLAN_BASES_KEPT

# counters that are measurements or the fast path's own, not the flow's decisions
NOT_DECISIONS = frozenset({"latency_ms", "compile_ms", "compile_ms_critical", "plan.replay",
                           "plan.replay.same_signature", "plan.replay.transition"})

# what the flow reads back from a node's previous execution (put back after replays); the
# rest of a PrimitiveInst is either fixed or physical (kernel objects, memo tables, caches)
INST_STATE = ("in_layouts", "dep_state", "deps", "deps_key", "shape_changed", "shape_done_by_other",
              "unfuse_reason", "skip_now", "in_place_now", "bound", "internal_layouts", "internals",
              "pending", "want_weights", "weights_override", "kv_pad")
BOUND_STATE = ("call", "gws", "lws", "offsets", "tensors")   # info, arg_ids: kept true by replays
# a tensor's: all but `dev_src` (physical: what the device holds now)
TENSOR_STATE = ("layout", "buf", "offset", "host", "version", "dev_version", "capacity", "by_other",
                "state")


def signature(feeds: dict, by_value: frozenset = frozenset()) -> tuple:
    """Input shapes and dtypes; the values too of the inputs shape inference reads."""
    return tuple((k, np.shape(v), np.asarray(v).dtype.str,
                  np.asarray(v).tobytes() if k in by_value else None) for k, v in sorted(feeds.items()))


def value_inputs(net) -> frozenset:
    """Graph inputs whose values decide shapes: read as a memory dep by a device node or by a
    host impl (a Shape node reads only the shape)."""
    names = set()
    for inst in net.insts:
        for i in inst.family():
            if i.node.host and i.node.op != "Shape":
                idx = range(len(i.inputs))
            else:
                idx = i.opdef.shape_deps
            names |= {i.inputs[k].name for k in idx if k < len(i.inputs) and i.inputs[k] is not None}
    return frozenset(names & set(net.program.inputs))


def fast_path_blocker(net) -> str:
    """Why this network cannot replay plans ("" when it can)."""
    if net.feedback:
        return "feedback"
    for inst in net.insts:
        for i in inst.family():
            if i.opdef.dynamic_output:
                return f"dynamic_output:{i.node.name}"
    return ""


class Plan:
    __slots__ = ("key", "epoch", "of_iter", "launches", "reallocs", "hosts", "counters", "state",
                 "io_state")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


class FastPath:
    def __init__(self, net):
        self.net = net
        self.blocker = fast_path_blocker(net)
        self.by_value = value_inputs(net)
        self.plans = Memo(PLAN_BASES_KEPT)   # (previous signature, signature) -> Plan
        self.epoch = 0                 # inferences of the flow that changed a resource
        self.seen: set = set()         # transitions the flow ran once in this epoch
        self.last_sig = None
        self.restore: Plan | None = None   # the replayed plan whose node state is not put back
        self.recording = None
        # graph outputs a host impl computes (shape subgraphs) keep their host value; every
        # other output is read back from its buffer
        host = {t.name for i in net.insts if i.node.host for t in i.outputs}
        self.device_outputs = [o for o in net.program.outputs if o not in host]
        # host values that device kernels read: a replay makes sure the device holds its own
        self.host_args = list({t.name: t for inst in net.insts for i in inst.family()
                               if not i.node.host for t in i.inputs
                               if t is not None and t.name in host}.values())
        self.all_insts = [i for inst in net.insts for i in inst.family()]
        # graph inputs and outputs: their layouts are put back at once (outputs are read, and
        # callers ask for the shapes), the rest of the state lazily
        self.io_tensors = {net.tensors[n] for n in list(net.program.inputs) + net.program.outputs}

    # ---- around a flow inference ----------------------------------------------------------
    def begin_flow(self, sig) -> None:
        """Put the nodes' state back if plans ran since the flow last did; log what this
        inference enqueues and asks the predictor."""
        net = self.net
        if self.restore is not None:
            _restore(self.restore.state)
            self.restore = None
        self.recording = (self.last_sig, sig, net.memory.changes)
        net.log_launches, net.log_reallocs = [], []

    def end_flow(self, counters: Counter) -> bool:
        """After the flow's inference: record it as its transition's plan when it changed no
        resource; True when recorded (the trace marks the inference as a plan base)."""
        net = self.net
        prev, sig, mem = self.recording
        launches, reallocs = net.log_launches, net.log_reallocs
        net.log_launches = net.log_reallocs = None
        self.last_sig = sig
        if net.memory.changes != mem or not _resource_free(net, counters):
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
        self.plans.put((prev, sig), Plan(
            key=(prev, sig), epoch=self.epoch, of_iter=net.iter, launches=launches,
            reallocs=reallocs, hosts=[(t, t.host) for t in self.host_args
                                      if t.buf is not None and t.dev_src is t.host],
            counters=Counter(counters), state=(state := _snapshot(self.all_insts, net)),
            io_state=[e for e in state if e[0] in self.io_tensors]))
        return True

    # ---- the replay ---------------------------------------------------------------------
    def find(self, sig) -> Plan | None:
        plan = self.plans.get((self.last_sig, sig))
        return plan if plan is not None and plan.epoch == self.epoch else None

    def replay(self, plan: Plan, feeds: dict, want: list) -> dict:
        net = self.net
        q = net.queue
        _restore(plan.io_state)
        for name, value in feeds.items():
            t = net.tensors[name]
            value = np.require(value, requirements="C")
            t.host = value
            t.version += 1
            t.dev_version = t.version
            if value.nbytes:
                cl.enqueue_copy(q, t.buf, value, is_blocking=False)
                net.keep(value)
        for t, arr in plan.hosts:      # shape-subgraph values of this signature on the device
            if t.dev_src is not arr and arr.nbytes:
                cl.enqueue_copy(q, t.buf, np.require(arr, requirements="C"), is_blocking=False)
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
        net.arena.flush(q, net.keep)
        enqueue = cl.enqueue_nd_range_kernel
        if net.profile:
            net.events = [enqueue(q, k, g, l) for _, k, g, l, _, _ in plan.launches]
        else:
            for _, k, g, l, _, _ in plan.launches:
                enqueue(q, k, g, l)
        used = net.used_bytes
        for t, shape, bits in plan.reallocs:   # the same predictor calls as the flow's
            t.state.realloc_if_needed(net.predictor, t.name, shape, bits, used)
        for name in want:
            if name in self.device_outputs:
                net.read_to_host(net.tensors[name])
        self.last_sig = plan.key[1]
        self.restore = plan
        return {name: net.tensors[name].host for name in want}


def _snapshot(insts, net) -> list:
    """The nodes' and tensors' state after this inference (what the flow would read next), as
    (object, values) pairs in the order of INST_STATE / BOUND_STATE / the tensor's fields."""
    state = []
    for i in insts:
        d = i.__dict__
        state.append((i, INST_STATE, tuple(dict(d[k]) if k == "dep_state" else
                                           list(d[k]) if k == "internals" else d[k]
                                           for k in INST_STATE)))
        for b in i.bound:
            state.append((b, BOUND_STATE, tuple(getattr(b, k) for k in BOUND_STATE)))
        for t in i.internals:
            state.append((t, TENSOR_STATE, tuple(t.__dict__[k] for k in TENSOR_STATE)))
    for t in net.tensors.values():
        state.append((t, TENSOR_STATE, tuple(t.__dict__[k] for k in TENSOR_STATE)))
    return state


def _restore(state: list) -> None:
    for obj, keys, values in state:
        for k, v in zip(keys, values):
            setattr(obj, k, v)


# decisions that leave every resource as it was (the memory pool's own count covers buffers)
_FREE = ("update_shape.", "update_impl.keep", "update_weights.skip", "realloc.reuse", "realloc.view",
         "realloc.external", "realloc.by_other", "realloc.empty", "set_args.", "execute.",
         "fusion.unfuse", "in_place_concat.apply")


def _resource_free(net, counters: Counter) -> bool:
    """This inference of the flow changed no resource its replay would rely on."""
    if counters.get("device_reads"):
        return False
    for k in counters:
        if "." in k and not k.startswith(_FREE) and not k.startswith("plan."):
            return False
    return not any(i.pending is not None for i in net.insts)
