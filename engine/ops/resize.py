"""Resize (opsets 10, 11, 13, 18, 19) and Upsample (opset 9) on the device (cl/resize.cl):
nearest over any dims, linear and cubic over the last two (the others must keep their size);
the coordinate modes exporters use (half_pixel, asymmetric, align_corners, pytorch_half_pixel,
tf_half_pixel_for_nn, half_pixel_symmetric, tf_crop_and_resize), every nearest_mode, antialias
(linear and cubic filters stretched by 1 / scale when downsampling) and keep_aspect_ratio_policy.
`scales`, `sizes` and `roi` are memory deps (shape inference reads their values). Coordinates
are computed in float32 from the scale the model gives (not out/in), as onnxruntime does; the
scales and roi reach the kernel as float bits in shape_info, so one build serves every shape
and scale."""
from __future__ import annotations

import numpy as np

from engine.kernels import KernelCall, MAX_RANK
from engine.layout import Layout, type_jit
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError, norm_axis
from engine.ops.norm import _f

COORD = {"half_pixel": 0, "asymmetric": 1, "align_corners": 2, "pytorch_half_pixel": 3,
         "tf_half_pixel_for_nn": 4, "half_pixel_symmetric": 5, "tf_crop_and_resize": 6}
MODES = {"nearest": 0, "linear": 1, "bilinear": 1, "cubic": 2}
NEAREST = {"round_prefer_floor": 0, "round_prefer_ceil": 1, "floor": 2, "ceil": 3}


def _attr(node, name, default):
    v = node.attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else v


def _modes(node):
    """(mode: 0 nearest, 1 linear, 2 cubic; COORD; NEAREST) for the node's form, refusing what
    the kernel cannot do."""
    name = f"{node.op} {node.name}"
    mode = _attr(node, "mode", "nearest")
    old = node.op == "Upsample" or node.opset < 11
    if mode not in MODES or old and mode == "cubic":
        raise ShapeInferenceError(f"{name}: mode {mode!r} is not supported "
                                  f"({'nearest, linear' if old else 'nearest, linear, cubic'} are)")
    if old:
        # opset < 11: asymmetric coordinates; nearest floors (ceil when downsampling)
        return MODES[mode], COORD["asymmetric"], 4
    coord = _attr(node, "coordinate_transformation_mode", "half_pixel")
    if coord not in COORD:
        raise ShapeInferenceError(f"{name}: coordinate_transformation_mode {coord!r} is not "
                                  f"supported ({', '.join(COORD)} are)")
    nearest = _attr(node, "nearest_mode", "round_prefer_floor")
    if nearest not in NEAREST:
        raise ShapeInferenceError(f"{name}: nearest_mode {nearest!r} is not supported")
    if int(node.attrs.get("antialias", 0)) and coord == "align_corners":
        # onnxruntime and ONNX's reference disagree there
        raise ShapeInferenceError(f"{name}: antialias=1 with align_corners is not supported")
    policy = _attr(node, "keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise ShapeInferenceError(f"{name}: unknown keep_aspect_ratio_policy {policy!r}")
    return MODES[mode], COORD[coord], NEAREST[nearest]


def _scales_or_sizes(node, name, deps, old: bool):
    """(scales, sizes), one of them None: inputs 2 and 3 (an empty one is absent), or before
    opset 11 (and Upsample) input 1 or the `scales` attribute."""
    scales = deps.get(1) if old else deps.get(2)
    sizes = None if old else deps.get(3)
    if scales is not None and scales.size == 0:
        scales = None
    if sizes is not None and sizes.size == 0:
        sizes = None
    if old and node.attrs.get("scales") is not None:
        scales = np.asarray(node.attrs["scales"], np.float32)
    if (scales is None) == (sizes is None):
        raise ShapeInferenceError(f"{name}: exactly one of scales and sizes must be given")
    return scales, sizes


def _geometry(node, ins, deps):
    """(output shape, per-dim float32 scales, roi starts, roi ends) for the current input and
    scales/sizes (and roi, for tf_crop_and_resize) values."""
    name = f"{node.op} {node.name}"
    x = ins[0]
    rank = x.rank
    if rank > MAX_RANK or rank == 0:
        raise ShapeInferenceError(f"{name}: input {x} must have rank 1..{MAX_RANK}")
    old = node.op == "Upsample" or node.opset < 11
    scales, sizes = _scales_or_sizes(node, name, deps, old)
    axes = node.attrs.get("axes")
    axes = list(range(rank)) if axes is None else [norm_axis(int(a), rank) for a in axes]
    given = (scales if scales is not None else sizes).reshape(-1)
    if len(given) != len(axes):
        raise ShapeInferenceError(f"{name}: {len(given)} scales/sizes for {len(axes)} axes of {x}")
    full = np.ones(rank, np.float32)
    start, end = np.zeros(rank, np.float32), np.ones(rank, np.float32)
    if not old and _attr(node, "coordinate_transformation_mode", "") == "tf_crop_and_resize":
        roi = deps.get(1)
        if roi is None or roi.size != 2 * len(axes):
            raise ShapeInferenceError(f"{name}: tf_crop_and_resize needs roi with "
                                      f"{2 * len(axes)} values")
        roi = roi.reshape(-1).astype(np.float32)
        start[axes], end[axes] = roi[:len(axes)], roi[len(axes):]
    out = list(x.shape)
    policy = "stretch" if old else _attr(node, "keep_aspect_ratio_policy", "stretch")
    if sizes is not None and policy != "stretch":
        # one scale for every resized axis, the largest that fits (not_larger) or the smallest
        # that covers (not_smaller) the sizes; sizes round to nearest
        pick = min if policy == "not_larger" else max
        if any(x.shape[a] == 0 for a in axes):
            raise ShapeInferenceError(f"{name}: keep_aspect_ratio_policy over an empty dim of {x}")
        ratio = pick(np.float32(v) / np.float32(x.shape[a]) for a, v in zip(axes, given))
        scales, sizes = None, None
        given = np.asarray([np.floor(ratio * np.float32(x.shape[a]) + np.float32(0.5))
                            for a in axes], np.int64)
        full[axes] = ratio
    for a, v in zip(axes, given):
        if scales is not None:
            full[a] = np.float32(v)
            if not full[a] > 0:
                raise ShapeInferenceError(f"{name}: scale {v} must be > 0")
            # float32, as onnxruntime. The spec scales a tf_crop_and_resize size by the roi's
            # extent too; onnxruntime and ONNX's reference do not, and neither do we.
            out[a] = int(np.floor(np.float32(x.shape[a]) * full[a]))
        else:
            out[a] = int(v)
            if out[a] < 0:
                raise ShapeInferenceError(f"{name}: negative size {v}")
            if policy == "stretch":
                full[a] = np.float32(out[a]) / np.float32(x.shape[a]) if x.shape[a] else 1.0
    return tuple(out), full, start, end


def _kernels(node, ins, outs, deps):
    mode, coord, nearest = _modes(node)
    out, scales, start, end = _geometry(node, ins, deps)
    x = ins[0]
    if mode:
        for a in range(x.rank - 2):
            if out[a] != x.shape[a] or (scales[a] != 1 and x.shape[a] != 1):
                raise ShapeInferenceError(
                    f"{node.op} {node.name}: {_attr(node, 'mode', '')} mode resizes the last two "
                    f"dims only, got {x} -> {out}")
    bits = np.zeros((3, MAX_RANK), np.float32)
    bits[0], bits[2] = 1.0, 1.0          # padded leading dims: scale 1, roi [0, 1]
    bits[:, MAX_RANK - x.rank:] = scales, start, end
    jit = (*type_jit("T", x.dtype), ("COORD", coord), ("NEAREST", nearest),
           ("LINEAR", int(mode == 1)), ("CUBIC", int(mode == 2)),
           ("EXTRAPOLATION", _f(node.attrs.get("extrapolation_value", 0.0))), ("IMPL_TAG", node.op))
    if mode == 2:
        jit += (("CUBIC_A", _f(node.attrs.get("cubic_coeff_a", -0.75))),)
    if mode:
        jit += (("EXCLUDE_OUTSIDE", int(node.attrs.get("exclude_outside", 0))),
                ("ANTIALIAS", int(node.attrs.get("antialias", 0))))
    return [KernelCall("resize", "resize", jit, (("in", 0), ("out", 0)),
                       params=tuple(int(v) for v in bits.reshape(-1).view(np.int32)),
                       gws=(max(outs[0].count, 1),))]


def _infer(node, ins, deps):
    _modes(node)
    if ins[0].dtype not in ("f32", "f16"):
        raise ShapeInferenceError(f"{node.op} {node.name}: float32 or float16 data only, got {ins[0]}")
    out = _geometry(node, ins, deps)[0]
    return [Layout(out, ins[0].dtype)]


register("Resize", checked=19, kernels=_kernels, shape_deps=(1, 2, 3), f16=True)(_infer)
register("Upsample", checked=10, kernels=_kernels, shape_deps=(1,), f16=True)(_infer)
