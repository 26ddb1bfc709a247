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
    arena.flush(q, kept.append)
    assert arena.writes == 1 and len(kept) == 1          # both slots: one dirty span, one write
    assert list(_read(q, a)[:5]) == [0, 1, 2, 3, 4] and list(_read(q, b)[:3]) == [7, 8, 9]
    arena.flush(q, kept.append)
    assert arena.writes == 1                             # nothing dirty: nothing written
    b.write(np.array([1, 2, 3], np.int32))
    arena.flush(q, kept.append)
    assert arena.writes == 2 and list(_read(q, b)[:3]) == [1, 2, 3] and list(_read(q, a)[:5]) == [0, 1, 2, 3, 4]


def test_a_full_chunk_starts_another(device):
    ctx = cl.Context([device])
    arena = ShapeInfoArena(ctx, device)
    big = arena.slot(CHUNK_BYTES // 4 - 8)
    other = arena.slot(64)
    assert len(arena.chunks) == 2 and other.chunk is not big.chunk and other.at == 0
