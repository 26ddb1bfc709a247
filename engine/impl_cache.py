"""The implementations cache (an LRU of compiled impls keyed by their full ImplParams) and the
per-op decision of which ops get static impls."""
from __future__ import annotations

from collections import OrderedDict

IMPL_MODES = ("auto", "dynamic", "static")

# Ops whose static impl is worth building in `--impls auto` (seed 002: the critical ops), per
# device type. Decided by scripts/bench_impls.py: geometric mean of dynamic / static kernel time
# over the example models' shapes (> 1: static faster); an op is True only where its static
# impl measured faster.
# - PoCL CPU (2 shared cores, --repeat 15): MatMul 23.9 (2.8..70.9), Gemm 25.5, Conv 1.44
#   (1.13..1.96 with PW=8; PW=16 lost: 0.97), Softmax 0.82 (0.59..1.00).
# - NVIDIA H200 (--repeat 50 --large): MatMul 0.41 (0.27..1.12), Gemm 0.52, Conv 1.30
#   (0.89..3.87), Softmax 1.07 (0.97..1.17): the register-blocked static GEMM loses to the
#   dynamic tiled kernel there, so GPUs build static Conv only.
# - Issue 12's register-tiled GEMMs (scripts/bench_gemm.py --impl both, dynamic / static us):
#   PoCL CPU (gemm_rb 8x16; static reorders B): 128x384x384 228 / 137, 128x1536x384 1114 / 723,
#   128x384x1536 1132 / 748, 32x1536x384 312 / 229, 12x128x32x128 92 / 81: static still wins.
#   H100 (gemm_lm, same tile): 4096^3 3041 / 3117, 2048x1536x384 64 / 67, 512x3072x768 83 / 85,
#   and the static build has no split-K (8x768x3072 23 / 113): GPUs keep the dynamic GEMM.
STATIC_WORTH = {
    "cpu": {"MatMul": True, "Gemm": True, "Conv": True, "Softmax": False},
    "gpu": {"MatMul": False, "Gemm": False, "Conv": True, "Softmax": False},
}


def static_worth(device_type: str, op: str) -> bool:
    return STATIC_WORTH.get(device_type, STATIC_WORTH["gpu"]).get(op, False)


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
