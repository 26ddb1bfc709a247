"""Device memory of one network: every buffer with the tensors that hold it, and the memory pool
(the GPU plugin's memory_pool) that hands a buffer whose holders are all dead to a later tensor
of the same inference.

Lifetimes are steps of the execution order (engine/load_passes.py): a tensor lives from the
step that writes it to the last step that reads it, or any view of it (graph outputs live past
the end). Buffers stay with
their tensors across inferences (realloc_if_needed reuses them), so a pooled buffer ends up
held by several tensors whose lifetimes never overlap; a tensor may take it only when every
holder's lifetime ends before its own begins. That keeps the sharing safe in every later
inference too, whatever each holder does with its own buffer meanwhile.

The pool's size rule is the plugin's: a buffer is taken only when the request is more than
half its size (a small tensor does not pin a large buffer), and the smallest such buffer wins.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np
import pyopencl as cl

from engine.diagnose import DeviceMemoryError, nbytes_text, too_large

END = 1 << 30   # the lifetime end of graph outputs: read after the last step


@dataclass
class _Block:
    buf: cl.Buffer
    nbytes: int
    constant: bool
    holders: set = field(default_factory=set)
    made: int = 0           # the pool's count of buffers made when this one was (their order)
    # the last step any holder lives to (past END where a holder is not pooled), for the
    # lifetimes' version `spans` (-1: not worked out): `take` compares it, not every holder
    dead_after: int = 0
    spans: int = -1


class MemoryPool:
    def __init__(self, lifetimes: dict[str, list[int]], poolable: set[str], enabled: bool = True):
        self.lifetimes = lifetimes
        self.enabled = enabled
        self.poolable = poolable if enabled else set()
        self._blocks: dict[int, _Block] = {}    # id(buf) -> block
        # the non-constant ones by (size, order made): what `take` looks through, from the
        # smallest size it may take (a growth's sixty takes each walked every block)
        self._by_size: list = []
        self._made = 0
        self.used_bytes = 0                     # every buffer held (weights included)
        self.act_bytes = 0                      # buffers of non-constant tensors
        self.peak_bytes = 0                     # max act_bytes since begin_inference
        self._live: dict[str, int] = {}         # tensor -> bytes it occupies in this inference
        self.changes = 0                        # buffers made, freed or shared (engine/fast_path)
        self.limits: tuple[int, int] | None = None   # (global_mem_size, max_mem_alloc_size)
        self._spans = 0                         # lifetimes' version (add_scratch changes them)
        self._sweep: tuple | None = None        # (names, version, their births and deaths in order)

    def add_scratch(self, name: str, step: int) -> None:
        """An impl's internal buffer: live during its node's step only."""
        self.lifetimes[name] = [step, step]
        self._spans += 1
        if self.enabled:
            self.poolable.add(name)

    # ---- buffers ------------------------------------------------------------------------
    def alloc(self, ctx: cl.Context, nbytes: int, holder: str, constant: bool = False) -> cl.Buffer:
        """A new buffer, refused (DeviceMemoryError, the reason only) when the device's limits
        (`limits`: global_mem_size, max_mem_alloc_size) say it cannot be had, or it fails."""
        if self.limits is not None:
            why = too_large(nbytes, self.used_bytes, *self.limits)
            if why:
                raise DeviceMemoryError(why)
        self.changes += 1
        try:
            buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, max(nbytes, 1))
        except (cl.Error, MemoryError) as e:
            raise DeviceMemoryError(f"the device could not allocate it ({getattr(e, 'what', e)}) "
                                    f"with {nbytes_text(self.used_bytes)} held") from None
        self._made += 1
        b = self._blocks[id(buf)] = _Block(buf, nbytes, constant, {holder}, self._made)
        self.used_bytes += nbytes
        if not constant:
            bisect.insort(self._by_size, (nbytes, b.made, b))
            self.act_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.act_bytes)
        return buf

    def release(self, buf: cl.Buffer | None, holder: str) -> None:
        """`holder` lets go of `buf`; the buffer is freed with its last holder."""
        b = self._blocks.get(id(buf)) if buf is not None else None
        if b is None:
            return
        self.changes += holder in b.holders
        b.holders.discard(holder)
        b.spans = -1
        if not b.holders:
            del self._blocks[id(buf)]
            self.used_bytes -= b.nbytes
            if not b.constant:
                del self._by_size[bisect.bisect_left(self._by_size, (b.nbytes, b.made))]
                self.act_bytes -= b.nbytes

    def take(self, holder: str, need: int) -> tuple[cl.Buffer, int] | None:
        """A pooled buffer for `holder` (which needs `need` bytes) or None: every holder of the
        buffer dead before `holder` is written, `need` more than half the buffer's size."""
        if holder not in self.poolable:
            return None
        life = self.lifetimes[holder]
        start, spans = life[0], self._spans
        by_size = self._by_size
        for k in range(bisect.bisect_left(by_size, (need,)), len(by_size)):
            b = by_size[k][2]               # (the smallest first, the first made of a size)
            if b.nbytes >= 2 * need:
                return None
            if b.spans != spans:
                self._dead_after(b)
            if b.dead_after < start:        # every holder dead before `holder` is written
                self.changes += 1
                b.holders.add(holder)
                b.dead_after = max(b.dead_after, life[1])
                return b.buf, b.nbytes
        return None

    def _dead_after(self, b: _Block) -> None:
        """b.dead_after for the lifetimes now (a growth's sixty takes each looked at every
        holder of every block of a size it may take)."""
        b.spans = self._spans
        pooled, lifetimes = self.poolable, self.lifetimes
        b.dead_after = max((lifetimes[h][1] if h in pooled else END + 1 for h in b.holders), default=-1)

    # ---- per-inference figures ----------------------------------------------------------
    def begin_inference(self) -> None:
        self.peak_bytes = self.act_bytes
        self._live = {}

    def note_live(self, name: str, nbytes: int) -> None:
        """`name` occupies `nbytes` of device memory of its own in this inference."""
        self._live[name] = nbytes

    def live(self) -> dict:
        """What note_live was told in this inference so far: tensor -> bytes."""
        return dict(self._live)

    def note_many(self, live: dict) -> None:
        """note_live for each (name, nbytes) of `live` (a partial replay's repeated nodes)."""
        self._live.update(live)

    def live_lower_bound(self) -> int:
        """The largest sum of bytes of tensors live at one step of this inference: no
        allocator can hold less (views and in-place concat inputs occupy nothing of their own).
        A sweep over births (first step) and deaths (after the last step), in numpy: every
        inference reports it, and a Python sweep cost 0.3 ms of a decode step. The order of
        the sweep depends only on which tensors are live: it is kept while they are the same
        (a decode step's are, their sizes aside)."""
        live = self._live
        if not live:
            return 0
        n = len(live)
        sweep = self._sweep
        # the same tensors in another order (a partial replay notes its blocks in bulk) keep it
        if sweep is None or sweep[1] != self._spans or live.keys() != sweep[3]:
            names = tuple(live)
            span = self.lifetimes.get
            ends = np.fromiter((x for name in names for x in span(name, (0, END))), np.int64, 2 * n)
            # births of a step before its deaths; the max of the running sum is reached at the
            # end of a step's births whatever their order
            keys = ends * 2
            keys[1::2] += 1
            order = np.argsort(keys, kind="stable")
            # the k-th event of the sweep: tensor order[k] // 2, a birth (+) or a death (-)
            sweep = self._sweep = (names, self._spans, (order // 2, 1 - 2 * (order % 2)), frozenset(names))
        sizes = np.fromiter(map(live.__getitem__, sweep[0]), np.int64, n)
        which, sign = sweep[2]
        return max(0, int(np.cumsum(sizes[which] * sign).max()))
