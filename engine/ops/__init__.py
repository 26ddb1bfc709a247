"""The ops: `OPS` (engine/ops/registry.py says what an `OpDef` holds), filled by importing the
family modules below; a new family is one more module in this list."""
from __future__ import annotations

from engine.ops.registry import DEFAULT_CHECKED, OPS, OpDef, register, supported_ops
from engine.ops import eltwise, matmul, movement, shape_ops, conv, pool, norm, nonzero  # noqa: F401
from engine.ops import attention, ln_gemv  # noqa: F401
from engine.ops import ms  # noqa: F401  (com.microsoft ops, expanded at load)
from engine.ops import llm  # noqa: F401  (ONNX LLM ops, expanded at load)
from engine.ops import activation, logic, reduce, indexing, arrange, einsum, norm_stats  # noqa: F401
from engine.ops import deconv, resize, group_norm, space_depth, topk, unique  # noqa: F401
from engine.ops import bitwise, swish_shrink, cast_like, reduce_sums, axis_norm, indicator, compress, grid_sample, nms  # noqa: F401
from engine.ops import quant  # noqa: F401
from engine.ops import recurrent  # noqa: F401
from engine.ops import control  # noqa: F401

__all__ = ["OPS", "OpDef", "register", "supported_ops", "DEFAULT_CHECKED"]
