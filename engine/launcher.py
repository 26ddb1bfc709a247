"""Kernel launches without pyopencl's per-launch Event: clEnqueueNDRangeKernel called through
ctypes with no event, from the same OpenCL library pyopencl is linked against.

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

import pyopencl as cl


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
    loaded (pyopencl's launch then). The work sizes go through two arrays of three reused for
    every launch (the driver copies them): a new signature's sizes cost no allocation."""

    def __init__(self, lib: ctypes.CDLL, queue: cl.CommandQueue):
        self._fn = lib.clEnqueueNDRangeKernel
        self._fn.restype = ctypes.c_int
        self._queue = ctypes.c_void_p(queue.int_ptr)
        self._queue_ref = queue           # the handle lives as long as this
        self._g = (ctypes.c_size_t * 3)()
        self._l = (ctypes.c_size_t * 3)()

    @classmethod
    def for_queue(cls, queue: cl.CommandQueue) -> "Launcher | None":
        lib = _library()
        return cls(lib, queue) if lib is not None else None

    def launch_all(self, launches) -> None:
        """Each (kernel, gws, lws) in order."""
        fn, q, ga, la = self._fn, self._queue, self._g, self._l
        for k, g, l in launches:
            n = len(g)
            ga[:n] = g
            if l is not None:
                la[:n] = l
            err = fn(q, ctypes.c_void_p(k.int_ptr), n, None, ga, None if l is None else la, 0, None, None)
            if err:
                raise cl.LogicError(f"clEnqueueNDRangeKernel failed for kernel {k.function_name}: "
                                    f"OpenCL error {err} (work sizes {tuple(g)}, {l and tuple(l)})")
