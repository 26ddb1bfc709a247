"""Decisions: every branch the flow takes is counted (per inference) and written to the trace
sink. One place, so that the counters an `infer_end` carries and the events of the trace are
the same decisions."""
from __future__ import annotations

from collections import Counter

# fields of a decision that are summed into a counter of their own
_SUMMED = {("realloc", "alloc"): ("bytes", "bytes_allocated"),
           ("execute", "enqueue"): ("kernels", "kernels")}
_SUMMED_KIND = {"update_shape": ("device_reads", "device_reads"),
                "kv_cache": ("bytes_copied", "kv_bytes_copied")}
# (kind, action, reason) -> (the counter names it increments, (field, counter) summed or None):
# made once per kind of decision, so a decision costs one lookup (the flow makes a few hundred
# per new signature)
_COUNTS: dict = {}


def _counts_of(kind: str, action: str, reason: str) -> tuple:
    keys = (f"{kind}.{action}",) + ((f"{kind}.{action}.{reason}",) if reason else ())
    spec = _COUNTS[(kind, action, reason)] = (keys, _SUMMED.get((kind, action)) or _SUMMED_KIND.get(kind))
    return spec


class InputNode:
    """Graph inputs appear in the trace as nodes of op "Parameter" (OpenVINO's name)."""
    op = "Parameter"

    def __init__(self, name):
        self.name = name


class NullTrace:
    """A sink that keeps nothing (a network made without a trace)."""
    iter = -1
    keeps_nothing = True

    def event(self, *a, **k):
        pass

    def flush(self):
        pass


class Decisions:
    def __init__(self, trace=None):
        self.trace = trace or NullTrace()
        # whether the sink keeps events: nothing is built for one that keeps none (this one, or
        # `--trace none`'s: traces/sinks.py NoTrace)
        self.traced = not getattr(self.trace, "keeps_nothing", False)
        self.counters: Counter = Counter()
        # (node name, kind, action, reason, fields) of every decision while a list is set here
        # (the fast path records an inference of the flow node by node: engine/fast_path)
        self.log: list | None = None

    def begin(self) -> None:
        """A new inference of the flow: counters start from zero."""
        self.counters = Counter()

    def record(self, kind: str, action: str, reason: str = "", node=None, **fields) -> None:
        count(self.counters, kind, action, reason, fields)
        self.write(kind, action, reason, node, **fields)

    @property
    def itemized(self) -> bool:
        """Whether each decision is read one by one (a trace, the fast path's log); when not,
        callers may count a run of equal decisions at once (count_many)."""
        return self.traced or self.log is not None

    def count_many(self, n: int, kind: str, action: str, reason: str = "", **fields) -> None:
        """`n` decisions alike counted, none written (callers check `itemized` first)."""
        keys, summed = _COUNTS.get((kind, action, reason)) or _counts_of(kind, action, reason)
        c = self.counters
        for k in keys:
            c[k] += n
        if summed is not None:
            c[summed[1]] += n * fields.get(summed[0], 0)

    def write(self, kind: str, action: str, reason: str = "", node=None, **fields) -> None:
        """A decision to the log and the trace, not counted (a caller that counts in bulk)."""
        name = node.name if node else ""
        if self.log is not None:
            self.log.append((name, kind, action, reason, fields))
        if self.traced:
            self.trace.event(kind, name, node.op if node else "", action, reason, **fields)


def count(c: Counter, kind: str, action: str, reason: str, fields: dict) -> None:
    """What one decision adds to an inference's counters."""
    keys, summed = _COUNTS.get((kind, action, reason)) or _counts_of(kind, action, reason)
    for k in keys:
        c[k] += 1
    if summed is not None:
        c[summed[1]] += fields.get(summed[0], 0)
