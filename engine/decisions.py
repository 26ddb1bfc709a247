"""Decisions: every branch the flow takes is counted (per inference) and written to the trace
sink. One place, so that the counters an `infer_end` carries and the events of the trace are
the same decisions."""
from __future__ import annotations

from collections import Counter

_COUNTER_KEYS: dict = {}   # (kind, action, reason) -> the counter names it increments
# fields of a decision that are summed into a counter of their own
_SUMMED = {("realloc", "alloc"): ("bytes", "bytes_allocated"),
           ("execute", "enqueue"): ("kernels", "kernels")}
_SUMMED_KIND = {"update_shape": ("device_reads", "device_reads"),
                "kv_cache": ("bytes_copied", "kv_bytes_copied")}


class InputNode:
    """Graph inputs appear in the trace as nodes of op "Parameter" (OpenVINO's name)."""
    op = "Parameter"

    def __init__(self, name):
        self.name = name


class NullTrace:
    """A sink that keeps nothing (a network made without a trace)."""
    iter = -1

    def event(self, *a, **k):
        pass

    def flush(self):
        pass


class Decisions:
    def __init__(self, trace=None):
        self.trace = trace or NullTrace()
        self.counters: Counter = Counter()
        # (node name, kind, action, reason, fields) of every decision while a list is set here
        # (the fast path records an inference of the flow node by node: engine/fast_path)
        self.log: list | None = None

    def begin(self) -> None:
        """A new inference of the flow: counters start from zero."""
        self.counters = Counter()

    def record(self, kind: str, action: str, reason: str = "", node=None, **fields) -> None:
        count(self.counters, kind, action, reason, fields)
        if self.log is not None:
            self.log.append((node.name if node else "", kind, action, reason, fields))
        self.trace.event(kind, node.name if node else "", node.op if node else "", action, reason,
                         **fields)


def count(c: Counter, kind: str, action: str, reason: str, fields: dict) -> None:
    """What one decision adds to an inference's counters."""
    keys = _COUNTER_KEYS.get((kind, action, reason))
    if keys is None:
        keys = _COUNTER_KEYS[(kind, action, reason)] = \
            (f"{kind}.{action}",) + ((f"{kind}.{action}.{reason}",) if reason else ())
    for k in keys:
        c[k] += 1
    summed = _SUMMED.get((kind, action)) or _SUMMED_KIND.get(kind)
    if summed is not None:
        c[summed[1]] += fields.get(summed[0], 0)
