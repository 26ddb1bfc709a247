"""Host impls that replace onnx.reference's where it is wrong (engine/program.py hands these to
every ReferenceEvaluator it makes for a shape subgraph or a constant fold).

- GatherElements: onnx.reference's falls back, when `np.choose` refuses an axis of more than 32
  entries, to a path that only handles one index per row (BERT's token_type_ids buffer, 512
  entries gathered by position ids, is such a case).
"""
from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun


class GatherElements(OpRun):
    op_domain = ""

    def _run(self, data, indices, axis=None):
        axis = int(axis or 0) % data.ndim
        idx = np.where(indices < 0, indices + data.shape[axis], indices)
        return (np.take_along_axis(data, idx.astype(np.int64), axis=axis),)


HOST_OPS = [GatherElements]
