"""The device queue of one network: kernels the flow decided to run wait here behind one write
of the shape_info arena, reads and copies go through here, and every launch passes one
observer (the fast path's door, engine/fast_path)."""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from engine.accounting import mark, since
from engine.launcher import Launcher
from engine.layout import np_dtype
from engine.memory import Tensor
from engine.shape_info_arena import ShapeInfoArena


class Observer:
    """What the runtime services report as they act (nothing, by default). The fast path
    subclasses it to record an inference as a plan."""

    def launched(self, bound, kernel, gws, lws) -> None:
        pass

    def predicted(self, tensor, shape, bits) -> None:
        pass

    def touched(self, cache, key) -> None:
        """A cache hit (the impl cache, a node's weights cache): `cache.get(key)` again repeats it."""


class DeviceQueue:
    # On a GPU, kernels wait for at most this many others before a flush sends them (with one
    # arena write): the device starts on the first ones while the flow decides the rest (one
    # flush per inference left an H100 idle through the whole flow of a decode step). A CPU
    # device runs them on the cores the flow needs: one flush at the end there.
    FLUSH_EVERY = {"gpu": 32, "cpu": 1 << 30}

    def __init__(self, ctx: cl.Context, device: cl.Device, device_type: str, profile: bool = False,
                 side_writes: bool | None = None):
        self.ctx = ctx
        self.cl_queue = cl.CommandQueue(
            ctx, properties=cl.command_queue_properties.PROFILING_ENABLE if profile else 0)
        # On GPUs, a write made while kernels wait on the queue goes through a queue of its
        # own, and the kernels after it wait for it (a barrier): NVIDIA's OpenCL returns from a
        # write on a busy queue only once the queue has drained (H200: 530-545 us behind 0.6 ms
        # of kernels, pinned memory alike; scripts/probe_driver.py), so the host
        # stopped launching until the device ran dry. `side_writes` forces it either way.
        # (That probe wrote through pyopencl, whose released event waits for the copy: how much
        # of the wait is the driver's is to be measured again with Launcher.write.)
        side = device_type == "gpu" if side_writes is None else side_writes
        self.side = cl.CommandQueue(ctx) if side else None
        self.busy = False              # kernels or copies enqueued since the last finish
        self.in_order = 0              # > 0: every write waits its turn (control flow bodies)
        self.profile = profile
        # launches with no Event object (engine/launcher.py); a profiling queue reads events
        self.launcher = None if profile else Launcher.for_queue(self.cl_queue)
        # every kernel's shape_info block, written once per flush (engine/shape_info_arena.py)
        self.arena = ShapeInfoArena(ctx, device)
        self.args_version = 0          # bumped whenever a bound kernel's arguments are set
        self.launches: list = []
        self.flush_every = self.FLUSH_EVERY[device_type]
        self.observer = Observer()
        self.events: list = []         # with profile=True: this inference's kernel events
        self.blocked_s = 0.0           # this inference's time blocked on the device (reads, finish)
        self.enqueue_s = 0.0           # ... spent enqueueing kernels, shape_info and uploads
        self._keep: list = []
        # a small buffer the kernels write and the end of every inference reads with the
        # outputs (engine/index_flags.py: indices out of range); None: nothing to read
        self.status = None

    def begin_inference(self) -> None:
        self.blocked_s, self.enqueue_s, self.events = 0.0, 0.0, []
        self.arena.epoch += 1
        if self.status is not None:
            self.status.begin(self.cl_queue)

    def launch(self, kernel: cl.Kernel, gws: tuple, lws: tuple | None, bound=None) -> None:
        """A kernel the flow decided to run: enqueued at the next flush. `bound`: the node's
        BoundKernel it belongs to (its arguments and shape_info, for the observer)."""
        self.launches.append((kernel, gws, lws))
        self.observer.launched(bound, kernel, gws, lws)
        if len(self.launches) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Write the shape_info arena's dirty spans, then enqueue the waiting kernels. Called
        before any other command goes on the queue (copies, reads), so the order on the
        in-order queue is the order the flow decided."""
        self.arena.flush(self.write)      # its writes count their own time (write)
        if self.launches:
            self.enqueue(self.launches)
            self.launches = []

    def enqueue(self, launches) -> None:
        """(kernel, gws, lws) in order: the one enqueue loop of the flow and of plan replays."""
        enqueue, q = cl.enqueue_nd_range_kernel, self.cl_queue
        self.busy = True
        t0 = mark()
        if self.profile:
            self.events += [enqueue(q, k, g, l) for k, g, l in launches]
        elif self.launcher is not None:
            self.launcher.launch_all(launches)
        else:
            for k, g, l in launches:
                enqueue(q, k, g, l)
        self.enqueue_s += since(t0)

    def write(self, buf: cl.Buffer, arr: np.ndarray, offset: int = 0, copy: bool = False,
              ahead: bool = False) -> None:
        """A non-blocking host-to-device copy into `buf` at byte `offset` (no flush: callers
        write buffers no waiting kernel reads, such as inputs, host values and the shape_info
        arena), from `arr` (a copy of it when `copy`: the caller writes it again), kept alive
        until the inference ends. `ahead`: no command waiting on the queue reads what it
        changes (the arena says so of its spans), so while kernels wait it goes on the side
        queue, the queue's next commands behind a barrier on it."""
        t0 = mark()
        arr = np.require(arr, requirements="C")
        if copy:
            arr = arr.copy()
        if ahead and self.side is not None and self.busy and not self.in_order:
            done = cl.enqueue_copy(self.side, buf, arr, dst_offset=offset, is_blocking=False)
            cl.enqueue_barrier(self.cl_queue, wait_for=[done])
        elif self.launcher is not None:     # (no Event object: nothing waits on it)
            self.launcher.write(buf, arr, offset)
        else:
            cl.enqueue_copy(self.cl_queue, buf, arr, dst_offset=offset, is_blocking=False)
        self.keep(arr)
        self.enqueue_s += since(t0)

    def copy(self, dst: cl.Buffer, src: cl.Buffer, nbytes: int, src_offset: int) -> None:
        """A device-to-device copy, in order after every kernel decided so far."""
        self.flush()
        self.busy = True
        cl.enqueue_copy(self.cl_queue, dst, src, byte_count=nbytes, src_offset=src_offset, dst_offset=0)

    def read_to_host(self, t: Tensor) -> np.ndarray:
        l = t.layout
        arr = np.empty(l.phys, dtype=np_dtype(l.dtype))
        if l.count:
            self.flush()
            t0 = mark()
            cl.enqueue_copy(self.cl_queue, arr, t.buf, src_offset=t.offset * l.itemsize, is_blocking=True)
            self.blocked_s += since(t0)
        if l.pad:
            arr = np.ascontiguousarray(arr[tuple(slice(0, d) for d in l.shape)])
        t.host = arr
        return arr

    def keep(self, obj) -> None:
        """Host arrays of non-blocking copies must outlive the copy: kept until the inference ends."""
        self._keep.append(obj)

    def read_status(self) -> None:
        """After the inference's last kernel (the waiting ones are flushed first): the status
        read goes before the outputs' blocking reads, so that their wait is its wait too (a read
        of its own after them cost the H200 a second round trip, 40-50 us a decode step)."""
        if self.status is not None and self.status.unread:
            self.flush()
            # a wait where the driver copies to pageable memory before returning (NVIDIA's
            # OpenCL does: 0.27-0.30 ms of a same-length BERT inference on an H200)
            t0 = mark()
            self.status.read(self.cl_queue)
            self.blocked_s += since(t0)

    def finish(self) -> None:
        """Wait for the inference's commands; the host arrays kept for them can go. (The
        status is read here only when read_status was not called: an inference with no
        outputs to read.)"""
        self.read_status()
        t0 = mark()
        self.cl_queue.finish()
        self.busy = False
        self.blocked_s += since(t0)
        self._keep.clear()

    def device_ms(self) -> float:
        """Summed kernel time of the last inference (profile=True: OpenCL profiling events)."""
        return sum(e.profile.end - e.profile.start for e in self.events) * 1e-6
