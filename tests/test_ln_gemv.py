"""LayerNormalization inside the decode GEMV that reads it (engine/ln_gemv_fusion.py, the internal
`ln_gemv` op, cl/gemm.cl gemv with GV_LN) against onnxruntime: rows up to GEMV_MAX_ROWS run the
one kernel on a GPU kind device; more rows (a prompt), a CPU kind device, a normalisation over
more than the last axis or a broadcast gamma run the unfused subgraph (the LayerNormalization,
then the MatMul with its epilogue), and the trace says why. The GPU kernels run on the suite's
device (PoCL) through `net.impls.device_type` (tests/test_gemm_tiles.py make_net)."""
import numpy as np
import pytest
from onnx import helper

import engine.ops.matmul as mm
from engine import Network, build_program
from engine.fast_path import NOT_DECISIONS
from tests.conftest import run_vs_ort
from tests.models import FLOAT, _Builder, gpt2_decoder
from tests.test_partial_replay import _decisions
from traces import MemoryTrace

LAYERS = 2
FUSED = 2 * LAYERS + 1          # ln_1 -> c_attn, ln_2 -> c_fc per layer, ln_f -> lm_head


def _ln_matmul(K, N, epilogue="none", gamma=None, axis=-1, beta=True):
    """y = [epilogue](LayerNormalization(x) @ W), x [b, m, K]: "none"; "bias_gelu" (bias + tanh
    GELU, GPT-2's c_fc); "residual" (bias, then + r [b, m, N]). `gamma`: the shape of gamma and
    beta ([K] by default); `beta`: whether the LayerNormalization has one."""
    b = _Builder(17, K + N)
    w = b.weight("w", (K, N), K)
    g = b.init("gamma", (1 + 0.1 * b.rng.standard_normal(gamma or K)).astype(np.float32))
    ln_ins = ["x", g] + ([b.init("beta", (0.1 * b.rng.standard_normal(gamma or K)).astype(np.float32))]
                         if beta else [])
    h = b.op("LayerNormalization", ln_ins, name="LN", axis=axis, epsilon=1e-3)
    y = b.op("MatMul", [h, w], name="MatMul")
    ins = [helper.make_tensor_value_info("x", FLOAT, ["b", "m", K])]
    if epilogue != "none":
        y = b.op("Add", [y, b.bias("bias", N, 0.1)])
    if epilogue == "bias_gelu":
        cube = b.op("Mul", [b.op("Pow", [y, b.const(3.0)]), b.const(0.044715)])
        t = b.op("Tanh", [b.op("Mul", [b.op("Add", [y, cube]), b.const(0.7978845608)])])
        y = b.op("Mul", [b.op("Mul", [y, b.const(0.5)]), b.op("Add", [t, b.const(1.0)])])
    if epilogue == "residual":
        y = b.op("Add", [y, "r"])
        ins.append(helper.make_tensor_value_info("r", FLOAT, ["b", "m", N]))
    return b.model(ins, [helper.make_tensor_value_info(y, FLOAT, ["b", "m", N])], "ln_matmul")


def _feeds(rng, bs, m, K, N, residual):
    f = {"x": (2 * rng.standard_normal((bs, m, K)) + 0.5).astype(np.float32)}
    if residual:
        f["r"] = rng.standard_normal((bs, m, N)).astype(np.float32)
    return f


def _net(model, device, kind, **kw):
    trace = MemoryTrace()
    kw.setdefault("impls", "dynamic")
    net = Network(build_program(model), device, trace=trace, **kw)
    net.impls.device_type = kind
    return net, trace


def _unfused(trace, i):
    return [(e["node"], e["reason"]) for e in trace.of(i, "fusion", "unfuse")]


def _enqueued(trace, i):
    return {e["node"]: e["kernels"] for e in trace.of(i, "execute", "enqueue")}


def test_the_pair_becomes_one_internal_node():
    """LN -> MatMul -> bias + GELU: one `ln_gemv` node reading x, W, gamma, beta and the
    epilogue's operands, writing the epilogue's output; LN and MatMul run as its subgraph."""
    prog = build_program(_ln_matmul(64, 32, "bias_gelu"))
    by = {n.name: n for n in prog.nodes}
    node = by["MatMul_0_ln"]
    assert node.op == "ln_gemv" and node.opdef.internal
    assert node.fusion.position == "subgraph" and node.fusion.names() == ["LN_0", "MatMul_0"]
    assert node.inputs[:4] == ["x", "w", "gamma", "beta"]
    assert node.inputs[4:] == node.attrs["epilogue"].extra and node.inputs[4:]
    assert by["LN_0"].fused_into is node and by["MatMul_0"].fused_into is node
    assert node.outputs == [by["MatMul_0"].fusion.out]


def test_what_stays_unfused_at_load():
    """An LN read twice, a MatMul by an activation, an LN with a prologue of its own (x + r:
    its add stays in the LN's reads) keep their nodes."""
    b = _Builder(17, 0)
    w = b.weight("w", (16, 8), 16)
    h = b.layer_norm("x", "ln", 16)
    a = b.op("MatMul", [h, w])
    c = b.op("MatMul", [b.layer_norm("x", "ln2", 16), "v"])       # B not a constant
    p = b.op("MatMul", [b.layer_norm(b.op("Add", ["x", "r"]), "ln3", 16), w])   # LN with a prologue
    vi = lambda n, s: helper.make_tensor_value_info(n, FLOAT, s)  # noqa: E731
    model = b.model([vi("x", [1, 16]), vi("r", [1, 16]), vi("v", [16, 8])],
                    [vi(a, [1, 8]), vi(h, [1, 16]), vi(c, [1, 8]), vi(p, [1, 8])], "unfused")
    prog = build_program(model)
    assert not [n for n in prog.nodes if n.op == "ln_gemv"]
    assert any(n.op == "LayerNormalization" and n.fusion is not None for n in prog.nodes)


# K below and across a work-group's row step (4 x 64 slices x 4 quads = 1024 rows) and not a
# multiple of 4 (A read per float, the last rows one by one); N around a work-group's 32
# columns and not a multiple of 4; 1 to 4 rows from M or from a batch dim (builds of 1, 2, 4).
# Each build of rows is a JIT constant (a cold PoCL build: 3 to 7 s optimized, about 1 s as the
# GPU kind's kernels build on a CPU device, ImplManager.optimize): no epilogue and the
# residual (an operand read per row) take all three, bias + GELU (per column, the same for
# every row) the builds of 1 and 4 rows (3 rows: a repeated 4th; from M and from a batch dim).
ROWS = [(1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2), (1, 5), (3, 2), (1, 1)]
ROWS_1_4 = [(1, 1), (1, 3), (1, 4), (2, 2), (1, 5), (3, 2), (1, 1)]


@pytest.mark.parametrize("epilogue", ["none", "bias_gelu", "residual"])
@pytest.mark.parametrize("K,N", [(64, 32), (100, 130), (99, 65), (768, 96)])
def test_fused_matches_ort_across_shapes(device, K, N, epilogue):
    model = _ln_matmul(K, N, epilogue)
    net, trace = _net(model, device, "gpu")
    rng = np.random.default_rng(K + N)
    rows = ROWS_1_4 if epilogue == "bias_gelu" else ROWS
    run_vs_ort(model, [_feeds(rng, bs, m, K, N, epilogue == "residual") for bs, m in rows], device,
               rtol=2e-4, atol=5e-5, net=net)
    for i, (bs, m) in enumerate(rows):
        if bs * m > mm.GEMV_MAX_ROWS:
            assert _unfused(trace, i) == [("MatMul_0_ln", "too_many_rows")]
            assert set(_enqueued(trace, i)) == {"LN_0", "MatMul_0"}
        else:
            assert not _unfused(trace, i) and _enqueued(trace, i) == {"MatMul_0_ln": 1}


# forced GEMV tiles (WX, KY, U, G): quads of 3 per step, 64-column groups, K split in parts of
# GEMV_MIN_CHUNK rows (the partial kernel normalises, gemm_splitk_reduce applies the epilogue),
# with the rows (b, m) each takes: a tile changes the work-group's steps over K, not the rows'
# (test_fused_matches_ort_across_shapes takes every build of rows on the table's tile), so the
# unsplit tiles take one build each (4 rows from M and from a batch dim; 1 row), the split one
# both
@pytest.mark.parametrize("tile,rows", [((8, 32, 3, 0), [(1, 3), (2, 2)]), ((16, 16, 1, 0), [(1, 1)]),
                                       ((8, 4, 2, 10 ** 6), [(1, 1), (1, 3), (2, 2)])])
def test_fused_with_forced_tiles(device, tile, rows, monkeypatch):
    monkeypatch.setattr(mm, "gemv_tile", lambda N, K: tile)
    model = _ln_matmul(301, 70, "residual")
    net, trace = _net(model, device, "gpu")
    rng = np.random.default_rng(3)
    run_vs_ort(model, [_feeds(rng, bs, m, 301, 70, True) for bs, m in rows], device,
               rtol=2e-4, atol=5e-5, net=net)
    split = tile[3] > 0
    for i in range(len(rows)):
        assert not _unfused(trace, i) and _enqueued(trace, i) == {"MatMul_0_ln": 2 if split else 1}


# (without B the kernel adds no beta, whatever the rows: one build of rows each)
@pytest.mark.parametrize("epilogue,rows", [("none", [(1, 1), (1, 6)]), ("residual", [(1, 4), (1, 6)])])
def test_fused_without_beta(device, epilogue, rows):
    """A LayerNormalization without B (the epilogue's operands then follow an empty input)."""
    model = _ln_matmul(99, 40, epilogue, beta=False)
    net, trace = _net(model, device, "gpu")
    rng = np.random.default_rng(6)
    run_vs_ort(model, [_feeds(rng, bs, m, 99, 40, epilogue == "residual") for bs, m in rows], device,
               rtol=2e-4, atol=5e-5, net=net)
    assert [len(_unfused(trace, i)) for i in range(2)] == [0, 1]
    assert _enqueued(trace, 0) == {"MatMul_0_ln": 1}


@pytest.mark.parametrize("case,reason", [("axis", "norm_not_last_axis"), ("gamma", "norm_scale_broadcast")])
def test_unfused_where_the_kernel_does_not_normalise(device, case, reason):
    """An LN over the last two axes, or with one gamma for every column: the subgraph runs."""
    model = _ln_matmul(32, 16, "bias_gelu", axis=-2 if case == "axis" else -1,
                       gamma=(2, 32) if case == "axis" else (1,))       # x [1, 2, 32]
    net, trace = _net(model, device, "gpu")
    rng = np.random.default_rng(4)
    run_vs_ort(model, [_feeds(rng, 1, 2, 32, 16, False)], device, rtol=2e-4, atol=5e-5, net=net)
    assert _unfused(trace, 0) == [("MatMul_0_ln", reason)]


def _gpt2_steps(tokens=6, prompt=6):
    """A decode: a prompt of `prompt` tokens from an empty past, then single tokens with the KV
    caches fed back ([(feeds, fed back?)])."""
    rng = np.random.default_rng(5)
    steps = []
    for t in range(tokens):
        n = prompt if t == 0 else 1
        feeds = {"input_ids": rng.integers(0, 100, (1, n)).astype(np.int64)}
        if t == 0:
            feeds.update({f"past_{k}_{i}": np.zeros((1, 4, 0, 16), np.float32)
                          for i in range(LAYERS) for k in ("key", "value")})
        steps.append((feeds, t > 0))
    return steps


FEEDBACK = {f"present_{k}_{i}": f"past_{k}_{i}" for i in range(LAYERS) for k in ("key", "value")}


def _gpt2():
    return gpt2_decoder(layers=LAYERS, d_model=64, heads=4, vocab=100, max_pos=64)


def _decode(prog, device, kind, steps, sess=None, names=()):
    """Runs the decode loop; returns the trace and the kernels of every step (outputs checked
    against onnxruntime's when `sess` is given, fed its own presents)."""
    from tests.conftest import assert_close
    trace = MemoryTrace()
    net = Network(prog, device, trace=trace, impls="dynamic", feedback=FEEDBACK)
    net.impls.device_type = kind
    kernels, past = [], {}
    for t, (feeds, fed) in enumerate(steps):
        outs = net.infer(feeds, fed_back={v: k for k, v in FEEDBACK.items()} if fed else None)
        kernels.append(net.counters["kernels"])
        if sess is not None:
            ref = dict(zip(names, sess.run(None, {**feeds, **past})))
            for name in names:
                assert_close(outs[name], ref[name], 2e-4, 3e-5, f"{kind} step {t} {name}")
            past = {p: ref[k] for k, p in FEEDBACK.items()}
    return trace, kernels


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_gpt2_decode_loop(device, kind, monkeypatch):
    """A tiny GPT-2 decoder: a 6-token prompt (more rows than a GEMV: every pair unfused), then
    single tokens with the KV caches fed back: on a GPU kind device each of the 2 x layers + 1
    LayerNormalizations runs inside its GEMV, one kernel fewer each; a CPU kind device has no
    GEMV and always runs the subgraph (the kernels of the program built without the fusion)."""
    from tests.conftest import ort_session
    model = _gpt2()
    sess = ort_session(model)
    names = [o.name for o in sess.get_outputs()]
    steps = _gpt2_steps()
    prog = build_program(model)
    pairs = sorted(n.name for n in prog.nodes if n.op == "ln_gemv")
    assert len(pairs) == FUSED and "lm_head_ln" in pairs
    trace, kernels = _decode(prog, device, kind, steps, sess, names)
    monkeypatch.setattr("engine.fusion.fuse_ln_gemv", lambda prog: 0)
    # the run without the fusion only counts kernels (its outputs are not checked): its GEMVs
    # take the table's work-groups with one quad of K rows a step, the same kernels (the table
    # never splits K) at a third of the table's cold build (4 quads a step)
    table = mm.gemv_tile
    monkeypatch.setattr(mm, "gemv_tile", lambda N, K: table(N, K)[:2] + (1,) + table(N, K)[3:])
    _, before = _decode(build_program(model), device, kind, steps)
    for i in range(len(steps)):
        unfused = _unfused(trace, i)
        if kind == "cpu":
            assert sorted(unfused) == [(p, "device_kind") for p in pairs]
        elif i == 0:
            assert sorted(unfused) == [(p, "too_many_rows") for p in pairs]
        else:
            assert not unfused and all(_enqueued(trace, i)[p] == 1 for p in pairs)
    want = [b - (FUSED if kind == "gpu" and i else 0) for i, b in enumerate(before)]
    assert kernels == want, (kernels, before)


def test_gpt2_fast_path_on_and_off(device):
    """The same decode with the fast path on and off (GPU kind): identical outputs, decision
    counters and decisions per inference, the prompt's unfuse among them."""
    steps = _gpt2_steps(tokens=5, prompt=5)
    prog = build_program(_gpt2())
    runs = []
    for fast in (True, False):
        trace = MemoryTrace()
        net = Network(prog, device, trace=trace, impls="dynamic", feedback=FEEDBACK, fast_path=fast)
        net.impls.device_type = "gpu"
        outs, counters = [], []
        for feeds, fed in steps:
            o = net.infer(feeds, fed_back={v: k for k, v in FEEDBACK.items()} if fed else None)
            outs.append({k: np.array(v) for k, v in o.items()})
            counters.append({k: v for k, v in net.counters.items() if k not in NOT_DECISIONS})
        runs.append((outs, counters, trace))
    (on, on_c, on_t), (off, off_c, off_t) = runs
    for i in range(len(steps)):
        assert all(np.array_equal(on[i][k], off[i][k]) for k in off[i]), f"inference {i}"
        assert _decisions(on_t.events, i) == _decisions(off_t.events, i), f"inference {i}"
    assert on_c == off_c
    assert len(_unfused(on_t, 0)) == FUSED and not _unfused(on_t, 4)
    assert any(e["kind"] == "plan" for e in on_t.events)      # the fast path did replay
