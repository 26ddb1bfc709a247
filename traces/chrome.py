"""Export a trace in the Chrome Trace Event Format (opens in ui.perfetto.dev and chrome://tracing).

Layout: one process per run (pid 1, named after the model). Threads (tracks): `inference`
(one complete `X` event per inference, its input shapes and counters in `args`), `node` (one
`X` per node execution: the node's consecutive events), then one track per pipeline stage
(update_shape, update_impl, update_weights, realloc, set_args, execute; other kinds such as
`compile` or `check` get a track of their own when they occur). Metadata (`M`) events name
the process and the threads and keep the stages in pipeline order.

Durations: an event's `ts` is taken when the decision is recorded, i.e. at the end of that
stage. A node's stages are consecutive events of that node within an inference, so a stage's
`X` event spans from the previous event's `ts` (the `infer_start` for the first) to its own.
Spans are made monotonic (a stage never starts before the previous one ended), so the `X`
events of one thread never overlap and the node and inference spans contain their stages.
Times are integer microseconds.

Decisions that changed something (impl builds, evictions, reallocs, reorders, unfusions...) are
also instant (`i`) events with the event's fields in `args`. Events outside inferences (run end,
checks) are instant events. A counter (`C`) track `device bytes` follows every realloc:
`allocated` is the running total of bytes allocated (`realloc.alloc` bytes), `live` the
capacity of the buffers the run holds (each node output's latest capacity, graph inputs
included).
"""
from __future__ import annotations

import json
import os
from typing import IO, Iterable, Iterator

from traces.query import EventFilter
from traces.summary import is_change

PID = 1
STAGES = ("update_shape", "update_impl", "update_weights", "realloc", "set_args", "execute")
TID_INFER, TID_NODE, TID_STAGE0 = 1, 2, 10


def _us(ts: float) -> int:
    return int(round(ts * 1e6))


def _args(ev: dict) -> dict:
    return {k: v for k, v in ev.items() if k not in ("kind", "ts") and v != ""}


class _Exporter:
    def __init__(self, header: dict, flt: EventFilter):
        self.flt = flt
        self.tids: dict[str, int] = {k: TID_STAGE0 + i for i, k in enumerate(STAGES)}
        self.used: set[int] = set()
        model = os.path.basename(str(header.get("model", "model")))
        self.meta = [{"ph": "M", "pid": PID, "tid": 0, "ts": 0, "name": "process_name",
                      "args": {"name": f"dyncli {model}"}}]
        self.cursor = 0          # end of the last stage, in us
        self.in_infer = False
        self.infer_start = 0
        self.node: str | None = None
        self.node_span = (0, 0, "")
        self.allocated = self.live = 0
        self.capacity: dict[tuple, int] = {}     # (node, k-th output) -> bytes held
        self.seen_outputs: dict[str, int] = {}   # realloc events per node in this inference

    def tid(self, kind: str) -> int:
        t = self.tids.get(kind)
        if t is None:
            t = self.tids[kind] = TID_STAGE0 + len(self.tids)
        return self.thread(t, kind)

    def thread(self, tid: int, name: str) -> int:
        """`tid`, named by M events the first time it is used."""
        if tid not in self.used:
            self.used.add(tid)
            self.meta.append({"ph": "M", "pid": PID, "tid": tid, "ts": 0, "name": "thread_name", "args": {"name": name}})
            self.meta.append({"ph": "M", "pid": PID, "tid": tid, "ts": 0, "name": "thread_sort_index",
                              "args": {"sort_index": tid}})
        return tid

    def close_node(self) -> Iterator[dict]:
        if self.node is not None:
            start, end, op = self.node_span
            yield {"ph": "X", "pid": PID, "tid": self.thread(TID_NODE, "node"), "ts": start,
                   "dur": end - start, "name": self.node, "cat": op, "args": {"op": op}}
        self.node = None

    def memory(self, ev: dict, ts: int) -> Iterator[dict]:
        k = self.seen_outputs.get(ev["node"], 0)
        self.seen_outputs[ev["node"]] = k + 1
        key = (ev["node"], k)
        action = ev["action"]
        if action == "alloc" or (action == "external" and ev["reason"] == "alloc"):
            cap = ev.get("capacity", ev.get("bytes", 0)) or 0
            if action == "alloc":
                self.allocated += ev.get("bytes", cap) or 0
            self.live += cap - self.capacity.get(key, 0)
            self.capacity[key] = cap
        else:
            return
        if self.flt.iter_ok(ev["iter"]):
            yield {"ph": "C", "pid": PID, "tid": 0, "ts": ts, "name": "device bytes",
                   "args": {"allocated": self.allocated, "live": self.live}}

    def event(self, ev: dict) -> Iterator[dict]:
        kind = ev["kind"]
        ts = _us(ev["ts"])
        if kind == "infer_start":
            self.in_infer, self.infer_start, self.cursor = True, ts, ts
            self.seen_outputs = {}
            self.shapes = ev.get("shapes", {})
            return
        if kind == "infer_end" and self.in_infer:
            yield from self.close_node()
            end = max(ts, self.cursor)
            self.in_infer = False
            if self.flt.iter_ok(ev["iter"]):
                yield {"ph": "X", "pid": PID, "tid": self.thread(TID_INFER, "inference"),
                       "ts": self.infer_start, "dur": end - self.infer_start, "name": f"infer #{ev['iter']}",
                       "args": {"shapes": self.shapes, "latency_ms": ev.get("latency_ms"),
                                "counters": ev.get("counters", {})}}
            return
        selected = self.flt(ev)
        if not self.in_infer:  # run-level events and checks: instants
            if selected:
                yield {"ph": "i", "s": "t", "pid": PID, "tid": self.tid(kind), "ts": ts,
                       "name": f"{kind}.{ev['action']}" if ev["action"] else kind, "args": _args(ev)}
            return
        start, end = self.cursor, max(ts, self.cursor)
        self.cursor = end
        if kind == "realloc":
            yield from self.memory(ev, end)
        if ev["node"] != self.node:
            yield from self.close_node()
            if ev["node"] and self.flt.iter_ok(ev["iter"]) and self.flt.node_ok(ev["node"], ev["op"]):
                self.node, self.node_span = ev["node"], (start, end, ev["op"])
        elif self.node is not None:
            self.node_span = (self.node_span[0], end, self.node_span[2])
        if not selected:
            return
        name = f"{ev['node']} {ev['action']}".strip() or kind
        yield {"ph": "X", "pid": PID, "tid": self.tid(kind), "ts": start, "dur": end - start,
               "name": name, "cat": kind, "args": _args(ev)}
        if is_change(ev):
            yield {"ph": "i", "s": "t", "pid": PID, "tid": self.tid(kind), "ts": end,
                   "name": f"{kind}.{ev['action']}" + (f".{ev['reason']}" if ev["reason"] else ""),
                   "args": _args(ev)}


def export_chrome(header: dict, events: Iterable[dict], out: IO[str], flt: EventFilter | None = None) -> int:
    """Stream `events` as a Chrome trace JSON object into `out`; returns the number of trace
    events written (metadata included)."""
    ex = _Exporter(header, flt or EventFilter())
    out.write('{"displayTimeUnit":"ms","traceEvents":[\n')
    n = 0
    for ev in events:
        for ce in ex.event(ev):
            out.write((",\n" if n else "") + json.dumps(ce, separators=(",", ":")))
            n += 1
    for ce in ex.close_node():
        out.write((",\n" if n else "") + json.dumps(ce, separators=(",", ":")))
        n += 1
    for ce in ex.meta:
        out.write((",\n" if n else "") + json.dumps(ce, separators=(",", ":")))
        n += 1
    other = {k: header.get(k) for k in ("model", "device", "options") if k in header}
    out.write("\n],\"otherData\":" + json.dumps(other, default=str) + "}\n")
    return n
