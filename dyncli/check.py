"""--check: onnxruntime on the same inputs as the reference for every output."""
from __future__ import annotations

import re
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


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# onnxruntime's exception text: '[ONNXRuntimeError] : 10 : INVALID_GRAPH : the reason'
_ORT_PREFIX = re.compile(r"^\s*\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*[A-Z_]+\s*:\s*")


def ort_reason(e: Exception) -> str:
    """The first line of onnxruntime's message, without its code prefix and colour codes."""
    first = (_ANSI.sub("", str(e)).strip().splitlines() or ["no message"])[0]
    return _ORT_PREFIX.sub("", first).strip() or "no message"


class OnnxRuntimeRefused(RuntimeError):
    """onnxruntime refused the model or an inference: one line, exit status 2."""


def ort_session(model: onnx.ModelProto, opts):
    """An onnxruntime CPU session of `model`, and the IR version it was declared at when the
    installed onnxruntime is older than the onnx that wrote it (None: as written). That
    onnxruntime refuses the newer IR version outright, though the model rarely uses anything
    of it: it is tried at the newest one the runtime reads, and a real need of the newer IR
    is still refused by the runtime."""
    import onnxruntime as ort
    try:
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]), None
    except Exception as e:  # noqa: BLE001 - onnxruntime's errors share no public base class
        newest = re.search(r"max supported IR version: (\d+)", str(e))
        if newest is None or model.ir_version <= int(newest.group(1)):
            raise
    older = onnx.ModelProto()
    older.CopyFrom(model)
    older.ir_version = int(newest.group(1))
    return ort.InferenceSession(older.SerializeToString(), opts, providers=["CPUExecutionProvider"]), \
        older.ir_version


class Reference:
    def __init__(self, model: onnx.ModelProto):
        try:
            import onnxruntime as ort
        except ImportError:
            raise CheckUnavailable("--check needs onnxruntime: pip install 'dyncli[check]'") from None
        opts = ort.SessionOptions()
        opts.log_severity_level = 4   # fatal only: its errors come back as exceptions, said once
        try:
            self.sess, self.ir_declared = ort_session(model, opts)
        except Exception as e:  # noqa: BLE001 - onnxruntime's errors share no public base class
            raise OnnxRuntimeRefused(f"--check: onnxruntime refused the model: {ort_reason(e)}") from None
        self.outputs = [o.name for o in self.sess.get_outputs()]

    def run(self, feeds: dict) -> dict:
        try:
            return dict(zip(self.outputs, self.sess.run(None, feeds)))
        except Exception as e:  # noqa: BLE001
            raise OnnxRuntimeRefused(f"--check: onnxruntime refused the inference: {ort_reason(e)}") from None


# default (rtol, atol) of --check by the output's element type: a half has an 11-bit
# significand and both engines round intermediates to it at different points
TOLERANCE = {"float16": (1e-2, 1e-2)}
DEFAULT_TOLERANCE = (1e-3, 1e-4)
# 8-bit integer outputs are quantized values: one quantization step apart by default (a float
# sum the engine rounds differently from onnxruntime's integer kernels lands on the other side
# of a rint tie, docs/ops.md). Every other integer and bool output must match exactly.
QUANTIZED_STEPS = {"int8": 1, "uint8": 1}


def compare(name: str, got: np.ndarray, want: np.ndarray, rtol: float | None = None,
            atol: float | None = None) -> Comparison:
    """got vs the reference; a tolerance left None takes the output type's default."""
    d_rtol, d_atol = TOLERANCE.get(want.dtype.name, DEFAULT_TOLERANCE)
    rtol = d_rtol if rtol is None else rtol
    if got.shape != want.shape:
        return Comparison(name, False, float("inf"), float("inf"),
                          f"shape {got.shape} != reference {want.shape}")
    if got.size == 0:
        return Comparison(name, True, 0.0, 0.0)
    # integers and bool: exact, but for the quantized types (QUANTIZED_STEPS; --atol in steps)
    if got.dtype.kind in "biu" or want.dtype.kind in "biu":
        if want.dtype.name in QUANTIZED_STEPS and got.dtype == want.dtype:
            steps = QUANTIZED_STEPS[want.dtype.name] if atol is None else atol
            diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
            bad, near = int(np.count_nonzero(diff > steps)), int(np.count_nonzero(diff))
            detail = f"{bad} elements differ by more than {steps:g}" if bad else \
                f"{near} elements within {steps:g} quantization step(s)" if near else ""
            return Comparison(name, bad == 0, float(diff.max()), 0.0, detail)
        bad = int(np.count_nonzero(got != want))
        return Comparison(name, bad == 0, float(bad and 1), 0.0, f"{bad} elements differ" if bad else "")
    g, w = got.astype(np.float64), want.astype(np.float64)
    # NaN and infinities must match exactly where either side has them; they are compared
    # apart, so no arithmetic below meets them (numpy would warn on inf - inf)
    g_nan, w_nan = np.isnan(g), np.isnan(w)
    if not np.array_equal(g_nan, w_nan):
        return Comparison(name, False, float("inf"), float("inf"), _nan_words(g_nan, w_nan))
    w_inf = np.isinf(w)
    if not np.array_equal(g[w_inf], w[w_inf]):
        first = int(np.flatnonzero(w_inf & (g != w))[0])
        return Comparison(name, False, float("inf"), float("inf"),
                          f"onnxruntime has {w.flat[first]:+g} at index {first}, dyncli {g.flat[first]:g}")
    finite = ~(w_nan | w_inf)
    if not finite.any():
        return Comparison(name, True, 0.0, 0.0)
    atol = d_atol if atol is None else atol
    gf, wf = g[finite], w[finite]
    diff = np.abs(gf - wf)    # inf where dyncli alone has an infinity: a mismatch as any other
    max_abs = float(diff.max())
    max_rel = float((diff / np.maximum(np.abs(wf), 1e-12)).max())
    ok = bool(np.all(diff <= atol + rtol * np.abs(wf)))
    return Comparison(name, ok, max_abs, max_rel)


def _nan_words(g_nan: np.ndarray, w_nan: np.ndarray) -> str:
    parts = []
    for mask, what in ((g_nan & ~w_nan, "NaN where onnxruntime has a number"),
                       (w_nan & ~g_nan, "a number where onnxruntime has NaN")):
        idx = np.flatnonzero(mask)
        if idx.size:
            parts.append(f"{what} at {idx.size} element(s) (first at index {int(idx[0])})")
    return "; ".join(parts)
