"""Compiled shape functions (engine/symbolic.py, engine/fast_path/shape_fns.py): an op's shape
Python traced on symbolic dims and compiled gives, for new dims, exactly what the op's Python
gives, or None where a branch it took no longer holds.

The unit tests trace small functions; the property tests run BERT- and GPT-2-style networks
over random shape sequences (batch changes, growth, shrink, decode with the KV cache fed back,
fusion on and off, CPU and GPU kernel variants) with every compiled answer checked against the
op's Python (`ShapeFns.check`), outputs against onnxruntime, and the fast path (which takes
the compiled answers) against the flow."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import Network, build_program
from engine.kernels import KernelCall, round_up
from engine.layout import Layout
from engine.symbolic import Escape, Session, args_of, trace
from tests.models import bert_encoder, gpt2_decoder_step
from tests.test_partial_replay import SETTINGS, _same
from tests.test_steady_steps import _gpt2_steps


def _tiles(ls):
    """Shape code of the kinds ops have: a broadcast check, a product, a tile choice, a
    rounded-up work size, a kernel call rebuilt with new parameters."""
    a, b = ls
    m, k = a.shape[-2], a.shape[-1]
    if b.shape[0] != k:
        raise ValueError("no chain")
    n = b.shape[1]
    rows = 1
    for d in a.shape[:-1]:
        rows = rows * d
    tile = 8 if m <= 16 else 32
    call = KernelCall("gemm", "g", (("T", "float"),), (("in", 0), ("in", 1), ("out", 0)),
                      params=(rows, n, max(k, 4)), gws=(round_up(n, tile), (rows + tile - 1) // tile))
    return [Layout(a.shape[:-1] + (n,), a.dtype)], call


def test_a_traced_function_gives_the_ops_answer_for_new_dims_or_none():
    a, b = Layout((2, 5, 7)), Layout((7, 3))
    got, fn = trace(_tiles, [a, b])
    assert got == _tiles([a, b])
    for dims in [(2, 9, 7), (4, 16, 7), (1, 1, 7), (3, 11, 7)]:
        ins = [Layout(dims), Layout((7, 3))]
        assert fn.fn(*args_of(ins, frozenset())) == _tiles(ins)
    # m past the tile threshold, k past max's: the branch taken differs, a guard says so
    assert fn.fn(*args_of([Layout((2, 17, 7)), b], frozenset())) is None
    assert fn.fn(*args_of([Layout((2, 5, 2)), Layout((2, 3))], frozenset())) is None
    # a constant input's layout stays out of the arguments (it is part of the key)
    got, fn = trace(_tiles, [a, b], fixed=frozenset({1}))
    assert fn.fn(*args_of([Layout((6, 3, 7)), b], frozenset({1}))) == _tiles([Layout((6, 3, 7)), b])


def _tile_by_size(m: int) -> int:
    return 8 if m <= 16 else 16 if m <= 64 else 32


def test_a_piecewise_choice_is_a_value_of_the_traced_function_not_a_guard():
    """symbolic.piecewise: a choice by size (a tile) computed by its function when the traced
    function runs, so the one function serves every range; the same choice made with an `if`
    is a guard and the trace serves only its range."""
    from engine.symbolic import piecewise

    def by_value(ls):
        return ls[0].shape[0] * piecewise(_tile_by_size, ls[0].shape[1])

    def by_guard(ls):
        return ls[0].shape[0] * _tile_by_size(ls[0].shape[1])
    a = Layout((3, 10))
    got, fn = trace(by_value, [a])
    _, guarded = trace(by_guard, [a])
    assert got == 24
    for m in (1, 16, 17, 64, 65, 1000):
        assert fn.fn(*args_of([Layout((5, m))], frozenset())) == 5 * _tile_by_size(m)
    assert guarded.fn(*args_of([Layout((5, 17))], frozenset())) is None
    assert piecewise(_tile_by_size, 70) == 32        # no Sym: the plain call


@pytest.mark.parametrize("op", [lambda d: int(d), lambda d: hash(d), lambda d: np.asarray([d]),
                                lambda d: d / 2, lambda d: range(d), lambda d: float(d)])
def test_what_a_dim_cannot_follow_escapes(op):
    with pytest.raises(Escape):
        trace(lambda ls: op(ls[0].shape[0]), [Layout((3,))])


def _check(net):
    fns = net.fast.shape_fns
    fns.check = True
    return fns


BERT = dict(layers=2, d_model=32, heads=2, ff=64, vocab=100, max_pos=160)


def _bert_steps(shapes, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for b, s in shapes:
        mask = np.ones((b, s), np.int64)
        mask[:, s - max(s // 4, 0):] = 0 if s > 2 else 1
        out.append(({"input_ids": rng.integers(0, 100, (b, s)).astype(np.int64), "attention_mask": mask}, False))
    return out


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
@pytest.mark.parametrize("fusion", [True, False])
@given(shapes=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 140)), min_size=3, max_size=6))
@SETTINGS
def test_bert_over_random_shapes_takes_compiled_answers_equal_to_the_ops(device, kind, fusion, shapes):
    """Random (batch, length) sequences: growth, shrink, repeats, batch changes. Every compiled
    answer is checked against the op's Python as it is taken; the outputs match onnxruntime;
    the fast path and the flow decide the same."""
    import onnxruntime as ort
    model = bert_encoder(**BERT)
    prog = build_program(model, fusion=fusion)
    steps = _bert_steps(shapes)
    net = Network(prog, device, impls="dynamic")
    net.impls.device_type = kind
    fns = _check(net)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feeds, _ in steps:
        got = net.infer(feeds)["last_hidden_state"]
        want = sess.run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    new = len({s for s in shapes}) - 1
    assert fns.escapes == {}
    if new >= 2:
        assert fns.hits > 0
    if kind == "cpu":
        _same(prog, steps, device)


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_a_gpt2_decode_takes_compiled_answers_equal_to_the_ops(device, kind):
    """A 5-token prompt then 30 tokens fed back, the attention mask growing: the KV appends,
    attentions and position ops answer each step from compiled functions."""
    prog = build_program(gpt2_decoder_step(layers=2))
    steps = _gpt2_steps(5, 30, mask=True)
    from tests.test_steady_steps import GPT2_FEEDBACK
    net = Network(prog, device, impls="dynamic", feedback={k: v for k, v in GPT2_FEEDBACK.items()
                                                           if k.endswith(("_0", "_1"))})
    net.impls.device_type = kind
    fns = _check(net)
    back = {v: k for k, v in net.feedback.items()}
    for feeds, fed in steps:
        net.infer(feeds, fed_back=back if fed else None)
    assert fns.escapes == {}
    assert fns.hits >= 30


def test_a_call_with_no_shape_in_it_is_a_new_object_per_answer(device):
    """NonZero's count kernel: its call has no field that depends on the shapes (its dims come
    from the input's layout), so every compiled answer is the same call but for its identity,
    which the flow's shape_info memo keys on. Shapes (0, 2, 0) -> (2, 2, 1) -> (2, 3, 2) gave
    the second shape's count kernel the first one's dims (a count of 2 for 5, and heap damage
    on PoCL) when the compiled function handed back one call object."""
    from onnx import TensorProto
    from tests.test_nonzero import nonzero_alone
    from tests.conftest import run_vs_ort
    rng = np.random.default_rng(0)
    feeds = []
    for shape in [(0, 2, 0), (2, 2, 1), (2, 3, 2), (3, 3, 2), (1, 1, 1)]:
        x = rng.standard_normal(shape).astype(np.float32)
        x[x < 0] = 0
        feeds.append({"x": x})
    run_vs_ort(nonzero_alone(TensorProto.FLOAT, ["a", "b", "c"]), feeds, device)


def test_shape_values_that_change_every_inference_are_not_traced_each_time(device):
    """Reshape(x, Shape(x)[0] * 8): the Reshape's target (a shape value) changes with every new
    row count along with its input, a new key each time. A key's first miss is answered by the
    op's Python (a trace costs several times what it replaces once); a key that comes back is
    traced."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from tests.conftest import run_vs_ort
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Mul", ["n", "eight"], ["target"]),
             helper.make_node("Reshape", ["x", "target"], ["flat"]),
             helper.make_node("Relu", ["flat"], ["y"])]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([8], np.int64), "eight")]
    model = helper.make_model(helper.make_graph(
        nodes, "flatten", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m"])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    rng = np.random.default_rng(0)
    feeds = lambda rows: [{"x": rng.standard_normal((n, 8)).astype(np.float32)} for n in rows]
    net = Network(build_program(model), device)
    fns = _check(net)
    run_vs_ort(model, feeds([2]), device, net=net)
    first = fns.traced
    run_vs_ort(model, feeds(range(3, 14)), device, net=net)
    assert fns.traced == first          # eleven new shape values, no trace
    run_vs_ort(model, feeds([3, 6, 4, 6]), device, net=net)
    assert fns.traced > first           # rows that came back: their keys were traced


def test_equal_layouts_share_their_dims_under_a_guard():
    """Session.layout(share=True): a layout equal to an earlier one computes with its dims (one
    set of expressions for a decode step's caches), and the function gives None when the two
    differ at a later call, so it never answers for dims it was not traced for."""
    s = Session()
    first = Layout((1, 12, 7, 64), "f32", "bfyx", (1, 12, 10, 64))
    with s:
        a = s.layout(first, share=True)
        b = s.layout(first, share=True)
        c = s.layout(Layout((1, 12, 8, 64), "f32"), share=True)   # another layout: its own dims
        assert b is a and c is not a
        fn, src = s.function("f", f"({s.source(b.shape[2] + 1)}, {s.source(c.shape[2] * 2)})")
    assert src.count("!=") == 1                        # the one guard of the shared layout
    same = Layout((1, 12, 9, 64), "f32", "bfyx", (1, 12, 10, 64))
    assert fn(*args_of([same, same, Layout((1, 12, 3, 64), "f32")], ())) == (10, 6)
    apart = Layout((1, 12, 8, 64), "f32", "bfyx", (1, 12, 10, 64))
    assert fn(*args_of([same, apart, Layout((1, 12, 3, 64), "f32")], ())) is None
    s = Session()                                      # scalars: nothing to share, no guard
    with s:
        s.layout(Layout((), "i64"), share=True)
        s.layout(Layout((), "i64"), share=True)
        fn, src = s.function("g", "(1, )")
    assert "!=" not in src and fn() == (1,)
