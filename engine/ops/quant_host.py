"""Host impls of QuantizeLinear and DequantizeLinear (constant folding: a QDQ model's weights are
DequantizeLinear of int8 initializers). onnx.reference has none before opset 19, and exporters
write opsets 13-17; these serve every opset, with the device kernels' arithmetic (cl/quant.cl).
Types they do not take (8-bit floats, 4-bit ints) fall back to onnx.reference (None)."""
from __future__ import annotations

import numpy as np

from engine.host_ops import _fast
from engine.layout import np_dtype

# saturation range of each quantized type (the device kernels' too)
QRANGE = {"i8": (-128, 127), "u8": (0, 255), "i16": (-32768, 32767), "u16": (0, 65535)}
_NP_RANGE = {np_dtype(k): v for k, v in QRANGE.items()}


def _expand(node, x, p):
    """A scale or zero point broadcast to x: per tensor, per axis or blocked."""
    if p.size == 1:
        return p.reshape(())
    axis = int(node.attrs.get("axis", 1)) % x.ndim
    block = int(node.attrs.get("block_size", 0))
    if block <= 0:
        return p.reshape([-1 if d == axis else 1 for d in range(x.ndim)])
    return np.repeat(p, block, axis=axis).take(range(x.shape[axis]), axis=axis)


@_fast("DequantizeLinear")
def dequantize(node, x, scale, zp=None):
    if x.dtype not in _NP_RANGE and x.dtype != np.int32 or scale.dtype != np.float32:
        return None
    d = x.astype(np.int32)
    if zp is not None:
        d = d - _expand(node, x, zp).astype(np.int32)
    return [d.astype(np.float32) * _expand(node, x, scale)]


@_fast("QuantizeLinear")
def quantize(node, x, scale, zp=None):
    to = zp.dtype if zp is not None else np.dtype(np.uint8)
    if to not in _NP_RANGE or x.dtype != np.float32 or scale.dtype != np.float32 \
            or zp is None and int(node.attrs.get("output_dtype", 0)) not in (0, 2):
        return None
    lo, hi = _NP_RANGE[to]
    q = np.rint(x / _expand(node, x, scale))
    if zp is not None:
        q = q + _expand(node, x, zp).astype(np.float32)
    return [np.clip(q, lo, hi).astype(to)]
