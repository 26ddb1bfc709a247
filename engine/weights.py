"""Reordered weights (update_weights, the GPU plugin's preprocessing.md): the per-node cache of
weight copies in the layouts static impls want, and the reorder kernel that fills them."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pyopencl as cl

from engine.kernels import KernelCall, WeightsLayout, compose_shape_info, round_up
from engine.layout import Layout
from engine.memory import Tensor

MAX_CAPACITY = 3
MEMORY_SHARE = 0.3   # reordered copies of one node may take at most this share of free memory


def weights_cache_capacity(weight_bytes: int, global_mem: int, used_bytes: int) -> int:
    """1 by default; up to 3 when three copies of the node's weights fit in a share of the
    device memory still free (a node switching between static impls of different layouts
    then keeps each copy instead of reordering again)."""
    free = max(global_mem - used_bytes, 0)
    return MAX_CAPACITY if weight_bytes * MAX_CAPACITY <= MEMORY_SHARE * free else 1


class WeightsCache:
    """LRU of reordered copies of one node's weights, keyed by WeightsLayout."""

    def __init__(self, capacity: int = 1):
        self.capacity = capacity
        self._d: OrderedDict = OrderedDict()

    def get(self, wl: WeightsLayout) -> Tensor | None:
        t = self._d.get(wl)
        if t is not None:
            self._d.move_to_end(wl)
        return t

    def put(self, wl: WeightsLayout, t: Tensor) -> None:
        self._d[wl] = t
        self._d.move_to_end(wl)

    def make_room(self, release) -> Tensor | None:
        """Evict down to capacity - 1 entries; returns the last evicted copy (its buffer may be
        reused for the next reorder: the caller releases it otherwise), `release`s the others."""
        out = None
        while self._d and len(self._d) >= self.capacity:
            if out is not None:
                release(out)
            out = self._d.popitem(last=False)[1]
        return out

    def __len__(self) -> int:
        return len(self._d)


def reorder_call(wl: WeightsLayout) -> KernelCall:
    n = int(np.prod(wl.shape))
    return KernelCall("reorder", "reorder_weights", wl.jit + (("IMPL_TAG", wl.name),),
                      (("in", 0), ("out", 0)), params=wl.params + (n,), gws=(max(n, 1),))


def run_reorder(impls, buffers, node, src: Tensor, wl: WeightsLayout, reuse: Tensor | None) -> Tensor:
    """Enqueue the reorder kernel (its impl comes from the impl cache like any other) into
    `reuse`'s buffer when it is big enough, else a new one."""
    call = reorder_call(wl)
    impl = impls.dynamic(call, node)
    nbytes = int(np.prod(wl.shape)) * 4
    if reuse is not None and reuse.capacity >= nbytes:
        dst = reuse
    else:
        if reuse is not None:
            buffers.release(reuse)
        dst = Tensor(f"{src.name}:{wl.name}", constant=True)
        buffers.give(dst, nbytes)   # weights are constant: never from the pool
    dst.layout, dst.offset = Layout(tuple(wl.shape), "f32"), 0
    info = compose_shape_info([(src.offset, src.layout.shape), (0, wl.shape)], call.params)
    info_buf = cl.Buffer(buffers.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=info)
    k = cl.Kernel(impl.program, call.kernel)
    k.set_args(info_buf, buffers.device_buffer(src), dst.buf)
    buffers.queue.launch(k, (round_up(call.gws[0], 64),), (64,))
    buffers.queue.keep(info_buf)
    return dst
