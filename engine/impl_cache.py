"""The implementations cache (an LRU of compiled impls keyed by their full ImplParams), the impl
modes, and which ops get static impls in `--impls auto` (read from the op registry)."""
from __future__ import annotations

from collections import OrderedDict

from engine.ops import OPS

IMPL_MODES = ("auto", "dynamic", "static")


def static_worth(device_type: str, op: str) -> bool:
    """Whether `--impls auto` builds `op`'s static impl on a `device_type` ("cpu" | "gpu"; any
    other kind is taken as a GPU) device: its OpDef's `static_on`, where the measurements that
    decided it are (the GPU plugin's overall_flow.md: static impls for the critical ops)."""
    d = OPS.get(op)
    kind = device_type if device_type in ("cpu", "gpu") else "gpu"
    return d is not None and kind in d.static_on


class ImplCache:
    """LRU keyed by ImplParams (never a lossy hash). capacity 0 = unbounded; the GPU plugin's
    default is 300. Nodes hold the impls they use, so an eviction only means the next node
    (or shape) that wants the key builds it again."""

    def __init__(self, capacity: int = 300):
        self.capacity = capacity
        self._d: OrderedDict = OrderedDict()
        self.hits = self.misses = self.evictions = 0

    def get(self, key):
        impl = self._d.get(key)
        if impl is None:
            self.misses += 1
            return None
        self._d.move_to_end(key)
        self.hits += 1
        return impl

    def put(self, key, impl) -> list:
        """Insert; returns the (key, impl) pairs evicted to make room."""
        self._d[key] = impl
        self._d.move_to_end(key)
        evicted = []
        while self.capacity and len(self._d) > self.capacity:
            evicted.append(self._d.popitem(last=False))
        self.evictions += len(evicted)
        return evicted

    def __contains__(self, key) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)
