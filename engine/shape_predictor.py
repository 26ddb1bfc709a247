"""Output-buffer preallocation: OpenVINO GPU's ``ShapePredictor`` and a replay of ``realloc_if_needed``.

Behaviour follows openvinotoolkit/openvino, read at commit 473faca3:
``src/plugins/intel_gpu/src/runtime/shape_predictor.cpp`` (with the ``Settings`` struct in
``include/intel_gpu/runtime/shape_predictor.hpp``) and the caller
``primitive_inst::realloc_if_needed`` in ``src/plugins/intel_gpu/src/graph/primitive_inst.cpp``.
This is an independent Python rendering of that logic.

Predictor (``predict_preallocation_shape``):

* every call appends the shape to a per-id history of at most 3 shapes (oldest dropped), even
  when the caller can reuse its buffer; with ``can_reuse_buffer`` the answer is always "no";
* a caller-given dim + count (the kv_cache path) short-circuits: ``shape[dim] += count``;
* with fewer than 3 shapes recorded there is no prediction;
* iterations mode: the two consecutive diffs (last-prev, prev-prevprev) must both exist (no dim
  may shrink), be equal and not all zero; every per-dim step must be ``<= max_per_dim_diff``
  (the check is ``diff > max`` -> reject, so a step equal to the limit passes), and one
  iteration's slice - the current shape with every growing dim set to 1 - must take
  ``ceil(elements * bitwidth / 8) <= max_per_iter_size`` *bytes* (bits converted to bytes,
  rounded up; again only ``>`` rejects).  The prediction is ``current + step * next_iters``;
* otherwise, if ``ratio > 1.0`` (float32 compare) and the format is not blocked: ratio mode.
  The predicted "shape" is flat: ``[floor(f32(count) * f32(ratio)), 1, 1, ...]`` (same rank),
  computed in float32 exactly as the C++ ``size_t * float`` is; a blocked format gets no
  prediction;
* otherwise no prediction.

``can_preallocate(desired)``: false when ``desired`` exceeds the device's max single allocation
(newer sources only), else ``used + desired < max_global_mem_size * 0.90f``, a strict compare
done in float32 because the right side is a float.

``realloc_if_needed`` (replayed by :func:`simulate_openvino` for one plain output):

* reclaim: if ``required_elements * 10 < capacity_elements`` the recorded capacity is reset to 0,
  which forces a fresh (smaller) allocation below;
* ``can_reuse_buffer = buffer exists and required_elements <= capacity_elements``;
* the predictor is always called (so it records the shape); its shape is used only if it
  predicted and ``can_preallocate(shape_size(pred) * dtype_size_in_bytes)`` holds; if the
  predicted element count is below the required one the exact layout is used instead;
* on no reuse a new buffer is allocated and its element count becomes the capacity.
"""
from __future__ import annotations

import functools
import math
import re
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

__all__ = [
    "PreallocSettings",
    "ShapePredictor",
    "SimStep",
    "SimResult",
    "simulate",
    "simulate_openvino",
    "can_preallocate",
    "BufferState",
    "ReallocDecision",
    "MEMORY_THRESHOLD",
    "MAX_HISTORY",
    "RECLAIM_FACTOR",
]

MAX_HISTORY = 3          # shapes kept per id; also the number needed for a prediction
MEMORY_THRESHOLD = 0.90  # share of device global memory preallocation may fill
RECLAIM_FACTOR = 10      # realloc_if_needed drops a buffer > 10x what is required

_INT_RE = re.compile(r"[+]?\d+")


def _f32(x) -> np.float32:
    """Round a Python int/float to float32 the way a C++ conversion does (round-to-nearest-even).

    Large ints are rounded directly from their bits so no int->double->float double rounding
    can creep in.
    """
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        n = int(x)
        sign = -1 if n < 0 else 1
        n = abs(n)
        if n.bit_length() > 24:
            shift = n.bit_length() - 24
            mant = n >> shift
            rem = n - (mant << shift)
            half = 1 << (shift - 1)
            if rem > half or (rem == half and (mant & 1)):
                mant += 1
            n = mant << shift  # <= 25 significant bits: exact as a double and as a float32
        return np.float32(float(sign * n))
    return np.float32(x)


def _f32_mul(a, b) -> np.float32:
    # The product of two float32 values is exact in a double, so one rounding gives IEEE float32.
    return np.float32(float(_f32(a)) * float(_f32(b)))


def _shape_size(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _bytes_for(elements: int, dt_bitwidth: int) -> int:
    # layout::bytes_count for sub-byte types: bits rounded up to whole bytes
    return (elements * dt_bitwidth + 7) // 8


@dataclass(frozen=True)
class PreallocSettings:
    """ShapePredictor::Settings; the text form is the one OV_GPU_MemPreallocationOptions takes."""

    next_iters: int = 10
    max_per_iter_bytes: int = 16384
    max_per_dim_diff: int = 2
    ratio: float = 1.1

    def __post_init__(self):
        for name in ("next_iters", "max_per_iter_bytes", "max_per_dim_diff"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"PreallocSettings.{name} must be a non-negative int, got {v!r}")
        r = self.ratio
        if isinstance(r, bool) or not isinstance(r, (int, float, np.floating, np.integer)) \
                or not math.isfinite(float(r)) or float(r) < 0:
            raise ValueError(f"PreallocSettings.ratio must be a finite non-negative number, got {r!r}")

    @classmethod
    def parse(cls, text: str) -> "PreallocSettings":
        """Parse "ITERS MAX_BYTES_PER_ITER MAX_PER_DIM_DIFF RATIO", e.g. "10 16384 2 1.1".

        Like the plugin, exactly four whitespace-separated values are required; unlike its
        std::stol/std::stof we reject trailing junk and negative counts instead of wrapping them.
        """
        if not isinstance(text, str):
            raise ValueError(f"preallocation options must be a string, got {type(text).__name__}")
        parts = text.split()
        form = "expected 4 values 'ITERS MAX_BYTES_PER_ITER MAX_PER_DIM_DIFF RATIO', e.g. '10 16384 2 1.1'"
        if len(parts) != 4:
            raise ValueError(f"bad preallocation options {text!r}: {form}, got {len(parts)} value(s)")
        names = ("ITERS", "MAX_BYTES_PER_ITER", "MAX_PER_DIM_DIFF")
        ints = []
        for name, tok in zip(names, parts[:3]):
            if not _INT_RE.fullmatch(tok):
                raise ValueError(f"bad preallocation options {text!r}: {name} must be a non-negative integer, got {tok!r}")
            ints.append(int(tok))
        try:
            ratio = float(parts[3])
        except ValueError:
            raise ValueError(f"bad preallocation options {text!r}: RATIO must be a number, got {parts[3]!r}") from None
        if not math.isfinite(ratio) or ratio < 0:
            raise ValueError(f"bad preallocation options {text!r}: RATIO must be finite and >= 0, got {parts[3]!r}")
        return cls(ints[0], ints[1], ints[2], ratio)

    def __str__(self) -> str:
        return f"{self.next_iters} {self.max_per_iter_bytes} {self.max_per_dim_diff} {float(self.ratio)!r}"


def can_preallocate(desired_bytes: int, used_bytes: int = 0, device_mem_bytes: int | None = None,
                    max_alloc_bytes: int | None = None) -> bool:
    """90% rule: ``used + desired < 0.9 * device memory`` (strict, float32 like the C++); newer
    sources also refuse more than the device's max single allocation. Unknown memory: allowed."""
    if max_alloc_bytes is not None and desired_bytes > max_alloc_bytes:
        return False
    if device_mem_bytes is None:
        return True
    total, limit = int(used_bytes) + int(desired_bytes), _memory_limit(int(device_mem_bytes))
    # float32 rounds an integer by at most 2^-24 of it: well below the limit the answer is
    # True without rounding (a growth asks for each of its buffers)
    if total <= limit * (1 - 2.0 ** -22):
        return True
    return float(_f32(total)) < limit


@functools.lru_cache(maxsize=16)
def _memory_limit(device_mem_bytes: int) -> float:
    """0.9 x device memory in float32 (as the C++ computes it), once per device: a growth
    asks for it for every buffer."""
    return float(_f32_mul(device_mem_bytes, np.float32(MEMORY_THRESHOLD)))


class ShapePredictor:
    """Per-network predictor of output shapes worth preallocating (cldnn::ShapePredictor)."""

    def __init__(self, settings: PreallocSettings = PreallocSettings(), device_mem_bytes: int | None = None,
                 *, max_alloc_bytes: int | None = None):
        self.settings = settings
        self.device_mem_bytes = device_mem_bytes
        # Newer sources also refuse a preallocation bigger than the device's max single allocation.
        self.max_alloc_bytes = max_alloc_bytes
        self._shapes: dict[str, deque] = {}
        self.last_mode = "none"  # "none" | "iterations" | "ratio" | "custom" -- for tracing

    def reset(self) -> None:
        self._shapes.clear()
        self.last_mode = "none"

    def history(self, id: str) -> tuple[tuple[int, ...], ...]:
        """Shapes currently remembered for ``id`` (oldest first)."""
        return tuple(self._shapes.get(id, ()))

    def _add_shape(self, id: str, shape: tuple[int, ...]) -> None:
        q = self._shapes.setdefault(id, deque(maxlen=MAX_HISTORY))
        q.append(shape)

    def can_preallocate(self, desired_bytes: int, used_bytes: int = 0) -> bool:
        return can_preallocate(desired_bytes, used_bytes, self.device_mem_bytes, self.max_alloc_bytes)

    def predict_preallocation_shape(self, id: str, current_shape: tuple[int, ...], dt_bitwidth: int,
                                    can_reuse_buffer: bool, *, out_idx: int = 0,
                                    custom_next_iters: int = -1, custom_prealloc_dim: int = -1,
                                    blocked_format: bool = False) -> tuple[bool, tuple[int, ...]]:
        """Return (predicted, shape); shape is () when nothing was predicted.

        Keyword extras mirror the C++ overload: ``out_idx`` > 0 keys the history as ``id_outN``,
        ``custom_next_iters`` > 0 replaces the iteration count, and together with
        ``custom_prealloc_dim`` >= 0 skips prediction altogether (the kv_cache path).
        """
        self.last_mode = "none"
        s = self.settings
        cur = tuple(int(d) for d in current_shape)
        n_iters = custom_next_iters if custom_next_iters > 0 else s.next_iters
        key = id if out_idx <= 0 else f"{id}_out{out_idx}"

        # History is recorded before the reuse check, so reused iterations still feed the trend.
        self._add_shape(key, cur)
        if can_reuse_buffer:
            return False, ()

        if custom_prealloc_dim >= 0 and custom_next_iters > 0:
            new = list(cur)
            new[custom_prealloc_dim] += custom_next_iters
            self.last_mode = "custom"
            return True, tuple(new)

        shapes = self._shapes[key]
        if len(shapes) < MAX_HISTORY:
            return False, ()

        step = self._iteration_step(shapes, cur, dt_bitwidth)
        if step is not None:
            self.last_mode = "iterations"
            return True, tuple(c + d * n_iters for c, d in zip(cur, step))

        if _f32(s.ratio) > np.float32(1.0):
            if blocked_format:
                return False, ()
            # Flat shape [count * ratio, 1, ..., 1]; size_t * float is evaluated in float32, then truncated.
            flat = int(_f32_mul(_shape_size(cur), s.ratio))
            self.last_mode = "ratio"
            return True, (flat,) + (1,) * (len(cur) - 1)
        return False, ()

    def _iteration_step(self, shapes: list, cur: tuple, dt_bitwidth: int) -> tuple | None:
        """The per-iteration growth of the last MAX_HISTORY shapes when every step was the same
        non-zero one within the per-dim and per-iteration limits, else None."""
        s = self.settings
        # Newest diff first; a dim that shrank ends the chain (the C++ '-' returns an empty shape).
        diffs = []
        for i in range(MAX_HISTORY - 1):
            a, b = shapes[-1 - i], shapes[-2 - i]
            if len(a) != len(b):
                raise ValueError(f"[GPU] Rank mismatch: {a} and {b}")
            if not a or any(x < y for x, y in zip(a, b)):
                break
            diffs.append(tuple(x - y for x, y in zip(a, b)))

        use_iters = len(diffs) == MAX_HISTORY - 1 and all(d == diffs[0] for d in diffs[1:])
        if use_iters:
            use_iters = any(diffs[0])
        if use_iters:
            step = diffs[0]
            # '>' in the source: a step equal to the limit is still allowed
            if any(d > s.max_per_dim_diff for d in step):
                use_iters = False
            # One iteration's slice: growing dims count 1, static dims keep their size; bits -> bytes
            one_iter = _shape_size(c if d == 0 else 1 for c, d in zip(cur, step))
            if _bytes_for(one_iter, dt_bitwidth) > s.max_per_iter_bytes:
                use_iters = False
        return diffs[0] if use_iters else None

    def realloc(self, buf: "BufferState", id: str, shape: tuple[int, ...], dtype_bits: int,
                used_bytes: int | None = None) -> "ReallocDecision":
        """primitive_inst::realloc_if_needed for one plain output buffer (module docstring)."""
        need = _shape_size(shape)
        reclaimed = False
        if need * RECLAIM_FACTOR < buf.cap_elems:
            buf.cap_elems = 0
            reclaimed = True
        can_reuse = buf.has_buffer and need <= buf.cap_elems
        ok, pred = self.predict_preallocation_shape(id, shape, dtype_bits, can_reuse)
        mode = self.last_mode
        alloc_elems, used_pred = need, False
        # For the 90% rule the bytes already held count as used (the old buffer is alive).
        used = _bytes_for(buf.held_elems, dtype_bits) if used_bytes is None else used_bytes
        dt_size = (dtype_bits + 7) // 8  # ov::element::Type::size()
        if ok and self.can_preallocate(_shape_size(pred) * dt_size, used):
            alloc_elems, used_pred = _shape_size(pred), True
        if alloc_elems < need:
            alloc_elems, used_pred = need, False
        if can_reuse:
            return ReallocDecision("reuse", 0, False, mode, reclaimed)
        buf.take(alloc_elems)
        return ReallocDecision("alloc", alloc_elems, used_pred, mode, reclaimed)


# ----------------------------------------------------------------------------------------------
# Replay of one node's output buffer through primitive_inst::realloc_if_needed
# ----------------------------------------------------------------------------------------------

@dataclass
class SimStep:
    iter: int
    required_bytes: int
    capacity_bytes: int     # capacity after this step's decision
    action: str             # "alloc" | "reuse"
    predicted: bool         # the allocation used the predictor's (larger) shape
    mode: str = "none"      # predictor mode on this step (tracing only)
    reclaimed: bool = False  # the 10x reclaim rule discarded the previous buffer
    shape: tuple = ()        # the required shape of this step


@dataclass
class SimResult:
    steps: list[SimStep] = field(default_factory=list)
    reallocations: int = 0            # every allocation, the first one included
    total_allocated_bytes: int = 0    # sum of the sizes of all allocations
    peak_capacity_bytes: int = 0
    peak_required_bytes: int = 0
    peak_slack_bytes: int = 0         # max over steps of capacity - required
    peak_slack_ratio: float = 0.0     # max over steps of (capacity - required) / required
    mean_slack_ratio: float = 0.0     # mean over steps of (capacity - required) / capacity


class ReallocDecision(NamedTuple):
    """Immutable; a NamedTuple rather than a frozen dataclass, whose __init__ sets each field
    through object.__setattr__ (a growth makes one per buffer that moves)."""
    action: str             # "alloc" | "reuse"
    alloc_elems: int        # elements of the new buffer (when action == "alloc")
    predicted: bool         # the allocation used the predictor's (larger) shape
    mode: str               # predictor mode of this call
    reclaimed: bool         # the 10x rule discarded the previous buffer


@dataclass
class BufferState:
    """One output buffer as realloc_if_needed sees it; shared by the engine and the simulator.

    Capacity is tracked in elements like ``_max_output_layout_count``; ``held_elems`` is what
    is really allocated (the reclaim rule resets the capacity, not the buffer, until the
    reallocation that follows)."""
    cap_elems: int = 0
    held_elems: int = 0
    has_buffer: bool = False

    def realloc_if_needed(self, sp, id: str, shape, dtype_bits: int,
                          used_bytes: int | None = None) -> ReallocDecision:
        """Decide this step through ``sp``: a ShapePredictor (the plugin's rule) or any
        preallocation policy of engine/predictors.py; they all share this entry point."""
        return sp.realloc(self, id, tuple(map(int, shape)), dtype_bits, used_bytes)

    def take(self, alloc_elems: int) -> None:
        """A new buffer of ``alloc_elems`` elements replaces the held one."""
        self.has_buffer = True
        self.cap_elems = self.held_elems = alloc_elems

    def drop(self) -> None:
        """The held buffer is gone and none replaced it (the device could not give the one the
        decision asked for): the next decision allocates rather than reuse a size never had."""
        self.has_buffer = False
        self.cap_elems = self.held_elems = 0


def simulate(shapes, dtype_bits: int, predictor, id: str = "buf") -> SimResult:
    """Replay ``shapes`` (one per inference) of a single output buffer through
    ``predictor.realloc`` (the engine's per-output decision) and gather the figures."""
    buf = BufferState()
    res = SimResult()
    slack_ratios = []
    for it, shape in enumerate(shapes):
        shape = tuple(int(d) for d in shape)
        d = buf.realloc_if_needed(predictor, id, shape, dtype_bits)
        if d.action == "alloc":
            res.reallocations += 1
            res.total_allocated_bytes += _bytes_for(d.alloc_elems, dtype_bits)
        cap_b = _bytes_for(buf.held_elems, dtype_bits)
        req_b = _bytes_for(_shape_size(shape), dtype_bits)
        res.steps.append(SimStep(it, req_b, cap_b, d.action, d.predicted, d.mode, d.reclaimed, shape))
        res.peak_capacity_bytes = max(res.peak_capacity_bytes, cap_b)
        res.peak_required_bytes = max(res.peak_required_bytes, req_b)
        res.peak_slack_bytes = max(res.peak_slack_bytes, cap_b - req_b)
        if req_b:
            res.peak_slack_ratio = max(res.peak_slack_ratio, (cap_b - req_b) / req_b)
        slack_ratios.append((cap_b - req_b) / cap_b if cap_b else 0.0)
    res.mean_slack_ratio = sum(slack_ratios) / len(slack_ratios) if slack_ratios else 0.0
    return res


def simulate_openvino(shapes: list[tuple[int, ...]], dtype_bits: int, settings=PreallocSettings(),
                      device_mem_bytes=None, id="buf") -> SimResult:
    """Replay ``shapes`` through the plugin's ShapePredictor and realloc_if_needed."""
    return simulate(shapes, dtype_bits, ShapePredictor(settings, device_mem_bytes), id)
