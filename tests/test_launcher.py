"""Kernel launches without pyopencl's events (engine/launcher.py): the same results as
pyopencl's launch, which stays the path where the OpenCL library cannot be loaded, and an
error that names the kernel where the driver refuses a launch."""
from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from engine import Network, build_program
from engine import launcher as launcher_mod
from tests.models import bert_encoder
from tests.test_shape_functions import BERT, _bert_steps

SRC = """__kernel void add1(__global const float* a, __global float* b)
{ int i = get_global_id(0); b[i] = a[i] + 1.0f; }"""


def test_a_network_computes_the_same_with_either_launch(device, monkeypatch):
    import onnxruntime as ort
    model = bert_encoder(**BERT)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    steps = _bert_steps([(1, 17), (2, 9), (1, 30)])
    outs = {}
    for raw in (True, False):
        if not raw:
            monkeypatch.setattr(launcher_mod, "_library", lambda: None)
        net = Network(build_program(model), device)
        assert (net.queue.launcher is not None) == raw
        outs[raw] = [net.infer(feeds)["last_hidden_state"].copy() for feeds, _ in steps]
    for (feeds, _), a, b in zip(steps, outs[True], outs[False]):
        assert np.array_equal(a, b)
        np.testing.assert_allclose(a, sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def test_a_launch_the_driver_refuses_names_its_kernel(device):
    ctx = cl.Context([device])
    q = cl.CommandQueue(ctx)
    k = cl.Kernel(cl.Program(ctx, SRC).build(), "add1")
    a = np.arange(64, dtype=np.float32)
    mf = cl.mem_flags
    src = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    dst = cl.Buffer(ctx, mf.WRITE_ONLY, a.nbytes)
    k.set_args(src, dst)
    launch = launcher_mod.Launcher.for_queue(q)
    launch.launch_all([(k, (64,), (16,)), (k, (64,), None)])
    out = np.empty_like(a)
    cl.enqueue_copy(q, out, dst)
    assert np.array_equal(out, a + 1)
    # a work-group larger than the device allows: refused by the driver
    big = 2 * device.max_work_group_size
    with pytest.raises(cl.LogicError, match="add1"):
        launch.launch_all([(k, (big,), (big,))])


def test_kept_handles_and_work_sizes_launch_what_they_name(device, monkeypatch):
    """The kernel handles and work-size arrays the launcher keeps: a size seen before, a size
    given as a list (not kept), and caches started over past their limits all launch the
    sizes asked for."""
    monkeypatch.setattr(launcher_mod.Launcher, "SIZES", 3)
    monkeypatch.setattr(launcher_mod.Launcher, "KERNELS", 1)
    ctx = cl.Context([device])
    q = cl.CommandQueue(ctx)
    prg = cl.Program(ctx, SRC).build()
    kernels = [cl.Kernel(prg, "add1") for _ in range(2)]
    a = np.arange(256, dtype=np.float32)
    mf = cl.mem_flags
    src = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    launch = launcher_mod.Launcher.for_queue(q)
    for n, k in [(64, 0), (128, 1), (64, 0), (192, 1), (256, 0), (32, 1), (128, 0)]:
        dst = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.zeros_like(a))
        kernels[k].set_args(src, dst)
        sizes = (n,) if n != 192 else [n]
        launch.launch_all([(kernels[k], sizes, (32,))])
        out = np.empty_like(a)
        cl.enqueue_copy(q, out, dst)
        assert np.array_equal(out[:n], a[:n] + 1) and not out[n:].any()
    assert len(launch._sizes) <= 3 and len(launch._ptrs) <= 1


def test_writes_without_events_land_where_asked(device):
    """Launcher.write: a non-blocking copy at a byte offset, in queue order with launches."""
    ctx = cl.Context([device])
    q = cl.CommandQueue(ctx)
    k = cl.Kernel(cl.Program(ctx, SRC).build(), "add1")
    mf = cl.mem_flags
    src = cl.Buffer(ctx, mf.READ_WRITE, 64 * 4)
    dst = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.zeros(64, np.float32))
    k.set_args(src, dst)
    launch = launcher_mod.Launcher.for_queue(q)
    lo, hi = np.arange(32, dtype=np.float32), np.arange(100, 132, dtype=np.float32)
    launch.write(src, lo, 0)
    launch.write(src, hi, 32 * 4)
    launch.write(src, np.empty(0, np.float32), 0)      # nothing to copy
    launch.launch_all([(k, (64,), None)])
    out = np.empty(64, np.float32)
    cl.enqueue_copy(q, out, dst)
    assert np.array_equal(out, np.concatenate([lo, hi]) + 1)
    with pytest.raises(cl.LogicError, match="clEnqueueWriteBuffer"):
        launch.write(src, np.zeros(65, np.float32), 0)     # past the buffer's end
    q.finish()


def test_sizes_met_once_launch_from_a_scratch_array_each_as_asked(device):
    """New work sizes in one batch of launches (a new length's): each launch fills the scratch
    array before its call, so every kernel runs the sizes it was given; sizes met a second
    time are kept, the others not."""
    ctx = cl.Context([device])
    q = cl.CommandQueue(ctx)
    prg = cl.Program(ctx, SRC).build()
    a = np.arange(256, dtype=np.float32)
    mf = cl.mem_flags
    src = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    launch = launcher_mod.Launcher.for_queue(q)
    for rnd in range(2):
        sizes = [(32 * (k + 1),) for k in range(6)]
        batch, dsts = [], []
        for n, in sizes:
            k = cl.Kernel(prg, "add1")
            dst = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.zeros_like(a))
            k.set_args(src, dst)
            batch.append((k, (n,), (32,)))
            dsts.append((dst, k))
        launch.launch_all(batch)
        for (n,), (dst, _) in zip(sizes, dsts):
            out = np.empty_like(a)
            cl.enqueue_copy(q, out, dst)
            assert np.array_equal(out[:n], a[:n] + 1) and not out[n:].any(), (rnd, n)
        # the local size (32,) came six times: kept from its second; the global ones only
        # once each in the first round, kept in the second
        kept = set(launch._sizes)
        assert (32,) in kept and (all(s in kept for s in sizes) if rnd else not any(s in kept for s in sizes[1:]))
