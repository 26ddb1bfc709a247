"""Register-tiled GEMMs against onnxruntime: gemm_lm (GPUs: 2-level tiling, its
split-K mode, the GEMV split-K) and gemm_rb (CPUs), shape-agnostic and static, over shape
sequences that cross the tile sizes on one Network. The suite runs on PoCL, so each test runs
both device kinds' kernels there: the engine is told the device is a GPU (`kind`)."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import engine.ops.matmul as mm
from engine import Network, build_program
from tests.conftest import assert_close, ort_session, run_vs_ort

KINDS = ("cpu", "gpu")


def make_net(model, device, kind, attention=True, **kw):
    """A Network that picks the kernels of a `kind` device (the tiles are chosen per device kind
    in engine/ops/matmul.py) whatever device it runs on."""
    kw.setdefault("impls", "dynamic")
    net = Network(build_program(model, attention=attention), device, **kw)
    net.impls.device_type = kind
    return net


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _kernels(net):
    return [b.call.kernel for b in net.insts[0].bound]


def matmul_model():
    """y = a @ b, both inputs of any [m, k] x [k, n]: one Network sees every GEMM shape."""
    return _model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                  [("a", ["m", "k"]), ("b", ["k", "n"])], [("y", ["m", "n"])])


def matmul_feeds(rng, M, N, K):
    """a [M, K] and b [K, N] scaled by 1/sqrt(K), so outputs stay O(1) at every K."""
    return {"a": rng.standard_normal((M, K)).astype(np.float32),
            "b": (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)}


# (M, N, K): 1, tile - 1, tile, tile + 1 of the 32x32 / 32x64 / 64x64 GPU tiles and of the
# 8x16 and 12x32 CPU tiles, primes; (40, 70, 1100) is a small grid with a long K (gemm_lm split-K on
# GPUs), (1, 1, 1), (1, 50, 600) and (3, 130, 513) are GEMVs (the GEMV kernel on GPUs).
SEQ = [(1, 1, 1), (31, 63, 15), (32, 64, 16), (33, 65, 17), (97, 131, 37), (7, 16, 8), (64, 128, 33),
       (65, 17, 131), (40, 70, 1100), (1, 50, 600), (3, 130, 513), (97, 131, 37)]


@pytest.mark.parametrize("kind", KINDS)
def test_matmul_shapes_cross_tiles_on_one_network(device, kind):
    model = matmul_model()
    net = make_net(model, device, kind)
    rng = np.random.default_rng(0)
    seen = set()
    for M, N, K in SEQ:
        run_vs_ort(model, [matmul_feeds(rng, M, N, K)], rtol=2e-4, atol=2e-5, net=net)
        seen.add(tuple(_kernels(net)))
    if kind == "gpu":
        assert seen == {("gemm_lm",), ("gemm_lm", "gemm_splitk_reduce"), ("gemv",)}
    else:
        assert seen == {("gemm_rb",)}


@pytest.mark.parametrize("kind", KINDS)
def test_batched_broadcast_matmul(device, kind):
    """A [2, 3, m, k] x B [3, k, n] (B broadcast over the leading batch dim), then a 2-D A
    broadcast against a batched B."""
    rng = np.random.default_rng(1)
    m1 = _model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                [("a", [2, 3, "m", "k"]), ("b", [3, "k", "n"])], [("y", [2, 3, "m", "n"])])
    m2 = _model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                [("a", ["m", "k"]), ("b", [2, "k", "n"])], [("y", [2, "m", "n"])])
    for model, sa, sb in ((m1, (2, 3), (3,)), (m2, (), (2,))):
        net = make_net(model, device, kind)
        for M, N, K in ((5, 9, 33), (33, 65, 4), (1, 3, 1)):
            run_vs_ort(model, [{"a": rng.standard_normal(sa + (M, K)).astype(np.float32),
                                "b": rng.standard_normal(sb + (K, N)).astype(np.float32)}],
                       rtol=2e-4, atol=2e-5, net=net)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ta,tb,bias", [(1, 0, "n"), (0, 1, "mn"), (1, 1, "1")])
def test_gemm_transposes_alpha_beta_bias(device, kind, ta, tb, bias):
    rng = np.random.default_rng(2)
    K, N = 37, 67
    w = (rng.standard_normal((N, K) if tb else (K, N)) / 6).astype(np.float32)
    c_shape = {"n": [N], "mn": ["m", N], "1": [1]}[bias]
    model = _model([helper.make_node("Gemm", ["a", "w", "c"], ["y"], transA=ta, transB=tb, alpha=0.75, beta=-1.5)],
                   [("a", [K, "m"] if ta else ["m", K]), ("c", c_shape)], [("y", ["m", N])],
                   [numpy_helper.from_array(w, "w")], opset=13)
    net = make_net(model, device, kind)
    seq = []
    for M in (1, 33, 64, 97, 8):
        c = [M if d == "m" else d for d in c_shape]
        seq.append({"a": rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32),
                    "c": rng.standard_normal(c).astype(np.float32)})
    run_vs_ort(model, seq, rtol=2e-4, atol=2e-5, net=net)


def _mm_add_relu(K=48, N=40, seed=3, residual=True):
    """x[b, s, K] @ W + bias -> Relu (-> + residual r[b, s, N]): the epilogue chain fused into
    the GEMM (bias along N, a residual with the output's shape; static GEMMs fuse only
    operands along N, so their tests leave the residual out)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((K, N)) / 5).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.5, N).astype(np.float32), "bias")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "bias"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r0" if residual else "y"])]
    ins = [("x", ["b", "s", K])]
    if residual:
        nodes.append(helper.make_node("Add", ["r0", "r"], ["y"]))
        ins.append(("r", ["b", "s", N]))
    return _model(nodes, ins, [("y", ["b", "s", N])], inits)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("impls", ["dynamic", "static"])
def test_fused_epilogue_static_and_dynamic(device, kind, impls):
    model = _mm_add_relu(residual=impls == "dynamic")
    net = make_net(model, device, kind, impls=impls)
    rng = np.random.default_rng(4)
    for b, s in ((1, 7), (2, 33), (1, 64), (3, 5), (1, 7)):
        feeds = {"x": rng.standard_normal((b, s, 48)).astype(np.float32)}
        if impls == "dynamic":
            feeds["r"] = rng.standard_normal((b, s, 40)).astype(np.float32)
        run_vs_ort(model, [feeds], rtol=2e-4, atol=2e-5, net=net)
        inst = net.insts[0]
        assert inst.fusion is not None and len(inst.bound) == 1
        assert inst.bound[0].impl.kind == impls
        assert inst.bound[0].call.kernel == ("gemm_lm" if kind == "gpu" else "gemm_rb")


@pytest.mark.parametrize("kind", KINDS)
def test_split_k_with_fused_epilogue(device, kind, monkeypatch):
    """Both split-K paths apply the fused ops in the reduce; on CPUs split-K is off by default,
    so it is turned on there too; the GEMV kernel (tests/test_gemv.py) is turned off."""
    monkeypatch.setattr(mm, "SPLITK_DEVICES", ("gpu", "cpu"))
    monkeypatch.setattr(mm, "GEMV_DEVICES", ())
    K = 1040
    model = _mm_add_relu(K=K, N=36, seed=5)
    net = make_net(model, device, kind)
    rng = np.random.default_rng(6)
    for b, s in ((1, 1), (1, 4), (2, 3), (1, 17)):
        run_vs_ort(model, [{"x": rng.standard_normal((b, s, K)).astype(np.float32),
                            "r": rng.standard_normal((b, s, 36)).astype(np.float32)}],
                   rtol=2e-4, atol=2e-5, net=net)
        if s <= 4:      # a GEMV per batch: split-K on both kinds (turned on above)
            assert _kernels(net) == ["gemm_splitk_partial", "gemm_splitk_reduce"]
        elif kind == "gpu":  # a 1 x 2 grid of 32x32 tiles, K = 1040: gemm_lm splits K
            assert _kernels(net) == ["gemm_lm", "gemm_splitk_reduce"]
        else:
            assert _kernels(net) == ["gemm_rb"]


@pytest.mark.parametrize("kind", KINDS)
def test_static_fake_aligned_rows(device, kind):
    """Static impls (IS_DYNAMIC=0) of both kernels: rows 9..16 share one fake-aligned build;
    the real M comes from the runtime shape_info."""
    model = _mm_add_relu(K=24, N=20, seed=7, residual=False)
    net = make_net(model, device, kind, impls="static")
    sess = ort_session(model)
    rng = np.random.default_rng(8)
    names = set()
    for s in (16, 9, 13):
        feeds = {"x": rng.standard_normal((1, s, 24)).astype(np.float32)}
        assert_close(net.infer(feeds)["y"], sess.run(None, feeds)[0], 2e-4, 2e-5, f"s={s}")
        names.add(net.insts[0].bound[0].impl.name)
    assert len(names) == 1 and "static[M16xN20xK24" in names.pop()


def test_padded_kv_operands_on_gpu_tiles(device):
    """The decode loop's K/V caches are padded buffers fed back in place: gemm_lm walks their
    batches with the buffer's dims (GEMM_MAT_STRIDE). Attention stays unfused, so the cache
    feeds MatMuls."""
    from tests.models import kv_decoder_step
    model = kv_decoder_step()
    net = make_net(model, device, "gpu", attention=False,
                   feedback={"present_k": "past_k", "present_v": "past_v"})
    sess = ort_session(model)
    names = [o.name for o in sess.get_outputs()]
    rng = np.random.default_rng(9)
    past = {"past_k": np.zeros((1, 2, 0, 16), np.float32), "past_v": np.zeros((1, 2, 0, 16), np.float32)}
    padded = 0
    for step in range(12):
        feeds = {"x": rng.standard_normal((1, 1, 32)).astype(np.float32), **past}
        outs = net.infer(feeds, fed_back={"past_k": "present_k", "past_v": "present_v"} if step else {})
        padded += any(l is not None and l.pad for i in net.insts if i.node.op == "MatMul"
                      for l in i.in_layouts)
        ref = dict(zip(names, sess.run(None, feeds)))
        for name in names:
            assert_close(outs[name], ref[name], 2e-4, 2e-5, f"step {step} {name}")
        past = {"past_k": ref["present_k"], "past_v": ref["present_v"]}
    assert padded > 0
