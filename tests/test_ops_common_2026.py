"""Single ops of recent exporters' graphs (LogSoftmax, the Reduce* sums, Hardmax, LpNormalization,
MeanVarianceNormalization, Shrink, Swish, SwiGLU, CastLike, bitwise ops, BitShift, CumProd,
OneHot, Compress, EyeLike, GridSample, NonMaxSuppression) in small models over shape sequences
(growth, repeat, shrink) on one Network each, against onnxruntime: the node tests run one shape
per network; here the shape-agnostic kernels and the data-dependent outputs see them change."""
import numpy as np
from onnx import TensorProto, helper

from engine import Network, build_program
from tests.conftest import assert_close, run_vs_ort

F, I64, I32, U8, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.UINT8, TensorProto.BOOL
SEQ = [(1, 4), (2, 9), (2, 9), (1, 3), (3, 12)]   # (batch, sequence) per inference


def _model(nodes, inputs, outputs, opset=18, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
                          initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _const(name, values, dtype=np.int64):
    return helper.make_tensor(name, TensorProto.INT64 if dtype == np.int64 else TensorProto.FLOAT,
                              [len(values)], list(values))


def test_normalisations_and_reductions_over_shapes(device):
    """LogSoftmax (large logits too), Hardmax, LpNormalization, MVN, the Reduce* sums."""
    ax = _const("ax", [1])
    model = _model([
        helper.make_node("LogSoftmax", ["x"], ["log_softmax"], axis=-1),
        helper.make_node("Hardmax", ["x"], ["hardmax"], axis=1),
        helper.make_node("LpNormalization", ["x"], ["l2"], axis=1, p=2),
        helper.make_node("LpNormalization", ["x"], ["l1"], axis=-1, p=1),
        helper.make_node("MeanVarianceNormalization", ["x"], ["mvn"], axes=[0, 1]),
        helper.make_node("ReduceLogSumExp", ["x", "ax"], ["lse"], keepdims=0),
        helper.make_node("ReduceSumSquare", ["x", "ax"], ["ssq"]),
        helper.make_node("ReduceL1", ["x"], ["l1_all"], keepdims=0),
        helper.make_node("Abs", ["x"], ["ax_"]),
        helper.make_node("ReduceLogSum", ["ax_", "ax"], ["log_sum"]),
        helper.make_node("Shrink", ["x"], ["shrink"], lambd=0.4, bias=0.1),
        helper.make_node("Swish", ["x"], ["swish"], alpha=1.5),
    ], [("x", F, ["b", "s", 6])],
        [(n, F) for n in ("log_softmax", "hardmax", "l2", "l1", "mvn", "lse", "ssq", "l1_all",
                          "log_sum", "shrink", "swish")], opset=24, inits=[ax])
    rng = np.random.default_rng(0)
    seq = []
    for k, (b, s) in enumerate(SEQ):
        x = rng.standard_normal((b, s, 6)).astype(np.float32) * (100.0 if k == 1 else 2.0)
        seq.append({"x": x})
    run_vs_ort(model, seq, device, rtol=1e-4, atol=1e-4)


def test_swiglu_over_shapes(device):
    """SwiGLU (opset 28; onnxruntime has none yet): A * sigmoid(alpha * A) * B in numpy."""
    model = _model([helper.make_node("SwiGLU", ["a", "b"], ["y"], alpha=1.702)],
                   [("a", F, ["n", "d"]), ("b", F, ["n", "d"])], [("y", F)], opset=28)
    net = Network(build_program(model), device)
    rng = np.random.default_rng(1)
    for n, d in SEQ:
        a, b = (rng.standard_normal((n, 2 * d)).astype(np.float32) * 3 for _ in range(2))
        want = (a / (1 + np.exp(-1.702 * a.astype(np.float64))) * b).astype(np.float32)
        assert_close(net.infer({"a": a, "b": b})["y"], want, 1e-5, 1e-6, f"{n}x{2 * d}")


def test_integer_and_indicator_ops_over_shapes(device):
    """Bitwise ops, BitShift, CumProd, CastLike, OneHot (depth from the input's shape), EyeLike
    and Compress (condition from the data: its output length changes with it)."""
    model = _model([
        helper.make_node("BitwiseAnd", ["u", "v"], ["and"]),
        helper.make_node("BitwiseOr", ["u", "v"], ["or"]),
        helper.make_node("BitwiseXor", ["u", "v"], ["xor"]),
        helper.make_node("BitwiseNot", ["u"], ["not"]),
        helper.make_node("BitShift", ["u", "sh"], ["shl"], direction="LEFT"),
        helper.make_node("BitShift", ["u", "sh"], ["shr"], direction="RIGHT"),
        helper.make_node("CumProd", ["f", "one"], ["cumprod"], reverse=1),
        helper.make_node("CastLike", ["f", "i"], ["f_as_i"]),
        helper.make_node("Shape", ["f"], ["fshape"], start=1, end=2),
        helper.make_node("OneHot", ["i", "fshape", "onoff"], ["onehot"], axis=1),
        helper.make_node("EyeLike", ["f"], ["eye"], k=1),
        helper.make_node("Greater", ["f", "zero"], ["pos"]),
        helper.make_node("ReduceMax", ["pos", "zero_i"], ["row_pos"], keepdims=0),
        helper.make_node("Compress", ["f", "row_pos"], ["compressed"], axis=0),
    ], [("u", U8, ["b", "s"]), ("v", U8, ["b", "s"]), ("sh", U8, ["b", "s"]), ("f", F, ["b", "s"]),
        ("i", I64, ["b"])],
        [("and", U8), ("or", U8), ("xor", U8), ("not", U8), ("shl", U8), ("shr", U8),
         ("cumprod", F), ("f_as_i", I64), ("onehot", F), ("eye", F), ("compressed", F)],
        inits=[_const("one", [1]), helper.make_tensor("zero", F, [], [0.0]),
               _const("zero_i", [1]), helper.make_tensor("onoff", F, [2], [-1.0, 2.5])], opset=26)
    rng = np.random.default_rng(2)
    seq = []
    for b, s in SEQ:
        f = (rng.standard_normal((b, s)) * 2).astype(np.float32)
        f[0] = -np.abs(f[0])       # row 0 never kept by Compress
        seq.append({"u": rng.integers(0, 256, (b, s), dtype=np.uint8),
                    "v": rng.integers(0, 256, (b, s), dtype=np.uint8),
                    "sh": rng.integers(0, 9, (b, s), dtype=np.uint8), "f": f,
                    "i": rng.integers(-s, s + 2, (b,)).astype(np.int64)})
    run_vs_ort(model, seq, device, rtol=1e-5, atol=1e-6)


def test_grid_sample_over_shapes(device):
    """GridSample: bilinear with border padding, bicubic with reflection (points out of range
    on purpose), nearest with zeros; input and grid sizes change."""
    modes = [("linear", "border", 0), ("cubic", "reflection", 1), ("nearest", "zeros", 0)]
    model = _model([helper.make_node("GridSample", ["x", "g"], [f"y{k}"], mode=m, padding_mode=p,
                                     align_corners=a) for k, (m, p, a) in enumerate(modes)],
                   [("x", F, ["n", "c", "h", "w"]), ("g", F, ["n", "ho", "wo", 2])],
                   [(f"y{k}", F) for k in range(len(modes))], opset=20)
    rng = np.random.default_rng(3)
    seq = [{"x": rng.standard_normal((n, 2, h, w)).astype(np.float32),
            "g": rng.uniform(-1.4, 1.4, (n, ho, wo, 2)).astype(np.float32)}
           for n, h, w, ho, wo in [(1, 4, 5, 3, 3), (2, 7, 6, 5, 4), (2, 7, 6, 5, 4), (1, 3, 3, 2, 6)]]
    run_vs_ort(model, seq, device, rtol=1e-4, atol=1e-5)


def test_non_max_suppression_over_box_counts(device):
    """NonMaxSuppression: the number of selected boxes follows the data (none at all once the
    score threshold passes every score), over changing batch, class and box counts."""
    model = _model([helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "th"],
                                     ["sel"], center_point_box=0)],
                   [("boxes", F, ["b", "n", 4]), ("scores", F, ["b", "c", "n"]), ("max_out", I64, [1]),
                    ("iou", F, [1]), ("th", F, [1])], [("sel", I64)], opset=11)
    rng = np.random.default_rng(4)
    seq = []
    for b, c, n, th in [(1, 1, 6, 0.0), (2, 3, 20, 0.3), (2, 3, 20, 0.3), (1, 2, 9, 2.0), (3, 1, 40, 0.5)]:
        corner = rng.uniform(0, 10, (b, n, 2))
        size = rng.uniform(1, 4, (b, n, 2))
        boxes = np.concatenate([corner, corner + size], axis=2).astype(np.float32)
        seq.append({"boxes": boxes, "scores": rng.random((b, c, n)).astype(np.float32),
                    "max_out": np.array([5], np.int64), "iou": np.array([0.3], np.float32),
                    "th": np.array([th], np.float32)})
    net = run_vs_ort(model, seq, device)
    assert net.infer(seq[3])["sel"].shape == (0, 3)


def test_float16_axis_kernels_over_shapes(device):
    """LogSoftmax, LpNormalization and MVN read and write half directly (computed in float):
    against numpy in float64 from the same half inputs, to half's precision."""
    H = TensorProto.FLOAT16
    model = _model([helper.make_node("LogSoftmax", ["x"], ["ls"], axis=1),
                    helper.make_node("LpNormalization", ["x"], ["lp"], axis=-1, p=2),
                    helper.make_node("MeanVarianceNormalization", ["x"], ["mvn"], axes=[0, 2])],
                   [("x", H, ["b", "s", 5])], [("ls", H), ("lp", H), ("mvn", H)])
    net = Network(build_program(model), device)
    rng = np.random.default_rng(5)
    for b, s in SEQ:
        x = rng.standard_normal((b, s, 5)).astype(np.float16)
        x64 = x.astype(np.float64)
        m = x64.max(axis=1, keepdims=True)
        mean = x64.mean(axis=(0, 2), keepdims=True)
        want = {"ls": x64 - m - np.log(np.exp(x64 - m).sum(axis=1, keepdims=True)),
                "lp": x64 / np.sqrt((x64 * x64).sum(axis=-1, keepdims=True)),
                "mvn": (x64 - mean) / (np.sqrt(((x64 - mean) ** 2).mean(axis=(0, 2), keepdims=True)) + 1e-9)}
        outs = net.infer({"x": x})
        for k, v in want.items():
            assert_close(outs[k], v.astype(np.float16), 2e-3, 2e-3, f"{k} {b}x{s}")
