"""Math, rounding, trigonometric and indexing ops over shape sequences (growth, shrink,
repeats) on one Network each, against onnxruntime: the node tests run one shape per network; here the shape-agnostic kernels see the
shapes change under them. Einsum's GEMM path (float32 matrix products) is covered here."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import run_vs_ort

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(nodes, inputs, outputs, opset=18):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("eq,a,b", [
    ("bhqd,bhkd->bhqk", (1, 2, 5, 8), (1, 2, 7, 8)),      # attention scores: B transposed
    ("bhqk,bhkd->bhqd", (2, 2, 5, 7), (2, 2, 7, 8)),      # attention context: plain batched GEMM
    ("bid,bjd->bji", (2, 4, 6), (2, 3, 6)),               # result in another letter order
    ("ij,jk->ik", (5, 7), (7, 3)),
    ("...ij,...jk->...ik", (2, 3, 4, 5), (2, 3, 5, 6)),   # ellipsis
    ("bij->bj", (3, 4, 5), None),                          # a sum: loop kernel
])
def test_einsum_over_shapes(device, eq, a, b):
    rng = np.random.default_rng(0)
    names = ["a"] + (["b"] if b else [])
    dyn = lambda s: [f"d{i}" for i in range(len(s))]
    model = _model([helper.make_node("Einsum", names, ["y"], equation=eq)],
                   [(n, F, dyn(s)) for n, s in zip(names, (a, b))], [("y", F, None)], opset=12)
    seq = []
    for scale in (1, 2, 1, 1, 3):   # grow, shrink, repeat: scale the letters that only one operand has
        sa = tuple(d * scale if k == len(a) - 2 else d for k, d in enumerate(a))
        feeds = {"a": _randn(rng, *sa)}
        if b:
            feeds["b"] = _randn(rng, *b)
        seq.append(feeds)
    net = run_vs_ort(model, seq, device, rtol=1e-4, atol=1e-5)
    gemm = any(c.source == "gemm" for i in net.insts for c in [b.call for b in i.bound])
    assert gemm == (eq.count(",") == 1)   # the ellipsis letters are batch letters too


def test_sdpa_mask_ops_on_device_inputs(device):
    """Range from device scalars, GatherElements, GreaterOrEqual, And, Not, IsNaN, Where."""
    model = _model([
        helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
        helper.make_node("Unsqueeze", ["r", "ax0"], ["r2"]),
        helper.make_node("Expand", ["r2", "mshape"], ["idx"]),
        helper.make_node("GatherElements", ["mask", "idx"], ["g"], axis=1),
        helper.make_node("Cast", ["g"], ["gb"], to=B),
        helper.make_node("GreaterOrEqual", ["r", "start"], ["ge"]),
        helper.make_node("And", ["gb", "ge"], ["keep"]),
        helper.make_node("Not", ["keep"], ["drop"]),
        helper.make_node("Div", ["x", "x"], ["nan_at_zero"]),
        helper.make_node("IsNaN", ["nan_at_zero"], ["isnan"]),
        helper.make_node("Or", ["drop", "isnan"], ["out_mask"]),
        helper.make_node("Where", ["out_mask", "zero", "x"], ["y"]),
    ], [("start", I64, []), ("limit", I64, []), ("delta", I64, []), ("ax0", I64, [1]),
        ("mshape", I64, [2]), ("mask", I64, ["b", "s"]), ("x", F, ["b", "s"]), ("zero", F, [])],
        [("y", F, None)])
    rng = np.random.default_rng(1)
    seq = []
    for b, s in [(1, 4), (2, 9), (2, 9), (1, 3), (3, 12)]:
        x = _randn(rng, b, s)
        x[0, 0] = 0
        seq.append({"start": np.array(0, np.int64), "limit": np.array(s, np.int64),
                    "delta": np.array(1, np.int64), "ax0": np.array([0], np.int64),
                    "mshape": np.array([b, s], np.int64), "mask": (rng.random((b, s)) > 0.3).astype(np.int64),
                    "x": x, "zero": np.array(0, np.float32)})
    run_vs_ort(model, seq, device)


def test_range_float16_over_lengths(device):
    """Range-27's float16: start + i * delta computed in float32, rounded once to half (as
    onnxruntime); lengths change between inferences, a descending range among them; the result
    feeds a float16 Mul."""
    H = TensorProto.FLOAT16
    model = _model([helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
                    helper.make_node("Mul", ["r", "r"], ["sq"])],
                   [(n, H, []) for n in ("start", "limit", "delta")], [("r", H, None), ("sq", H, None)],
                   opset=27)
    seq = [{"start": np.array(a, np.float16), "limit": np.array(b, np.float16),
            "delta": np.array(c, np.float16)}
           for a, b, c in [(0.5, 60, 0.3), (1, 5, 2), (-3.25, 7.5, 0.125), (10, -2, -0.7), (1, 5, 2)]]
    run_vs_ort(model, seq, device, rtol=4e-3, atol=1e-3)   # a few half ulps (the Mul)


@pytest.mark.parametrize("elem,opset", [(F, 12), (F, 13), (TensorProto.FLOAT16, 13)])
def test_dropout_mask_output(device, elem, opset):
    """Dropout's mask (inference, and training_mode=1 with ratio 0): all true, as a graph output
    and read by another node; an unread mask is not computed (no kernel)."""
    from engine import Network, build_program
    nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["d", "mask"]),
             helper.make_node("Dropout", ["x"], ["d2", "unread"]),
             helper.make_node("Cast", ["mask"], ["mf"], to=elem),
             helper.make_node("Mul", ["d", "mf"], ["m"]),
             helper.make_node("Add", ["m", "d2"], ["y"])]
    inputs = [("x", elem, ["a", "b"]), ("ratio", F, []), ("training", B, [])]
    model = _model(nodes, inputs, [("y", elem, None), ("mask", B, None)], opset=opset)
    rng = np.random.default_rng(3)
    dt = np.float16 if elem == TensorProto.FLOAT16 else np.float32
    seq = []
    for (a, b), train in [((2, 5), False), ((3, 70), True), ((1, 1), False), ((2, 5), True)]:
        # training_mode=1 drops at random unless the ratio is 0
        seq.append({"x": rng.standard_normal((a, b)).astype(dt),
                    "ratio": np.array(0.0 if train else 0.3, np.float32), "training": np.array(train)})
    net = run_vs_ort(model, seq, device, rtol=1e-3, atol=1e-3)
    assert [i.node.op for i in net.insts].count("dropout_mask") == 1   # not for "unread"
    assert Network(build_program(model)).infer(seq[1])["mask"].all()


def test_dropout_refuses_mask_before_opset12(device):
    """Before Dropout-12 onnxruntime's inference mask is all false, ONNX's reference all true."""
    from engine import Network, build_program
    from engine.ops.common import ShapeInferenceError
    model = _model([helper.make_node("Dropout", ["x"], ["d", "mask"])], [("x", F, ["a"])],
                   [("d", F, None), ("mask", B, None)], opset=11)
    with pytest.raises(ShapeInferenceError, match="before opset 12"):
        Network(build_program(model), device).infer({"x": np.ones(3, np.float32)})


def test_split_tile_pad_trilu_over_shapes(device):
    model = _model([
        helper.make_node("Split", ["x", "sizes"], ["p0", "p1", "p2"], axis=1),
        helper.make_node("Tile", ["p0", "reps"], ["t"]),
        helper.make_node("Pad", ["p1", "pads", "val"], ["pc"], mode="constant"),
        helper.make_node("Pad", ["p2", "pads"], ["pr"], mode="reflect"),
        helper.make_node("Trilu", ["t", "k"], ["tl"], upper=0),
    ], [("x", F, ["b", "s"]), ("sizes", I64, [3]), ("reps", I64, [2]), ("pads", I64, [4]),
        ("val", F, []), ("k", I64, [])],
        [("tl", F, None), ("pc", F, None), ("pr", F, None)])
    rng = np.random.default_rng(2)
    seq = []
    for b, sizes, k in [(2, (2, 3, 4), 0), (3, (4, 3, 5), 1), (3, (4, 3, 5), 1), (2, (2, 2, 3), -1)]:
        seq.append({"x": _randn(rng, b, sum(sizes)), "sizes": np.array(sizes, np.int64),
                    "reps": np.array([2, 3], np.int64), "pads": np.array([1, 2, 0, 1], np.int64),
                    "val": np.array(1.5, np.float32), "k": np.array(k, np.int64)})
    run_vs_ort(model, seq, device)


def test_reductions_scatter_cumsum_over_shapes(device):
    model = _model([
        helper.make_node("ReduceSum", ["x", "axes"], ["rs"], keepdims=0),
        helper.make_node("ReduceMax", ["x", "axes"], ["rmax"], keepdims=1),
        helper.make_node("ReduceL2", ["x", "axes"], ["rl2"], keepdims=0),
        helper.make_node("ArgMax", ["x"], ["am"], axis=-1, keepdims=0),
        helper.make_node("CumSum", ["x", "cax"], ["cs"], reverse=1),
        helper.make_node("ScatterND", ["x", "ind", "upd"], ["snd"], reduction="add"),
        helper.make_node("ScatterElements", ["x", "eind", "eupd"], ["se"], axis=1),
    ], [("x", F, ["a", "b", "c"]), ("axes", I64, [None]), ("cax", I64, []), ("ind", I64, ["n", 1]),
        ("upd", F, ["n", "b", "c"]), ("eind", I64, ["a", "m", "c"]), ("eupd", F, ["a", "m", "c"])],
        [("rs", F, None), ("rmax", F, None), ("rl2", F, None), ("am", I64, None), ("cs", F, None),
         ("snd", F, None), ("se", F, None)])
    rng = np.random.default_rng(3)
    seq = []
    for a, b, c, axes in [(2, 3, 4, [1]), (3, 5, 2, [0, 2]), (3, 5, 2, [0, 2]), (1, 2, 6, [-1])]:
        ind = np.array([[0], [a - 1], [0]], np.int64)   # a repeated index: the adds accumulate
        seq.append({"x": _randn(rng, a, b, c), "axes": np.array(axes, np.int64),
                    "cax": np.array(1, np.int64), "ind": ind, "upd": _randn(rng, 3, b, c),
                    "eind": rng.random((a, b, c)).argsort(axis=1)[:, :2, :].astype(np.int64), "eupd": _randn(rng, a, 2, c)})
    run_vs_ort(model, seq, device, check_nonconstant=False)


def test_old_opsets_run_unless_an_op_schema_differs(device):
    """Opset 1 Not runs (its schema is the one opset 7 selects); opset 6 Add (the `broadcast`
    attribute era) is refused naming Add."""
    from engine import ModelError, build_program
    from tests.conftest import run_vs_ort as check
    not_model = _model([helper.make_node("Not", ["x"], ["y"])], [("x", B, ["n"])], [("y", B, None)], opset=1)
    not_model.ir_version = 3
    check(not_model, [{"x": np.array([True, False, True])}, {"x": np.array([False] * 5)}], device)
    add6 = _model([helper.make_node("Add", ["x", "x"], ["y"])], [("x", F, ["n"])], [("y", F, None)], opset=6)
    with pytest.raises(ModelError, match=r"opset 6: the versions of Add .* older"):
        build_program(add6)


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_integer_signs_and_zero_divisor(device, fmod):
    """Integer Mod over broadcasting shapes, both sign rules; a divisor of 0 and MIN % -1 give
    0 as numpy (ONNX's reference) does, where C's % is undefined and a CPU traps."""
    from onnx.reference import ReferenceEvaluator
    from engine import Network, build_program
    i32 = TensorProto.INT32
    model = _model([helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)],
                   [("a", i32, ["n", "m"]), ("b", i32, ["m"])], [("y", i32, None)])
    net, ref = Network(build_program(model), device), ReferenceEvaluator(model)
    rng = np.random.default_rng(fmod)
    for n, m in [(3, 5), (1, 7), (3, 5)]:
        a = rng.integers(-20, 20, (n, m)).astype(np.int32)
        b = rng.integers(-6, 6, m).astype(np.int32)
        b[0], b[-1] = 0, -1
        a[0, -1] = np.iinfo(np.int32).min
        with np.errstate(all="ignore"):
            want = ref.run(None, {"a": a, "b": b})[0]
        np.testing.assert_array_equal(net.infer({"a": a, "b": b})["y"], want)
