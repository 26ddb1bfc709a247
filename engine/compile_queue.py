"""Background compilation of static impls (the GPU plugin's async_compilation.md).

A node that gets a new shape runs its dynamic impl at once and submits the static build here;
the worker builds it (pyopencl releases the GIL while the OpenCL compiler runs) and keeps the
program until the engine takes it at a later update_impl. Builds are deduplicated by key.
Kernel objects are created by the engine on the main thread, never here.
"""
from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref


class CompileQueue:
    # Finished builds nobody took (the node's shape moved on before it came back for them) are
    # kept at most this many (16), oldest dropped: a run whose shapes keep changing would otherwise
    # hold a compiled program per shape it ever saw (RSS grew ~20 MB per 1,000 inferences).
    MAX_DONE = 16

    def __init__(self, workers: int = 1, yield_to_inference: bool = False):
        self._q: queue.Queue = queue.Queue()
        # On a CPU device the builds take the cores the inference's kernels run on: there a
        # build starts only while no inference is in flight (`in_flight`), so it waits for
        # the gaps between inferences instead of stretching one (a repeated shape of a tiny
        # CNN took 1210 ms during its first run, against 3-12 ms once the builds were done).
        self.yield_to_inference = yield_to_inference
        self._idle = threading.Event()
        self._idle.set()
        self._cv = threading.Condition()
        self._pending: set = set()          # submitted, not finished
        self._done: dict = {}               # key -> (result | None, ms, error | None)
        self._stopped = False
        self._threads = [threading.Thread(target=self._work, name=f"dyncli-compile-{i}", daemon=True)
                         for i in range(max(1, workers))]
        for t in self._threads:
            t.start()
        self.submitted = 0
        # a build still running when the interpreter exits aborts it (C++ terminate in the
        # OpenCL compiler's thread): stop the workers first
        atexit.register(_close_ref, weakref.ref(self))

    def stop(self) -> None:
        """Drop the queued builds and let the workers end after the build in progress
        (without waiting for it)."""
        with self._cv:
            self._stopped = True
            self._pending.clear()
        self._idle.set()
        while True:
            try:
                self._q.get_nowait()
            except queue.Empty:
                break
        for _ in self._threads:
            self._q.put(None)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the workers after the build in progress (queued builds are dropped)."""
        self.stop()
        for t in self._threads:
            t.join(timeout)

    def submit(self, key, build) -> bool:
        """Queue `build()` (returns (program, ms)) under `key`; False when already queued or
        finished and not yet taken (dedup)."""
        with self._cv:
            if key in self._pending or key in self._done:
                return False
            self._pending.add(key)
            self.submitted += 1
        self._q.put((key, build))
        return True

    def in_flight(self, busy: bool) -> None:
        """An inference starts (True) or ends (False)."""
        if self.yield_to_inference:
            (self._idle.clear if busy else self._idle.set)()

    def take(self, key):
        """The finished build of `key` as (program, ms, error), removed from the queue; None
        while it is pending or was never submitted."""
        with self._cv:
            return self._done.pop(key, None)

    def pending(self, key) -> bool:
        with self._cv:
            return key in self._pending or key in self._done

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing is pending (tests use it between inferences for fixed traces)."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._pending, timeout)

    def _work(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            self._idle.wait()
            if self._stopped:          # dropped while it waited for the inference's end
                return
            self._build(*item)
            # nothing of the build is kept while the worker waits for the next: its callable
            # may hold the network, which must stay collectable (its finalizer stops the queue)
            del item

    def _build(self, key, build) -> None:
        t0 = time.perf_counter()
        try:
            prg, ms = build()
            res = (prg, ms, None)
        except Exception as e:  # noqa: BLE001 - reported by the engine at take()
            # without its traceback, whose frames hold the build's callable and the network
            res = (None, (time.perf_counter() - t0) * 1e3, e.with_traceback(None))
        with self._cv:
            self._pending.discard(key)
            self._done[key] = res
            while len(self._done) > self.MAX_DONE:
                self._done.pop(next(iter(self._done)))
            self._cv.notify_all()


def _close_ref(ref) -> None:
    q = ref()
    if q is not None:
        q.close()
