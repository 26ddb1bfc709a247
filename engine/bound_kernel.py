"""A kernel of a node's current impl with its bound arguments, its shape_info slot and its work
sizes (the plugin's update_dispatch_data computes them per execution)."""
from __future__ import annotations

from operator import attrgetter

import pyopencl as cl

from engine.kernels import KernelCall, round_up


def work_sizes(call: KernelCall, cpu: bool = False) -> tuple:
    """Global/local sizes for this execution. 1-D kernels get a fixed work-group of 64 so a new
    global size never changes the local size: PoCL specialises a kernel per local size, and
    GPUs want a fixed group anyway; kernels bounds-check. Kernels of more dims that name no
    local size get one work-item per group on a CPU device (the driver would pick a local size
    from the global size: on PoCL with empty caches each new shape then cost 520-650 ms of
    specialising the README encoder's kernels, 4-8 ms with a fixed one; warm, the MiniLM-width
    BERT ran 29-30 ms at length 32 against 38, 87-88 at 128 against 90-94), and the driver's
    choice on a GPU."""
    lws = call.lws or ((64,) if len(call.gws) == 1 else (1,) * len(call.gws) if cpu else None)
    gws = tuple(round_up(g, l) for g, l in zip(call.gws, lws)) if lws else call.gws
    return gws, lws


class BoundKernel:
    __slots__ = ("call", "kernel", "impl", "info", "slot", "arg_ids", "offsets", "gws", "lws",
                 "tensors", "cpu")
    # what the flow reads back from its previous execution (a plan replay puts it back);
    # `info` and `arg_ids` describe what the device holds, kept true by replays themselves
    STATE = ("call", "gws", "lws", "offsets", "tensors")

    def __init__(self, call: KernelCall, impl, cpu: bool = False):
        self.call, self.impl, self.cpu = call, impl, cpu
        self.kernel = cl.Kernel(impl.program, call.kernel)  # per node: arguments stay bound
        self.info = None
        self.slot = None               # its shape_info block in the queue's arena
        self.tensors = None            # the tensors bound to its arguments (after shape_info)
        self.arg_ids = None
        self.offsets = None
        self.gws, self.lws = work_sizes(call, cpu)

    def retarget(self, call: KernelCall) -> None:
        """The same kernel object for a new call (new shapes): new work sizes."""
        self.call = call
        self.gws, self.lws = work_sizes(call, self.cpu)

    def __del__(self):
        # nothing refers to this kernel any more (a plan that launches it holds it): its
        # shape_info slot can serve another
        if self.slot is not None:
            self.slot.release()

    def snapshot(self) -> tuple:
        return _STATE_OF(self)          # (one C call)

    def restore(self, state: tuple) -> None:
        # STATE's fields in its order, unpacked at once (a growth puts back fifty of these)
        self.call, self.gws, self.lws, self.offsets, self.tensors = state


_STATE_OF = attrgetter(*BoundKernel.STATE)
# a tensor's offset: mapped over a kernel's `tensors`, what its shape_info block must say
# (`offsets`: what it says)
offset_of = attrgetter("offset")
