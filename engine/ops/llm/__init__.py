"""The ONNX ops of an LLM's decode step (opset 23: RMSNormalization, RotaryEmbedding,
Attention; 24: TensorScatter), each rewritten at load into ONNX nodes the engine runs
(engine/domain_ops.py), as the com.microsoft ops are: the attention chain fuses into the
`attention` kernel and a present key or value is a Concat(past, new) that a fed-back cache
appends to in place."""
from __future__ import annotations

from engine.ops.llm import norm, rotary, attention, scatter  # noqa: F401
