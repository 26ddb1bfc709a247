"""Which ONNX opsets the engine runs, and which version of each op's schema its implementation
was checked against.

The engine runs every opset from MIN_OPSET to the newest the installed onnx defines. Per op,
its register() (engine/ops/) says in `checked` the newest schema version (`since_version`)
whose attributes and inputs the implementation was read against; a model whose opset selects
a newer schema of an op (a newer onnx) still runs, with one warning naming those ops. The changes
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

from engine.ops import DEFAULT_CHECKED, OPS

MIN_OPSET = 1
# the oldest schema of an op the engine runs is the one opset 7 selects (broadcasting as numpy):
# a model whose opset selects an older one (Add-6's `broadcast` attribute...) is refused
OLDEST_OPSET = 7
MAX_OPSET = onnx.defs.onnx_opset_version()   # 28 with onnx 1.23


def checked_version(op: str) -> int:
    """The newest schema version of `op` its implementation was checked against (its register()
    in engine/ops/; DEFAULT_CHECKED for an op the engine does not have)."""
    d = OPS.get(op)
    return d.checked if d is not None else DEFAULT_CHECKED


# op -> checked version of every supported op, read from the registry (for `dyncli ops`)
CHECKED = {name: d.checked for name, d in OPS.items() if not d.internal}


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
        if opset > MAX_OPSET or v is None or v > checked_version(op):
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
