"""The memory pool: dead tensors' buffers handed to later nodes, checked against
onnxruntime over shape sequences that grow and shrink (a wrong hand-over corrupts a value)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Network, build_program
from engine.load_passes import tensor_lifetimes
from engine.memory_pool import END, MemoryPool
from tests.conftest import run_traced
from tests.models import encoder_block, small_cnn


def _encoder_seq(rng, shapes):
    return [{"x": rng.standard_normal((b, s, 64)).astype(np.float32),
             "mask": (rng.random((b, s)) > 0.2).astype(np.float32)} for b, s in shapes]


def test_lifetimes_follow_views_and_outputs(device):
    net = Network(build_program(encoder_block()), device, impls="dynamic")
    life = tensor_lifetimes(net.insts, net.program.inputs, net.program.outputs)
    steps = {t.name: s for s, i in enumerate(net.insts) for t in i.outputs}
    for s, inst in enumerate(net.insts):
        for t in inst.inputs:
            if t is not None and t.name in life and not inst.node.host:
                assert life[t.name][0] <= s <= life[t.name][1], (t.name, s, life[t.name])
    producer = {t.name: i for i in net.insts for t in i.outputs}
    for o in net.program.outputs:   # an output that is a view keeps its source alive
        while o not in life:
            o = producer[o].inputs[0].name
        assert life[o][1] == END
    assert all(life[n][0] == steps[n] for n in life if n in steps)


def test_pool_hands_dead_buffers_on_and_lowers_the_peak(device):
    rng = np.random.default_rng(0)
    shapes = [(2, 16), (2, 16), (1, 24), (3, 9), (2, 16)]
    seq = _encoder_seq(rng, shapes)
    net, trace = run_traced(encoder_block(), seq, device, 2e-4, 2e-5)
    off, trace_off = run_traced(encoder_block(), seq, device, 2e-4, 2e-5, memory_pool=False)
    pooled = [e for e in trace.events if e["kind"] == "realloc" and e["action"] == "from_pool"]
    assert pooled and not any(e["action"] == "from_pool" for e in trace_off.events
                              if e["kind"] == "realloc")
    for e in pooled:   # the plugin's rule: the request is more than half the pooled buffer
        assert e["bytes"] <= e["capacity"] < 2 * e["bytes"], e
    ends = {i: trace.of(i, "infer_end")[0]["counters"] for i in range(len(seq))}
    ends_off = {i: trace_off.of(i, "infer_end")[0]["counters"] for i in range(len(seq))}
    for i in ends:
        c, c_off = ends[i], ends_off[i]
        assert c["live_bytes_lower_bound"] == c_off["live_bytes_lower_bound"] > 0
        assert c_off["peak_bytes"] >= c["peak_bytes"] >= c["live_bytes_lower_bound"]
    assert ends[0]["peak_bytes"] < 0.8 * ends_off[0]["peak_bytes"], (ends[0], ends_off[0])
    # a repeated shape: every tensor keeps its (possibly shared) buffer
    assert not trace.of(1, "realloc", "alloc") and not trace.of(1, "realloc", "from_pool")
    assert net.buffers.used_bytes < off.buffers.used_bytes


def test_pool_on_a_cnn_with_changing_resolution(device):
    rng = np.random.default_rng(1)
    seq = [{"x": rng.standard_normal((n, 3, h, h)).astype(np.float32)}
           for n, h in [(1, 32), (2, 24), (1, 40), (1, 12), (2, 32)]]
    net, trace = run_traced(small_cnn(), seq, device, 2e-4, 2e-5)
    assert any(e["action"] == "from_pool" for e in trace.events if e["kind"] == "realloc")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(spans=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12), st.integers(0, 5000)),
                      max_size=30),
       unknown=st.lists(st.integers(0, 5000), max_size=3))
def test_the_live_lower_bound_is_the_peak_of_a_sweep(spans, unknown):
    """live_lower_bound (numpy) against a plain sweep of births and deaths, births of a step
    counted before its deaths; a tensor without a lifetime lives for the whole inference."""
    life = {f"t{k}": sorted(s[:2]) for k, s in enumerate(spans)}
    pool = MemoryPool(life, set(life))
    pool.begin_inference()
    for k, s in enumerate(spans):
        pool.note_live(f"t{k}", s[2])
    for k, n in enumerate(unknown):
        pool.note_live(f"u{k}", n)
    def peak(sizes):
        spans_all = [(*pool.lifetimes.get(name, (0, END)), n) for name, n in sizes.items()]
        return max([0] + [sum(n for a, b, n in spans_all if a <= step <= b)
                          for step in {a for a, _, _ in spans_all}])
    assert pool.live_lower_bound() == peak(pool.live())
    # the same tensors with new sizes (the sweep's order is kept), then a scratch tensor
    # (its lifetime is new: the order is made again)
    pool.begin_inference()
    for k, s in enumerate(spans):
        pool.note_live(f"t{k}", s[2] // 3 + k)
    for k, n in enumerate(unknown):
        pool.note_live(f"u{k}", n + 1)
    assert pool.live_lower_bound() == peak(pool.live())
    pool.add_scratch("scratch", 6)
    pool.note_live("scratch", 777)
    assert pool.live_lower_bound() == peak(pool.live())
    if spans:     # a live tensor's lifetime changed, the same names live
        pool.add_scratch("t0", 13)
        assert pool.live_lower_bound() == peak(pool.live())


def test_take_gives_the_smallest_dead_buffer_that_fits_the_first_made_of_a_size(device):
    """MemoryPool.take (found by size): among buffers whose holders are all dead before the
    new holder is written, the smallest at least the need and under twice it; of equal sizes,
    the one made first; a buffer with a live holder, or freed, is never handed on."""
    import pyopencl as cl
    ctx = cl.Context([device])
    life = {"a": [0, 1], "b": [0, 2], "c": [0, 1], "d": [0, 9], "e": [0, 1], "new": [5, 6], "big": [7, 8],
            "mid": [3, 4]}
    pool = MemoryPool(life, set(life))
    bufs = {h: pool.alloc(ctx, n, h) for h, n in (("a", 1000), ("b", 600), ("c", 600), ("d", 500), ("e", 2000))}
    assert pool.take("new", 500)[0] is bufs["b"]         # d is live; b and c alike: b first made
    pool.release(bufs["b"], "b")
    pool.release(bufs["b"], "new")                          # b freed
    assert pool.take("new", 550)[0] is bufs["c"]
    assert pool.take("big", 1100) == (bufs["e"], 2000)      # 1000 is under the need
    assert pool.take("big", 900)[0] is bufs["a"]
    assert pool.take("big", 2100) is None
    # a holder let go: the buffer is dead as soon as the others are (c's, after 1)
    pool.release(bufs["c"], "new")
    assert pool.take("mid", 520)[0] is bufs["c"]


def _naive_take(pool, holder: str, need: int):
    """The pool's rule read off its blocks, holder by holder: what `take` must hand on."""
    if holder not in pool.poolable:
        return None
    start = pool.lifetimes[holder][0]
    for b in sorted(pool._blocks.values(), key=lambda b: (b.nbytes, b.made)):
        if b.constant or b.nbytes < need:
            continue
        if b.nbytes >= 2 * need:
            return None
        if all(h in pool.poolable and pool.lifetimes[h][1] < start for h in b.holders):
            return b.buf
    return None


@given(ops=st.lists(st.tuples(st.sampled_from(["alloc", "take", "release", "scratch"]),
                              st.integers(0, 7), st.integers(1, 9), st.integers(0, 12)),
                    min_size=1, max_size=40))
@settings(max_examples=60, deadline=None)
def test_take_answers_as_its_rule_read_holder_by_holder(device, ops):
    """What `take` hands on (it keeps each block's last holder step) is what the rule gives
    read off every holder's lifetime, through allocs, takes, releases and lifetimes that
    change (an impl's scratch buffer given a step: add_scratch)."""
    ctx = _ctx(device)
    names = [f"t{k}" for k in range(8)]
    life = {n: [k, k + 3] for k, n in enumerate(names)}
    pool = MemoryPool(life, set(names[:6]))       # t6, t7: not pooled (inputs, say)
    held: list = []
    for op, k, size, step in ops:
        name = names[k]
        if op == "alloc":
            held.append((pool.alloc(ctx, size * 100, name), name))
        elif op == "take":
            want = _naive_take(pool, name, size * 100)
            got = pool.take(name, size * 100)
            assert (None if got is None else got[0]) is want, (op, name, size)
            if got is not None:
                held.append((got[0], name))
        elif op == "release" and held:
            buf, holder = held.pop(step % len(held))
            pool.release(buf, holder)
        elif op == "scratch":
            pool.add_scratch(name, step)


_CTXS: dict = {}


def _ctx(device):
    import pyopencl as cl
    if device.int_ptr not in _CTXS:     # one context for all examples (each is a few us)
        _CTXS[device.int_ptr] = cl.Context([device])
    return _CTXS[device.int_ptr]
