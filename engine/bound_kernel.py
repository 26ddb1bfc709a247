"""A kernel of a node's current impl with its bound arguments, its shape_info slot and its work
sizes (the plugin's update_dispatch_data computes them per execution)."""
from __future__ import annotations

import pyopencl as cl

from engine.kernels import KernelCall, round_up


def work_sizes(call: KernelCall) -> tuple:
    """Global/local sizes for this execution. 1-D kernels get a fixed work-group of 64 so a new
    global size never changes the local size: PoCL specialises a kernel per local size, and
    GPUs want a fixed group anyway; kernels bounds-check."""
    lws = call.lws or ((64,) if len(call.gws) == 1 else None)
    gws = tuple(round_up(g, l) for g, l in zip(call.gws, lws)) if lws else call.gws
    return gws, lws


class BoundKernel:
    __slots__ = ("call", "kernel", "impl", "info", "slot", "arg_ids", "offsets", "gws", "lws",
                 "tensors")
    # what the flow reads back from its previous execution (a plan replay puts it back);
    # `info` and `arg_ids` describe what the device holds, kept true by replays themselves
    STATE = ("call", "gws", "lws", "offsets", "tensors")

    def __init__(self, call: KernelCall, impl):
        self.call, self.impl = call, impl
        self.kernel = cl.Kernel(impl.program, call.kernel)  # per node: arguments stay bound
        self.info = None
        self.slot = None               # its shape_info block in the queue's arena
        self.tensors = None            # the tensors bound to its arguments (after shape_info)
        self.arg_ids = None
        self.offsets = None
        self.gws, self.lws = work_sizes(call)

    def retarget(self, call: KernelCall) -> None:
        """The same kernel object for a new call (new shapes): new work sizes."""
        self.call = call
        self.gws, self.lws = work_sizes(call)

    def snapshot(self) -> tuple:
        return tuple(getattr(self, k) for k in self.STATE)

    def restore(self, state: tuple) -> None:
        for k, v in zip(self.STATE, state):
            setattr(self, k, v)
