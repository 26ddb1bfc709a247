"""ConvTranspose (2-D, NCHW) on the device (cl/deconv.cl): strides, dilations, pads,
output_padding, output_shape, group and auto_pad. Strides and dilations are JIT constants
(attributes); pads are computed per input shape (auto_pad, output_shape) and go through
shape_info, so one build serves every shape. float32 and float16 (stored half)."""
from __future__ import annotations

from engine.f16 import type_jit
from engine.kernels import KernelCall
from engine.layout import Layout
from engine.ops import register
from engine.ops.common import ShapeInferenceError
from engine.ops.conv import _ints


def _geometry(node, ins):
    name = f"ConvTranspose {node.name}"
    if len(ins) < 2 or ins[0] is None or ins[1] is None:
        raise ShapeInferenceError(f"{name}: needs X and W")
    x, w = ins[0], ins[1]
    if x.rank != 4 or w.rank != 4:
        raise ShapeInferenceError(f"{name}: only 2-D (NCHW) is supported, got X {x}, W {w}")
    if any(l is not None and l.dtype != x.dtype for l in ins) or x.dtype not in ("f32", "f16"):
        raise ShapeInferenceError(f"{name}: X, W, B must all be float32 or all float16")
    N, C, H, W = x.shape
    Cw, OCg, KH, KW = w.shape
    group = int(node.attrs.get("group", 1))
    if group < 1 or C % group or Cw != C:
        raise ShapeInferenceError(f"{name}: input {x} and weight {w} do not match group={group}")
    ks = node.attrs.get("kernel_shape")
    if ks is not None and [int(k) for k in ks] != [KH, KW]:
        raise ShapeInferenceError(f"{name}: kernel_shape {list(ks)} != weight {w}")
    OC = OCg * group
    if len(ins) > 2 and ins[2] is not None and tuple(ins[2].shape) != (OC,):
        raise ShapeInferenceError(f"{name}: bias {ins[2]} must be [{OC}]")
    s = _ints(node, "strides", 2, 1)
    d = _ints(node, "dilations", 2, 1)
    op = _ints(node, "output_padding", 2, 0)
    if any(v < 1 for v in s + d) or any(v < 0 for v in op):
        raise ShapeInferenceError(f"{name}: bad strides {s}, dilations {d} or output_padding {op}")
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    full = [s[i] * ((H, W)[i] - 1) + op[i] + (((KH, KW)[i] - 1) * d[i] + 1) for i in range(2)]
    out_shape = node.attrs.get("output_shape")
    if out_shape is not None:
        out_shape = [int(v) for v in out_shape][-2:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = [(H, W)[i] * s[i] for i in range(2)]
    if out_shape is not None:
        # the padding that gives the asked output size, split as the ONNX reference does
        total = [full[i] - out_shape[i] for i in range(2)]
        if any(t < 0 for t in total):
            raise ShapeInferenceError(f"{name}: output_shape {out_shape} larger than the full "
                                      f"output {full} (input {x})")
        upper = auto_pad == "SAME_UPPER"
        pb = [t // 2 if upper else t - t // 2 for t in total]
        pe = [t - b for t, b in zip(total, pb)]
    elif auto_pad in ("NOTSET", "VALID"):
        pads = _ints(node, "pads", 4, 0) if auto_pad == "NOTSET" else [0, 0, 0, 0]
        if any(p < 0 for p in pads):
            raise ShapeInferenceError(f"{name}: negative pads {pads}")
        pb, pe = pads[:2], pads[2:]
    else:
        raise ShapeInferenceError(f"{name}: unknown auto_pad {auto_pad!r}")
    OH, OW = (full[i] - pb[i] - pe[i] for i in range(2))
    if OH < 0 or OW < 0:
        raise ShapeInferenceError(f"{name}: pads {pb + pe} exceed the output of input {x}")
    return dict(N=N, OC=OC, OH=OH, OW=OW, s=s, d=d, pb=pb, group=group)


def _kernels(node, ins, outs, deps):
    g = _geometry(node, ins)
    has_bias = len(ins) > 2 and ins[2] is not None
    jit = (*type_jit("T", ins[0].dtype), ("SY", g["s"][0]), ("SX", g["s"][1]),
           ("DY", g["d"][0]), ("DX", g["d"][1]), ("HAS_BIAS", int(has_bias)),
           ("IMPL_TAG", "ConvTranspose"))
    args = (("in", 0), ("in", 1)) + ((("in", 2),) if has_bias else ()) + (("out", 0),)
    return [KernelCall("deconv", "conv_transpose2d", jit, args,
                       params=(g["pb"][0], g["pb"][1], g["group"]), gws=(max(outs[0].count, 1),))]


@register("ConvTranspose", kernels=_kernels, f16=True)
def _conv_transpose(node, ins, deps):
    g = _geometry(node, ins)
    return [Layout((g["N"], g["OC"], g["OH"], g["OW"]), ins[0].dtype)]
