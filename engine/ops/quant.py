"""Quantization ops on the device (cl/quant.cl), with onnxruntime's CPU arithmetic:

- QuantizeLinear: rint(x / scale) + zero point, saturated (round half to even); per tensor,
  per axis (a 1-D scale) or blocked (`block_size`, opset 21+); int8/uint8/int16/uint16 out.
- DequantizeLinear: float(x - zero point) * scale, the same three granularities; int8/uint8/
  int16/uint16/int32 in.
- DynamicQuantizeLinear: the range of x widened to hold 0 gives scale and zero point (one
  work-group), then QuantizeLinear's kernel.
- MatMulInteger, ConvInteger: exact int32 accumulation of (a - a_zp) * (b - b_zp).
- QLinearMatMul, QLinearConv: the same accumulation (plus QLinearConv's int32 bias), requantized
  as rint(float(acc) * (a_scale * b_scale / y_scale)) + y_zp, saturated.

A QDQ model (QuantizeLinear/DequantizeLinear around float ops) runs as written: DequantizeLinear,
the float op, QuantizeLinear. onnxruntime fuses such groups into its integer kernels, so the
two differ where a float sum lands on the other side of a rounding tie (docs/ops.md bounds it).
float16 scales and data run through the Casts the program inserts (computed in float32), the
8-bit float and 2/4-bit types are not device types.
"""
from __future__ import annotations

from engine.kernels import KernelCall
from engine.layout import Layout, cl_type, type_jit
from engine.ops.common import ShapeInferenceError, norm_axis
from engine.ops.conv import _conv_geometry
from engine.ops.matmul import _mm_operands
from engine.ops.registry import register
# QRANGE: the saturation range of each quantized type; importing quant_host registers the host
# impls (constant folding at every opset)
from engine.ops.quant_host import QRANGE
from onnx import TensorProto

# the element types the integer kernels take for A/X and B/W
INT8 = ("i8", "u8")
# one work-group reduces DynamicQuantizeLinear's input range
DQL_WG = 256


def _name(node) -> str:
    return f"{node.op} {node.name}"


def _given(ins, i):
    return ins[i] if len(ins) > i and ins[i] is not None else None


def _check_float(node, layout, what):
    if layout.dtype != "f32":
        raise ShapeInferenceError(f"{_name(node)}: {what} must be float (got {layout.dtype})")


def _granularity(node, x: Layout, scale: Layout, zp: Layout | None) -> tuple:
    """(mode, params) of cl/quant.cl's q_param_index for data x and its scale: 0 per tensor,
    1 per axis, 2 blocked; params (axis dim, elements after the axis, block, scale's axis dim)."""
    if zp is not None and tuple(zp.shape) != tuple(scale.shape):
        raise ShapeInferenceError(f"{_name(node)}: zero point {zp} and scale {scale} differ in shape")
    block = int(node.attrs.get("block_size", 0))
    if scale.count == 1 and block == 0:
        return 0, (1, 1, 1, 1)
    if x.rank == 0:
        raise ShapeInferenceError(f"{_name(node)}: a scalar input takes a scalar scale, got {scale}")
    axis = norm_axis(int(node.attrs.get("axis", 1)), x.rank)
    a = x.shape[axis]
    inner = 1
    for d in x.shape[axis + 1:]:
        inner *= d
    if block <= 0:
        if scale.rank != 1 or scale.shape[0] != a:
            raise ShapeInferenceError(f"{_name(node)}: scale {scale} must be a scalar or [{a}] "
                                      f"(axis {axis} of {x})")
        return 1, (a, inner, 1, a)
    sa = -(-a // block)
    want = tuple(sa if d == axis else n for d, n in enumerate(x.shape))
    if tuple(scale.shape) != want:
        raise ShapeInferenceError(f"{_name(node)}: blocked scale {scale} must be "
                                  f"{'x'.join(map(str, want))} (block {block} on axis {axis} of {x})")
    return 2, (a, max(inner, 1), block, sa)


def _q_call(kernel, node, x: Layout, mode: int, params: tuple, tx: str, tz: str | None, ty: str,
            args: tuple) -> KernelCall:
    lo, hi = QRANGE.get(ty, (0, 255))   # the range only matters where ty is quantized
    jit = (*type_jit("TX", tx), ("TY", cl_type(ty)), ("Q_MODE", mode), ("HAS_ZP", int(tz is not None)),
           ("QMIN", lo), ("QMAX", hi), ("IMPL_TAG", node.op))
    if tz is not None:
        jit += (("TZ", cl_type(tz)),)
    return KernelCall("quant", kernel, jit, args, params=params, gws=(max(x.count, 1),))


def _quant_out_dtype(node, zp: Layout | None) -> str:
    if zp is not None:
        dt = zp.dtype
    else:
        code = int(node.attrs.get("output_dtype", 0)) or TensorProto.UINT8
        dt = {TensorProto.UINT8: "u8", TensorProto.INT8: "i8", TensorProto.UINT16: "u16",
              TensorProto.INT16: "i16"}.get(code, TensorProto.DataType.Name(code))
    if dt not in QRANGE:
        raise ShapeInferenceError(f"{_name(node)}: quantizing to {dt} is not supported "
                                  f"({', '.join(QRANGE)})")
    return dt


def _quantize_kernels(node, ins, outs, deps):
    x, scale, zp = ins[0], ins[1], _given(ins, 2)
    mode, params = _granularity(node, x, scale, zp)
    args = (("in", 0), ("in", 1)) + ((("in", 2),) if zp is not None else ()) + (("out", 0),)
    return [_q_call("quantize", node, x, mode, params, x.dtype, zp and zp.dtype, outs[0].dtype, args)]


# checked 28: versions 24, 25 and 28 only add element types (8-bit/6-bit floats, int2/uint2)
@register("QuantizeLinear", checked=28, kernels=_quantize_kernels, host_ok=True)
def _quantize(node, ins, deps):
    x, scale, zp = ins[0], ins[1], _given(ins, 2)
    if x.dtype not in ("f32", "i32"):
        raise ShapeInferenceError(f"{_name(node)}: input {x} must be float or int32")
    _check_float(node, scale, "the scale")
    # precision (opset 23+): the division's type; float16 runs in float32 here, as the data
    if int(node.attrs.get("precision", 0)) not in (0, TensorProto.FLOAT, TensorProto.FLOAT16):
        raise ShapeInferenceError(f"{_name(node)}: precision {node.attrs['precision']} is not supported")
    dt = _quant_out_dtype(node, zp)
    _granularity(node, x, scale, zp)
    return [Layout(x.shape, dt)]


def _dequantize_kernels(node, ins, outs, deps):
    x, scale, zp = ins[0], ins[1], _given(ins, 2)
    mode, params = _granularity(node, x, scale, zp)
    args = (("in", 0), ("in", 1)) + ((("in", 2),) if zp is not None else ()) + (("out", 0),)
    return [_q_call("dequantize", node, x, mode, params, x.dtype, zp and zp.dtype, "f32", args)]


@register("DequantizeLinear", checked=28, kernels=_dequantize_kernels, host_ok=True)
def _dequantize(node, ins, deps):
    x, scale, zp = ins[0], ins[1], _given(ins, 2)
    if x.dtype not in (*QRANGE, "i32"):
        raise ShapeInferenceError(f"{_name(node)}: dequantizing {x.dtype} is not supported")
    _check_float(node, scale, "the scale")
    if zp is not None and zp.dtype != x.dtype:
        raise ShapeInferenceError(f"{_name(node)}: zero point {zp} and input {x} differ in type")
    _granularity(node, x, scale, zp)
    # output_dtype (opset 23+) may only name the scale's type: float32, or float16 (Casts)
    return [Layout(x.shape, "f32")]


def _dql_kernels(node, ins, outs, deps):
    x = ins[0]
    params = _q_call("dql_params", node, x, 0, (), "f32", None, "u8",
                     (("in", 0), ("out", 1), ("out", 2)))
    params.jit += (("DQL_WG", DQL_WG),)
    params.gws, params.lws = (DQL_WG,), (DQL_WG,)
    # the quantize kernel reads the scale and zero point the first kernel wrote
    quant = _q_call("quantize", node, x, 0, (1, 1, 1, 1), "f32", "u8", "u8",
                    (("in", 0), ("out", 1), ("out", 2), ("out", 0)))
    return [params, quant]


@register("DynamicQuantizeLinear", checked=11, kernels=_dql_kernels)
def _dynamic_quantize(node, ins, deps):
    _check_float(node, ins[0], "the input")
    return [Layout(ins[0].shape, "u8"), Layout((), "f32"), Layout((), "u8")]


def _int_types(node, p: Layout, q: Layout, pz: Layout | None, qz: Layout | None):
    for what, l, z in (("A", p, pz), ("B", q, qz)):
        if l.dtype not in INT8:
            raise ShapeInferenceError(f"{_name(node)}: {what} {l} must be int8 or uint8")
        if z is not None and z.dtype != l.dtype:
            raise ShapeInferenceError(f"{_name(node)}: {what}'s zero point {z} is not {l.dtype}")


def _zp_shape(node, z: Layout | None, n: int, what: str):
    """A zero point or scale: a scalar, or `n` values along one dim."""
    if z is not None and z.count != 1 and (z.rank != 1 or z.shape[0] != n):
        raise ShapeInferenceError(f"{_name(node)}: {what} {z} must be a scalar or [{n}]")


def _int_jit(node, p: Layout, q: Layout, pz, qz, kind: int, y: str | None = None,
             bias: bool = False) -> tuple:
    jit = (("TA", cl_type(p.dtype)), ("TB", cl_type(q.dtype)), ("HAS_PZ", int(pz is not None)),
           ("HAS_QZ", int(qz is not None)), ("INT_KIND", kind), ("HAS_BIAS", int(bias)),
           ("IMPL_TAG", node.op))
    if y is not None:
        lo, hi = QRANGE[y]
        jit += (("TY", cl_type(y)), ("QMIN", lo), ("QMAX", hi))
    return jit


# input positions: (A, B, A's zp, B's zp, [A's scale, B's scale, Y's scale, Y's zp, [bias]])
MM_INPUTS = {"MatMulInteger": (0, 1, 2, 3), "ConvInteger": (0, 1, 2, 3),
             "QLinearMatMul": (0, 3, 2, 5, 1, 4, 6, 7), "QLinearConv": (0, 3, 2, 5, 1, 4, 6, 7, 8)}


def _int_args(node, ins) -> tuple:
    """The kernel's tensor arguments (absent optional inputs left out) and its JIT."""
    pos = MM_INPUTS[node.op]
    got = [(i, _given(ins, i)) for i in pos]
    p, q, pz, qz = (l for _, l in got[:4])
    _int_types(node, p, q, pz, qz)
    kind, y, bias = 1, None, False
    if len(pos) > 4:
        kind = 2
        for what, (_, l) in zip(("A's scale", "B's scale", "Y's scale"), got[4:7]):
            _check_float(node, l, what)
        if got[7][1] is None or got[7][1].dtype not in INT8:
            raise ShapeInferenceError(f"{_name(node)}: Y's zero point must be int8 or uint8")
        y = got[7][1].dtype
        bias = len(got) > 8 and got[8][1] is not None
        if bias and got[8][1].dtype != "i32":
            raise ShapeInferenceError(f"{_name(node)}: the bias must be int32")
    args = tuple(("in", i) for i, l in got if l is not None) + (("out", 0),)
    return args, _int_jit(node, p, q, pz, qz, kind, y, bias), got


def _mm_kernels(node, ins, outs, deps):
    args, jit, got = _int_args(node, ins)
    a2, b2, batch, _ = _mm_operands(got[0][1].shape, got[1][1].shape)
    M, K, N = a2[-2], a2[-1], b2[-1]
    nb = 1
    for d in batch:
        nb *= d
    dims = {0: a2, 1: b2, len(args) - 1: tuple(batch) + (M, N)}
    return [KernelCall("quant", "matmul_integer", jit + (("INT_MM", 1),), args, params=(M, N, K),
                       gws=(max(N, 1), max(M, 1), max(nb, 1)), dims=dims)]


def _mm_infer(node, ins, deps):
    got = _int_args(node, ins)[2]
    a2, b2, _, out = _mm_operands(got[0][1].shape, got[1][1].shape)
    _zp_shape(node, got[2][1], a2[-2], "A's zero point")
    _zp_shape(node, got[3][1], b2[-1], "B's zero point")
    if len(got) > 4:
        for what, (_, l) in zip(("A's scale", "B's scale", "Y's scale", "Y's zero point"), got[4:8]):
            _zp_shape(node, l, b2[-1] if what == "B's scale" else 1, what)
        return [Layout(out, got[7][1].dtype)]
    return [Layout(out, "i32")]


register("MatMulInteger", checked=10, kernels=_mm_kernels)(_mm_infer)
register("QLinearMatMul", checked=21, kernels=_mm_kernels)(_mm_infer)


def _conv_geo(node, ins):
    _, _, got = _int_args(node, ins)
    x, w = got[0][1], got[1][1]
    # the float Conv's geometry (it checks types: give it float layouts of the same shapes);
    # its errors name the op as Conv
    try:
        g = _conv_geometry(node, [Layout(x.shape, "f32"), Layout(w.shape, "f32")])
    except ShapeInferenceError as e:
        raise ShapeInferenceError(str(e).replace("Conv ", f"{node.op} ", 1)) from None
    _zp_shape(node, got[2][1], 1, "x's zero point")
    _zp_shape(node, got[3][1], g["OC"], "w's zero point")
    if len(got) > 4:
        for what, (_, l) in zip(("x's scale", "w's scale", "y's scale", "y's zero point"), got[4:8]):
            _zp_shape(node, l, g["OC"] if what == "w's scale" else 1, what)
        if len(got) > 8 and got[8][1] is not None and tuple(got[8][1].shape) != (g["OC"],):
            raise ShapeInferenceError(f"{_name(node)}: bias {got[8][1]} must be [{g['OC']}]")
    return g, got


def _conv_kernels(node, ins, outs, deps):
    args, jit, _ = _int_args(node, ins)
    g, _ = _conv_geo(node, ins)
    jit += (("INT_CONV", 1), ("SY", g["strides"][0]), ("SX", g["strides"][1]),
            ("DY", g["dil"][0]), ("DX", g["dil"][1]))
    dims = {}
    if g["one_d"]:   # [N, C, L] as [N, C, 1, L]
        dims = {0: (g["N"], g["C"], 1, g["W"]), 1: (g["OC"], g["ICg"], 1, g["KW"]),
                len(args) - 1: (g["N"], g["OC"], 1, g["OW"])}
    return [KernelCall("quant", "conv_integer", jit, args,
                       params=(g["pads"][0], g["pads"][1], g["group"]),
                       gws=(max(g["OW"], 1), max(g["OH"], 1), max(g["N"] * g["OC"], 1)), dims=dims)]


def _conv_infer(node, ins, deps):
    g, got = _conv_geo(node, ins)
    dt = got[7][1].dtype if len(got) > 4 else "i32"
    if g["one_d"]:
        return [Layout((g["N"], g["OC"], g["OW"]), dt)]
    return [Layout((g["N"], g["OC"], g["OH"], g["OW"]), dt)]


register("ConvInteger", checked=10, kernels=_conv_kernels)(_conv_infer)
register("QLinearConv", checked=10, kernels=_conv_kernels)(_conv_infer)
