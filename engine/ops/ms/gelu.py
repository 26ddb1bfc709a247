"""Gelu, BiasGelu and FastGelu (com.microsoft): ONNX Gelu (opset 20), exact erf or the tanh
approximation FastGelu is, after the bias Add; both fuse into the MatMul before them.
QuickGelu (CLIP's): x * sigmoid(alpha * x)."""
from __future__ import annotations

from engine.ops.ms.domain import MS
from engine.ops.registry import register_expansion


def _gelu(ctx, approximate: str) -> None:
    x, bias = ctx.input(0), ctx.input(1)
    if bias:
        x = ctx.op("Add", [x, bias])
    ctx.op("Gelu", [x], outputs=[ctx.output(0)], approximate=approximate)
    dims = ctx.symbols(ctx.input(0))
    if dims is not None:
        ctx.declare(ctx.output(0), ctx.elem_type(ctx.input(0)), dims)


@register_expansion(MS, "Gelu")
def gelu(node, ctx):
    """y = 0.5 x (1 + erf(x / sqrt 2))."""
    _gelu(ctx, "none")


@register_expansion(MS, "BiasGelu")
def bias_gelu(node, ctx):
    """Gelu(A + B), B a bias over the last dim."""
    _gelu(ctx, "none")


@register_expansion(MS, "FastGelu")
def fast_gelu(node, ctx):
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) of X (+ bias)."""
    _gelu(ctx, "tanh")


@register_expansion(MS, "QuickGelu")
def quick_gelu(node, ctx):
    """x * sigmoid(alpha x), alpha 1.702 unless given."""
    x = ctx.input(0)
    scaled = ctx.op("Mul", [x, ctx.const(float(ctx.attrs.get("alpha", 1.702)))])
    ctx.op("Mul", [x, ctx.op("Sigmoid", [scaled])], outputs=[ctx.output(0)])
    dims = ctx.symbols(x)
    if dims is not None:
        ctx.declare(ctx.output(0), ctx.elem_type(x), dims)
