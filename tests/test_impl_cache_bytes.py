"""The impl cache is bounded by the bytes of its static impls as well as by count: a long run
of varying shapes keeps building static impls (one per shape class), each holding megabytes of
host memory on a CPU runtime, so the count alone (300) let a 20,000-inference run grow the
process by ~270 MiB. Evictions are traced with their reason and the bytes freed."""
import pytest

from engine import Network, build_program
from engine.impl_cache import STATIC_BYTES, ImplCache
from engine.kernels import Impl
from tests.test_impls import mm_model, run_seq


pytestmark = pytest.mark.usefixtures("static_gemms")


def _impl(name, kind, nbytes):
    return Impl(name, kind, None, 1.0, nbytes)


def test_static_bytes_evict_least_recent_static_and_never_dynamic():
    c = ImplCache(capacity=10, static_bytes=3000)
    assert c.put("d", _impl("d", "dynamic", 10_000)) == []      # dynamic impls are not counted
    assert c.put("s1", _impl("s1", "static", 1000)) == []
    assert c.put("s2", _impl("s2", "static", 1000)) == []
    c.get("s1")                                                  # s2 is now the least recent
    ev = c.put("s3", _impl("s3", "static", 1500))
    assert [(k, why) for k, _, why in ev] == [("s2", "bytes")]
    assert c.held_static == 2500 and "d" in c and "s1" in c and "s3" in c
    ev = c.put("s4", _impl("s4", "static", 5000))                # alone past the bound: kept
    assert sorted(k for k, _, _ in ev) == ["s1", "s3"] and c.held_static == 5000 and len(c) == 2
    c.put("s4", _impl("s4", "static", 5000))                     # a replacement counts once
    assert c.held_static == 5000
    small = ImplCache(capacity=1, static_bytes=0)
    small.put("a", _impl("a", "static", 1))
    assert [(k, why) for k, _, why in small.put("b", _impl("b", "static", 1))] == [("a", "capacity")]


def test_run_of_varying_shapes_keeps_static_bytes_bounded_and_correct(device):
    probe, _ = run_seq(mm_model(), [8], impl_cache=ImplCache(0, 0), async_compile=False, wait=False)
    one = max(i.nbytes for i in probe.impls.cache._d.values() if i.kind == "static")
    assert one > 0
    cache = ImplCache(300, static_bytes=2 * one)
    # each seq is its own static GEMM shape class for both MatMuls; run_seq checks onnxruntime
    net, ev = run_seq(mm_model(), [8, 16, 24, 32, 40, 8], impl_cache=cache, async_compile=False,
                      wait=False)
    evicts = [(r, f) for i, n, k, a, r, f in ev.events if a == "evict"]
    assert evicts and all(r == "bytes" and f["impl_kind"] == "static" and f["bytes"] > 0 for r, f in evicts)
    statics = [i for i in cache._d.values() if i.kind == "static"]
    assert cache.held_static == sum(i.nbytes for i in statics) <= 2 * one
    assert len(statics) <= 2 < sum(1 for i, n, k, a, r, f in ev.events if a == "build" and r == "static")


def test_default_network_bounds_static_bytes(device):
    net = Network(build_program(mm_model()), device)
    assert net.impls.cache.capacity == 300 and net.impls.cache.static_bytes == STATIC_BYTES == 64 << 20


def test_evictions_give_freed_heap_back(monkeypatch):
    """Freed programs' pages go back to the OS after an eviction (glibc keeps them otherwise)."""
    calls = []
    monkeypatch.setattr("engine.impl_manager.give_back_freed_heap", lambda: calls.append(1))
    run_seq(mm_model(), [8, 16, 24], impl_cache=ImplCache(300, static_bytes=1), async_compile=False,
            wait=False)
    assert calls


def test_evicted_static_impls_are_not_kept_alive_by_spare_kernels(device):
    """A node keeps a few spare kernel objects for impls it may take back; one of an evicted
    static impl would keep its program (megabytes on a CPU runtime) past the cache's byte bound,
    and an evicted static impl is never taken back: only the node's current kernels hold one."""
    probe, _ = run_seq(mm_model(), [8], impl_cache=ImplCache(0, 0), async_compile=False, wait=False)
    one = max(i.nbytes for i in probe.impls.cache._d.values() if i.kind == "static")
    cache = ImplCache(300, static_bytes=2 * one)
    net, _ = run_seq(mm_model(), [8, 16, 24, 32, 40, 8, 48], impl_cache=cache, async_compile=False,
                     wait=False)
    assert cache.evictions
    cached = {id(i) for i in cache._d.values()}
    for inst in net.insts:
        spare = [b for b in inst._bound_cache.values() if b.impl.kind == "static" and b not in inst.bound]
        assert all(id(b.impl) in cached for b in spare), [b.impl.name for b in spare]
