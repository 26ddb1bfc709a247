"""gemm_rb's vector epilogue (CPUs): a full tile applies ALPHA/BETA, the bias and the fused ops
to FUSED_VW outputs at once (FUSED_VOPS_BODY, cl/common.cl erf_v / exp_v / bcast_vload), a
partial tile and a chain with no vector spelling (Pow) go lane by lane. Against onnxruntime
over shapes that cross the tile (full tiles, partial ones, rows past the last row block), on
the shape-agnostic and the static impls, with operands of each broadcast kind: a scalar, a bias
along N, a residual of the output's shape, a per-row column."""
import math

import numpy as np
import pytest
from onnx import helper, numpy_helper

import engine.ops.matmul as mm
from tests.conftest import run_vs_ort
from tests.test_gemm_tiles import _model, make_net

K = 40
# (batch, seq, N): N = 16, 32 (full tiles of 16 and 32 columns), 48, 33 and 7 (a partial tile);
# seq 1..13 crosses the 8- and 12-row blocks
SHAPES = [(1, 13, 48), (2, 5, 33), (1, 8, 32), (1, 1, 7), (3, 12, 16), (1, 9, 48)]


def _chain_model(N, chain):
    """x[b, s, K] @ W[K, N] + bias, then `chain`: "gelu" (BERT's erf GELU: / sqrt 2, Erf, + 1,
    *, * 0.5), "act" (Relu, Sigmoid * residual r[b, s, N], Tanh * per-row scale c[b, s, 1]),
    "res" (+ residual r[b, s, N]: BERT's output projections; static impls take it too),
    "pow" (Pow by a column of exponents: no vector spelling; by one value, a square or a cube
    is products, engine/fusion.py)."""
    rng = np.random.default_rng(N)
    inits = [numpy_helper.from_array((rng.standard_normal((K, N)) / 4).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.5, N).astype(np.float32), "bias"),
             numpy_helper.from_array(np.array(math.sqrt(2.0), np.float32), "sqrt2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.full(N, 2.0, np.float32), "two")]
    node = helper.make_node
    nodes = [node("MatMul", ["x", "w"], ["h"]), node("Add", ["h", "bias"], ["hb"])]
    ins = [("x", ["b", "s", K])]
    if chain == "gelu":
        nodes += [node("Div", ["hb", "sqrt2"], ["d"]), node("Erf", ["d"], ["e"]),
                  node("Add", ["e", "one"], ["e1"]), node("Mul", ["hb", "e1"], ["m"]),
                  node("Mul", ["m", "half"], ["y"])]
    elif chain == "act":
        nodes += [node("Relu", ["hb"], ["r0"]), node("Sigmoid", ["r0"], ["s0"]),
                  node("Mul", ["s0", "r"], ["s1"]), node("Tanh", ["s1"], ["t0"]),
                  node("Mul", ["t0", "c"], ["y"])]
        ins += [("r", ["b", "s", N]), ("c", ["b", "s", 1])]
    elif chain == "res":
        nodes += [node("Add", ["hb", "r"], ["y"])]
        ins += [("r", ["b", "s", N])]
    else:
        nodes += [node("Pow", ["hb", "two"], ["y"])]
    return _model(nodes, ins, [("y", ["b", "s", N])], inits)


def _feeds(rng, b, s, N, chain):
    f = {"x": rng.standard_normal((b, s, K)).astype(np.float32)}
    if chain in ("act", "res"):
        f["r"] = rng.standard_normal((b, s, N)).astype(np.float32)
    if chain == "act":
        f["c"] = rng.standard_normal((b, s, 1)).astype(np.float32)
    return f


# Each chain on both impls and both tiles, each impls on both tiles, in 8 of the 16 combinations
# (a static impl builds once per N: five cold builds of 1 to 2 s): the tiles differ in rows (8,
# 12) and in vectors a row (TN 16: one, 32: two, FUSED_VW 16 for both), which the chain's vector
# spelling does not see; static impls bake N and the rows (the per-row column keeps them
# dynamic), which it does not see either.
CASES = [("gelu", "dynamic", (8, 16)), ("gelu", "static", (12, 32)),
         ("act", "dynamic", (12, 32)), ("act", "static", (8, 16)),
         ("res", "dynamic", (8, 16)), ("res", "static", (12, 32)),
         ("pow", "dynamic", (12, 32)), ("pow", "static", (8, 16))]


def test_cases_cover_every_pair():
    pairs = lambda i, j: {(c[i], c[j]) for c in CASES}  # noqa: E731
    assert pairs(0, 1) == {(c, i) for c in ("gelu", "act", "res", "pow") for i in ("dynamic", "static")}
    assert pairs(0, 2) == {(c, t) for c in ("gelu", "act", "res", "pow") for t in ((8, 16), (12, 32))}
    assert pairs(1, 2) == {(i, t) for i in ("dynamic", "static") for t in ((8, 16), (12, 32))}


@pytest.mark.parametrize("chain,impls,tile", CASES)
def test_vector_epilogue_matches_ort(device, monkeypatch, static_gemms, tile, impls, chain):
    monkeypatch.setattr(mm, "cpu_tile", lambda M, static=False: tile)
    rng = np.random.default_rng(7)
    for N in sorted({n for _, _, n in SHAPES}):
        model = _chain_model(N, chain)
        net = make_net(model, device, "cpu", impls=impls)
        feeds = [_feeds(rng, b, s, N, chain) for b, s, n in SHAPES if n == N]
        run_vs_ort(model, feeds, rtol=2e-4, atol=2e-5, net=net)
        inst = net.insts[0]
        assert inst.fusion is not None and len(inst.bound) == 1
        if chain != "act":     # the per-row column keeps the dynamic impl (static: rows baked)
            assert inst.bound[0].impl.kind == impls
        jit = dict(inst.bound[0].call.jit)
        assert ("FUSED_VOPS_BODY" in jit) == (chain != "pow")
        assert "erf_v(" in jit.get("FUSED_VOPS_BODY", "erf_v(") or chain != "gelu"


def test_erf_v_extremes(device):
    """erf_v and exp_v (in Erf fused into a MatMul by the identity) at the branch point
    (|x| = 0.5), past exp's clamp, at 0 and at huge magnitudes."""
    vals = np.array([0.0, 1e-30, 0.5, -0.5, 0.4999999, 0.5000001, 3.0, -3.0, 9.5, -12.0, 0.1,
                     -0.2, 1e30, -1e30, 20.0, 1e4], np.float32)
    x = np.stack([vals, -vals])
    model = _model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Erf", ["h"], ["y"])],
                   [("x", ["m", 16])], [("y", ["m", 16])],
                   [numpy_helper.from_array(np.eye(16, dtype=np.float32), "w")])
    net = make_net(model, device, "cpu")
    out = net.infer({"x": x})["y"]
    assert "erf_v(" in dict(net.insts[0].bound[0].call.jit)["FUSED_VOPS_BODY"]
    ref = np.array([math.erf(float(v)) for v in x.ravel()], np.float32).reshape(x.shape)
    np.testing.assert_allclose(out, ref, rtol=0, atol=3e-7)
