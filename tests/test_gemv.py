"""The GEMV kernels (cl/gemm.cl gemv and gemv_t: at most 4 rows times a weight with no
batch dims, GPUs) against onnxruntime, over shapes that cross their tiles: N around the 32, 64
and 128 columns of a work-group and not a multiple of 4 (B's rows unaligned: the per-float
load path), K odd and around the rows a work-group steps by (4 x slices x quads per step), K
split across work-groups or not, 1..4 rows from M or from a batch dim (builds of 1, 2 and 4
rows). The suite runs on PoCL: the engine is told the device is a GPU (tests/test_gemm_tiles.py
make_net), which picks the GEMV there."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import engine.ops.matmul as mm
from tests.conftest import assert_close_for, ort_session, run_vs_ort
from tests.test_gemm_tiles import _kernels, _model, make_net, matmul_feeds, matmul_model

SPLIT = ["gemm_splitk_reduce"]


def _expect_split(N, K, trans_b=False):
    """Whether the engine's choice splits K for this shape (mirrors engine/ops/matmul.py gemv)."""
    if trans_b:
        _, cols, _, target = mm.GEMV_T_TILE
    else:
        wx, _, _, target = mm.gemv_tile(N, K)
        cols = 4 * wx
    groups = -(-N // cols)
    return max(1, min(-(-target // groups), K // mm.GEMV_MIN_CHUNK)) > 1


def _gemv_kernels(M, N, K, trans_b=False):
    name = "gemv_t" if trans_b else "gemv"
    return [name] + (SPLIT if _expect_split(N, K, trans_b) else [])


# Tiles forced on top of the engine's table: (WX, KY, U, G) with the split target G (0: one
# kernel): the defaults' shapes, U = 3 (K crosses whole steps of 3 quads and single quads),
# 64- and 128-column groups, splits at small K.
TILES = [None, (8, 32, 3, 0), (32, 8, 1, 264), (16, 16, 4, 0), (8, 4, 2, 10 ** 6)]


def test_table_widths():
    """N >= 8192: the widest columns with >= 256 work-groups; below, 16 columns x 64 slices
    (a weight of at most GEMV_SMALL elements at least twice as tall as wide: 128 slices)."""
    assert [mm.gemv_tile(n, 768)[:2] for n in (8200, 16390, 32000, 50257, 4096, 3072, 384)] == \
        [(8, 32), (16, 16), (16, 16), (32, 8), (4, 64), (4, 64), (4, 128)]
    assert [mm.gemv_tile(n, k)[:3] for n, k in ((4096, 4096), (4096, 11008), (768, 3072), (3072, 768))] == \
        [(4, 64, 2), (4, 64, 2), (4, 128, 4), (4, 64, 4)]


# (M, N, K): N around a work-group's 32 to 128 columns (and 4-column vectors: N % 4 != 0 reads B
# per float), K odd, below and above a work-group's row step and GEMV_MIN_CHUNK (a split tile
# splits K >= 128: the last split shorter, with a tail of < 4 rows); N >= 8192 picks 32-, 64-
# and 128-column work-groups.
SHAPES = [(1, 1, 1), (1, 3, 5), (2, 127, 31), (3, 128, 32), (4, 129, 33), (1, 130, 513),
          (4, 256, 1031), (2, 517, 67), (1, 1000, 129), (3, 64, 2047), (1, 8, 4), (4, 385, 255),
          (1, 8200, 9), (2, 16390, 7), (1, 33000, 5)]


# The rows of A a forced tile takes (M of every shape in turn): each build of rows (1, 2 or 4,
# a cold PoCL build of 2 to 7 s each) is its own JIT constant, and the table's tile runs all
# three over SHAPES. A forced tile changes the columns, slices and quads (WX, KY, U) and the
# split, which the rows only repeat (an accumulator per row): each forced tile takes every N
# and K of SHAPES with one or two row builds, and together they take each build, split and not
# (the split's rows 1 and 2 on (32, 8, 1, 264), 4 on (8, 4, 2, 10**6); 3 rows compute a
# repeated 4th, so M = 3 and 4 share a build).
TILE_ROWS = {(8, 32, 3, 0): (3, 4), (32, 8, 1, 264): (1, 2), (16, 16, 4, 0): (1,), (8, 4, 2, 10 ** 6): (4, 3)}


@pytest.mark.parametrize("tile", TILES)
def test_matmul_gemv_shapes_cross_tiles(device, tile, monkeypatch):
    """Both operands are inputs, so one Network sees every shape (the shape-agnostic build)."""
    shapes = SHAPES
    if tile:
        monkeypatch.setattr(mm, "gemv_tile", lambda N, K: tile)
        rows = TILE_ROWS[tile]
        shapes = [(rows[i % len(rows)], N, K) for i, (_, N, K) in enumerate(SHAPES)]
    model = matmul_model()
    net = make_net(model, device, "gpu")
    rng = np.random.default_rng(0)
    seen, builds = set(), set()
    for M, N, K in shapes:
        run_vs_ort(model, [matmul_feeds(rng, M, N, K)], rtol=2e-4, atol=3e-5, net=net)
        assert _kernels(net) == _gemv_kernels(M, N, K), (M, N, K)
        assert dict(net.insts[0].bound[0].call.jit)["GV_ROWS"] == mm.gemv_rows(M)
        seen.add(len(_kernels(net)))
        builds.add((mm.gemv_rows(M), len(_kernels(net))))
    if tile is None:
        assert seen == {1}              # the table never splits K
        assert {r for r, _ in builds} == {1, 2, 4}
    elif tile[3]:
        assert seen == {1, 2}           # split and unsplit both ran
        assert builds == {(mm.gemv_rows(r), s) for r in TILE_ROWS[tile] for s in (1, 2)}


def test_forced_tiles_take_every_row_build_split_and_not():
    split = {mm.gemv_rows(r) for t, rows in TILE_ROWS.items() if t[3] for r in rows}
    assert set(TILE_ROWS) == set(TILES[1:]) and split == {1, 2, 4}


def test_gemv_offsets_unaligned(device):
    """x sliced at an odd offset (a Slice view): A's 128-bit loads need an aligned offset, so
    the kernel reads it per float; B's rows 16-byte aligned (N % 4 == 0) take float4 loads."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((95, 132)) / 10).astype(np.float32)
    starts = numpy_helper.from_array(np.array([1], np.int64), "st")
    ends = numpy_helper.from_array(np.array([96], np.int64), "en")
    axes = numpy_helper.from_array(np.array([1], np.int64), "ax")
    model = _model([helper.make_node("Slice", ["x", "st", "en", "ax"], ["xs"]),
                    helper.make_node("MatMul", ["xs", "w"], ["y"])],
                   [("x", ["m", 97])], [("y", ["m", 132])],
                   [numpy_helper.from_array(w, "w"), starts, ends, axes])
    net = make_net(model, device, "gpu")
    run_vs_ort(model, [{"x": rng.standard_normal((m, 97)).astype(np.float32)} for m in (1, 4, 3)],
               rtol=2e-4, atol=3e-5, net=net)
    mm_inst = next(i for i in net.insts if i.node.op == "MatMul")
    assert [b.call.kernel for b in mm_inst.bound] == ["gemv"]


@pytest.mark.parametrize("n_split", [(40, 96), (1030, 600)])
def test_batched_rows_and_vector(device, n_split):
    """x [B, M, K] @ W[K, N] with B x M <= 4 (rows from the batch dim), then more rows (the
    tiled GEMM); a 1-D x [K] (M = 1, output [N])."""
    N, K = n_split
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                   [("x", ["b", "m", K])], [("y", ["b", "m", N])], [numpy_helper.from_array(w, "w")])
    net = make_net(model, device, "gpu")
    for b, m in ((2, 2), (4, 1), (1, 3), (3, 1), (2, 1), (2, 3), (1, 1)):
        run_vs_ort(model, [{"x": rng.standard_normal((b, m, K)).astype(np.float32)}],
                   rtol=2e-4, atol=3e-5, net=net)
        want = _gemv_kernels(b * m, N, K) if b * m <= 4 else None
        if want:
            assert _kernels(net) == want, (b, m)
        else:
            assert _kernels(net)[0] in ("gemm_lm", "gemm_splitk_partial"), (b, m)
    vec = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [K])], [("y", [N])],
                 [numpy_helper.from_array(w, "w")])
    net = make_net(vec, device, "gpu")
    run_vs_ort(vec, [{"x": rng.standard_normal(K).astype(np.float32)}], rtol=2e-4, atol=3e-5, net=net)
    assert _kernels(net) == _gemv_kernels(1, N, K)


# (ta, tb, bias, N, K, rows M in turn): each row build (1, 2, 4; 3 rows compute a repeated
# 4th) is a JIT constant, a cold PoCL build each (3 to 7 s for gemv's table tile of 4 quads a
# step). gemv_t unsplit takes the three builds; split, 4 and 2 with a bias of the output's shape
# (read per row), 1 and 4 with transA; gemv takes 2 and 4 with transA and a bias read per row,
# 1 and 4 with the bias along N (the same for every row). So each kernel runs each build, split
# and not, with the epilogue, and transA with more than one row.
@pytest.mark.parametrize("ta,tb,bias,N,K,rows", [(0, 1, "n", 67, 37, (1, 4, 3, 2)),
                                                 (0, 1, "mn", 21, 1500, (4, 3, 2)),
                                                 (1, 1, "1", 133, 301, (1, 4, 3)),
                                                 (1, 0, "mn", 259, 650, (2, 4, 3)),
                                                 (0, 0, "n", 130, 77, (1, 3))])
def test_gemm_trans_alpha_beta_bias(device, ta, tb, bias, N, K, rows):
    """Gemm with transA / transB (gemv_t reads B's rows along K), ALPHA, BETA and a bias along
    N, of the output's shape, or a scalar; split and unsplit; 3 quads per unrolled step."""
    mm_t, mm.GEMV_T_TILE = mm.GEMV_T_TILE, (32, 8, 3, 264)
    try:
        _gemm_trans(device, ta, tb, bias, N, K, rows)
    finally:
        mm.GEMV_T_TILE = mm_t


def _gemm_trans(device, ta, tb, bias, N, K, rows):
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((N, K) if tb else (K, N)) / np.sqrt(K)).astype(np.float32)
    c_shape = {"n": [N], "mn": ["m", N], "1": [1]}[bias]
    model = _model([helper.make_node("Gemm", ["a", "w", "c"], ["y"], transA=ta, transB=tb, alpha=0.75, beta=-1.5)],
                   [("a", [K, "m"] if ta else ["m", K]), ("c", c_shape)], [("y", ["m", N])],
                   [numpy_helper.from_array(w, "w")], opset=13)
    net = make_net(model, device, "gpu")
    for M in rows:
        c = [M if d == "m" else d for d in c_shape]
        feeds = {"a": rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32),
                 "c": rng.standard_normal(c).astype(np.float32)}
        run_vs_ort(model, [feeds], rtol=2e-4, atol=3e-5, net=net)
        assert _kernels(net) == _gemv_kernels(M, N, K, trans_b=bool(tb)), M


def _mm_add_relu_residual(K, N, seed):
    """x[b, s, K] @ W + bias -> Relu -> + r[b, s, N]: the chain fused into the GEMV's store
    (unsplit) or into gemm_splitk_reduce (split)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.5, N).astype(np.float32), "bias")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "bias"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r0"]), helper.make_node("Add", ["r0", "r"], ["y"])]
    return _model(nodes, [("x", ["b", "s", K]), ("r", ["b", "s", N])], [("y", ["b", "s", N])], inits)


@pytest.mark.parametrize("K,N,tile", [(96, 1030, None), (1040, 36, None), (1040, 36, (32, 8, 1, 264))])
def test_fused_epilogue(device, K, N, tile, monkeypatch):
    if tile:    # K split 16 ways: the fused ops run in gemm_splitk_reduce
        monkeypatch.setattr(mm, "gemv_tile", lambda N, K: tile)
    model = _mm_add_relu_residual(K, N, seed=4)
    net = make_net(model, device, "gpu")
    rng = np.random.default_rng(5)
    for b, s in ((1, 1), (1, 4), (2, 2), (1, 3)):
        run_vs_ort(model, [{"x": rng.standard_normal((b, s, K)).astype(np.float32),
                            "r": rng.standard_normal((b, s, N)).astype(np.float32)}],
                   rtol=2e-4, atol=3e-5, net=net)
        inst = net.insts[0]
        assert inst.fusion is not None
        assert _kernels(net) == _gemv_kernels(b * s, N, K)
        assert len(_kernels(net)) == (2 if tile else 1)
        # the kernel that stores the output carries the fused ops
        assert "FUSED_OPS_BODY" in dict(inst.bound[-1].call.jit)


def test_float16_model(device):
    """A float16 MatMul (weights and activations in half) runs the float32 GEMV between the
    Casts the program inserts (engine/f16.py); half tolerances."""
    rng = np.random.default_rng(6)
    K, N = 300, 261
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float16)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["m", K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["m", N])],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    net = make_net(model, device, "gpu")
    sess = ort_session(model)
    for m in (1, 4):
        feeds = {"x": rng.standard_normal((m, K)).astype(np.float16)}
        assert_close_for(net.infer(feeds)["y"], sess.run(None, feeds)[0], f"m={m}")
    kernels = [b.call.kernel for i in net.insts if i.node.op == "MatMul" for b in i.bound]
    assert kernels == _gemv_kernels(4, N, K)


def test_cpu_keeps_register_tile(device):
    """On CPUs the GEMV is off (PoCL: see GEMV_DEVICES): gemm_rb as before."""
    model = matmul_model()
    net = make_net(model, device, "cpu")
    rng = np.random.default_rng(7)
    run_vs_ort(model, [{"a": rng.standard_normal((1, 64)).astype(np.float32),
                        "b": rng.standard_normal((64, 40)).astype(np.float32)}], net=net)
    assert _kernels(net) == ["gemm_rb"]
