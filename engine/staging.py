"""Pinned staging: host memory the driver copies to the device without waiting for the queue.

NVIDIA's OpenCL returns from a non-blocking write of host memory only once every command
before it on the in-order queue has run, pinned host memory included: on an H200, a 16-byte
write behind 0.6 ms of kernels returned after 530-545 us, and a copy from a buffer allocated
with ALLOC_HOST_PTR (pinned, in host memory) after 8-11 us (.device/write_busy.py of session
9). An inference writes while its kernels run (the shape_info arena between launches, a shape
value its readers need, the inputs of a replay), so each such write stalled the host until the
device drained. Writes are copied into a ring in such a buffer (mapped once: its host pointer
stays valid) and the device copies buffer to buffer from there. The ring is reused only after
the queue's finish, when every copy from it has run; a write that does not fit goes from its
own array, as before.
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl

RING_BYTES = 1 << 20       # an inference's writes: its inputs, shape values, shape_info spans
ALIGN = 64


class PinnedStaging:
    def __init__(self, ctx: cl.Context, queue: cl.CommandQueue, nbytes: int = RING_BYTES):
        self.buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes)
        # mapped for the life of the network: only its host pointer is used, as the source of
        # ordinary writes (the buffer object itself never reaches a kernel or a copy)
        self.host, _ = cl.enqueue_map_buffer(queue, self.buf, cl.map_flags.WRITE | cl.map_flags.READ,
                                             0, (nbytes,), np.uint8, is_blocking=True)
        self.used = 0
        self.staged = 0            # writes staged so far (figures, tests)

    def stage(self, arr: np.ndarray) -> int | None:
        """`arr`'s bytes copied into the ring: their offset in `buf` (None when they do not
        fit before the next reset)."""
        n = arr.nbytes
        at = -(-self.used // ALIGN) * ALIGN
        if at + n > len(self.host):
            return None
        self.host[at:at + n] = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        self.used = at + n
        self.staged += 1
        return at

    def reset(self) -> None:
        """Every copy from the ring has run (the queue finished): it can be written again."""
        self.used = 0
