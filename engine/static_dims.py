"""Shape values the model fixes (program build): `Gather(Shape(t), constant index)` where ONNX
shape inference (with data propagation) knows those dims of t becomes a constant, and a Shape
left without readers goes. A traced SDPA export computes its scale so (sqrt(q.size(-1))): the
Shape read of q then no longer keeps q's heads-split Transpose out of the attention fusion
(engine/attention_fusion.py), and the scale folds into a constant."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from engine.graph import link

SMALL = 1024          # initializers up to this many bytes keep their values for the inference


def fold_static_dims(model: onnx.ModelProto, prog) -> int:
    """Fold the static-dim Gathers of `prog`; returns how many."""
    shape_of = {n.outputs[0]: n for n in prog.nodes if n.op == "Shape"}
    todo = [n for n in prog.nodes if n.op == "Gather" and n.inputs[0] in shape_of
            and n.inputs[1] in prog.constants and int(n.attrs.get("axis", 0)) == 0]
    if not todo:
        return 0
    dims = _static_dims(model)
    folded = 0
    for g in todo:
        s = shape_of[g.inputs[0]]
        d = dims.get(s.inputs[0])
        if d is None:
            continue
        vec = d[int(s.attrs.get("start", 0)):s.attrs.get("end")]
        idx = np.asarray(prog.constants[g.inputs[1]])
        try:
            picked = [vec[int(i)] for i in idx.reshape(-1)]
        except IndexError:
            continue            # the node will say what is wrong at run time
        if any(p is None for p in picked):
            continue
        prog.constants[g.outputs[0]] = np.array(picked, np.int64).reshape(idx.shape)
        g.outputs = []          # marks it for removal
        folded += 1
    if folded:
        prog.nodes = [n for n in prog.nodes if n.outputs]
        link(prog)
        read = set(prog.users) | set(prog.outputs)
        prog.nodes = [n for n in prog.nodes if not (n.op == "Shape" and n.outputs[0] not in read)]
        link(prog)
        prog.folded += folded
    return folded


def _static_dims(model: onnx.ModelProto) -> dict:
    """tensor -> [dim or None] by ONNX inference; large initializers enter as typed inputs (their
    values are never needed for dims, and copying them would cost the load)."""
    g = model.graph
    small, big = [], []
    for t in g.initializer:      # ByteSize: raw_data or the typed fields (float_data, ...)
        if t.ByteSize() <= SMALL and not t.external_data:
            small.append(t)
        else:
            big.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    lean = helper.make_graph(g.node, g.name, list(g.input) + big, g.output, small, value_info=g.value_info)
    m = helper.make_model(lean, opset_imports=model.opset_import, ir_version=model.ir_version)
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:        # a model ONNX cannot infer still runs; nothing folds
        return {}
    out = {}
    for vi in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape"):
            out[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return out
