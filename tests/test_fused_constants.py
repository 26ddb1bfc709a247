"""One-value float constants of a fused chain are written into its kernel as literals (engine/
fusion.py _operands): GPT-2's tanh GELU reads only its bias, Pow by 2 or 3 is products. Against
onnxruntime on a GPU kind device (the decode GEMV and gemm_lm epilogues) and a CPU kind one
(gemm_rb's lane and vector epilogues), with a constant of rank 2 that would grow a 1-D product
(the fusion gives way to the nodes), extreme values and a non-integer exponent."""
import math

import numpy as np
import pytest
from onnx import helper, numpy_helper

from engine.fusion import c_literal
from tests.conftest import ort_session, run_vs_ort
from tests.test_gemm_tiles import _model, make_net
from traces import MemoryTrace

K, N = 24, 40


def _scalar(name, v, shape=()):
    return numpy_helper.from_array(np.full(shape, v, np.float32), name)


def _gelu_tanh_model():
    """x[b, s, K] @ W + bias, then GPT-2's GELU: 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3)))."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((K, N)) / 3).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.5, N).astype(np.float32), "bias"),
             _scalar("three", 3.0), _scalar("c", 0.044715), _scalar("k", math.sqrt(2 / math.pi)),
             _scalar("half", 0.5), _scalar("one", 1.0)]
    node = helper.make_node
    nodes = [node("MatMul", ["x", "w"], ["h"]), node("Add", ["h", "bias"], ["hb"]),
             node("Pow", ["hb", "three"], ["p"]), node("Mul", ["p", "c"], ["pc"]),
             node("Add", ["hb", "pc"], ["inner"]), node("Mul", ["inner", "k"], ["ik"]),
             node("Mul", ["hb", "half"], ["hh"]), node("Tanh", ["ik"], ["t"]),
             node("Add", ["t", "one"], ["t1"]), node("Mul", ["hh", "t1"], ["y"])]
    return _model(nodes, [("x", ["b", "s", K])], [("y", ["b", "s", N])], inits)


def _feeds(rng, shapes):
    return [{"x": rng.standard_normal(s).astype(np.float32)} for s in shapes]


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_gelu_tanh_reads_only_its_bias(device, kind):
    model = _gelu_tanh_model()
    net = make_net(model, device, kind)
    f = net.insts[0].node.fusion
    assert f.extra == ["bias"] and len(f.ops) == 9
    assert f.ops[1].expr == "(a * a * a)" and f.ops[1].operands == [("v", 1), ("c", ("(3.0f)", 0))]
    # decode rows (a GEMV on a GPU kind) and prompt rows
    run_vs_ort(model, _feeds(np.random.default_rng(0), [(1, 1, K), (1, 7, K), (2, 3, K), (1, 1, K)]),
               rtol=2e-4, atol=2e-5, net=net)
    jit = dict(net.insts[0].bound[-1].call.jit)
    body = jit["FUSED_OPS_BODY"]
    assert "(0.044715f)" in body and "(0.5f)" in body and "pow(" not in body
    assert "F0" in jit["FUSED_PARAMS"] and "F1" not in jit["FUSED_PARAMS"]


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
@pytest.mark.parametrize("exponent", [2.0, 3.0, 2.5])
def test_pow_by_one_value(device, kind, exponent):
    """Relu then Pow by a scalar: a square and a cube are products, 2.5 stays powf; onnxruntime's
    values either way."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal((K, N)) / 3).astype(np.float32), "w"),
             _scalar("e", exponent)]
    node = helper.make_node
    model = _model([node("MatMul", ["x", "w"], ["h"]), node("Relu", ["h"], ["r"]), node("Pow", ["r", "e"], ["y"])],
                   [("x", ["b", "s", K])], [("y", ["b", "s", N])], inits)
    net = make_net(model, device, kind)
    pow_op = net.insts[0].node.fusion.ops[1]
    assert (pow_op.expr == "pow((float)a, (float)b)") == (exponent == 2.5)
    run_vs_ort(model, _feeds(rng, [(1, 1, K), (2, 5, K)]), rtol=2e-4, atol=2e-5, net=net)


@pytest.mark.parametrize("op,value", [("Add", 0.25), ("Pow", 2.0)])
def test_a_constant_that_would_grow_the_product_unfuses(device, op, value):
    """Relu(x) of a 1-D x; adding a [1, 1] constant (or raising to a [1, 1] power, written as a
    product) makes it [1, N]: the literal cannot broadcast in the kernel, so the fusion gives
    way (broadcast_grows_output) and the nodes run alone."""
    rng = np.random.default_rng(9)
    node = helper.make_node
    model = _model([node("Relu", ["x"], ["h"]), node(op, ["h", "c"], ["y"])],
                   [("x", [N])], [("y", [1, N])], [_scalar("c", value, (1, 1))])
    trace = MemoryTrace()
    net = make_net(model, device, "gpu", trace=trace)
    assert net.insts[0].node.fusion.ops[0].operands == [("v", 0), ("c", (f"({value}f)", 2))]
    run_vs_ort(model, [{"x": rng.standard_normal(N).astype(np.float32)}], net=net)
    assert [e["reason"] for e in trace.of(0, "fusion", "unfuse")] == ["broadcast_grows_output"]


def test_extreme_values_are_exact(device):
    """float32's lowest, its smallest normal and the infinities survive the literal exactly."""
    lowest = float(np.finfo(np.float32).min)
    assert c_literal(lowest) == "(-3.4028235e+38f)" and c_literal(-math.inf) == "(-INFINITY)"
    assert c_literal(math.nan) == "NAN" and c_literal(0.1) == "(0.1f)"
    rng = np.random.default_rng(11)
    tiny = float(np.finfo(np.float32).tiny)
    inits = [numpy_helper.from_array((rng.standard_normal((K, N)) / 3).astype(np.float32), "w"),
             _scalar("lo", lowest), _scalar("tiny", tiny)]
    node = helper.make_node
    model = _model([node("MatMul", ["x", "w"], ["h"]), node("Mul", ["h", "tiny"], ["t"]),
                    node("Add", ["t", "lo"], ["y"])], [("x", ["s", K])], [("y", ["s", N])], inits)
    net = make_net(model, device, "gpu")
    assert [op.operands[1][0] for op in net.insts[0].node.fusion.ops] == ["c", "c"]
    feeds = {"x": rng.standard_normal((3, K)).astype(np.float32)}
    out = net.infer(feeds)["y"]
    ref = ort_session(model).run(None, feeds)[0]
    assert np.array_equal(out, ref) and np.all(out == np.float32(lowest))
