"""Host evaluation of a shape-subgraph node (the GPU plugin runs its shape_of subgraphs on CPU
impls): a Shape reads only its input's layout; every other op runs on host values
(Node.run_host: numpy for the common shape math, onnx.reference for the rest)."""
from __future__ import annotations

from engine.ops.shape_ops import shape_value


def host_outputs(node, in_layouts: list, values: list) -> list:
    """The node's output values for these input layouts and host values (None where absent)."""
    if node.op == "Shape":
        return [shape_value(node, in_layouts[0].shape)]
    return node.run_host(values)
