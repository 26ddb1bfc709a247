"""The fast path: replay of an input signature's plan (a decision beyond the seeds).

The per-node flow (primitive_inst.py) is the reference and makes every decision. When an
inference changes nothing (every update_shape skipped, no impl, weights or buffer decision, no
static build pending, no value read back for shape inference), the network's state after it is
the state before it, so the next inference with the same input signature would make exactly
the same decisions and enqueue exactly the same kernels with the same arguments. The plan of
that signature is those kernels, in order; a replay uploads the new inputs, enqueues them and
reads the outputs, with no per-node Python work.

A replay stands for the decisions of the inference it was recorded from: its counters are that
inference's, and the trace holds one `plan replay` event with `of_iter`, which the trace reader
expands into that inference's decision events (traces/reader.py). `Network(fast_path=False)`
(`--no-fast-path`) turns it off; the tests run sequences both ways and compare outputs and
decision counts.

Not used (the flow runs every inference) when the program's shapes depend on data (NonZero's
dynamic output, a shape dep computed on the device) or decode feedback moves buffers between
inferences (--feedback).
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pyopencl as cl

# counters that are measurements or the fast path's own, not the flow's decisions
NOT_DECISIONS = frozenset({"latency_ms", "compile_ms", "compile_ms_critical", "plan.replay",
                           "plan.replay.same_signature"})


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
    __slots__ = ("sig", "of_iter", "launches", "counters")

    def __init__(self, sig, of_iter: int, launches: list, counters: Counter):
        self.sig, self.of_iter, self.launches, self.counters = sig, of_iter, launches, counters


class FastPath:
    """One plan: the last inference's, once it proved steady. A new signature runs the flow
    (which makes the decisions), and its plan is armed when the flow repeats it unchanged."""

    def __init__(self, net):
        self.net = net
        self.blocker = fast_path_blocker(net)
        self.by_value = value_inputs(net)
        self.plan: Plan | None = None
        self.last_sig = None
        self.recording = None
        # graph outputs a host impl computes (shape subgraphs) keep their host value; every
        # other output is read back from its buffer
        host = {t.name for i in net.insts if i.node.host for t in i.outputs}
        self.device_outputs = [o for o in net.program.outputs if o not in host]

    # ---- around a flow inference ----------------------------------------------------------
    def begin_flow(self, sig) -> None:
        """Log the kernels the flow enqueues in this inference (Network.flush appends)."""
        self.recording = sig
        self.net.log_launches = [] if not self.blocker else None

    def end_flow(self, counters: Counter) -> bool:
        """After the flow's inference: arm the plan when it changed nothing; True when armed
        (the trace marks the inference as a plan base)."""
        net, sig = self.net, self.recording
        launches, net.log_launches = net.log_launches, None
        steady = launches is not None and sig == self.last_sig and _changed_nothing(net, counters)
        self.last_sig = sig
        self.plan = Plan(sig, net.iter, launches, Counter(counters)) if steady else None
        return steady

    # ---- the replay ---------------------------------------------------------------------
    def can_replay(self, sig) -> bool:
        return self.plan is not None and self.plan.sig == sig

    def replay(self, feeds: dict, want: list) -> dict:
        net, plan = self.net, self.plan
        q = net.queue
        for name, value in feeds.items():
            t = net.tensors[name]
            value = np.require(value, requirements="C")
            t.host = value
            t.version += 1
            t.dev_version = t.version
            if value.nbytes:
                cl.enqueue_copy(q, t.buf, value, is_blocking=False)
                net.keep(value)
        enqueue = cl.enqueue_nd_range_kernel
        if net.profile:
            net.events = [enqueue(q, k, g, l) for k, g, l in plan.launches]
        else:
            for k, g, l in plan.launches:
                enqueue(q, k, g, l)
        for name in want:
            if name in self.device_outputs:
                net.read_to_host(net.tensors[name])
        return {name: net.tensors[name].host for name in want}


def _changed_nothing(net, counters: Counter) -> bool:
    """The flow's state after this inference is its state before it."""
    if counters.get("update_shape.infer") or counters.get("device_reads"):
        return False
    if any(k.startswith(("update_impl.", "update_weights.", "kv_cache.")) for k in counters):
        return False
    if counters.get("realloc.alloc") or counters.get("realloc.from_pool"):
        return False
    return not any(i.pending is not None for i in net.insts)
