"""Vision ops (ConvTranspose, Resize, Upsample, InstanceNormalization, GroupNormalization,
DepthToSpace, SpaceToDepth) against onnxruntime, each on one Network over a sequence of input
shapes that crosses the kernels' work-group size (64) and changes between inferences; float16
versions of most (stored half, computed float32)."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine import Network, build_program
from engine.ops.common import ShapeInferenceError
from tests.conftest import run_vs_ort as _run_vs_ort

FLOAT, FLOAT16, INT64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64
RNG = np.random.default_rng(11)


def model(nodes, inputs, inits=None, opset=13, outputs=("y",)):
    """inputs: [(name, elem, rank)], all dims symbolic."""
    vis = [helper.make_tensor_value_info(n, t, [f"{n}{k}" for k in range(r)]) for n, t, r in inputs]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    g = helper.make_graph(nodes, "t", vis, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def randn(shape, dt=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dt)


def run(m, feeds, f16=False, **kw):
    """float16: inputs and weights are exactly representable in half and the kernels compute in
    float32, so the only error is the final rounding to half (and onnxruntime's own half math):
    rtol/atol 1e-2 is a few half ulps at the values seen here."""
    tol = dict(rtol=1e-2, atol=1e-2) if f16 else dict(rtol=1e-4, atol=1e-5)
    tol.update(kw)
    return _run_vs_ort(m, feeds, check_nonconstant=False, **tol)


# ---------------------------------------------------------------- ConvTranspose
CT_SHAPES = [(1, 5, 7), (2, 9, 9), (1, 5, 7), (1, 1, 3), (2, 12, 10)]
CT_CASES = {
    # name: (C, OC, kernel, attrs, bias)
    "s2_p1_op1": (3, 4, (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]), True),
    "g2_dil2": (4, 6, (3, 2), dict(group=2, dilations=[2, 2], pads=[0, 1, 2, 0]), True),
    "s3_k4_no_pad": (2, 3, (4, 4), dict(strides=[3, 2]), False),
    "same_upper_s2": (3, 2, (3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2]), True),
    "same_lower_s2": (3, 2, (4, 3), dict(auto_pad="SAME_LOWER", strides=[2, 2]), False),
    "valid_depthwise": (4, 4, (2, 2), dict(auto_pad="VALID", group=4, strides=[2, 2]), True),
}


@pytest.mark.parametrize("case", CT_CASES)
def test_conv_transpose(case):
    C, OC, (kh, kw), attrs, bias = CT_CASES[case]
    g = attrs.get("group", 1)
    inits = {"w": randn((C, OC // g, kh, kw), scale=0.5)}
    ins = ["x", "w"]
    if bias:
        inits["b"] = randn((OC,))
        ins.append("b")
    m = model([helper.make_node("ConvTranspose", ins, ["y"], **attrs)], [("x", FLOAT, 4)], inits)
    run(m, [{"x": randn((n, C, h, w))} for n, h, w in CT_SHAPES])


CT1_CASES = {
    # name: (C, OC, K, attrs, bias, float16)
    "s2_p1_op1_bias": (3, 4, 3, dict(strides=[2], pads=[1, 1], output_padding=[1]), True, False),
    "g2_dil2_asym": (4, 6, 3, dict(group=2, dilations=[2], pads=[0, 2]), False, False),
    "same_lower_s3_f16": (2, 3, 4, dict(auto_pad="SAME_LOWER", strides=[3]), True, True),
    "output_shape_s2": (3, 2, 3, dict(strides=[2], output_shape=[10]), True, False),
}


@pytest.mark.parametrize("case", CT1_CASES)
def test_conv_transpose_1d(case):
    """1-D (NCL, as 2-D with a unit height) over changing lengths (output_shape: fixed output)."""
    C, OC, K, attrs, bias, f16 = CT1_CASES[case]
    dt, elem = (np.float16, FLOAT16) if f16 else (np.float32, FLOAT)
    g = attrs.get("group", 1)
    inits = {"w": randn((C, OC // g, K), dt, 0.5)}
    ins = ["x", "w"]
    if bias:
        inits["b"] = randn((OC,), dt)
        ins.append("b")
    m = model([helper.make_node("ConvTranspose", ins, ["y"], **attrs)], [("x", elem, 3)], inits)
    lengths = [5, 6, 8, 5] if "output_shape" in attrs else [5, 17, 1, 40, 5]
    run(m, [{"x": randn((n, C, L), dt)} for n, L in zip([1, 2, 1, 3, 1], lengths)], f16=f16)


def test_conv_transpose_output_shape_and_f16():
    inits = {"w": randn((2, 3, 3, 3), np.float16, 0.5), "b": randn((3,), np.float16)}
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2],
                            output_shape=[10, 9], auto_pad="SAME_UPPER")
    m = model([node], [("x", FLOAT16, 4)], inits)
    run(m, [{"x": randn((n, 2, 5, 5), np.float16)} for n in (1, 2, 1)], f16=True)


# ---------------------------------------------------------------- Resize / Upsample
RS_SHAPES = [(1, 2, 5, 7), (2, 3, 9, 12), (1, 2, 5, 7), (1, 1, 1, 3), (1, 2, 17, 6)]
RS_CASES = {
    # name: (opset, attrs, scales)
    "nearest_half_pixel_floor": (13, dict(mode="nearest"), [1, 1, 2.0, 1.5]),
    "nearest_asym_floor": (13, dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                                    nearest_mode="floor"), [1, 1, 2.0, 3.0]),
    "nearest_align_ceil_down": (13, dict(mode="nearest", coordinate_transformation_mode="align_corners",
                                         nearest_mode="ceil"), [1, 1, 0.6, 0.5]),
    "nearest_prefer_ceil": (13, dict(mode="nearest", nearest_mode="round_prefer_ceil"), [1, 1, 1.5, 2.5]),
    "nearest_tf_nn": (11, dict(mode="nearest", coordinate_transformation_mode="tf_half_pixel_for_nn"),
                      [1, 1, 1.7, 0.8]),
    "linear_half_pixel_up": (13, dict(mode="linear"), [1, 1, 2.0, 2.0]),
    "linear_half_pixel_down": (19, dict(mode="linear"), [1, 1, 0.5, 0.7]),
    "linear_align_corners": (13, dict(mode="linear", coordinate_transformation_mode="align_corners"),
                             [1, 1, 1.5, 2.0]),
    "linear_pytorch": (13, dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
                       [1, 1, 3.0, 0.4]),
    "linear_asymmetric": (18, dict(mode="linear", coordinate_transformation_mode="asymmetric"),
                          [1, 1, 1.3, 2.0]),
    "nearest_half_pixel_symmetric": (19, dict(mode="nearest",
                                              coordinate_transformation_mode="half_pixel_symmetric"),
                                     [1, 1, 1.7, 0.65]),   # 0.6 ties: ORT and ONNX's reference differ
    "linear_half_pixel_symmetric": (19, dict(mode="linear",
                                             coordinate_transformation_mode="half_pixel_symmetric"),
                                    [1, 1, 2.5, 0.45]),
    "cubic_half_pixel": (13, dict(mode="cubic"), [1, 1, 2.0, 1.5]),
    "cubic_align_exclude": (13, dict(mode="cubic", coordinate_transformation_mode="align_corners",
                                     exclude_outside=1, cubic_coeff_a=-0.5), [1, 1, 0.7, 2.3]),
    "cubic_asymmetric_down": (19, dict(mode="cubic", coordinate_transformation_mode="asymmetric"),
                              [1, 1, 0.5, 0.8]),
    "opset10_nearest": (10, dict(mode="nearest"), [1, 1, 2.0, 0.5]),
    "opset10_linear": (10, dict(mode="linear"), [1, 1, 2.0, 1.5]),
}


@pytest.mark.parametrize("case", RS_CASES)
def test_resize_scales(case):
    opset, attrs, scales = RS_CASES[case]
    inits = {"scales": np.array(scales, np.float32), "roi": np.zeros(0, np.float32)}
    ins = ["x", "scales"] if opset < 11 else ["x", "roi" if opset < 13 else "", "scales"]
    m = model([helper.make_node("Resize", ins, ["y"], **attrs)], [("x", FLOAT, 4)], inits, opset)
    run(m, [{"x": randn(s)} for s in RS_SHAPES])


@pytest.mark.parametrize("mode,roi", [("nearest", [0, 0, 0.2, -0.1, 1, 1, 0.9, 1.3]),
                                      ("linear", [0, 0, -0.3, 0.25, 1, 1, 0.5, 0.75]),
                                      ("cubic", [0, 0, 0.1, 0.1, 1, 1, 1.2, 0.8])])
def test_resize_tf_crop_and_resize(mode, roi):
    """A crop box (partly outside the input: extrapolation_value there) resized to sizes. Every
    resized dim changes size: where one keeps it, onnxruntime ignores the roi along it (ONNX's
    reference and we crop it)."""
    node = helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode=mode,
                            coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-7.5)
    m = model([node], [("x", FLOAT, 4)], {"roi": np.array(roi, np.float32)}, 13)
    m.graph.input.append(helper.make_tensor_value_info("sizes", INT64, [4]))
    seq = [{"x": randn((n, 2, h, w)), "sizes": np.array([n, 2, oh, ow], np.int64)}
           for n, h, w, oh, ow in [(1, 5, 7, 4, 6), (2, 9, 12, 7, 1), (1, 5, 7, 4, 6), (1, 1, 3, 2, 5)]]
    run(m, seq)


def test_resize_tf_crop_and_resize_scales():
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="linear",
                            coordinate_transformation_mode="tf_crop_and_resize")
    inits = {"roi": np.array([0, 0, 0.2, -0.1, 1, 1, 0.9, 1.3], np.float32),
             "scales": np.array([1, 1, 2, 1.5], np.float32)}
    run(model([node], [("x", FLOAT, 4)], inits, 13), [{"x": randn(s)} for s in RS_SHAPES])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_sizes_from_input_change_between_inferences(mode):
    """sizes is a graph input: a memory dep whose value changes while x keeps its shape."""
    m = model([helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode)],
              [("x", FLOAT, 4)], opset=13)
    m.graph.input.append(helper.make_tensor_value_info("sizes", INT64, [4]))
    x = randn((2, 3, 6, 5))
    seq = [{"x": x, "sizes": np.array(s, np.int64)} for s in
           ([2, 3, 12, 10], [2, 3, 7, 3], [2, 3, 7, 3], [2, 3, 70, 9], [2, 3, 1, 1])]
    seq.insert(3, {"x": randn((1, 3, 4, 4)), "sizes": np.array([1, 3, 9, 9], np.int64)})
    run(m, seq)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_keep_aspect_ratio(policy):
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear", axes=[2, 3],
                            keep_aspect_ratio_policy=policy)
    m = model([node], [("x", FLOAT, 4)], opset=18)
    m.graph.input.append(helper.make_tensor_value_info("sizes", INT64, [2]))
    seq = [{"x": randn((1, 2, h, w)), "sizes": np.array(s, np.int64)}
           for h, w, s in [(5, 7, [10, 10]), (9, 12, [4, 20]), (5, 7, [10, 10]), (6, 6, [3, 9])]]
    run(m, seq)


def test_resize_axes_opset18_and_f16():
    m = model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", axes=[2, 3])],
              [("x", FLOAT16, 4)], {"scales": np.array([2.0, 1.5], np.float32)}, 18)
    run(m, [{"x": randn(s, np.float16)} for s in RS_SHAPES[:3]], f16=True)


def test_upsample_opset9():
    m = model([helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")],
              [("x", FLOAT, 4)], {"scales": np.array([1, 1, 2.0, 3.0], np.float32)}, 9)
    run(m, [{"x": randn(s)} for s in RS_SHAPES])


@pytest.mark.parametrize("mode,coord,exclude", [("linear", "half_pixel", 0), ("linear", "asymmetric", 1),
                                                ("cubic", "half_pixel", 0), ("cubic", "pytorch_half_pixel", 1)])
def test_resize_antialias(mode, coord, exclude):
    """Downsampling with the filter stretched by 1 / scale (up to 2 / 0.3 taps a dim), and
    upsampling (no stretch) along the other dim."""
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, antialias=1,
                            coordinate_transformation_mode=coord, exclude_outside=exclude)
    m = model([node], [("x", FLOAT, 4)], {"scales": np.array([1, 1, 0.3, 1.6], np.float32)}, 18)
    run(m, [{"x": randn(s)} for s in [(1, 2, 17, 6), (2, 1, 40, 9), (1, 2, 17, 6), (1, 1, 4, 3)]])


def test_resize_refuses_unsupported_mode_naming_the_node():
    m = model([helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode="linear",
                                antialias=1, coordinate_transformation_mode="align_corners")],
              [("x", FLOAT, 4)], {"scales": np.array([1, 1, 2.0, 2.0], np.float32)}, 18)
    net = Network(build_program(m))
    with pytest.raises(ShapeInferenceError, match="Resize up: antialias=1 with align_corners"):
        net.infer({"x": randn((1, 1, 2, 2))})


# ---------------------------------------------------------------- Instance/GroupNormalization
NORM_SHAPES = [(1, 4, 3, 5), (2, 4, 9, 9), (1, 4, 3, 5), (3, 4, 1, 1), (1, 4, 40, 33)]


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_instance_norm(dt):
    np_dt, elem = (np.float16, FLOAT16) if dt == "f16" else (np.float32, FLOAT)
    inits = {"s": randn((4,), np_dt), "b": randn((4,), np_dt)}
    m = model([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)],
              [("x", elem, 4)], inits)
    # an offset mean: the two-pass variance keeps it exact
    run(m, [{"x": (randn(s) * 2 + 3).astype(np_dt)} for s in NORM_SHAPES], f16=dt == "f16")


@pytest.mark.parametrize("opset", [18, 21])
def test_group_norm(opset):
    n = 2 if opset == 18 else 6
    inits = {"s": randn((n,)), "b": randn((n,))}
    m = model([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)],
              [("x", FLOAT, 4)], inits, opset)
    run(m, [{"x": randn(s)} for s in [(1, 6, 3, 5), (2, 6, 9, 9), (1, 6, 1, 1), (1, 6, 30, 20)]],
        rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- DepthToSpace / SpaceToDepth
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_depth_to_space(mode, dt):
    np_dt, elem = (np.float16, FLOAT16) if dt == "f16" else (np.float32, FLOAT)
    m = model([helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode)], [("x", elem, 4)])
    run(m, [{"x": randn(s, np_dt)} for s in [(1, 8, 3, 5), (2, 12, 9, 9), (1, 8, 3, 5), (1, 4, 1, 1)]],
        rtol=0, atol=0)


def test_space_to_depth():
    m = model([helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=3)], [("x", FLOAT, 4)])
    run(m, [{"x": randn(s)} for s in [(1, 2, 3, 6), (2, 3, 9, 12), (1, 2, 3, 6), (1, 1, 3, 3)]],
        rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_space_to_depth_mode_opset28(mode, dt):
    """SpaceToDepth-28's `mode`: CRD puts a channel's block of b*b pixels together."""
    np_dt, elem = (np.float16, FLOAT16) if dt == "f16" else (np.float32, FLOAT)
    m = model([helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2, mode=mode)],
              [("x", elem, 4)], opset=28)
    run(m, [{"x": randn(s, np_dt)} for s in [(1, 2, 4, 6), (2, 3, 8, 10), (1, 1, 2, 2)]],
        rtol=0, atol=0)


# ---------------------------------------------------------------- a small U-Net
def unet(dt=np.float32, opset=13):
    """down: Conv s2 + InstanceNorm + Relu; up: ConvTranspose s2 + skip Concat; Resize x2 nearest
    + linear, DepthToSpace back to one channel; SpaceToDepth of the input on a side branch."""
    elem = FLOAT16 if dt == np.float16 else FLOAT
    w = lambda *s: randn(s, dt, 1 / np.sqrt(np.prod(s[1:])))  # noqa: E731
    inits = {"w1": w(8, 3, 3, 3), "b1": randn((8,), dt, 0.1), "s1": randn((8,), dt), "t1": randn((8,), dt),
             "wt": w(8, 4, 2, 2), "bt": randn((4,), dt, 0.1), "w2": w(4, 7, 3, 3),
             "sc": np.array([1, 1, 2, 2], np.float32), "sl": np.array([1, 1, 1, 1], np.float32)}
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("InstanceNormalization", ["c1", "s1", "t1"], ["i1"]),
        n("Relu", ["i1"], ["r1"]),
        n("ConvTranspose", ["r1", "wt", "bt"], ["u1"], strides=[2, 2]),
        n("Concat", ["u1", "x"], ["cat"], axis=1),
        n("Conv", ["cat", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        n("Resize", ["c2", "", "sc"], ["up"], mode="nearest"),
        n("Resize", ["up", "", "sl"], ["lin"], mode="linear"),
        n("DepthToSpace", ["lin"], ["y"], blocksize=2, mode="CRD"),
        n("SpaceToDepth", ["x"], ["side"], blocksize=2),
    ]
    return model(nodes, [("x", elem, 4)], inits, opset, outputs=("y", "side"))


UNET_SHAPES = [(1, 8, 8), (2, 16, 12), (1, 8, 8), (1, 2, 2), (1, 24, 30)]


def test_unet_varying_resolution():
    run(unet(), [{"x": randn((n, 3, h, w))} for n, h, w in UNET_SHAPES], rtol=1e-4, atol=1e-4)


def test_unet_f16_varying_resolution():
    run(unet(np.float16), [{"x": randn((n, 3, h, w), np.float16)} for n, h, w in UNET_SHAPES], f16=True)


@pytest.mark.parametrize("op", ["InstanceNormalization", "GroupNormalization"])
def test_norms_on_3d_input_f16(op):
    """(N, C, L) input, float16 storage."""
    attrs = {"num_groups": 3} if op == "GroupNormalization" else {}
    n = 6
    inits = {"s": randn((n,), np.float16), "b": randn((n,), np.float16)}
    m = model([helper.make_node(op, ["x", "s", "b"], ["y"], **attrs)], [("x", FLOAT16, 3)], inits, 21)
    run(m, [{"x": randn(s, np.float16)} for s in [(1, 6, 7), (2, 6, 100), (1, 6, 1), (1, 6, 7)]], f16=True)


def test_upsample_opset9_linear():
    m = model([helper.make_node("Upsample", ["x", "scales"], ["y"], mode="linear")],
              [("x", FLOAT, 4)], {"scales": np.array([1, 1, 2.0, 2.5], np.float32)}, 9)
    run(m, [{"x": randn(s)} for s in RS_SHAPES])
