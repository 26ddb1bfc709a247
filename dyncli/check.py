"""--check: onnxruntime on the same inputs as the reference for every output."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx


class CheckUnavailable(RuntimeError):
    pass


@dataclass
class Comparison:
    output: str
    ok: bool
    max_abs: float
    max_rel: float
    detail: str = ""


def relaxed_model(model: onnx.ModelProto, overrides: dict) -> onnx.ModelProto:
    """A copy whose graph inputs declare the relaxed dims of --model-shape (None = unknown), so
    that onnxruntime accepts the shapes the user asked for."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        dims = overrides.get(vi.name)
        if dims is None:
            continue
        shape = vi.type.tensor_type.shape
        del shape.dim[:]
        for k, d in enumerate(dims):
            dim = shape.dim.add()
            if d is None:
                dim.dim_param = f"{vi.name}_d{k}"
            else:
                dim.dim_value = d
    return m


class Reference:
    def __init__(self, model: onnx.ModelProto):
        try:
            import onnxruntime as ort
        except ImportError:
            raise CheckUnavailable("--check needs onnxruntime: pip install 'dyncli[check]'") from None
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        self.sess = ort.InferenceSession(model.SerializeToString(), opts,
                                         providers=["CPUExecutionProvider"])
        self.outputs = [o.name for o in self.sess.get_outputs()]

    def run(self, feeds: dict) -> dict:
        return dict(zip(self.outputs, self.sess.run(None, feeds)))


# default (rtol, atol) of --check by the output's element type: a half has an 11-bit
# significand and both engines round intermediates to it at different points
TOLERANCE = {"float16": (1e-2, 1e-2)}
DEFAULT_TOLERANCE = (1e-3, 1e-4)


def compare(name: str, got: np.ndarray, want: np.ndarray, rtol: float | None = None,
            atol: float | None = None) -> Comparison:
    """got vs the reference; a tolerance left None takes the output type's default."""
    d_rtol, d_atol = TOLERANCE.get(want.dtype.name, DEFAULT_TOLERANCE)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    if got.shape != want.shape:
        return Comparison(name, False, float("inf"), float("inf"),
                          f"shape {got.shape} != reference {want.shape}")
    if got.size == 0:
        return Comparison(name, True, 0.0, 0.0)
    if got.dtype.kind in "biu" or want.dtype.kind in "biu":   # integers and bool: exact
        bad = int(np.count_nonzero(got != want))
        return Comparison(name, bad == 0, float(bad and 1), 0.0, f"{bad} elements differ" if bad else "")
    g, w = got.astype(np.float64), want.astype(np.float64)
    diff = np.abs(g - w)
    finite = np.isfinite(w)
    # nan/inf must match exactly where the reference has them
    if not np.array_equal(np.isnan(g), np.isnan(w)) or not np.array_equal(g[~finite & ~np.isnan(w)],
                                                                           w[~finite & ~np.isnan(w)]):
        return Comparison(name, False, float("inf"), float("inf"), "non-finite values differ")
    diff = np.where(finite, diff, 0.0)
    max_abs = float(diff.max())
    max_rel = float((diff / np.maximum(np.abs(w), 1e-12)).max())
    ok = bool(np.all(diff <= atol + rtol * np.abs(np.where(finite, w, 0.0))))
    return Comparison(name, ok, max_abs, max_rel)
