"""Which events a `dyncli trace` question is about: --iter, --node GLOB, --op, --kind, --action."""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

_ITER = re.compile(r"^\s*(\d+)\s*(?:\.\.\s*(\d+)\s*)?$")


def parse_iters(spec: str) -> tuple[int, int]:
    """`3` -> (3, 3); `2..5` -> (2, 5), both ends included."""
    m = _ITER.match(spec)
    if not m:
        raise ValueError(f"--iter {spec!r}: expected N or FIRST..LAST (e.g. 3 or 2..5)")
    lo = int(m.group(1))
    hi = int(m.group(2)) if m.group(2) is not None else lo
    if hi < lo:
        raise ValueError(f"--iter {spec!r}: LAST is before FIRST")
    return lo, hi


@dataclass
class EventFilter:
    iters: tuple[int, int] | None = None
    node: str | None = None      # glob, e.g. 'MatMul_*'
    op: str | None = None
    kind: str | None = None
    action: str | None = None

    def __post_init__(self):
        self._node_re = re.compile(fnmatch.translate(self.node)) if self.node else None

    @property
    def selects_events(self) -> bool:
        """True when some events of a selected inference are left out."""
        return bool(self.node or self.op or self.kind or self.action)

    def iter_ok(self, it: int) -> bool:
        return self.iters is None or self.iters[0] <= it <= self.iters[1]

    def node_ok(self, node: str, op: str) -> bool:
        return ((self._node_re is None or self._node_re.match(node) is not None)
                and (self.op is None or op == self.op))

    def event_ok(self, ev: dict) -> bool:
        return (self.node_ok(ev["node"], ev["op"])
                and (self.kind is None or ev["kind"] == self.kind)
                and (self.action is None or ev["action"] == self.action))

    def __call__(self, ev: dict) -> bool:
        return self.iter_ok(ev["iter"]) and self.event_ok(ev)

    def describe(self) -> dict:
        d = {k: getattr(self, k) for k in ("node", "op", "kind", "action") if getattr(self, k)}
        if self.iters:
            d["iter"] = f"{self.iters[0]}..{self.iters[1]}"
        return d
