"""Kernel launches and host-to-device writes without pyopencl's per-command Event:
clEnqueueNDRangeKernel and clEnqueueWriteBuffer called through ctypes with no event, from the
same OpenCL library pyopencl is linked against.

pyopencl's enqueue_nd_range_kernel wraps every launch's event in a Python object and releases
it later; a launch whose event nobody waits on pays for that. Measured on an H200 host
(`.device/launch_floor.py`, the same 4096-element kernel): 7.41 us a launch through pyopencl,
5.84 through ctypes with no event. The flow and every replay launch this way (DeviceQueue.
enqueue); a profiling queue keeps pyopencl's, whose events it reads.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import statistics
import time

import numpy as np
import pyopencl as cl

from engine.kernels import load_source


def _library() -> ctypes.CDLL | None:
    """The OpenCL ICD loader pyopencl uses: its wheel's own, else the system's."""
    here = os.path.join(os.path.dirname(cl.__file__), ".libs")
    paths = sorted(glob.glob(os.path.join(here, "libOpenCL*"))) or \
        [p for p in [ctypes.util.find_library("OpenCL")] if p]
    for path in paths:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


class Launcher:
    """`launch_all(launches)` on one queue; None from `for_queue` where the library cannot be
    loaded (pyopencl's launch then). Each kernel's handle and each work size's array are made
    once and kept (`_ptrs`, `_sizes`) instead of at every launch: a BERT inference's 54 launches
    took 8.67-8.88 us each against 9.12-9.25 on an H200 host (the two alternating in one
    process; every argument made beforehand: 8.24-8.28)."""

    # kept at most, then started over: kernels (the dict keeps each alive; an impl cache's
    # evicted ones go with the next start) and work sizes (a decode's change with the KV length)
    KERNELS, SIZES = 1024, 4096

    def __init__(self, lib: ctypes.CDLL, queue: cl.CommandQueue):
        self._fn = lib.clEnqueueNDRangeKernel
        self._fn.restype = ctypes.c_int
        self._queue = ctypes.c_void_p(queue.int_ptr)
        self._queue_ref = queue           # the handle lives as long as this
        self._ptrs: dict = {}             # kernel -> its handle (the key keeps the kernel alive)
        self._sizes: dict = {}            # work sizes (a tuple) -> its size_t array
        # work sizes met once: the launch fills a scratch array (the call reads it before it
        # returns) instead of making one, a new length's 54 launches made theirs for nothing
        # (1.1 us a make against 0.4 a fill on PoCL's host); kept from the second time on
        self._once: set = set()
        self._scratch = {(n, k): (ctypes.c_size_t * n)() for n in (1, 2, 3) for k in (0, 1)}
        self._write = lib.clEnqueueWriteBuffer
        self._write.restype = ctypes.c_int

    @classmethod
    def for_queue(cls, queue: cl.CommandQueue) -> "Launcher | None":
        lib = _library()
        return cls(lib, queue) if lib is not None else None

    def _ptr(self, k: cl.Kernel) -> ctypes.c_void_p:
        if len(self._ptrs) >= self.KERNELS:
            self._ptrs.clear()
        p = self._ptrs[k] = ctypes.c_void_p(k.int_ptr)
        return p

    def _array(self, sizes, k: int) -> ctypes.Array:
        """`sizes`' size_t array: kept when met before, else a scratch one (`k`: 0 global, 1
        local) filled with them."""
        if sizes.__class__ is tuple and sizes in self._once:
            a = (ctypes.c_size_t * len(sizes))(*sizes)
            if len(self._sizes) >= self.SIZES:
                self._sizes.clear()
            self._sizes[sizes] = a
            return a
        a = self._scratch.get((len(sizes), k))
        if a is None:
            return (ctypes.c_size_t * len(sizes))(*sizes)
        if sizes.__class__ is tuple:
            if len(self._once) >= self.SIZES:
                self._once.clear()
            self._once.add(sizes)
        a[:] = sizes
        return a

    def launch_all(self, launches) -> None:
        """Each (kernel, gws, lws) in order."""
        fn, q, ptrs, arrays = self._fn, self._queue, self._ptrs, self._sizes
        for k, g, l in launches:
            kp = ptrs.get(k) or self._ptr(k)
            ga = (arrays.get(g) if g.__class__ is tuple else None) or self._array(g, 0)
            la = None if l is None else (arrays.get(l) if l.__class__ is tuple else None) or self._array(l, 1)
            err = fn(q, kp, len(g), None, ga, la, 0, None, None)
            if err:
                raise cl.LogicError(f"clEnqueueNDRangeKernel failed for kernel {k.function_name}: "
                                    f"OpenCL error {err} (work sizes {tuple(g)}, {l and tuple(l)})")

    def write(self, buf: cl.Buffer, arr, offset: int) -> None:
        """A non-blocking copy of C-contiguous `arr` into `buf` at byte `offset`, with no event:
        the caller keeps `arr` alive, unchanged, until the queue has run it (DeviceQueue.keep
        holds it to the inference's finish). pyopencl's non-blocking copy returns an event that
        waits for the copy when it is released (it keeps the host array alive that way), so a
        write behind waiting kernels returned only once they had run; this one returns at once.
        An idle queue's write on an H200 host: 9.6-11.3 us against pyopencl's 10.4-12.2 (the
        driver's own cost is most of it, pinned host memory alike)."""
        n = arr.nbytes
        if not n:
            return
        err = self._write(self._queue, ctypes.c_void_p(buf.int_ptr), 0, ctypes.c_size_t(offset),
                          ctypes.c_size_t(n), ctypes.c_void_p(arr.ctypes.data), 0, None, None)
        if err:
            raise cl.LogicError(f"clEnqueueWriteBuffer failed: OpenCL error {err} "
                                f"({n} bytes at offset {offset} of a {buf.size}-byte buffer)")


def launch_floor(queue: cl.CommandQueue, launches: int = 2000, rounds: int = 5) -> float | None:
    """The host's us per launch of one small kernel (cl/launch_floor.cl, 4096 items, its
    arguments set once) through `Launcher`, the median of `rounds` runs of `launches` after a
    warm-up: what the engine's own launches cannot go below on this device (the issue's
    "launch floor", measured beside the model it is compared with). None where the library
    cannot be loaded."""
    own = Launcher.for_queue(queue)
    if own is None:
        return None
    ctx, n = queue.context, 4096
    k = cl.Kernel(cl.Program(ctx, load_source("launch_floor")).build(), "floor_add")
    mf = cl.mem_flags
    # (held here: a kernel's arguments do not keep their buffers alive)
    bufs = [cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.array([n, 0, 0, 0], np.int32))] + \
        [cl.Buffer(ctx, mf.READ_WRITE, n * 4) for _ in range(3)]
    k.set_args(*bufs)
    batch = [(k, (n,), (64,))] * launches
    own.launch_all(batch[:200])
    queue.finish()
    per = []
    for _ in range(rounds):
        t = time.perf_counter()
        own.launch_all(batch)
        per.append((time.perf_counter() - t) * 1e6 / launches)
        queue.finish()
    return statistics.median(per)
