"""com.microsoft ops: the fused ops onnxruntime's transformer optimizer emits, each rewritten
at load into ONNX-domain nodes (engine/domain_ops.py) to the semantics of onnxruntime's
contrib-op documentation (docs/ContribOperators.md), checked against onnxruntime's CPU kernels
(tests/test_ms_fused_ops.py). A family is one more module in the list below."""
from __future__ import annotations

from engine.ops.ms import gelu, norm, attention, rotary, gqa, matmul  # noqa: F401
