"""Reading a model file as untrusted input: external data only from inside the model's folder,
declared tensor sizes checked before any tensor is materialised, and a graph checker that
names the node at fault (cycles, undefined inputs, tensors written twice)."""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import external_data_helper

from engine.diagnose import nbytes_text
from engine.graph import ModelError


def _tensors(graph: onnx.GraphProto):
    """(owner, TensorProto) of every initializer and Constant value, subgraphs included."""
    for t in graph.initializer:
        yield f"initializer {t.name}", t
    for n in graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield f"Constant node {n.name or n.output[0]}", a.t
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                yield from _tensors(g)


def declared_bytes(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        if d < 0:
            raise ModelError(f"tensor {t.name}: negative dim {d}")
        n *= d
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 1
    return n * itemsize


def _external_location(owner: str, t: onnx.TensorProto, folder: str) -> str:
    """The checked path of `t`'s external file: inside `folder`, symlinks resolved, present."""
    info = external_data_helper.ExternalDataInfo(t)
    loc = info.location
    if not loc or os.path.isabs(loc) or loc.startswith(("/", "\\")) or ".." in loc.replace("\\", "/").split("/"):
        raise ModelError(f"{owner}: external data location {loc!r} is outside the model's folder; refused")
    real = os.path.realpath(os.path.join(folder, loc))
    if os.path.commonpath([real, os.path.realpath(folder)]) != os.path.realpath(folder):
        raise ModelError(f"{owner}: external data location {loc!r} leads outside the model's folder "
                         f"(to {real}); refused")
    if not os.path.isfile(real):
        raise ModelError(f"{owner}: external data file {os.path.join(folder, loc)} is missing")
    size = os.path.getsize(real)
    end = (info.offset or 0) + (info.length if info.length is not None else 0)
    if end > size:
        raise ModelError(f"{owner}: external data {loc!r} ends at byte {end}, past the file's {size} bytes")
    return real


def load_model(path: str, max_bytes: int | None = None) -> onnx.ModelProto:
    """Parse `path` without following external data, check it, then load the external data.
    `max_bytes`: refuse any initializer or Constant whose declared dims need more than that
    (the device's memory), before reading it."""
    try:
        model = onnx.load(path, load_external_data=False)
    except FileNotFoundError:
        raise ModelError(f"model file not found: {path}") from None
    except IsADirectoryError:
        raise ModelError(f"model path is a folder, not a file: {path}") from None
    except PermissionError:
        raise ModelError(f"cannot read model file {path}: permission denied") from None
    except Exception as e:  # protobuf errors have no common base worth naming
        raise ModelError(f"cannot parse {path} as ONNX: {str(e).splitlines()[0] if str(e) else 'not a model'}") from None
    folder = os.path.dirname(os.path.abspath(path))
    for owner, t in _tensors(model.graph):
        need = declared_bytes(t)
        if max_bytes is not None and need > max_bytes:
            dims = "x".join(str(d) for d in t.dims)
            raise ModelError(f"{owner}: declared dims {dims} need {nbytes_text(need)}, more than the "
                             f"device's largest buffer ({nbytes_text(max_bytes)}, max_mem_alloc_size); "
                             "refused before loading")
        if t.data_location == onnx.TensorProto.EXTERNAL:
            _external_location(owner, t, folder)
            try:
                external_data_helper.load_external_data_for_tensor(t, folder)
            except (OSError, ValueError) as e:
                raise ModelError(f"{owner}: cannot read its external data: {e}") from None
    return model


def check_graph(graph: onnx.GraphProto) -> None:
    """Refuse a tensor written twice, a node input nothing defines, or a cycle, naming the node."""
    defined = {vi.name: "graph input" for vi in graph.input}
    defined.update({t.name: "initializer" for t in graph.initializer})
    writer = {}
    for k, n in enumerate(graph.node):
        name = n.name or f"{n.op_type}_{k}"
        for o in n.output:
            if not o:
                continue
            if o in writer:
                raise ModelError(f"node {name} ({n.op_type}) writes tensor {o!r}, which node {writer[o]} "
                                 "also writes")
            if o in defined:
                raise ModelError(f"node {name} ({n.op_type}) writes tensor {o!r}, which is a {defined[o]}")
            writer[o] = name
    for k, n in enumerate(graph.node):
        for i in n.input:
            if i and i not in writer and i not in defined:
                raise ModelError(f"node {n.name or f'{n.op_type}_{k}'} ({n.op_type}) reads tensor {i!r}, "
                                 "which no node, graph input or initializer defines")
    outs = [o.name for o in graph.output]
    dup = next((o for k, o in enumerate(outs) if o in outs[:k]), None)
    if dup is not None:
        raise ModelError(f"graph output {dup!r} is listed twice")
    # cycle: nodes left when every node whose inputs are ready has been taken
    ready = set(defined) | {""}
    pending = list(enumerate(graph.node))
    while pending:
        rest = [(k, n) for k, n in pending if not all(i in ready for i in n.input)]
        if len(rest) == len(pending):
            # walk back from a stuck node through producers of its missing inputs to a repeat
            prod = {o: k for k, n in rest for o in n.output}
            k, path, at = rest[0][0], [], {}
            while k not in at:
                at[k] = len(path)
                path.append(k)
                k = next(prod[i] for i in graph.node[k].input if i not in ready)
            names = [graph.node[j].name or f"{graph.node[j].op_type}_{j}" for j in path[at[k]:]]
            raise ModelError(f"nodes {' -> '.join(names)} form a cycle (node {names[0]} depends on its "
                             "own output)")
        for k, n in pending:
            if all(i in ready for i in n.input):
                ready.update(n.output)
        pending = rest
