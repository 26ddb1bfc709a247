"""Sibling projections packed into one GEMM (engine/packed_projections.py, cl/gemm.cl SPLIT_N):
which chains are packed, and outputs against onnxruntime over row counts and column counts that
cross the GEMM tiles (a part boundary inside a tile, partial tiles), with the shape-agnostic and
the static impls."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine import Network, build_program
from tests.conftest import assert_close, ort_session


def _projections(n: int, k: int, widths, *, bias=True, swap=(), shared_out=False, seed=0,
                 rank=3) -> onnx.ModelProto:
    """x [b, s, k] (or [s, k]) -> `widths`[i] columns by MatMul(x, W_i) (+ Add bias_i; `swap`:
    chains whose Add reads the bias first) -> Relu; `shared_out`: chain 0's MatMul output is
    also a graph output (read elsewhere: not packable)."""
    rng = np.random.default_rng(seed)
    nodes, inits, outs = [], [], []
    for i, w in enumerate(widths):
        inits.append(numpy_helper.from_array(rng.standard_normal((k, w)).astype(np.float32) / 4, f"W{i}"))
        nodes.append(helper.make_node("MatMul", ["x", f"W{i}"], [f"mm{i}"], name=f"mm{i}"))
        y = f"mm{i}"
        if bias:
            inits.append(numpy_helper.from_array(rng.standard_normal(w).astype(np.float32), f"b{i}"))
            ins = [f"b{i}", y] if i in swap else [y, f"b{i}"]
            nodes.append(helper.make_node("Add", ins, [f"add{i}"], name=f"add{i}"))
            y = f"add{i}"
        nodes.append(helper.make_node("Relu", [y], [f"y{i}"], name=f"relu{i}"))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    if shared_out:
        outs.append(helper.make_tensor_value_info("mm0", TensorProto.FLOAT, None))
    x_shape = ["b", "s", k] if rank == 3 else ["s", k]
    g = helper.make_graph(nodes, "projections", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _parts(prog) -> list:
    return [n.attrs["parts"] for n in prog.nodes if n.op == "gemm_split"]


def _check(model, device, shapes, **kw):
    prog = build_program(model)
    net = Network(prog, device, **kw)
    sess = ort_session(model)
    names = [o.name for o in sess.get_outputs()]
    rng = np.random.default_rng(1)
    for shape in shapes:
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        got = net.infer(feeds)
        for name, want in zip(names, sess.run(None, feeds)):
            assert_close(got[name], want, what=f"{shape} {name}")
    return prog, net


@pytest.mark.parametrize("impls", ["dynamic", "static"])
@pytest.mark.parametrize("widths,k", [((40, 40, 40), 24), ((16, 16, 16), 70), ((33, 33), 9)])
def test_packed_projections_match_onnxruntime(device, static_gemms, impls, widths, k):
    """Rows 1..37 (partial row tiles), 33 and 40 columns a part (a part boundary inside a
    column tile, partial tiles) and 16 (whole tiles, stored by vectors on CPUs)."""
    model = _projections(2, k, widths, swap=(1,))
    prog, net = _check(model, device, [(1, 1, k), (1, 5, k), (2, 37, k), (1, 8, k), (1, 37, k)], impls=impls)
    assert _parts(prog) == [len(widths)]
    split = next(i for i in net.insts if i.node.op == "gemm_split")
    assert [b.impl.kind for b in split.bound] == [impls]


def test_four_siblings_pack_as_two_pairs_and_a_rank_2_input(device):
    model = _projections(2, 12, (8, 8, 8, 8), rank=2)
    prog, _ = _check(model, device, [(3, 12), (20, 12)], impls="dynamic")
    assert _parts(prog) == [2, 2]
    # the separate weights are gone from the program's constants, the packed ones are there
    assert not any(c in prog.constants for c in ("W0", "W1", "b0", "b3"))
    split = next(n for n in prog.nodes if n.op == "gemm_split")
    assert prog.constants[split.inputs[1]].shape == (12, 16)


@pytest.mark.parametrize("what", ["widths", "no_bias", "read_elsewhere", "one", "no_fusion"])
def test_what_is_not_packed(device, what):
    """Chains of different widths, without a bias, whose MatMul output is read elsewhere, a
    lone chain, or a program built without fusion keep their nodes (and still match)."""
    model = {"widths": lambda: _projections(2, 12, (8, 16, 24)),
             "no_bias": lambda: _projections(2, 12, (8, 8, 8), bias=False),
             "read_elsewhere": lambda: _projections(2, 12, (8, 8), shared_out=True),
             "one": lambda: _projections(2, 12, (8,)),
             "no_fusion": lambda: _projections(2, 12, (8, 8, 8))}[what]()
    prog = build_program(model, fusion=what != "no_fusion")
    assert _parts(prog) == []
    if what != "no_fusion":
        _check(model, device, [(1, 7, 12)], impls="dynamic")


def test_large_projections_are_not_packed():
    """The split GEMM has no GEMV or split-K: projections past PACK_MAX_K or PACK_MAX_N stay."""
    from engine.packed_projections import PACK_MAX_K, PACK_MAX_N
    assert _parts(build_program(_projections(2, PACK_MAX_K + 4, (8, 8)))) == []
    assert _parts(build_program(_projections(2, 8, (PACK_MAX_N + 4,) * 2))) == []
    assert _parts(build_program(_projections(2, PACK_MAX_K, (PACK_MAX_N,) * 2))) == [2]
