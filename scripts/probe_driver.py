#!/usr/bin/env python3
"""Driver facts the runtime's design leans on, measured on the OpenCL device at hand:

    python scripts/probe_driver.py

1. Does a non-blocking write to a busy in-order queue return at once? (NVIDIA's OpenCL: no,
   it returns when the queue has drained, pinned host memory alike; a write on a second queue
   with the first queue's next commands behind a barrier does: engine/device_queue.py.)
2. What does a freshly built program cost at its first launch: creating the kernel object,
   the first enqueue, and a second kernel object of the same program?
3. Do program builds on another thread (the static builds of async compilation) stall this
   thread's enqueues?
H200 (driver 580.159), session 9: busy-queue write 530-545 us pageable, 15-21 us on a side
queue with a barrier; a new program's kernel object 1.2 ms, its first enqueue 60 us (13 after).
Session 10 (3.): three builds of 3.4-9.0 s on a thread; the enqueues meanwhile kept their median
(6.3-7.8 us against 6.5-6.8 alone), but one of them waited 4.0 s in one run and 10 ms in
another: a build in flight can hold an inference's launches for a long time.
4. What does a new buffer cost: clCreateBuffer, the first launch of a kernel that uses it, a
   later launch, its release? (What a growth pays beyond its decisions.)
H200 (driver 580.159), session 19: created in 1.4-3.6 us, but its first launch took 26-65 us
against 9-11 for the next ones (the memory is placed at first use), its release 7-44 us.
   With the memory made resident first (clEnqueueMigrateMemObjects, what a growth could do
   before its launches), do the first launches cost what later ones do, and what does the
   migration cost? H200, session 28, this probe (idle device, enqueue time): 0.29 MB buffers
   41.6 us at their first launch against 7.4 after, or 8.2 to migrate and 8.7 to launch; 1.77
   MB 57.0 against 10.8, or 35.0 and 10.8 (new buffers here may take memory the probe just
   freed). Behind a busy kernel (`.device/resid.py`, 12 buffers of 370 KB among 66 launches)
   the migration cost 53-160 us, as much as it took off the launches, and in the BERT's growth
   itself as much again: the cost is per new buffer, moved, not removed (performance.md).
"""
import threading
import time

import numpy as np
import pyopencl as cl


def busy_writes(ctx, q):
    prg = cl.Program(ctx, """__kernel void spin(__global float* x, int n){ float a = x[get_global_id(0)];
    for (int i = 0; i < n; i++) a = a * 0.999f + 0.001f; x[get_global_id(0)] = a; }""").build()
    x = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 1024 * 128)
    small = cl.Buffer(ctx, cl.mem_flags.READ_ONLY, 256)
    k = prg.spin
    # about 0.1 ms of spinning a kernel on a GPU; a CPU device gets far fewer iterations
    k.set_args(x, np.int32(20000 if ctx.devices[0].type & cl.device_type.GPU else 50))
    side = cl.CommandQueue(ctx)
    host = np.zeros(64, np.int32)
    for label in ("idle", "busy"):
        for how in ("one queue", "side queue + barrier"):
            ts = []
            for rep in range(5):
                if label == "busy":
                    for _ in range(5):
                        cl.enqueue_nd_range_kernel(q, k, (1024 * 128,), (128,))
                host[:] = rep * 7 + 1
                t0 = time.perf_counter()
                if how == "one queue":
                    cl.enqueue_copy(q, small, host, is_blocking=False)
                else:
                    done = cl.enqueue_copy(side, small, host, is_blocking=False)
                    cl.enqueue_barrier(q, wait_for=[done])
                ts.append((time.perf_counter() - t0) * 1e6)
                q.finish()
                back = np.empty(64, np.int32)
                cl.enqueue_copy(q, back, small, is_blocking=True)
                assert (back == rep * 7 + 1).all(), f"{how}: the device holds {back[:4]}"
            print(f"{label} queue, {how:22s} write: " + " ".join(f"{t:.1f}" for t in ts) + " us")


def first_launches(ctx, q):
    x = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 << 20)
    for rep in range(3):
        src = (f"__kernel void k{rep}(__global float* x, int n) {{ int i = get_global_id(0); "
               f"if (i < n) x[i] = x[i] * {rep + 2}.0f + 1.0f; }}")
        t0 = time.perf_counter()
        prg = cl.Program(ctx, src).build()
        t1 = time.perf_counter()
        k = cl.Kernel(prg, f"k{rep}")
        k.set_args(x, np.int32(1 << 20))
        t2 = time.perf_counter()
        cl.enqueue_nd_range_kernel(q, k, (1 << 20,), (256,))
        t3 = time.perf_counter()
        q.finish()
        t4 = time.perf_counter()
        cl.enqueue_nd_range_kernel(q, k, (1 << 20,), (256,))
        t5 = time.perf_counter()
        q.finish()
        print(f"build {1e3 * (t1 - t0):.1f} ms, kernel object {1e6 * (t2 - t1):.0f} us, first enqueue "
              f"{1e6 * (t3 - t2):.0f} us, second {1e6 * (t5 - t4):.0f} us")


def builds_beside(ctx, q, builds=3):
    x = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 << 20)
    k = cl.Program(ctx, "__kernel void k(__global float* x, int n) { int i = get_global_id(0); "
                        "if (i < n) x[i] += 1.0f; }").build().k
    k.set_args(x, np.int32(1 << 20))
    # a program that takes its compiler seconds (no cache hit: each build's source differs)
    body = "\n".join(f"__kernel void f{j}(__global float* x) {{ float a = x[get_global_id(0)]; "
                     f"for (int t = 0; t < {j % 7 + 3}; ++t) a = sin(a) * cos(a + {j}.0f) + exp(a * 0.1f); "
                     f"x[get_global_id(0)] = a; }}" for j in range(60))

    def enqueues(n):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            cl.enqueue_nd_range_kernel(q, k, (1 << 20,), (256,))
            ts.append(time.perf_counter() - t0)
        q.finish()
        return ts
    enqueues(50)
    alone = enqueues(400)
    took = []

    def build(r):
        t0 = time.perf_counter()
        cl.Program(ctx, f"{body}\n// {r} {time.time()}").build()
        took.append(time.perf_counter() - t0)
    th = threading.Thread(target=lambda: [build(r) for r in range(builds)])
    th.start()
    during = []
    while th.is_alive():
        during += enqueues(20)
    print(f"builds on a thread {[round(t * 1e3) for t in took]} ms; enqueue alone median "
          f"{np.median(alone) * 1e6:.1f} us (max {max(alone) * 1e6:.0f}), during the builds median "
          f"{np.median(during) * 1e6:.1f} us, max {max(during) * 1e3:.1f} ms")


def new_buffers(ctx, q, n=10):
    prg = cl.Program(ctx, "__kernel void touch(__global float* a) { a[get_global_id(0)] = 1.0f; }").build()
    k = prg.touch

    def launches(bufs) -> float:
        """One launch on each of `bufs`: the enqueues' time, the queue drained after."""
        t = time.perf_counter()
        for b in bufs:
            k.set_args(b)
            cl.enqueue_nd_range_kernel(q, k, (256,), (256,))
        took = time.perf_counter() - t
        q.finish()
        return took

    for nbytes in (294912, 1769472):     # a BERT activation at 192 tokens, a 12-head score block
        t0 = time.perf_counter()
        bufs = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, nbytes) for _ in range(n)]
        t1 = time.perf_counter()
        laps = [launches(bufs) for _ in range(2)]
        t = time.perf_counter()
        del bufs
        freed = time.perf_counter() - t
        # the same with the memory made resident first (one call for all of them)
        bufs = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, nbytes) for _ in range(n)]
        t = time.perf_counter()
        cl.enqueue_migrate_mem_objects(q, bufs, flags=cl.mem_migration_flags.CONTENT_UNDEFINED)
        q.finish()
        migrated = time.perf_counter() - t
        after = launches(bufs)
        print(f"{n} new buffers of {nbytes / 1e6:.2f} MB: created in {(t1 - t0) / n * 1e6:.1f} us each; "
              f"first launch using one {laps[0] / n * 1e6:.1f} us, the next {laps[1] / n * 1e6:.1f} us; "
              f"released in {freed / n * 1e6:.1f} us each; migrated first: {migrated / n * 1e6:.1f} us "
              f"each, then its first launch {after / n * 1e6:.1f} us")


def main():
    ctx = cl.create_some_context(interactive=False)
    q = cl.CommandQueue(ctx)
    print(ctx.devices[0].name.strip(), "/", ctx.devices[0].driver_version)
    busy_writes(ctx, q)
    first_launches(ctx, q)
    builds_beside(ctx, q)
    new_buffers(ctx, q)


if __name__ == "__main__":
    main()
