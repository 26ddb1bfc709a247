"""Pinned staging (engine/staging.py): writes made while kernels run go through a ring of
pinned host memory on GPUs. The ring's copies reach the device intact, are never overwritten
before the queue finishes, and a network that stages every write (forced here on the CPU
device) gives the outputs of one that does not, over a decode loop and a replayed sequence."""
import numpy as np
import pyopencl as cl

from engine import Network, build_program
from engine.device_queue import DeviceQueue
from engine.staging import PinnedStaging
from tests.models import encoder_block, kv_decoder_step
from tests.test_partial_replay import KV_FEEDBACK, _decode_steps


def test_staged_writes_arrive_and_the_ring_is_reused_after_finish(device):
    ctx = cl.Context([device])
    q = DeviceQueue(ctx, device, "cpu", pinned=True)
    bufs = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 400) for _ in range(3)]
    values = [np.arange(100, dtype=np.int32) * (k + 1) for k in range(3)]
    for b, v in zip(bufs, values):
        q.write(b, v)
    assert q.staging.used >= 3 * 400           # each write has its own bytes in the ring
    values[0][:] = -1                          # the caller's array may change at once
    q.finish()
    assert q.staging.used == 0
    for k, b in enumerate(bufs):
        out = np.empty(100, np.int32)
        cl.enqueue_copy(q.cl_queue, out, b, is_blocking=True)
        assert np.array_equal(out, np.arange(100, dtype=np.int32) * (k + 1))


def test_a_write_that_does_not_fit_goes_from_its_own_array(device):
    ctx = cl.Context([device])
    q = DeviceQueue(ctx, device, "cpu", pinned=False)
    q.staging = PinnedStaging(ctx, q.cl_queue, nbytes=256)
    b = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4000)
    v = np.arange(1000, dtype=np.int32)
    q.write(b, v)
    assert q.staging.staged == 0 and len(q._keep) == 1
    q.finish()
    out = np.empty(1000, np.int32)
    cl.enqueue_copy(q.cl_queue, out, b, is_blocking=True)
    assert np.array_equal(out, v)


def _pinned(net):
    net.queue.staging = PinnedStaging(net.ctx, net.queue.cl_queue, nbytes=4096)
    return net


def test_a_network_staging_its_writes_gives_the_same_outputs(device):
    """A small ring (4 KiB): some writes staged, some not, the arena's spans among them."""
    prog = build_program(kv_decoder_step())
    steps = _decode_steps([3, 1, 1, 2, 1, 1, 1])
    back = {v: k for k, v in KV_FEEDBACK.items()}
    nets = [Network(prog, device, feedback=KV_FEEDBACK), _pinned(Network(prog, device, feedback=KV_FEEDBACK))]
    for feeds, fed in steps:
        a, b = (n.infer(feeds, fed_back=back if fed else None) for n in nets)
        for name in a:
            assert np.array_equal(a[name], b[name]), name
    assert nets[1].queue.staging.staged > 0
    prog = build_program(encoder_block(vocab=1000))
    rng = np.random.default_rng(0)
    nets = [Network(prog, device), _pinned(Network(prog, device))]
    for s in (8, 16, 8, 16, 24, 16):
        feeds = {"input_ids": rng.integers(0, 1000, (2, s)).astype(np.int64),
                 "attention_mask": np.ones((2, s), np.int64)}
        a, b = (n.infer(feeds) for n in nets)
        for name in a:
            assert np.array_equal(a[name], b[name]), name
    assert nets[1].queue.staging.staged > 0
