"""engine/shape_info_arena.py: every kernel's shape_info block in shared chunks, one device write
per dirty span at a flush."""
import numpy as np
import pyopencl as cl

from engine.shape_info_arena import CHUNK_BYTES, ShapeInfoArena


def _read(queue, slot):
    out = np.empty(slot.nbytes // 4, np.int32)
    cl.enqueue_copy(queue, out, slot.buf, is_blocking=True)
    return out


def test_slots_are_aligned_and_written_at_the_flush(device):
    ctx = cl.Context([device])
    q = cl.CommandQueue(ctx)
    arena = ShapeInfoArena(ctx, device)
    a, b = arena.slot(5), arena.slot(3)
    assert a.at % arena.align == 0 and b.at % arena.align == 0 and b.at >= a.at + 20
    a.write(np.arange(5, dtype=np.int32))
    b.write(np.array([7, 8, 9], np.int32))
    kept = []

    def write(buf, span, offset, copy, ahead):     # DeviceQueue.write on one queue
        kept.append(span.copy())
        cl.enqueue_copy(q, buf, kept[-1], dst_offset=offset, is_blocking=False)
    arena.flush(write)
    assert arena.writes == 1 and len(kept) == 1          # both slots: one dirty span, one write
    assert list(_read(q, a)[:5]) == [0, 1, 2, 3, 4] and list(_read(q, b)[:3]) == [7, 8, 9]
    arena.flush(write)
    assert arena.writes == 1                             # nothing dirty: nothing written
    b.write(np.array([1, 2, 3], np.int32))
    arena.flush(write)
    assert arena.writes == 2 and list(_read(q, b)[:3]) == [1, 2, 3] and list(_read(q, a)[:5]) == [0, 1, 2, 3, 4]


def test_a_full_chunk_starts_another(device):
    ctx = cl.Context([device])
    arena = ShapeInfoArena(ctx, device)
    big = arena.slot(CHUNK_BYTES // 4 - 8)
    other = arena.slot(64)
    assert len(arena.chunks) == 2 and other.chunk is not big.chunk and other.at == 0


def test_a_released_slot_serves_the_next_of_its_size(device):
    ctx = cl.Context([device])
    arena = ShapeInfoArena(ctx, device)
    a = arena.slot(20)
    used = arena.chunks[0].used
    a.release()
    assert arena.slot(20) is a and arena.chunks[0].used == used
    assert arena.slot(20) is not a and arena.chunks[0].used > used


def test_nodes_that_keep_taking_new_kernels_keep_the_arena_bounded(device, static_gemms, monkeypatch):
    """A node that sees more impls than the kernel objects it keeps makes a new kernel each time
    one comes back; the slot of the one it let go serves the new one (bump allocation alone
    grew the arena by every such switch of a long run)."""
    from engine.primitive_inst import PrimitiveInst
    from tests.test_impls import mm_model, run_seq
    monkeypatch.setattr(PrimitiveInst, "BOUND_KEPT", 1)
    net, _ = run_seq(mm_model(), [8, 16, 24] * 2, async_compile=False, fast_path=False)
    arena = net.queue.arena
    used = sum(c.used for c in arena.chunks)
    rng = np.random.default_rng(2)
    for s in [8, 16, 24] * 6:
        net.infer({"x": rng.standard_normal((1, s, 32)).astype(np.float32)})
    assert net.counters["update_impl.cache_hit"] > 0    # the static impls came back
    assert sum(c.used for c in arena.chunks) == used
