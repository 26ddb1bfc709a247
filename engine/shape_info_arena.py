"""The shape_info arena: every kernel's shape_info block (the GPU plugin's dynamic_impl.md)
lives in a few shared device buffers, written once per inference instead of once per node.

Each bound kernel owns a slot, a sub-buffer of an arena chunk (its kernel argument never moves,
so its arguments stay bound); `write` changes the host copy and marks the chunk dirty, and
`flush` copies each dirty chunk's dirty span in one non-blocking write, just before the
kernels that read it are enqueued (DeviceQueue.flush). Measured reason: a small non-blocking
write costs ~9.5 us on the H100 and ~40 us on PoCL, so one write per node was the main cost of
a changed shape on the CPU.

A span may go to the device ahead of kernels already waiting on the queue (DeviceQueue's side
queue): that is safe while none of its slots was flushed before in the same inference (a
kernel waiting on the queue may read it) and no kernel runs twice in the inference (a Loop
body's kernels, iteration after iteration: control flow writes in order); the span's other
bytes are what the device already holds. The arena says which (`flush`).
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl

CHUNK_BYTES = 64 * 1024


class _Chunk:
    def __init__(self, ctx: cl.Context, nbytes: int):
        self.buf = cl.Buffer(ctx, cl.mem_flags.READ_ONLY, nbytes)
        self.host = np.zeros(nbytes // 4, np.int32)
        self.used = 0                   # bytes handed out (bump allocation; slots never move)
        self.lo, self.hi = nbytes, 0    # dirty span in bytes
        self.written: list = []         # slots written since the last flush


class ShapeInfoArena:
    def __init__(self, ctx: cl.Context, device: cl.Device):
        self.ctx = ctx
        # sub-buffer origins must be multiples of the device's base address alignment
        self.align = max(device.mem_base_addr_align // 8, 4)
        self.chunks: list[_Chunk] = []
        self.writes = 0                 # device writes enqueued (figures for `dyncli bench`)
        # slots of kernels that are gone, by size: a node's spare kernels come and go over a
        # long run (more impls than it keeps), and bump allocation alone grew without bound
        self.free: dict[int, list] = {}
        self.epoch = 0                  # the inference (DeviceQueue.begin_inference)
        self.version = 0                # bumped by every write into a slot (Slot.write, write_image)

    def slot(self, nints: int) -> "Slot":
        nbytes = -(-nints * 4 // self.align) * self.align
        if self.free.get(nbytes):
            return self.free[nbytes].pop()
        c = self.chunks[-1] if self.chunks else None
        if c is None or c.used + nbytes > c.host.nbytes:
            c = _Chunk(self.ctx, max(CHUNK_BYTES, nbytes))
            self.chunks.append(c)
        at = c.used
        c.used += nbytes
        sub = c.buf.get_sub_region(at, nbytes)
        return Slot(c, at, nbytes, sub, self)

    @staticmethod
    def image(slots_infos) -> list:
        """What a plan's launches hold in their slots ((slot, shape_info) each), as one write
        per chunk for write_image: (chunk, word indices, values, slots, byte span)."""
        by_chunk: dict = {}
        for slot, info in slots_infos:
            by_chunk.setdefault(id(slot.chunk), (slot.chunk, []))[1].append((slot, info))
        out = []
        for chunk, items in by_chunk.values():
            idx = np.concatenate([np.arange(s.at // 4, s.at // 4 + len(i)) for s, i in items])
            vals = np.concatenate([i for _, i in items]).astype(np.int32)
            lo = min(s.at for s, _ in items)
            hi = max(s.at + i.nbytes for s, i in items)
            out.append((chunk, idx, vals, [s for s, _ in items], lo, hi))
        return out

    def write_image(self, image: list) -> None:
        """Slot.write of every (slot, shape_info) of `image` (ShapeInfoArena.image), in one
        assignment per chunk."""
        for chunk, idx, vals, slots, lo, hi in image:
            chunk.host[idx] = vals
            for s in slots:
                if not s.pending:
                    s.pending = True
                    chunk.written.append(s)
            chunk.lo, chunk.hi = min(chunk.lo, lo), max(chunk.hi, hi)
        self.version += 1

    def flush(self, write) -> None:
        """Copy every dirty span to the device: `write(buf, span, byte offset, copy=True,
        ahead=...)` (DeviceQueue.write: non-blocking, the span's bytes kept until the copy has
        run; `ahead`: it may run before the kernels waiting on the queue, no slot of it having
        been flushed before in this inference)."""
        epoch = self.epoch
        for c in self.chunks:
            if c.hi > c.lo:
                ahead = True
                for s in c.written:
                    ahead &= s.flushed != epoch
                    s.flushed, s.pending = epoch, False
                c.written.clear()
                write(c.buf, c.host[c.lo // 4:c.hi // 4], c.lo, copy=True, ahead=ahead)
                self.writes += 1
                c.lo, c.hi = c.host.nbytes, 0


class Slot:
    """One kernel's shape_info block in the arena."""
    __slots__ = ("chunk", "at", "nbytes", "buf", "arena", "flushed", "pending")

    def __init__(self, chunk: _Chunk, at: int, nbytes: int, buf: cl.Buffer, arena: "ShapeInfoArena"):
        self.chunk, self.at, self.nbytes, self.buf = chunk, at, nbytes, buf
        self.arena = arena
        self.flushed = -1               # the arena epoch it last went to the device in
        self.pending = False            # written since the last flush

    def release(self) -> None:
        """Its kernel is gone (no node, cache or plan holds it): the next slot of its size."""
        self.arena.free.setdefault(self.nbytes, []).append(self)

    def write(self, info: np.ndarray) -> None:
        self.arena.version += 1
        c = self.chunk
        c.host[self.at // 4:self.at // 4 + len(info)] = info
        if not self.pending:
            self.pending = True
            c.written.append(self)
        c.lo = min(c.lo, self.at)
        c.hi = max(c.hi, self.at + info.nbytes)
