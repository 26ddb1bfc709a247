"""The graph the passes work on: `Node` (one ONNX node, with its host impl), the error a model
that cannot be run raises, and `link` (topological indices, producers and users of a program's
tensors). Below the program build and its passes (engine/program.py, fusion.py,
attention_fusion.py, f16.py, model_file.py), which all import it."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from engine.host_ops import FAST, REPLACED
from engine.ops import OPS


class ModelError(ValueError):
    """The model cannot be run by this engine (unsupported op, type, opset, malformed graph)."""


@dataclass(eq=False)
class Node:
    name: str
    op: str
    inputs: list            # tensor names, "" for an omitted optional input
    outputs: list
    attrs: dict
    proto: onnx.NodeProto
    opset: int
    index: int = -1
    host: bool = False      # runs as a host impl (shape subgraph)
    shape_sources: frozenset = frozenset()  # Shape nodes this host node's value derives from
    static_output: bool = False             # output layouts fixed by the model (program.py)
    fusion: object = None                   # engine.fused_ops.Fusion of a node with fused ops
    fused_into: "Node | None" = None        # the node (producer, or prologue consumer) it runs in
    # a control-flow node: the outer-scope tensors its subgraphs read -> ONNX elem type (0:
    # unknown); they are appended to `inputs` (engine/subgraphs.py)
    outer: dict = field(default_factory=dict)
    _host_impl: object = field(default=None, repr=False)
    _memo: dict = field(default_factory=dict, repr=False)   # run_host results by input values

    @property
    def opdef(self):
        return OPS[self.op]

    def run_host(self, values: list) -> list:
        """Evaluate on the host (shape subgraphs; also used for constant folding): onnx.reference,
        or numpy directly for the ops engine/host_ops.py makes fast."""
        vals = [v for v, name in zip(values, self.inputs) if name]
        # shape math sees the same few small values again and again (one per sequence length):
        # remember its results instead of running onnx.reference every time
        key = tuple((v.dtype.str, v.shape, v.tobytes()) for v in map(np.asarray, vals)) \
            if sum(np.asarray(v).nbytes for v in vals) <= 4096 else None
        hit = self._memo.get(key) if key is not None else None
        if hit is not None:
            return hit
        # the common shape-math ops in plain numpy (engine/host_ops.py FAST), else the reference
        fast = FAST.get(self.op)
        out = fast(self, *[None if v is None else np.asarray(v) for v in values]) \
            if fast is not None else None
        if out is None:
            ev, names = self._reference()
            out = ev.run(None, dict(zip(names, vals)))
        out = [np.asarray(v) for v in out]     # numpy gives 0-d results as scalars
        if key is not None:
            if len(self._memo) >= 64:
                self._memo.pop(next(iter(self._memo)))
            self._memo[key] = out
        return out

    def _reference(self):
        """(onnx.reference evaluator of this node alone, its input names), built on first use."""
        if self._host_impl is None:
            names = [f"i{k}" if n else "" for k, n in enumerate(self.inputs)]
            outs = [f"o{k}" for k in range(len(self.outputs))]
            p = onnx.NodeProto()
            p.CopyFrom(self.proto)
            del p.input[:]
            p.input.extend(names)
            del p.output[:]
            p.output.extend(outs)
            g = helper.make_graph([p], "host", [helper.make_tensor_value_info(n, 0, None) for n in names if n],
                                  [helper.make_tensor_value_info(o, 0, None) for o in outs])
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)])
            self._host_impl = (ReferenceEvaluator(m, new_ops=REPLACED), [n for n in names if n])
        return self._host_impl


def link(prog) -> None:
    """Node indices (topological order), producers and users of every tensor."""
    prog.producers, prog.users = {}, {}
    for k, n in enumerate(prog.nodes):
        n.index = k
        for j, o in enumerate(n.outputs):
            prog.producers[o] = (n, j)
        for i in n.inputs:
            prog.users.setdefault(i, []).append(n)
