"""Where an inference's time went: every millisecond of its latency in one of a few parts, so
that a slow inference explains itself (infer_end's `time_ms`, `dyncli bench`, `dyncli trace`).

Measured where the time is spent (the services keep their own sums, reset per inference):
  build_wait   the flow waiting for a kernel build (critical-path builds, prebuilt ones not done)
  prebuild     walking a new input signature to start its builds in parallel
  alloc        making and pooling device buffers
  enqueue      kernel launches, shape_info and input writes handed to the OpenCL queue
  device_wait  blocked on the device: output reads, the status read (DeviceQueue.read_status),
               reads of shape values, the final finish
  trace        writing this inference's events, and what it makes only for the trace (a
               compiled variant's base: its nodes' events and template, preparing_trace)
  record       the fast path recording what the inference did, once its outputs are read (a
               plan, a partial plan, a compiled step's function: engine/fast_path)
  gc           Python's cyclic garbage collector (gc.callbacks): a collection of the oldest
               generation walks every tracked object, tens of ms on a big network (a pause
               inside another part is taken out of that part: `mark`, `since`)
and `flow`, the rest: the host's own decisions (per-node flow or plan replay, predictor calls,
bookkeeping). The parts sum to the latency by construction; `flow` is what no other part took.
"""
from __future__ import annotations

import gc
import time
from contextlib import contextmanager

PARTS = ("flow", "build_wait", "prebuild", "alloc", "enqueue", "device_wait", "trace", "record", "gc")


class _GcClock:
    """The collector's pauses in this process, summed (one callback for every network)."""
    spent_s = 0.0
    _t0 = 0.0

    @classmethod
    def on_gc(cls, phase: str, info: dict) -> None:
        if phase == "start":
            cls._t0 = time.perf_counter()
        else:
            cls.spent_s += time.perf_counter() - cls._t0


def mark() -> tuple:
    """Now, for `since`."""
    return time.perf_counter(), _GcClock.spent_s


def since(m: tuple) -> float:
    """Seconds since `m` (`mark()`) less the collector's pauses in between: the `gc` part's."""
    return time.perf_counter() - m[0] - (_GcClock.spent_s - m[1])


@contextmanager
def preparing_trace(trace):
    """The time of the block counted in the `trace` part: what a traced inference does only for
    its trace beyond writing events (a compiled variant's base: its nodes' events made and the
    template checked against them, 5-9 ms of the second inference of a traced run on an H200
    host, which the part `flow` held before). The events it writes count once."""
    if not hasattr(trace, "spent_s"):        # (a sink that times nothing)
        yield
        return
    m, s0 = mark(), trace.spent_s
    try:
        yield
    finally:          # (a collector's pause inside is the `gc` part's)
        trace.spent_s = s0 + since(m)


class Accounting:
    def __init__(self, queue, buffers, impls, trace):
        self.queue, self.buffers, self.impls, self.trace = queue, buffers, impls, trace
        self._trace0 = self._gc0 = 0.0
        self.record_s = 0.0
        if _GcClock.on_gc not in gc.callbacks:
            gc.callbacks.append(_GcClock.on_gc)

    def begin(self) -> None:
        """At the start of an inference (after the queue's own begin_inference)."""
        self.buffers.alloc_s = self.impls.wait_s = self.impls.prebuild_s = self.record_s = 0.0
        self._trace0 = getattr(self.trace, "spent_s", 0.0)
        self._gc0 = _GcClock.spent_s

    def recording(self, record):
        """`record()` (the fast path's end_flow), its time the `record` part less the events
        it writes and the collections it meets (the `trace` and `gc` parts'); returns what it
        returns."""
        t0, tr0, gc0 = time.perf_counter(), getattr(self.trace, "spent_s", 0.0), _GcClock.spent_s
        out = record()
        self.record_s += time.perf_counter() - t0 - (getattr(self.trace, "spent_s", 0.0) - tr0) - \
            (_GcClock.spent_s - gc0)
        return out

    def parts_ms(self, latency_ms: float) -> dict:
        q = self.queue
        ms = {"build_wait": self.impls.wait_s, "prebuild": self.impls.prebuild_s,
              "alloc": self.buffers.alloc_s, "enqueue": q.enqueue_s, "device_wait": q.blocked_s,
              "trace": getattr(self.trace, "spent_s", 0.0) - self._trace0, "record": self.record_s,
              "gc": _GcClock.spent_s - self._gc0}
        ms = {k: round(v * 1e3, 3) for k, v in ms.items()}
        ms["flow"] = round(max(0.0, latency_ms - sum(ms.values())), 3)
        return {k: ms[k] for k in PARTS}
