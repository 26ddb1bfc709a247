"""Impls: dynamic impl at once, static builds on the compile queue and switched to on
a later execution, fake-aligned static GEMMs, the impl cache LRU, update_weights reorders and
the reordered-weights cache. Every run is compared with onnxruntime."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dyncli.render import summary, summary_table
from dyncli.runner import RunOptions, execute_run
from engine import Network, build_program
from tests.conftest import assert_close, ort_session, run_vs_ort
from tests.models import mlp, small_cnn

SEQ = [8, 8, 16, 8, 16, 24, 8]


# These tests follow MatMul's static-impl flow: static GEMMs on every device, of any size
pytestmark = pytest.mark.usefixtures("static_gemms")


def mm_model(seed=0):
    """x[1, seq, 32] -> MatMul 32x64 -> Relu -> MatMul 64x24 -> Relu: a MatMul-heavy FC stack
    (each Relu fuses into its MatMul, so both MatMuls share one fused dynamic impl)."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((32, 64)) / 5).astype(np.float32)
    w2 = (rng.standard_normal((64, 24)) / 7).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "W2"], ["h2"], name="mm2"),
             helper.make_node("Relu", ["h2"], ["y"], name="relu2")]
    g = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", 24])],
                          [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


class Events:
    """A trace sink keeping (iter, node, kind, action, reason, fields)."""
    def __init__(self):
        self.iter, self.events = -1, []

    def event(self, kind, node="", op="", action="", reason="", **f):
        self.events.append((self.iter, node, kind, action, reason, f))

    def flush(self):
        pass

    def of(self, node, kinds=("update_impl", "update_weights")):
        return [(i, k, a, r) for i, n, k, a, r, _ in self.events if n == node and k in kinds]


def run_seq(model, seqs, wait=True, **net_kw):
    ev = Events()
    net = Network(build_program(model), trace=ev, **net_kw)
    rng = np.random.default_rng(1)
    for s in seqs:
        run_vs_ort(model, [{"x": rng.standard_normal((1, s, 32)).astype(np.float32)}], net=net)
        if wait:
            net.impls.compile_queue.wait_idle()
    return net, ev


def test_acceptance_sequence_dynamic_then_static_switch_weights_cache():
    net, ev = run_seq(mm_model(), SEQ)
    want = [
        # 8: the dynamic impl runs at once, the static build is queued
        (0, "update_impl", "build", "dynamic"), (0, "update_impl", "queue", "static"),
        (0, "update_weights", "skip", "original_layout"),
        # 8 again: the static impl is ready, switch; its weight layout needs a reorder
        (1, "update_impl", "switch", "static_ready"),
        (1, "update_impl", "build", "dynamic"),        # the reorder kernel's own impl
        (1, "update_weights", "reorder", ""),
        # 16: dynamic at once (back to the original weights), static queued
        (2, "update_impl", "keep", "dynamic"), (2, "update_impl", "queue", "static"),
        (2, "update_weights", "reset", ""),
        # 8: static impl cache hit, reordered weights cache hit
        (3, "update_impl", "keep", "dynamic"), (3, "update_impl", "cache_hit", "static"),
        (3, "update_weights", "cache_hit", ""),
        # 16: its static build is ready: switch, weights cache hit (same layout)
        (4, "update_impl", "keep", "dynamic"), (4, "update_impl", "switch", "static_ready"),
        (4, "update_weights", "cache_hit", ""),
        # 24: same path as 16
        (5, "update_impl", "keep", "dynamic"), (5, "update_impl", "queue", "static"),
        (5, "update_weights", "reset", ""),
        (6, "update_impl", "keep", "dynamic"), (6, "update_impl", "cache_hit", "static"),
        (6, "update_weights", "cache_hit", ""),
    ]
    assert ev.of("mm1") == want
    # mm2 shares mm1's dynamic impl (one build) and the reorder impl
    assert ev.of("mm2")[0] == (0, "update_impl", "cache_hit", "dynamic")
    assert (1, "update_impl", "cache_hit", "dynamic") in ev.of("mm2")
    switch = [f for i, n, k, a, r, f in ev.events if n == "mm1" and a == "switch"]
    assert switch[0]["old_impl"] == "gemm:MatMul+fused" and "static[M8xN64xK32" in switch[0]["new_impl"]
    assert switch[0]["compile_ms"] > 0 and switch[0]["critical"] is False
    assert "static[M8" in switch[1]["old_impl"] and "static[M16" in switch[1]["new_impl"]


@pytest.mark.parametrize("kind,optimized", [("gpu", None), ("cpu", None), ("gpu", True)])
def test_a_gpu_kinds_kernels_build_unoptimized_only_on_a_cpu_device(device, kind, optimized, monkeypatch):
    """ImplManager.optimize: the GPU kind's kernels on a CPU device (the suite's, a script's)
    are built with the compiler's optimizations off: static and dynamic impls, and the
    first inference's parallel prebuilds (the MLP's several programs); the CPU kind's, any
    kernel on a GPU, and a GPU kind a script marks `optimized`, keep them. Outputs match
    onnxruntime either way."""
    import pyopencl as cl

    from engine import prebuild
    prebuilt, build_loaded = [], prebuild._build_loaded

    def recorded(ctx, source, jit, kernels, optimize):
        prebuilt.append(optimize)
        return build_loaded(ctx, source, jit, kernels, optimize)
    monkeypatch.setattr(prebuild, "_build_loaded", recorded)
    off = kind == "gpu" and optimized is None and bool(device.type & cl.device_type.CPU)
    rng = np.random.default_rng(1)
    for model, impls, feeds in ((mm_model(), "static", [{"x": rng.standard_normal((1, n, 32))} for n in (8, 16)]),
                                (mlp(), "auto", [{"x": rng.standard_normal((b, 32))} for b in (2, 3)])):
        net = Network(build_program(model), device, impls=impls)
        net.impls.device_type, net.impls.optimized = kind, optimized
        run_vs_ort(model, [{k: v.astype(np.float32) for k, v in f.items()} for f in feeds], device, net=net)
        assert net.impls.optimize is not off
        built = [(impl.kind, impl.program.get_build_info(device, cl.program_build_info.OPTIONS))
                 for impl in net.impls.cache._d.values()]
        assert all(("-cl-opt-disable" in o) is off for _, o in built), built
        assert {"dynamic", "static"} <= {k for k, _ in built} if impls == "static" else \
            "dynamic" in {k for k, _ in built}, built
    assert prebuilt and all(optimize is not off for optimize in prebuilt)


def test_capacity_one_evicts_and_evicted_static_impls_are_not_rebuilt():
    net, ev = run_seq(mm_model(), SEQ, impl_cache_capacity=1)
    evicted = [f["impl"] for i, n, k, a, r, f in ev.events if a == "evict"]
    assert len(evicted) >= 4 and any("static" in e for e in evicted)
    # M8 was evicted before the third 8: the dynamic impl stays (no rebuild: a run whose shapes
    # want more static impls than the cache holds would rebuild them in turn for ever)
    assert (3, "update_impl", "fallback", "evicted") in ev.of("mm1")
    assert (3, "update_impl", "queue", "static") not in ev.of("mm1")
    assert not any(a == "cache_hit" and r == "static" for i, n, k, a, r, f in ev.events)
    assert len(net.impls) == 1


def test_fake_alignment_rows_9_to_16_share_one_static_gemm():
    model = mm_model()
    net, ev = run_seq(model, [16] + list(range(9, 17)), wait=False, async_compile=False)
    builds = [(i, n) for i, n, k, a, r, f in ev.events if a == "build" and r == "static"]
    assert builds == [(0, "mm1"), (0, "mm2")]
    hits = [i for i, n, k, a, r, f in ev.events if n == "mm1" and a == "cache_hit" and r == "static"]
    assert hits == list(range(1, 9))
    # padded rows are never written: after seq 9 the buffer's rows 9..15 still hold seq 16's
    sess = ort_session(model)
    x16 = np.random.default_rng(5).standard_normal((1, 16, 32)).astype(np.float32)
    net.infer({"x": x16})
    y = net.tensors["y"]
    net.infer({"x": x16[:, :9] * 2})
    raw = np.empty(16 * 24, np.float32)
    import pyopencl as cl
    cl.enqueue_copy(net.queue.cl_queue, raw, y.buf, src_offset=y.offset * 4, is_blocking=True)
    ref16 = sess.run(None, {"x": x16})[0]
    assert_close(raw.reshape(16, 24)[9:], ref16[0, 9:], what="rows past M untouched")
    assert_close(raw.reshape(16, 24)[:9], sess.run(None, {"x": x16[:, :9] * 2})[0][0], what="rows < M")


def test_no_async_compile_puts_compile_time_in_critical_path(tmp_path):
    path = tmp_path / "mm.onnx"
    onnx.save(mm_model(), path)
    shapes = [f"x:1x{s}x32" for s in SEQ]
    res = {}
    for flag in (True, False):
        r = execute_run(RunOptions(model=str(path), shapes=shapes, check=True, async_compile=flag,
                                   trace=str(tmp_path / f"t{flag}.jsonl")))
        assert r.status == "ok" and not r.check_failed
        res[flag] = summary(r)["counters"]
    sync = res[False]
    assert sync["static_compiles"] == 6 and sync["update_impl.build.static"] == 6
    assert sync["compile_ms_critical"] == sync["compile_ms"] > 0
    assert sync.get("update_impl.queue", 0) == 0 and sync.get("update_impl.switch", 0) == 0
    # async: static builds never count in the critical path
    asy = res[True]
    assert asy.get("update_impl.build.static", 0) == 0 and asy["update_impl.queue"] >= 2
    from rich.console import Console
    con = Console(width=200, record=True)
    con.print(summary_table(summary(r)))
    assert "compile ms: total / in critical path" in con.export_text()


def test_static_impls_everywhere_match_onnxruntime():
    """--impls static on Gemm(transB, bias, N not a tile multiple), Softmax and Conv."""
    rng = np.random.default_rng(3)
    seq = [{"x": rng.standard_normal((b, 32)).astype(np.float32)} for b in (3, 8, 3)]
    net = run_vs_ort(mlp(), seq, net=Network(build_program(mlp()), impls="static"), rtol=2e-4, atol=2e-5)
    assert net.counters.get("update_impl.cache_hit.static", 0) > 0
    seq = [{"x": rng.standard_normal((b, 3, h, w)).astype(np.float32)} for b, h, w in [(1, 16, 16), (2, 13, 9)]]
    net = run_vs_ort(small_cnn(), seq, net=Network(build_program(small_cnn()), impls="static"),
                     rtol=2e-4, atol=2e-5)
    assert net.counters["static_compiles"] > 0
