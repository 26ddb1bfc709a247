"""Streaming summary of a trace: one row per inference, summed counters, per-node cost, the
decisions that changed something, and optional group-by tables.

`Totals` sums per-inference counters; `dyncli run` feeds it the counters it holds in memory and
`dyncli trace` the `counters` of each `infer_end` event, so both print the same totals and an
`--expect` gives the same verdict on a run and on its trace.

The reader is consumed once, event by event. Only the events of the inference in flight are
buffered (an inference is summarised when its `infer_end` arrives, so a killed run's unfinished
inference is left out); everything kept after that is bounded by the number of inferences,
nodes and group keys, not by the number of events.
"""
from __future__ import annotations

import statistics
from collections import Counter

from traces.query import EventFilter

# Actions that leave the runtime's state as it was; any other action of a pipeline stage
# (an impl build or switch, an eviction, a realloc, a reorder, an unfusion...) changed something.
UNCHANGED_ACTIONS = frozenset({"", "skip", "reuse", "cache_hit", "set", "enqueue", "host", "infer",
                               "external", "view", "empty", "from_pool", "keep", "hit", "append",
                               "apply", "by_other"})
# Record types that are not pipeline decisions.
RECORD_KINDS = frozenset({"header", "infer_start", "infer_end", "check", "run_end"})
GROUP_KEYS = ("node", "op", "kind", "action", "iter")
# Per-inference counters that are levels, not counts: over a run they take the maximum.
MAX_COUNTERS = frozenset({"peak_bytes", "live_bytes_lower_bound"})


def latency_stats(lat: list) -> dict:
    return {"total": sum(lat), "mean": statistics.fmean(lat) if lat else 0.0,
            "median": statistics.median(lat) if lat else 0.0,
            "max": max(lat, default=0.0), "first": lat[0] if lat else 0.0}


class Totals:
    """Counters of every inference summed (any counter name; the MAX_COUNTERS take the
    maximum), and the latencies."""

    def __init__(self):
        self.counters: Counter = Counter()
        self.latencies: list[float] = []

    def add(self, counters: dict, latency_ms: float) -> None:
        for k, v in counters.items():
            if k in MAX_COUNTERS:
                self.counters[k] = max(self.counters[k], v)
            elif k != "latency_ms" and isinstance(v, (int, float)):
                self.counters[k] += v
        self.latencies.append(latency_ms)

    @property
    def inferences(self) -> int:
        return len(self.latencies)

    def counters_dict(self) -> dict:
        return dict(sorted(self.counters.items()))

    def latency(self) -> dict:
        return latency_stats(self.latencies)


def is_change(ev: dict) -> bool:
    return ev["kind"] not in RECORD_KINDS and ev["action"] not in UNCHANGED_ACTIONS


def _fields(ev: dict) -> dict:
    return {k: v for k, v in ev.items() if k not in ("kind", "iter", "node", "op", "action", "reason", "ts")}


class _Cost:
    __slots__ = ("events", "ms", "compile_ms", "actions", "op")

    def __init__(self, op: str = ""):
        self.events, self.ms, self.compile_ms, self.actions, self.op = 0, 0.0, 0.0, Counter(), op

    def add(self, ev: dict, ms: float) -> None:
        self.events += 1
        self.ms += ms
        self.compile_ms += ev.get("compile_ms", 0) or 0
        self.actions[f"{ev['kind']}.{ev['action']}" if ev["action"] else ev["kind"]] += 1

    def as_dict(self) -> dict:
        return {"events": self.events, "ms": round(self.ms, 3), "compile_ms": round(self.compile_ms, 3),
                "decisions": dict(self.actions.most_common())}


class TraceSummary:
    """Feed it events (`add`), then `result()`."""

    def __init__(self, header: dict, flt: EventFilter | None = None, group_by: str | None = None,
                 top: int = 10, limit: int = 30):
        if group_by is not None and group_by not in GROUP_KEYS:
            raise ValueError(f"--group-by must be one of {', '.join(GROUP_KEYS)}")
        self.header = header
        self.flt = flt or EventFilter()
        self.group_by, self.top, self.limit = group_by, top, limit
        self.totals = Totals()
        self.rows: list[dict] = []
        self.nodes: dict[str, _Cost] = {}
        self.groups: dict = {}
        self.changes: list[dict] = []
        self.changes_total = 0
        self.check_ok: dict[int, bool] = {}     # per inference, like `dyncli run`'s summary
        self.check_err = {"max_abs": 0.0, "max_rel": 0.0}
        self.run_end: dict | None = None
        self.events = 0
        self._pending: list[dict] = []   # events of the inference in flight
        self._open = False

    # -- streaming --------------------------------------------------------------------------
    def add(self, ev: dict) -> None:
        self.events += 1
        kind = ev["kind"]
        if kind == "infer_start":
            self._pending = [ev]
            self._open = True
        elif kind == "run_end":   # may follow an inference that failed half-way
            self.run_end = ev
        elif self._open:
            self._pending.append(ev)
            if kind == "infer_end":
                self._close_inference(self._pending)
                self._pending, self._open = [], False
        elif kind == "check":
            if self.flt.iter_ok(ev["iter"]):
                self.check_ok[ev["iter"]] = self.check_ok.get(ev["iter"], True) and ev["action"] == "pass"
                for k in ("max_abs", "max_rel"):
                    self.check_err[k] = max(self.check_err[k], ev.get(k, 0) or 0)

    def _close_inference(self, evs: list[dict]) -> None:
        start, end = evs[0], evs[-1]
        it = end["iter"]
        if not self.flt.iter_ok(it):
            return
        counters = end.get("counters") or {}
        latency = counters.get("latency_ms", end.get("latency_ms", 0.0))
        decisions: Counter = Counter()
        prev = start["ts"]
        for ev in evs:
            ms = max(0.0, ev["ts"] - prev) * 1e3
            prev = max(prev, ev["ts"])
            if not self.flt.event_ok(ev):
                continue
            kind, action = ev["kind"], ev["action"]
            if kind not in RECORD_KINDS:
                decisions[f"{kind}.{action}"] += 1
                if ev["reason"]:
                    decisions[f"{kind}.{action}.{ev['reason']}"] += 1
                if ev["node"]:
                    cost = self.nodes.get(ev["node"])
                    if cost is None:
                        cost = self.nodes[ev["node"]] = _Cost(ev["op"])
                    cost.add(ev, ms)
                if is_change(ev):
                    self.changes_total += 1
                    if len(self.changes) < self.limit:
                        self.changes.append({"iter": it, "node": ev["node"], "op": ev["op"], "kind": kind,
                                             "action": action, "reason": ev["reason"], **_fields(ev)})
            if self.group_by:
                key = ev[self.group_by] if self.group_by != "kind" else kind
                g = self.groups.get(key)
                if g is None:
                    g = self.groups[key] = _Cost(ev["op"])
                g.add(ev, ms)
        # With event filters the counters are the matching decisions; otherwise the engine's own.
        self.totals.add(decisions if self.flt.selects_events else counters, latency)
        self.rows.append({"iter": it, "inputs": start.get("shapes", {}), "outputs": end.get("out_shapes", {}),
                          "latency_ms": latency, "ts": start["ts"],
                          "counters": {k: v for k, v in counters.items() if k != "latency_ms"},
                          "time_ms": end.get("time_ms") or {},
                          "decisions": dict(sorted(decisions.items()))})

    # -- result -----------------------------------------------------------------------------
    @property
    def incomplete(self) -> int | None:
        """Iteration of an inference that started but never ended (a killed run), else None."""
        return self._pending[0]["iter"] if self._open else None

    def result(self) -> dict:
        nodes = sorted(self.nodes.items(), key=lambda kv: (-kv[1].ms, kv[0]))
        out = {
            "trace": self.header.get("_path", ""),
            "header": {k: v for k, v in self.header.items() if not k.startswith("_")},
            "filters": self.flt.describe(),
            "status": self.run_end["action"] if self.run_end else "incomplete",
            "incomplete_inference": self.incomplete,
            "error": self.run_end.get("reason", "") if self.run_end and self.run_end["action"] == "error" else "",
            "events": self.events,
            "inferences": self.totals.inferences,
            "latency_ms": self.totals.latency(),
            "counters": self.totals.counters_dict(),
            "rows": self.rows,
            "top_nodes": [{"node": n, "op": c.op, **c.as_dict()} for n, c in nodes[:self.top]],
            "changes": self.changes,
            "changes_total": self.changes_total,
            "check": {"passed": sum(self.check_ok.values()),
                      "failed": sum(not ok for ok in self.check_ok.values()), **self.check_err}
            if self.check_ok else None,
        }
        if self.group_by:
            groups = sorted(self.groups.items(), key=lambda kv: (-kv[1].ms, str(kv[0])))
            out["group_by"] = self.group_by
            out["groups"] = [{self.group_by: k, **({"op": g.op} if self.group_by == "node" else {}), **g.as_dict()}
                             for k, g in groups]
        return out


def summarise(path: str, flt: EventFilter | None = None, group_by: str | None = None,
              top: int = 10, limit: int = 30) -> dict:
    """Read the trace at `path` once and summarise it (raises traces.TraceError on corruption)."""
    from traces.reader import read_trace
    header, events = read_trace(path)
    s = TraceSummary({**header, "_path": path}, flt, group_by, top, limit)
    for ev in events:
        s.add(ev)
    return s.result()
