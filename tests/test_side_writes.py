"""The side queue of shape_info writes (engine/device_queue.py): on GPUs an arena span goes to
the device ahead of the kernels waiting on the queue, the kernels after it behind a barrier,
where no waiting kernel reads what it changes (engine/shape_info_arena.py). Forced on the CPU
device here, with one launch a flush so that every span after the first goes ahead: the
outputs are those of a network writing in order, over a decode loop, an encoder sequence and
a Loop whose body's kernels run again in one inference (its writes go in order)."""
import numpy as np
import pyopencl as cl

from engine import Network, build_program, load_program
from engine.device_queue import DeviceQueue
from tests.models import encoder_block, kv_decoder_step
from tests.test_control_flow import SEQUENCES, _path
from tests.test_partial_replay import KV_FEEDBACK, _decode_steps


def _sided(net):
    q = net.queue
    q.side = cl.CommandQueue(net.ctx)
    q.flush_every = 1
    return net


def _same(prog, steps, device, **kw):
    back = {v: k for k, v in kw.get("feedback", {}).items()}
    nets = [Network(prog, device, **kw), _sided(Network(prog, device, **kw))]
    aheads = []
    orig = DeviceQueue.write

    def write(self, buf, arr, offset=0, copy=False, ahead=False):
        if self is nets[1].queue and ahead and self.busy and not self.in_order:
            aheads.append(1)
        return orig(self, buf, arr, offset, copy, ahead)
    DeviceQueue.write = write
    try:
        for feeds, fed in steps:
            a, b = (n.infer(feeds, fed_back=back if fed else None) for n in nets)
            for name in a:
                assert np.array_equal(a[name], b[name]), name
    finally:
        DeviceQueue.write = orig
    return len(aheads)


def test_spans_ahead_of_waiting_kernels_give_the_same_outputs(device):
    assert _same(build_program(kv_decoder_step()), _decode_steps([3, 1, 1, 2, 1, 1]), device,
                 feedback=KV_FEEDBACK) > 0
    rng = np.random.default_rng(0)
    steps = [({"input_ids": rng.integers(0, 1000, (b, s)).astype(np.int64),
               "attention_mask": np.ones((b, s), np.int64)}, False) for b, s in [(1, 8), (2, 16), (1, 24), (2, 8)]]
    assert _same(build_program(encoder_block(vocab=1000)), steps, device) > 0


def test_a_loops_writes_wait_their_turn(device):
    """A counted Loop and a Scan: their bodies' kernels run again in one inference, with new
    shape_info; those writes go in order, and the outputs are those of one queue."""
    for name in ("loop_counted", "scan_cumsum"):
        _same(load_program(_path(name)), [(f, False) for f in SEQUENCES[name]], device)
