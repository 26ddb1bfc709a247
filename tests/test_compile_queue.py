"""The background compile queue of static builds (engine/compile_queue.py) and its owner's
lifetime: on a CPU device a build waits for the end of the inference in flight, the first
inference's too (the queue is made by that inference's first static build); a network that is
gone is collected with builds still queued, and they are dropped."""
import gc
import threading
import time
import weakref

import numpy as np
import pytest

from engine import Network, build_program, impl_manager
from engine.compile_queue import CompileQueue
from tests.models import mlp

pytestmark = pytest.mark.usefixtures("static_gemms")


def _feeds(net, rows):
    (name,) = net.program.inputs
    return {name: np.random.default_rng(rows).standard_normal((rows, 32)).astype(np.float32)}


def test_a_build_waits_for_the_inference_in_flight():
    q = CompileQueue(1, yield_to_inference=True)
    started = threading.Event()
    q.in_flight(True)
    q.submit("k", lambda: (started.set(), 0.0))
    assert not started.wait(0.3), "built while an inference was in flight"
    q.in_flight(False)
    assert started.wait(10) and q.wait_idle(10)
    q.close()


def test_the_first_inferences_builds_wait_for_its_end(device, monkeypatch):
    """The queue made during the first inference starts paused, as it is at every later one."""
    net = Network(build_program(mlp()), device)
    net.impls.in_flight(True)            # as infer() does before its first static build
    q = net.impls.compile_queue
    started = threading.Event()
    q.submit("k", lambda: (started.set(), 0.0))
    assert not started.wait(0.3), "built while the first inference was in flight"
    net.impls.in_flight(False)
    assert started.wait(10) and q.wait_idle(10)
    # and through infer(): every static build of the first inference starts after its end
    net = Network(build_program(mlp()), device)
    starts, compile_program = [], impl_manager.compile_program

    def timed(ctx, source, jit, dynamic=True, optimize=True):
        if not dynamic:
            starts.append(time.perf_counter())
        return compile_program(ctx, source, jit, dynamic, optimize)

    monkeypatch.setattr(impl_manager, "compile_program", timed)
    net.infer(_feeds(net, 3))
    ended = time.perf_counter()
    assert net.impls.compile_queue.submitted > 0
    assert net.impls.compile_queue.wait_idle(120)
    assert starts and min(starts) >= ended


def test_a_dropped_network_is_collected_and_its_queued_builds_dropped(device, monkeypatch):
    """Dropped while its first static build runs (held here) and more are queued: the network
    is collected all the same, the queued builds are dropped and the worker ends after the
    build in progress."""
    gate, running, keys = threading.Event(), threading.Event(), []
    compile_program = impl_manager.compile_program

    def held(ctx, source, jit, dynamic=True, optimize=True):
        if not dynamic:
            keys.append(jit)
            running.set()
            gate.wait(60)
        return compile_program(ctx, source, jit, dynamic, optimize)

    monkeypatch.setattr(impl_manager, "compile_program", held)
    net = Network(build_program(mlp()), device)
    net.infer(_feeds(net, 5))
    q, impls = net.impls.compile_queue, weakref.ref(net.impls)
    assert running.wait(60), "no static build started after the inference"
    assert q.submitted >= 2 and not q.wait_idle(0)
    threads = list(q._threads)
    del net
    gc.collect()
    assert impls() is None, "the queue kept the network alive"
    assert q.wait_idle(0), "its queued builds were not dropped"
    gate.set()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert len(keys) == 1, "a queued build ran after the network was gone"
