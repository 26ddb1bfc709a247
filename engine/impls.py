"""The implementations cache: an LRU of compiled impls keyed by their full parameters."""
from __future__ import annotations

from collections import OrderedDict


class ImplCache:
    """LRU keyed by the impl's parameters (never a lossy hash). capacity 0 = unbounded;
    the GPU plugin's default is 300."""

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
        """Insert; returns the keys evicted to make room."""
        self._d[key] = impl
        self._d.move_to_end(key)
        evicted = []
        while self.capacity and len(self._d) > self.capacity:
            evicted.append(self._d.popitem(last=False)[0])
        self.evictions += len(evicted)
        return evicted

    def __len__(self) -> int:
        return len(self._d)
