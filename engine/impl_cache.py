"""The implementations cache (an LRU of compiled impls keyed by their full ImplParams), the impl
modes, and which ops get static impls in `--impls auto` (read from the op registry)."""
from __future__ import annotations

import ctypes
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


# Bytes of static impls the cache keeps (Impl.nbytes, engine/kernels.py program_bytes). Static
# impls grow with the shapes a run sees (one per shape class), dynamic ones do not (one per
# kernel, each node keeps its own), so the bound is on the static ones: 64 MiB is 16 static
# impls on Intel's CPU runtime and 53 on PoCL, and on a GPU, whose binaries are tens of KiB, the
# count bounds. scripts/soak.py (20,000 inferences, Intel's CPU runtime): RSS +9% after
# inference 1,000 with the default trace, +11 to +15% with none (the count alone: +34% by
# inference 3,000); --impls dynamic: +2%.
STATIC_BYTES = 64 << 20


def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim     # glibc
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def give_back_freed_heap() -> None:
    """Return the heap pages freed programs left to the OS. Builds run on several threads (the
    compile queue, prebuild) and glibc keeps what they free in per-thread arenas, so without
    this the process does not shrink after evictions: a MatMul run that evicts on every build
    stays at 379 MiB, 217 MiB with it (Intel's CPU runtime). A no-op off glibc."""
    if _TRIM is not None:
        _TRIM(0)


class ImplCache:
    """LRU keyed by ImplParams (never a lossy hash), bounded by count (`capacity`; the GPU
    plugin's default is 300) and by the bytes of its static impls (`static_bytes`); 0 =
    unbounded. Nodes hold the impls they use, so an eviction only means the next node (or
    shape) that wants the key builds it again."""

    def __init__(self, capacity: int = 300, static_bytes: int | None = None):
        self.capacity = capacity
        # None: STATIC_BYTES as it is now (scripts/soak.py sets it)
        self.static_bytes = STATIC_BYTES if static_bytes is None else static_bytes
        self.held_static = 0          # bytes of the static impls in the cache
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
        """Insert; returns the (key, impl, why) evicted to make room, why "capacity" or "bytes"."""
        self._drop(key)
        self._d[key] = impl
        self.held_static += self._static_bytes(impl)
        evicted = []
        while self.capacity and len(self._d) > self.capacity:
            evicted.append((*self._d.popitem(last=False), "capacity"))
            self.held_static -= self._static_bytes(evicted[-1][1])
        if self.static_bytes and self.held_static > self.static_bytes:
            for k in [k for k, v in self._d.items() if v.kind == "static" and k != key]:
                if self.held_static <= self.static_bytes:
                    break
                evicted.append((k, self._d.pop(k), "bytes"))
                self.held_static -= self._static_bytes(evicted[-1][1])
        self.evictions += len(evicted)
        return evicted

    @staticmethod
    def _static_bytes(impl) -> int:
        return impl.nbytes if impl.kind == "static" else 0

    def _drop(self, key) -> None:
        old = self._d.pop(key, None)
        if old is not None:
            self.held_static -= self._static_bytes(old)

    def __contains__(self, key) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)
