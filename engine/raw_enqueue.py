"""Kernel launches through the OpenCL C API itself (ctypes), for the one loop that enqueues
every kernel of an inference: pyopencl's `enqueue_nd_range_kernel` makes an Event object per
launch (a Python object, a retain and a release) that nobody reads there. On an H200
(NVIDIA OpenCL 3.0) a compiled GPT-2-small decode step's 62 kernels took 9.2-9.7 us each
through pyopencl and 7.9-8.9 us through this (.device probe, the same kernels and queue).

Everything else stays pyopencl's: the kernels, their arguments, buffers, queues, profiling
(a profiling queue keeps pyopencl's call: its events are read). The library is the one
pyopencl's extension loaded (the same ICD loader instance and platforms); when it cannot be
found, or DYNCLI_PYOPENCL_ENQUEUE is set, launches go through pyopencl.
"""
from __future__ import annotations

import ctypes
import os

import pyopencl as cl

_SIZES_KEPT = 4096      # distinct work sizes remembered as size_t arrays


def _loaded_opencl() -> str | None:
    """Path of the libOpenCL this process loaded for pyopencl (Linux: /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "libOpenCL" in os.path.basename(path):
                    return path
    except OSError:
        pass
    return None


def _enqueue_fn():
    if os.environ.get("DYNCLI_PYOPENCL_ENQUEUE"):
        return None
    path = _loaded_opencl()
    if path is None:
        return None
    try:
        fn = ctypes.CDLL(path).clEnqueueNDRangeKernel
    except (OSError, AttributeError):
        return None
    p, u = ctypes.c_void_p, ctypes.c_uint
    fn.argtypes = [p, p, u, p, p, p, u, p, p]
    fn.restype = ctypes.c_int
    return fn


class RawEnqueue:
    """`launch(launches)`: (kernel, gws, lws) in order on `cl_queue`, no events."""

    def __init__(self, fn, cl_queue: cl.CommandQueue):
        self.fn = fn
        self.queue = cl_queue            # (held: the handle below lives as long as it does)
        self.handle = ctypes.c_void_p(cl_queue.int_ptr)
        self.sizes: dict = {}            # work sizes tuple -> size_t array

    def _array(self, dims: tuple):
        a = self.sizes.get(dims)
        if a is None:
            if len(self.sizes) >= _SIZES_KEPT:
                self.sizes.clear()
            a = self.sizes[dims] = (ctypes.c_size_t * len(dims))(*dims)
        return a

    def launch(self, launches) -> None:
        fn, q, sizes, array = self.fn, self.handle, self.sizes, self._array
        for k, g, l in launches:
            gs = sizes.get(g) or array(g)
            ls = None if l is None else (sizes.get(l) or array(l))
            err = fn(q, k.int_ptr, len(g), None, gs, ls, 0, None, None)
            if err:
                raise RuntimeError(f"clEnqueueNDRangeKernel failed: {_status_name(err)} "
                                   f"(kernel {k.function_name}, global {g}, local {l})")


def _status_name(code: int) -> str:
    names = {v: k for k, v in vars(cl.status_code).items() if isinstance(v, int)}
    return names.get(code, str(code))


def raw_enqueue(cl_queue: cl.CommandQueue) -> RawEnqueue | None:
    """A RawEnqueue on `cl_queue`, or None where launches stay pyopencl's."""
    fn = _enqueue_fn()
    return None if fn is None else RawEnqueue(fn, cl_queue)
