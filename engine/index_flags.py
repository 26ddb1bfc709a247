"""Indices computed on the device (an Add, a Cast, an ArgMax of device data), checked where the
kernels use them: the index kernels (cl/gather.cl, cl/indexing.cl) clamp a bad index so that
nothing outside a tensor is touched, and record it in the node's slot of one small device
buffer per network; the queue reads that buffer just before the outputs, in the wait that ends
every inference (flow, partial replay or plan replay alike: DeviceQueue.read_status), so indices
in range cost no blocking read of their own.

A slot is four ints: [found, index column (GatherND/ScatterND), index low bits, high bits]; the
first work-item of the node that finds a bad index writes it (cl/common.cl flag_index). Slots
stay zero while indices are in range: only a refused inference writes them back to zero.
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from engine.layout import Layout
from engine.memory import Tensor

SLOT_INTS = 4


class IndexFlags:
    def __init__(self, insts, queue):
        """One slot per device index node of `insts` (bound to its kernels as `inst.index_flag`);
        `queue` reads them at the end of each inference."""
        self.queue = queue
        self.host = np.zeros((max(len(insts), 1), SLOT_INTS), np.int32)
        self.zeros = np.zeros_like(self.host)
        self.buf = cl.Buffer(queue.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                             hostbuf=self.host)
        for k, inst in enumerate(insts):
            inst.index_flag = Tensor(f"{inst.node.name}:index_flag", Layout((SLOT_INTS,), "i32"),
                                     buf=self.buf, offset=k * SLOT_INTS, constant=True)
        self.unread = False            # kernels may have written since the last read
        self.unchecked = False         # read, but `found` has not looked at what it read
        queue.status = self

    def begin(self, q: cl.CommandQueue) -> None:
        """An inference starts: slots an inference that failed midway may have set go back
        to zero first (its end never read them, or never looked at what it read)."""
        if self.unread or self.unchecked:
            self._clear(q)
        self.unread, self.unchecked = True, False

    def read(self, q: cl.CommandQueue) -> None:
        """Enqueue the slots' read; the outputs' blocking read (or the finish) that follows
        waits for it."""
        cl.enqueue_copy(q, self.host, self.buf, is_blocking=False)
        self.unread, self.unchecked = False, True

    def found(self) -> dict:
        """{slot: (index column, index)} of the nodes that found a bad index in the inference
        just read; their slots are cleared for the next one."""
        self.unchecked = False
        hit = np.flatnonzero(self.host[:, 0])
        if not len(hit):
            return {}
        out = {int(k): (int(self.host[k, 1]), int((int(self.host[k, 3]) << 32) | (int(self.host[k, 2]) & 0xFFFFFFFF)))
               for k in hit}
        self.host[:] = 0
        self._clear(self.queue.cl_queue)
        return out

    def _clear(self, q: cl.CommandQueue) -> None:
        cl.enqueue_copy(q, self.buf, self.zeros, is_blocking=False)   # `zeros` lives as long
