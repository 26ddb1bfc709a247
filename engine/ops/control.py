"""If, Loop and Scan: control flow. Their outputs are known only once their subgraphs ran, so
they have no shape inference of their own: the node runs as a ControlInst
(engine/control_flow.py), a host-side decision (the condition, the trip count) over child
instances of its subgraphs. Scan is rewritten as a Loop at load (engine/subgraphs.py).
`dynamic_output`: the fast path replays no whole plan of a model with control flow (the same
input shapes may take another branch or another number of iterations). `f16`: values cross
into the subgraphs as their declared types (float16 included), which they cast themselves."""
from __future__ import annotations

from engine.ops.common import ShapeInferenceError
from engine.ops.registry import register


def _runs_subgraphs(node, ins, deps):
    # reached only by a walk ahead of the flow (prebuild), which stops here
    raise ShapeInferenceError(f"{node.op} node {node.name}: outputs known only once its subgraph ran")


register("If", control=True, dynamic_output=True, f16=True, checked=25)(_runs_subgraphs)
register("Loop", control=True, dynamic_output=True, f16=True, checked=25)(_runs_subgraphs)
# rewritten as a Loop before anything else sees it (engine/subgraphs.py scan_as_loop)
register("Scan", control=True, dynamic_output=True, f16=True, checked=25)(_runs_subgraphs)
