"""Bounded memo tables for the flow's pure functions of shapes (a node's output layouts, its
kernel calls, a kernel's shape_info for given offsets): a sequence of shapes that come back
computes each once. The flow still takes every decision; this only saves recomputing what the
same shapes gave before."""
from __future__ import annotations

import numpy as np


class Memo(dict):
    """A dict that forgets its oldest entry past `size` (insertion order)."""

    def __init__(self, size: int = 32):
        super().__init__()
        self.size = size

    def put(self, key, value):
        if len(self) >= self.size:
            del self[next(iter(self))]
        self[key] = value
        return value


def values_key(deps: dict) -> tuple:
    """Host values (memory deps) as a hashable key."""
    return tuple((i, a.dtype.str, a.shape, a.tobytes()) for i, a in ((i, np.asarray(v)) for i, v in deps.items()))
