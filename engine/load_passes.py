"""Load-time passes of a network, run once when it is made: its primitive instances (a fused
node with its unfused subgraph kept ready), the tensors' lifetimes over the execution order (the
memory pool's input), and which nodes may write in place at run time: KV-cache concats fed
back their own output (the GPU plugin's kv_cache.md) and concats whose producers write
straight into the concat's buffer (its runtime in-place concat)."""
from __future__ import annotations

from engine.control_flow import ControlInst
from engine.graph import ModelError
from engine.memory_pool import END
from engine.memo import node_class
from engine.primitive_inst import PrimitiveInst


def instantiate(program, tensors: dict, runtime) -> list[PrimitiveInst]:
    """The primitive instances in execution order, each knowing its step."""
    insts = [_inst(n, tensors, runtime) for n in program.nodes if n.fused_into is None]
    for step, inst in enumerate(insts):
        for i in inst.family():
            i.step = step
    return insts


def _inst(node, tensors: dict, runtime, unfused: bool = False) -> PrimitiveInst:
    inst = (ControlInst if node.opdef.control else PrimitiveInst)(node, runtime)
    inputs = list(node.inputs)
    while inputs and not inputs[-1]:
        inputs.pop()
    inst.inputs = [tensors[i] if i else None for i in inputs]
    inst.outputs = [tensors[o] for o in node.outputs]
    if node.opdef.control:   # its subgraphs' instances, made as a network's are
        inst.build_bodies(lambda prog, ts: instantiate(prog, ts, runtime))
    f = node.fusion
    if f is not None and not unfused:
        # the fused node reads the fused ops' extra inputs and writes the chain's output;
        # its unfused subgraph is kept ready for shapes that make the fusion invalid
        inst.fusion = f
        inst.n_own = len(inputs)
        if f.subgraph:   # an internal op standing for the nodes it replaced (engine/attention_fusion.py)
            inst.unfused = [_inst(op.node, tensors, runtime) for op in f.ops]
            return inst
        if f.prologue:   # the fused ops run on the chain's base, the node's new input 0
            inst.inputs[0] = tensors[f.base]
        inst.inputs += [tensors[i] for i in f.extra]
        inst.outputs = [tensors[f.out]]
        own = [_inst(node, tensors, runtime, unfused=True)]
        ops = [_inst(op.node, tensors, runtime) for op in f.ops]
        inst.unfused = ops + own if f.prologue else own + ops
    return inst


def tensor_lifetimes(insts, graph_inputs, graph_outputs) -> dict[str, list[int]]:
    """name -> [first step, last step] for every device tensor: graph inputs (from step 0), the
    outputs of device nodes, the intermediates of an unfused subgraph (its parent's step). A
    read of a view (Reshape, ...; or an op that may become one at run time) is a read of the
    tensor whose buffer it shares."""
    life: dict[str, list[int]] = {n: [0, 0] for n in graph_inputs}
    alias: dict[str, str] = {}

    def read(name: str, step: int) -> None:
        while name is not None:
            if name in life:
                life[name][1] = max(life[name][1], step)
            name = alias.get(name)

    for s, inst in enumerate(insts):
        if inst.node.host:
            continue
        for t in inst.inputs:
            if t is not None:
                read(t.name, s)
        src = inst.inputs[0].name if inst.inputs and inst.inputs[0] is not None else None
        if inst.opdef.view or inst.opdef.runtime_skip:
            alias[inst.outputs[0].name] = src
        elif inst.opdef.in_place_crop:      # every output may be a slice of input 0
            alias.update((t.name, src) for t in inst.outputs)
        for t in inst.outputs:
            if not inst.opdef.view:
                life.setdefault(t.name, [s, s])
        for sub in inst.family()[1:]:   # the unfused subgraph's intermediates
            for t in sub.outputs:
                life.setdefault(t.name, [s, s])
    for o in graph_outputs:
        read(o, END)
    return life



def kv_appends(prog, insts, feedback: dict) -> set:
    """--feedback OUT:IN: output OUT of inference i is input IN of inference i + 1, on the
    device. Marks the KV-cache concats whose past input aliases their buffer instead of taking
    a copy (`inst.kv_past`) and returns those inputs."""
    for out, inp in feedback.items():
        if out not in prog.outputs or inp not in prog.inputs:
            raise ModelError(f"feedback {out}:{inp}: {out!r} must be a graph output and "
                             f"{inp!r} a graph input")
        inst = next((i for i in insts if out in i.node.outputs), None)
        if inst is not None and kv_append_ok(prog, inst.node, inp):
            inst.kv_past = inp
    return {i.kv_past for i in insts if i.kv_past is not None}


def kv_into_attention(prog, insts) -> int:
    """The fused attention appends the new keys and values itself (kv_cache.md's KV-cache
    concat and the SDPA that reads it, as one kernel): where both caches an attention reads are
    KV-cache concats along its key axis read by nothing else on the device, each concat keeps
    the cache's room and copies but leaves the new entries to the attention (`append_by`), which
    reads them from the new tensors and writes them into the cache (`kv_from`, the new tensors
    its last two inputs). Returns the number of attentions that took them."""
    by_out = {i.outputs[0].name: i for i in insts if i.kv_past is not None}
    taken = 0
    for a in insts:
        if a.node.op != "attention":
            continue
        perms = a.node.attrs["perms"]
        pair = []
        for operand, l_dim in ((1, 3), (2, 2)):     # k^T's keys are its dim 3, v's its dim 2
            c = by_out.get(a.inputs[operand].name)
            rank = len(prog.inputs[c.kv_past].shape) if c is not None else 0
            p = perms[operand] or tuple(range(rank))
            if c is None or rank != 4 or c.append_by is not None or \
                    p[l_dim] != c.node.attrs["axis"] % rank or \
                    any(u.fused_into is not a.node and u is not a.node and not u.host
                        for u in prog.users.get(c.node.outputs[0], [])):
                break
            pair.append(c)
        if len(pair) != 2:
            continue
        for c in pair:
            c.append_by = a
            a.inputs.append(c.inputs[1])
        a.kv_from = tuple(pair)
        a.n_own = len(a.inputs)
        taken += 1
    return taken


def share_memos(insts, memos) -> int:
    """Give every node (its unfused subgraph's too) its class (engine/memo.py node_class, as a
    small number: keys hash it every time): nodes of one class share the memo tables of their
    layouts, dynamic kernel calls and shape_info. Returns the number of classes."""
    ids: dict = {}
    for inst in insts:
        for i in inst.family():
            if i.node.host or i.opdef.control:
                continue
            cls = node_class(i.node, i.fusion, i.n_own, bool(i.kv_from))
            if cls is not None:
                i.join_class(ids.setdefault(cls, len(ids)), memos)
    return len(ids)


def kv_append_ok(prog, node, past: str) -> bool:
    """A KV-cache concat: Concat(past, new) along an axis that is not the last, past read by
    nothing else (a Shape of it reads only its layout: exporters take the past length so), every
    reader of the result able to take a padded layout (so the buffer can keep room along the
    sequence axis and later steps append in place)."""
    if node.op != "Concat" or len(node.inputs) != 2 or node.inputs[0] != past:
        return False
    if [n.name for n in prog.users.get(past, []) if n.op != "Shape"] != [node.name]:
        return False
    axis = node.attrs.get("axis")
    rank = len(prog.inputs[past].shape)
    if axis is None or (axis % rank if rank else 0) == rank - 1:
        return False
    # a user fused into another node runs inside it, or on its own when unfused: both read the
    # padded buffer (the fused attention does, engine/ops/attention.py)
    return all(u.opdef.padded_ok and (u.fused_into is None or u.fused_into.opdef.padded_ok)
               and not u.host for u in prog.users.get(node.outputs[0], []))


def in_place_concats(prog, insts) -> list:
    """(concat inst, producers' insts, first producer's step) for every Concat that may run in
    place (the plugin's can_be_optimized at run time): every input produced by a device node
    of its own (one output, used by this concat alone, not a view, a concat or a graph output)
    whose inputs all exist before the first of them runs, so the concat can infer every
    producer's shape then. Whether the regions are contiguous depends
    on the shapes: decided at run time (PrimitiveInst.do_runtime_in_place_concat)."""
    producer = {t.name: i for i in insts for t in i.outputs}
    plans = []
    for c in insts:
        n = c.node
        if n.op != "Concat" or c.kv_past is not None or len(c.inputs) < 2 or \
                len({t.name for t in c.inputs if t is not None}) != len(n.inputs):
            continue
        producers = []
        for t in c.inputs:
            p = producer.get(t.name)
            # (a control node's output shape is known only once it ran)
            if p is None or p.node.host or p.opdef.control or p.opdef.view or p.opdef.runtime_skip or \
                    p.node.op == "Concat" or p.kv_past is not None or len(p.outputs) != 1 or \
                    t.name in prog.outputs or [u.name for u in prog.users.get(t.name, [])] != [n.name]:
                break
            producers.append(p)
        else:
            first = min(p.step for p in producers)
            if all(t is None or t.name not in producer or producer[t.name].step < first
                   for p in producers for t in p.inputs):
                plans.append((c, producers, first))
    return plans
