"""Shared test helpers: run a model through the engine over a sequence of inputs and compare
every output of every inference with onnxruntime."""
from __future__ import annotations

import gc
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict

import numpy as np
import onnx
import onnxruntime as ort
import pyopencl as cl
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import Network, build_program, select_device  # noqa: E402
from engine import impl_manager, kernels, prebuild  # noqa: E402
from engine.compile_queue import CompileQueue  # noqa: E402

# Every compile queue of the session (weakly: a queue lives while its workers do).
_QUEUES: "weakref.WeakSet[CompileQueue]" = weakref.WeakSet()
_queue_init = CompileQueue.__init__


def _registered_init(self, *args, **kwargs):
    _queue_init(self, *args, **kwargs)
    _QUEUES.add(self)


CompileQueue.__init__ = _registered_init


# The session's networks share one OpenCL context per device, and a program is built once per
# (context, source, JIT constants) for all of them: a test's network builds every program it
# needs again, and PoCL answers each rebuild from its cache only after preprocessing the source
# again (~0.1 s a program; thousands over the suite, as many as the cold builds cost). Only the
# OpenCL program is shared: kernels stay per node (engine/bound_kernel.py), and each network
# still asks for its builds, counts them and decides as before. A network given its own context
# (the ONNX backend's) keeps it, and builds there are not kept.
_CONTEXTS: dict = {}                   # device -> the shared context
_PROGRAMS: "OrderedDict[tuple, cl.Program]" = OrderedDict()
_PROGRAMS_MAX = 600                    # the least recently used go (a program holds its code)
_programs_lock = threading.Lock()
_compile_program = kernels.compile_program
_network_init = Network.__init__


def _shared_context_init(self, program, device=None, *args, **kwargs):
    if not args and kwargs.get("context") is None:
        device = device or select_device()
        with _programs_lock:
            if device.int_ptr not in _CONTEXTS:
                _CONTEXTS[device.int_ptr] = cl.Context([device])
            kwargs["context"] = _CONTEXTS[device.int_ptr]
    _network_init(self, program, device, *args, **kwargs)


def _compile_once(ctx, source, jit, dynamic=True, optimize=True):
    t0 = time.perf_counter()
    shared = ctx.int_ptr in {c.int_ptr for c in list(_CONTEXTS.values())}
    key = (ctx.int_ptr, source, jit, dynamic, optimize, tuple(kernels.build_options())) if shared else None
    try:
        hash(key)
    except TypeError:
        key = None
    with _programs_lock:
        prg = _PROGRAMS.get(key) if key is not None else None
        if prg is not None:
            _PROGRAMS.move_to_end(key)
    if prg is not None:
        return prg, (time.perf_counter() - t0) * 1e3
    prg, ms = _compile_program(ctx, source, jit, dynamic, optimize)
    if key is not None:
        with _programs_lock:
            _PROGRAMS[key] = prg
            while len(_PROGRAMS) > _PROGRAMS_MAX:
                _PROGRAMS.popitem(last=False)
    return prg, ms


Network.__init__ = _shared_context_init
for _module in (kernels, impl_manager, prebuild):
    _module.compile_program = _compile_once


# The files that take longest with a cold kernel cache (PoCL builds), longest first. With
# `-n 2 --dist loadfile` a worker takes the next file in collection order when it runs dry: a
# long file taken last keeps one worker busy while the other idles. Any other file follows
# these, in pytest's order (short files last even out the two workers' ends).
LONGEST_FIRST = [
    "test_onnx_node.py", "test_light_models.py", "test_conv_gemm.py", "test_conv_tiled.py",
    "test_exporters.py", "test_readme_commands.py", "test_compiled_plans.py",
    "test_gemm_vector_epilogue.py", "test_shape_functions.py", "test_ln_gemv.py",
    "test_ms_fused_ops.py", "test_recurrent_ops.py", "test_partial_replay.py", "test_user_errors.py",
    "test_steady_steps.py", "test_gemm_tiles.py", "test_packed_projections.py", "test_impls.py",
    "test_compiled_steps.py", "test_partial_replay_adversarial.py",
]


def pytest_configure(config):
    # xdist orders files by their number of tests unless told not to: LONGEST_FIRST is the order
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: a file's order stays


@pytest.hookimpl(trylast=True)         # after the test's fixtures are gone
def pytest_runtest_teardown(item, nextitem):
    """Networks a test dropped are collected before the next test, so their queued static
    builds stop (a network's finalizer drops them; networks sit in reference cycles, which only
    the collector frees): on a 2-core machine builds nobody will take slow the next tests."""
    if any(not q.wait_idle(0) for q in list(_QUEUES)):
        gc.collect()


@pytest.fixture(scope="session")
def device():
    """The OpenCL device of the suite; a missing device fails loudly, never skips."""
    return select_device()


@pytest.fixture
def static_gemms(monkeypatch):
    """Tests of MatMul's static-impl flow: `--impls auto` builds static GEMMs only where they
    were measured to pay (MatMul's `static_on`: CPUs, and there GEMMs of 2^20 multiply-adds or
    more), so these ask for them on every device and at every size."""
    monkeypatch.setattr("engine.impl_manager.static_worth", lambda device_type, op: True)
    monkeypatch.setattr("engine.impl_manager.CPU_STATIC_MIN_MACS", 0)


@pytest.fixture
def gemv_one_quad(monkeypatch):
    """GEMVs (GPU kind) on the table's work-groups with one quad of K rows a step, unsplit as
    the table is: the same kernels, launches and decisions, while the table's 4 quads a step
    (N < 8192) cost 3 to 7 s a cold PoCL build (rows x fused ops: a decode builds many), one
    quad about a third. For tests of what the runtime decides over many GEMV builds; the table's
    tiles are tested in tests/test_gemv.py and tests/test_ln_gemv.py."""
    import engine.ops.matmul as mm
    table = mm.gemv_tile

    def tile(N, K):
        t = table(N, K)
        return t[:2] + (1,) + t[3:]
    monkeypatch.setattr(mm, "gemv_tile", tile)


def ort_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """onnxruntime's CPU session of `model` (at the newest IR version it reads: the GPU
    machine's onnxruntime is older than the onnx that writes the tests' models)."""
    from dyncli.check import ort_session as session
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return session(model, opts)[0]


def assert_close(got: np.ndarray, want: np.ndarray, rtol=1e-4, atol=1e-5, what=""):
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def assert_close_for(got: np.ndarray, want: np.ndarray, what=""):
    """assert_close with the tolerance of the output's type. float32: 2e-4 relative. float16:
    1e-2 relative and absolute 1e-2 or 4e-3 of the output's largest magnitude (a few ulps of
    it: a dot product's rounding error scales with its terms, not with its result; both
    engines round intermediates to half, at different points, see tests/test_f16_models.py)."""
    if want.dtype != np.float16:
        return assert_close(got, want, 2e-4, 3e-5, what)
    scale = float(np.abs(want.astype(np.float32)).max(initial=0.0))
    assert_close(got, want, 1e-2, max(1e-2, 4e-3 * scale), what)


def run_vs_ort(model: onnx.ModelProto, feed_seq, device=None, rtol=1e-4, atol=1e-5, net=None,
               check_nonconstant=True, reference=ort_session) -> Network:
    """Run each feeds dict through one Network (the dynamic-shape path) and onnxruntime
    (`reference(model)`: a session of the judge, onnxruntime's by default)."""
    net = net or Network(build_program(model), device)
    sess = reference(model)
    names = [o.name for o in sess.get_outputs()]
    for i, feeds in enumerate(feed_seq):
        outs = net.infer(feeds)
        ref = dict(zip(names, sess.run(None, feeds)))
        shapes = {k: v.shape for k, v in feeds.items()}
        for name in names:
            assert_close(outs[name], ref[name], rtol, atol, f"inference {i} {shapes} output {name}")
            if check_nonconstant and ref[name].size > 1 and ref[name].dtype.kind == "f":
                # a constant reference hides errors: the models are built to avoid it
                assert np.ptp(ref[name]) > 0, f"reference output {name} is constant"
    return net


def run_traced(model: onnx.ModelProto, feed_seq, device=None, rtol=1e-4, atol=1e-5, **net_kw):
    """run_vs_ort on a fresh Network that records its trace in memory; shape-agnostic impls
    only unless told (a background static build would land at a moment that depends on the
    compiler's speed). Returns (net, trace)."""
    from traces import MemoryTrace
    trace = MemoryTrace()
    net_kw.setdefault("impls", "dynamic")
    net = Network(build_program(model), device, trace=trace, **net_kw)
    run_vs_ort(model, feed_seq, device, rtol, atol, net=net)
    return net, trace
