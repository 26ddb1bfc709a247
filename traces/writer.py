"""JSON Lines trace writer: buffered, flushed at every inference end (so a killed run loses at
most the inference in flight)."""
from __future__ import annotations

import json
import os
import time

from traces.reader import NOT_REPLAYED, each_input, replayed, stepped
from traces.schema import SCHEMA_VERSION


class TraceWriter:
    def __init__(self, path: str | os.PathLike, header: dict):
        self.path = str(path)
        self._f = open(self.path, "wb")
        self._t0 = time.perf_counter()
        self._buf: list[bytes] = []
        self.iter = -1
        self.spent_s = 0.0             # time spent writing events (infer_end's breakdown)
        self._heads: dict = {}         # (kind, node, op, action, reason) -> the line's JSON head
        # bytes known to be whole lines in the file, and whether a write since may have been cut
        # (Ctrl-C during a flush): the next flush cuts the file back and writes the lines again
        self._good, self._cut = 0, False
        self.write({"kind": "header", "schema": SCHEMA_VERSION, "tool": "dyncli", **header})
        self.flush()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def write(self, record: dict) -> None:
        self._buf.append(_dumps(record))

    def event(self, kind: str, node: str = "", op: str = "", action: str = "", reason: str = "",
              **fields) -> None:
        # The five names repeat from inference to inference: their JSON is made once and the
        # line is spliced from it, the iteration, the time and the fields (a third of the cost
        # of encoding a dict per event: the trace's cost is per decision)
        t0 = time.perf_counter()
        key = (kind, node, op, action, reason)
        head = self._heads.get(key)
        if head is None:
            head = self._heads[key] = _dumps({"kind": kind, "node": node, "op": op, "action": action,
                                              "reason": reason})[:-1] + b',"iter":'
            if len(self._heads) > 65536:      # a bound: names are per node, not per inference
                self._heads.clear()
        line = head + b"%d,\"ts\":%.6f" % (self.iter, t0 - self._t0)
        self._buf.append(line + b"," + _dumps(fields)[1:] if fields else line + b"}")
        self.spent_s += time.perf_counter() - t0

    def flush(self) -> None:
        t0 = time.perf_counter()
        if self._cut:                  # an interrupted flush: its lines are still in _buf
            self._f.seek(self._good)
            self._f.truncate()
            self._cut = False
        if self._buf:
            data = b"\n".join(self._buf) + b"\n"
            self._cut = True
            self._f.write(data)
            self._f.flush()
            # one statement: an interrupt lands before it (the lines are written again) or after
            self._buf, self._good, self._cut = [], self._good + len(data), False
        else:
            self._f.flush()
        self.spent_s += time.perf_counter() - t0

    def close(self) -> None:
        if not self._f.closed:
            self.flush()
            self._f.close()


def _default(o):
    # numpy scalars and tuples of numpy ints show up in shapes
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


try:   # orjson encodes an event ~10x faster than json: the trace's cost is per decision
    import orjson

    def _dumps(rec: dict) -> bytes:
        return orjson.dumps(rec, default=_default, option=orjson.OPT_SERIALIZE_NUMPY)
    ENCODER = "orjson"
except ImportError:  # pragma: no cover - orjson is a dependency; json keeps the file the same
    def _dumps(rec: dict) -> bytes:
        return json.dumps(rec, separators=(",", ":"), default=_default).encode()
    ENCODER = "json"          # (about 3x orjson's cost per event)


class MemoryTrace:
    """The writer's event API kept in memory (tests, scripts): `events` holds one dict per event
    with the same fields a trace file would."""

    def __init__(self):
        self._t0 = time.perf_counter()
        self.iter = -1
        self.events: list[dict] = []

    def event(self, kind: str, node: str = "", op: str = "", action: str = "", reason: str = "",
              **fields) -> None:
        rec = {"kind": kind, "iter": self.iter, "node": node, "op": op, "action": action,
               "reason": reason, "ts": time.perf_counter() - self._t0, **fields}
        self.events.extend(each_input(rec))
        if kind == "plan":   # expanded as the file reader does (traces/reader.py)
            if action != "compiled":
                base, end = self._base(fields["of_iter"])
                self.events.extend(replayed(base, rec, end.get("clean_nodes")))
            if "repeat_of" in fields:
                self.events.extend(replayed(self._base(fields["repeat_of"])[0], {**rec, "action": "repeat"}))
            if "template_of" in fields:
                base, end = self._base(fields["template_of"])
                self.events.extend(stepped(base, rec, end.get("template")))

    def _base(self, it: int) -> tuple:
        """(the decision events of inference `it`, its infer_end) among those kept."""
        base, end = [], {}
        for e in reversed(self.events):   # events come in iter order: stop past the base
            if e["iter"] < it:
                break
            if e["iter"] == it and not e.get("replayed"):
                if e["kind"] == "infer_end":
                    end = e
                elif e["kind"] not in NOT_REPLAYED:
                    base.append(e)
        return base[::-1], end

    def flush(self) -> None:
        pass

    def of(self, iter: int, kind: str | None = None, action: str | None = None) -> list[dict]:
        return [e for e in self.events if e["iter"] == iter and (kind is None or e["kind"] == kind)
                and (action is None or e["action"] == action)]
