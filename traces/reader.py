"""JSON Lines trace reader: validates the header and each line, streams events."""
from __future__ import annotations

import json
import warnings
from typing import Iterator

from traces.schema import CORE_FIELDS, KINDS, SCHEMA_VERSION


class TraceError(ValueError):
    pass


def read_trace(path: str) -> tuple[dict, Iterator[dict]]:
    """Return (header, events). Events are read lazily; a truncated last line (a killed run)
    is dropped with a warning, any other bad line raises TraceError naming its number."""
    f = open(path, encoding="utf-8")
    first = f.readline()
    try:
        header = json.loads(first)
    except json.JSONDecodeError as e:
        f.close()
        raise TraceError(f"{path}:1: not a dyncli trace header ({e.msg})") from None
    if header.get("kind") != "header" or header.get("schema") != SCHEMA_VERSION:
        f.close()
        raise TraceError(f"{path}:1: expected a header with schema {SCHEMA_VERSION}")

    bases = PlanBases()

    def events() -> Iterator[dict]:
        with f:
            lineno = 1
            pending = None
            for line in f:
                lineno += 1
                if pending is not None:
                    raise pending
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    if not line.endswith("\n"):  # last line cut short by a kill
                        warnings.warn(f"{path}:{lineno}: truncated last line ignored")
                        return
                    raise TraceError(f"{path}:{lineno}: not JSON ({e.msg})") from None
                missing = [k for k in CORE_FIELDS if k not in rec]
                if missing or rec["kind"] not in KINDS:
                    raise TraceError(f"{path}:{lineno}: bad event (missing {missing} "
                                     f"or unknown kind {rec.get('kind')!r})")
                if rec["kind"] == "plan":
                    yield rec
                    base = bases.events(rec["of_iter"])
                    if base is None:
                        raise TraceError(f"{path}:{lineno}: plan replay of inference "
                                         f"{rec['of_iter']}, which is not a plan base")
                    yield from replayed(base, rec)
                    continue
                bases.see(rec)
                yield rec

    return header, events()


# Events that are not decisions of the inference they belong to: never copied by a replay.
NOT_REPLAYED = frozenset({"infer_start", "infer_end", "check", "run_end", "plan"})


def replayed(base: list[dict], rec: dict) -> Iterator[dict]:
    """The decision events a `plan replay` event stands for: copies of its base inference's,
    renumbered to the replaying inference (ts: the replay's)."""
    for e in base:
        yield {**e, "iter": rec["iter"], "ts": rec["ts"], "replayed": True}


class PlanBases:
    """Keeps the decision events of the inferences marked `plan_base` (the last few), so
    `plan replay` events can be expanded while streaming."""
    KEEP = 8

    def __init__(self):
        self._cur: list[dict] = []
        self._cur_iter = None
        self._bases: dict[int, list[dict]] = {}

    def see(self, rec: dict) -> None:
        it = rec["iter"]
        if it != self._cur_iter:
            self._cur, self._cur_iter = [], it
        if rec["kind"] == "infer_end":
            if rec.get("plan_base"):
                self._bases[it] = self._cur
                while len(self._bases) > self.KEEP:
                    del self._bases[min(self._bases)]
        elif rec["kind"] not in NOT_REPLAYED:
            self._cur.append(rec)

    def events(self, it: int) -> list[dict] | None:
        return self._bases.get(it)
