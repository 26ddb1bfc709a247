"""ConvTranspose (2-D, NCHW; 1-D, NCL, as 2-D with a unit height) on the device (cl/deconv.cl):
strides, dilations, pads, output_padding, output_shape, group and auto_pad. Strides and
dilations are JIT constants (attributes); pads are computed per input shape (auto_pad,
output_shape) and go through shape_info, so one build serves every shape. float32 and float16
(stored half)."""
from __future__ import annotations

from engine.kernels import KernelCall
from engine.layout import Layout, type_jit
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError
from engine.ops.conv import _ints


def _geometry(node, ins):
    """The geometry of a 2-D ConvTranspose, or of a 1-D one ([N, C, L]) seen as 2-D with a unit
    height (X [N, C, 1, L], W [C, OC/group, 1, K]): `dims` holds those views (empty for 2-D)."""
    name = f"ConvTranspose {node.name}"
    if len(ins) < 2 or ins[0] is None or ins[1] is None:
        raise ShapeInferenceError(f"{name}: needs X and W")
    x, w = ins[0], ins[1]
    if x.rank not in (3, 4) or w.rank != x.rank:
        raise ShapeInferenceError(f"{name}: only 1-D (NCL) and 2-D (NCHW) are supported, "
                                  f"got X {x}, W {w}")
    if any(l is not None and l.dtype != x.dtype for l in ins) or x.dtype not in ("f32", "f16"):
        raise ShapeInferenceError(f"{name}: X, W, B must all be float32 or all float16")
    n = x.rank - 2
    N, C, sizes = x.shape[0], x.shape[1], list(x.shape[2:])
    Cw, OCg, ks = w.shape[0], w.shape[1], list(w.shape[2:])
    group = int(node.attrs.get("group", 1))
    if group < 1 or C % group or Cw != C:
        raise ShapeInferenceError(f"{name}: input {x} and weight {w} do not match group={group}")
    kshape = node.attrs.get("kernel_shape")
    if kshape is not None and [int(k) for k in kshape] != ks:
        raise ShapeInferenceError(f"{name}: kernel_shape {list(kshape)} != weight {w}")
    OC = OCg * group
    if len(ins) > 2 and ins[2] is not None and tuple(ins[2].shape) != (OC,):
        raise ShapeInferenceError(f"{name}: bias {ins[2]} must be [{OC}]")
    s = _ints(node, "strides", n, 1)
    d = _ints(node, "dilations", n, 1)
    op = _ints(node, "output_padding", n, 0)
    if any(v < 1 for v in s + d) or any(v < 0 for v in op):
        raise ShapeInferenceError(f"{name}: bad strides {s}, dilations {d} or output_padding {op}")
    full = [s[i] * (sizes[i] - 1) + op[i] + ((ks[i] - 1) * d[i] + 1) for i in range(n)]
    pb, pe = _pads(node, name, x, full, [sizes[i] * s[i] for i in range(n)])
    out = [full[i] - pb[i] - pe[i] for i in range(n)]
    if any(o < 0 for o in out):
        raise ShapeInferenceError(f"{name}: pads {pb + pe} exceed the output of input {x}")
    dims = {}
    if n == 1:   # the unit height: stride, dilation 1, no pad
        s, d, pb = [1] + s, [1] + d, [0] + pb
        has_bias = len(ins) > 2 and ins[2] is not None
        dims = {0: (N, C, 1, sizes[0]), 1: (Cw, OCg, 1, ks[0]),
                2 + has_bias: (N, OC, 1, out[0])}
    return dict(N=N, OC=OC, out=out, s=s, d=d, pb=pb, group=group, dims=dims)


def _pads(node, name, x, full, same) -> tuple[list, list]:
    """(begin, end) pads of each spatial dim: the `pads` attribute, or those that cut the full
    output `full` to `output_shape` or, for SAME_*, to `same` (input size * stride)."""
    n = len(full)
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    out_shape = node.attrs.get("output_shape")
    if out_shape is not None:
        out_shape = [int(v) for v in out_shape][-n:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = same
    if out_shape is not None:
        # the padding that gives the asked output size, split as the ONNX reference does
        total = [full[i] - out_shape[i] for i in range(n)]
        if any(t < 0 for t in total):
            raise ShapeInferenceError(f"{name}: output_shape {out_shape} larger than the full "
                                      f"output {full} (input {x})")
        upper = auto_pad == "SAME_UPPER"
        pb = [t // 2 if upper else t - t // 2 for t in total]
        return pb, [t - b for t, b in zip(total, pb)]
    if auto_pad in ("NOTSET", "VALID"):
        pads = _ints(node, "pads", 2 * n, 0) if auto_pad == "NOTSET" else [0] * (2 * n)
        if any(p < 0 for p in pads):
            raise ShapeInferenceError(f"{name}: negative pads {pads}")
        return pads[:n], pads[n:]
    raise ShapeInferenceError(f"{name}: unknown auto_pad {auto_pad!r}")


def _kernels(node, ins, outs, deps):
    g = _geometry(node, ins)
    has_bias = len(ins) > 2 and ins[2] is not None
    jit = (*type_jit("T", ins[0].dtype), ("SY", g["s"][0]), ("SX", g["s"][1]),
           ("DY", g["d"][0]), ("DX", g["d"][1]), ("HAS_BIAS", int(has_bias)),
           ("IMPL_TAG", "ConvTranspose"))
    args = (("in", 0), ("in", 1)) + ((("in", 2),) if has_bias else ()) + (("out", 0),)
    return [KernelCall("deconv", "conv_transpose2d", jit, args,
                       params=(g["pb"][0], g["pb"][1], g["group"]), gws=(max(outs[0].count, 1),),
                       dims=g["dims"])]


@register("ConvTranspose", checked=22, kernels=_kernels, f16=True)
def _conv_transpose(node, ins, deps):
    g = _geometry(node, ins)
    return [Layout((g["N"], g["OC"], *g["out"]), ins[0].dtype)]
