"""`ln_gemv`: MatMul(LayerNormalization(x), W) for a decode step's few rows as one GEMV kernel
(cl/gemm.cl gemv / gemv_t with GV_LN: each work-group normalises the rows it reads), made only
by the program's LN-GEMV fusion (engine/ln_gemv_fusion.py), never accepted from a model.

Inputs: x (the LayerNormalization's input), W (the MatMul's constant weight), gamma, beta (""
when the LayerNormalization has none), then the extra inputs of the MatMul's epilogue (attr
`epilogue`: its Fusion, applied as the MatMul's own kernel would). Attrs `axis` and `epsilon`
are the LayerNormalization's.
"""
from __future__ import annotations

from dataclasses import replace

from engine.fused_ops import with_fused_ops
from engine.layout import Layout
from engine.ops.matmul import _mm_operands, gemv, matmul_call
from engine.ops.norm import _f
from engine.ops.registry import register

EPILOGUE_INPUT = 4    # the epilogue's extra inputs start here


def call(node, ins, device="gpu"):
    """The MatMul's GEMM call for these shapes (x stands for the normalised A)."""
    return matmul_call(node, ins[:2], device)


def _kernels(node, ins, outs, deps, device="gpu"):
    calls = gemv(call(node, ins, device), device)
    if calls is None:
        return []        # runs unfused for these shapes (engine/ln_gemv_fusion.py check says why)
    if node.attrs["epilogue"] is not None:
        calls = with_fused_ops(calls, node.attrs["epilogue"], EPILOGUE_INPUT)
    beta = len(ins) > 3 and ins[3] is not None
    a = calls[0]         # the kernel reading A (the split's partial sums, or the one kernel)
    jit = (("GV_LN", 1), ("GV_LN_BIAS", int(beta)), ("GV_LN_T", len(a.args)),
           ("EPS", _f(node.attrs["epsilon"])))
    calls[0] = replace(a, jit=a.jit + jit, args=a.args + (("in", 2),) + ((("in", 3),) if beta else ()))
    return calls


@register("ln_gemv", kernels=_kernels, internal=True, per_device=True)
def _ln_gemv(node, ins, deps):
    return [Layout(_mm_operands(ins[0].shape, ins[1].shape)[3], "f32")]
