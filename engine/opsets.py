"""Which ONNX opsets the engine runs, and which version of each op's schema its implementation
was checked against.

The engine runs every opset from MIN_OPSET to the newest the installed onnx defines. Per op,
CHECKED holds the newest schema version (`since_version`) whose attributes and inputs the
implementation was read against; a model whose opset selects a newer schema of an op (a newer
onnx, or an op not in the table) still runs, with one warning naming those ops. The changes
that matter, by op (the others only added element types):
- Split 13: `split` attribute -> input; 18: `num_outputs`.   Squeeze/Unsqueeze 13: `axes` input.
- ReduceSum 13 and ReduceMean/Max/Min/Prod/L2 18: `axes` attribute -> input,
  `noop_with_empty_axes`.   ReduceMax/Min 20: bool.   ArgMax/ArgMin 12: `select_last_index`.
- Clip 11: min/max attributes -> inputs.   Pad 11: pads/value inputs; 18: `axes`; 19: `wrap`.
- Softmax 13: one axis instead of the flattened tail.   Slice 10: inputs.   Reshape 14:
  `allowzero`.   Shape 15: start/end.   ScatterND/ScatterElements 16: `reduction`, 18: max/min.
- AveragePool 19: dilations.   CumSum 14: types.   LeakyRelu/PRelu 16: types.
"""
from __future__ import annotations

import onnx
import onnx.defs

MIN_OPSET = 1
# the oldest schema of an op the engine runs is the one opset 7 selects (broadcasting as numpy):
# a model whose opset selects an older one (Add-6's `broadcast` attribute...) is refused
OLDEST_OPSET = 7
MAX_OPSET = onnx.defs.onnx_opset_version()   # 28 with onnx 1.23

# op -> newest schema version checked (ops absent: checked up to 21, the engine's old limit)
CHECKED = {
    "Abs": 13, "Add": 14, "And": 7, "ArgMax": 13, "ArgMin": 13, "AveragePool": 22,
    "BatchNormalization": 15, "Cast": 28, "Clip": 13, "Concat": 13, "Constant": 25,
    "ConstantOfShape": 25, "Conv": 22, "CumSum": 14, "Div": 14, "Dropout": 22, "Einsum": 28,
    "Elu": 22, "Equal": 19, "Erf": 13, "Exp": 13, "Expand": 13, "Flatten": 25, "Gather": 13,
    "GatherElements": 13, "Gelu": 20, "Gemm": 13, "GlobalAveragePool": 22, "Greater": 13,
    "GreaterOrEqual": 16, "HardSigmoid": 22, "HardSwish": 22, "Identity": 25, "IsInf": 20,
    "IsNaN": 20, "LRN": 13, "LayerNormalization": 17, "LeakyRelu": 16, "Less": 13,
    "LessOrEqual": 16, "Log": 13, "MatMul": 13, "Max": 13, "MaxPool": 22, "Min": 13, "Mul": 14,
    "Neg": 13, "NonZero": 13, "Not": 1, "Or": 7, "PRelu": 16, "Pad": 25, "Pow": 15,
    "Range": 27, "Reciprocal": 13, "ReduceL2": 18, "ReduceMax": 20, "ReduceMean": 18,
    "ReduceMin": 20, "ReduceProd": 18, "ReduceSum": 13, "Relu": 14, "Reshape": 25,
    "ScatterElements": 18, "ScatterND": 18, "Shape": 25, "Sigmoid": 13, "Slice": 13,
    "Softmax": 13, "Softplus": 22, "Split": 18, "Sqrt": 13, "Squeeze": 25, "Sub": 14, "Sum": 13,
    "Tanh": 13, "Tile": 13, "Transpose": 25, "Trilu": 14, "Unsqueeze": 25, "Where": 16,
    "Xor": 7,
    # ops-vision's: the 22 versions add types only; DepthToSpace-28 changes nothing,
    # SpaceToDepth-28 adds `mode` (DCR/CRD); TopK-24 and Unique-28 are not checked yet (a model
    # that picks them runs with the warning)
    "ConvTranspose": 22, "DepthToSpace": 28, "GroupNormalization": 21,
    "InstanceNormalization": 22, "Resize": 19, "SpaceToDepth": 28, "TopK": 11, "Unique": 11,
    "Upsample": 10,
    # exporter survey (scripts/export_models.py): rotary embeddings, GatherND of dynamo exports,
    # Mod of shape math; the 22/28 versions add types only (Mod-28 clarifies its text)
    "Sin": 22, "Cos": 22, "Tan": 22, "Asin": 22, "Acos": 22, "Atan": 22, "Sinh": 22, "Cosh": 22,
    "Asinh": 22, "Acosh": 22, "Atanh": 22, "Floor": 13, "Ceil": 13, "Round": 22, "Sign": 13,
    "Mod": 28, "Mish": 22, "Selu": 22, "Celu": 28, "ThresholdedRelu": 22, "Softsign": 22,
    "GatherND": 13,
}
DEFAULT_CHECKED = 21


def schema_version(op: str, opset: int) -> int | None:
    """The since_version of `op`'s schema that `opset` selects (capped at MAX_OPSET)."""
    try:
        return onnx.defs.get_schema(op, min(opset, MAX_OPSET), "").since_version
    except onnx.defs.SchemaError:
        return None


def unchecked_ops(ops, opset: int) -> list[str]:
    """Ops of a model at `opset` whose selected schema is newer than the one checked (every op
    when the opset is newer than the installed onnx knows: its changes are unknown)."""
    out = []
    for op in sorted(set(ops)):
        v = schema_version(op, opset)
        if opset > MAX_OPSET or v is None or v > CHECKED.get(op, DEFAULT_CHECKED):
            out.append(op)
    return out


def too_old_ops(ops, opset: int) -> list[str]:
    """Ops whose schema at `opset` is older than the one OLDEST_OPSET selects."""
    if opset >= OLDEST_OPSET:
        return []
    return sorted(op for op in set(ops)
                  if (schema_version(op, opset) or 0) < (schema_version(op, OLDEST_OPSET) or 0))


def op_versions(op: str) -> list[int]:
    """Every since_version of `op`'s schema that onnx defines (default domain)."""
    return sorted({s.since_version for s in onnx.defs.get_all_schemas_with_history()
                   if s.name == op and s.domain == ""})
