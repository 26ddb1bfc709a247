"""float16: stored as half, computed as float32, on every device.

- Kernels read and write half tensors with vload_half / vstore_half (core OpenCL: no
  cl_khr_fp16 needed, which NVIDIA's OpenCL and the PoCL here lack) and compute in float32,
  even where the device has cl_khr_fp16: one code path, and float32 accumulation is more
  exact than half math. `type_jit` (engine/layout.py) gives a kernel the macros of one
  tensor's type; pure copies move f16 as ushort bits (`bits_type`).
- Ops whose kernels take f16 say so (`OpDef.f16=True`; views need nothing). Every other op
  works in float16 too: at program build `insert_f16_casts` puts a Cast to float32 in front of
  each of its f16 inputs (f16 constants are converted once instead) and a Cast back to
  float16 after each f16 output, so the op runs its float32 kernel unchanged. A kernel that
  learns to read half (LOAD_X/STORE_X) opts in with f16=True and its casts disappear.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from engine.graph import Node
from engine.layout import dtype_from_onnx

# What `dyncli devices` and the trace header say about float16 on a device.
HALF_COMPUTE = "float32"
HALF_STORAGE = "half (vload_half/vstore_half)"


def has_fp16(device) -> bool:
    return "cl_khr_fp16" in device.extensions.split()


def half_support(device) -> dict:
    """How this engine runs float16 on `device` (the same on every device, said explicitly)."""
    return {"storage": HALF_STORAGE, "compute": HALF_COMPUTE, "cl_khr_fp16": has_fp16(device)}


def half_summary(device) -> str:
    native = "device has cl_khr_fp16" if has_fp16(device) else "no cl_khr_fp16"
    return f"stored half, computed f32 ({native})"


def tensor_dtypes(model: onnx.ModelProto) -> dict:
    """Element type of every tensor of the graph that ONNX type inference can tell."""
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:   # a model ONNX cannot infer still runs; casts then only where declared
        pass
    g = model.graph
    out = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        dt = dtype_from_onnx(vi.type.tensor_type.elem_type)
        if dt is not None:
            out[vi.name] = dt
    return out


def _mentions_f16(model: onnx.ModelProto) -> bool:
    """Any float16 input, initializer, Cast to float16 or float16 attribute tensor: only then
    is type inference worth its cost."""
    g = model.graph
    if any(vi.type.tensor_type.elem_type == TensorProto.FLOAT16 for vi in g.input) or \
            any(t.data_type == TensorProto.FLOAT16 for t in g.initializer):
        return True
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT16 or \
                    n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT16:
                return True
    return False


def insert_f16_casts(prog, model: onnx.ModelProto, more_dtypes=None) -> int:
    """Wrap every device node that reads or writes float16 but whose op lacks f16 kernels in
    Casts (f16 -> f32 before, f32 -> f16 after). Returns the number of Cast nodes added.
    `more_dtypes()`: tensor dtypes the model's type inference cannot tell (the expansions of
    domain ops, engine/domain_ops.py)."""
    if not _mentions_f16(model):
        return 0
    dtypes = tensor_dtypes(model)
    if more_dtypes is not None:
        dtypes.update(more_dtypes())
    for name, v in prog.constants.items():
        if v.dtype == np.float16:
            dtypes[name] = "f16"
    prog.dtypes = dtypes     # fusion reads it: fused ops compute and store float32
    if "f16" not in dtypes.values():
        return 0
    to32: dict = {}        # f16 tensor -> the name of its float32 copy
    nodes, added = [], 0

    def cast(src, dst, to, name):
        p = helper.make_node("Cast", [src], [dst], name=name, to=to)
        return Node(name, "Cast", [src], [dst], {"to": to}, p, prog.opset)

    for n in prog.nodes:
        od = n.opdef
        if n.host or od.view or od.f16:
            nodes.append(n)
            continue
        ins = [k for k, i in enumerate(n.inputs)
               if i and dtypes.get(i) == "f16" and k not in od.shape_deps]
        outs = [k for k, o in enumerate(n.outputs) if o and dtypes.get(o) == "f16"]
        after = []
        n.inputs, n.outputs = list(n.inputs), list(n.outputs)   # decompose may share the lists
        for k in ins:
            src = n.inputs[k]
            if src not in to32:
                to32[src] = f"{src}::f32"
                dtypes[to32[src]] = "f32"
                if src in prog.constants:
                    prog.constants[to32[src]] = prog.constants[src].astype(np.float32)
                else:
                    nodes.append(cast(src, to32[src], TensorProto.FLOAT, f"{src}::to_f32"))
                    added += 1
            n.inputs[k] = to32[src]
        for k in outs:
            o = n.outputs[k]
            n.outputs[k] = f"{o}::f32"
            dtypes[n.outputs[k]] = "f32"
            after.append(cast(n.outputs[k], o, TensorProto.FLOAT16, f"{o}::to_f16"))
            added += 1
        nodes += [n] + after
    prog.nodes = nodes
    return added


def cast_summary(prog) -> dict:
    """For the trace header: how many Casts the program inserted and around which ops."""
    casts = [n for n in prog.nodes if n.op == "Cast" and n.name.endswith(("::to_f32", "::to_f16"))]
    ids = set(map(id, casts))
    wrapped = {n.op for n in prog.nodes if id(n) not in ids and
               any(t.endswith("::f32") for t in list(n.inputs) + list(n.outputs))}
    return {"casts": len(casts), "f32_ops": sorted(wrapped)}
