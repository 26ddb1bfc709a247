"""What a compiled inference decided, for the trace: the events of the inference a variant was
bound from, with the fields that move with the dims named by the variant's variables.

A compiled step (compiled_steps.py: a decode step's dirty nodes) or a compiled plan
(compiled.py: a whole inference) makes the decisions its device nodes made in the inference of
steady steps that bound it (the base), with other numbers: the same kinds, actions and reasons,
the same impls and capacities (the epoch's), other shapes and byte counts. So a traced run
writes that base's events once, as they happen, and its infer_end carries a `template`: which
fields of which events are expressions of the dims, each a variable of the generated function
(`{"$": k}` stands for the k-th). Each compiled inference then writes one `plan` event (`partial`
for a step, `compiled` for a whole inference) with `template_of` (the base's iteration) and
`values` (those variables' values), and the reader (traces/reader.py `stepped`) expands it into
the base's events of those nodes with the values filled in: the seeds' events, as for a plan
replay.

Which fields move is said here, by kind, from the symbolic layouts the variant's trace left
(the nodes' input layouts, their outputs' and scratch buffers' layouts); `template` checks each
against the base's value before the variant serves a traced run, and the tests compare every
event, fields included, with the flow's. A buffer's capacity moves too, not with the dims but
with the epoch the variant is bound in (`Capacity`): a variant bound again to the buffers a
growth took, or bound beside the one a flow checked (another variant of the same kernels), still
expands to what the flow would have written.
"""
from __future__ import annotations

from collections import Counter

from engine.decisions import count
from engine.ops.common import norm_axis
from engine.symbolic import Sym, substitute


class Capacity:
    """A realloc event's `capacity`: the bytes of the buffer `tensor` holds when a compiled
    inference runs (a value of the epoch it is bound in, not of the dims)."""
    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor


def _moving_fields(kind: str, fields: dict) -> tuple:
    """The fields of an event that move with the dims or the epoch (among
    traces.schema.MOVING_FIELDS, which the reader lets a template fill)."""
    if kind == "update_shape":
        names = ("in_shapes", "out_shapes")
    elif kind == "realloc" and "shape" in fields:
        names = ("shape", "bytes", "capacity")
    elif kind == "kv_cache":
        names = ("bytes_copied", "capacity", "length")
    else:
        return ()
    return tuple(f for f in names if f in fields)


def _moving(inst, kind: str, fields: dict, in_l: list, layout) -> dict:
    """The symbolic values of those fields of a `kind` event of `inst` (`in_l`: its symbolic
    input layouts, `layout(t)`: a tensor's)."""
    if kind == "update_shape":
        return {"in_shapes": [None if l is None else l.shape for l in in_l],
                "out_shapes": [layout(t).shape for t in inst.outputs]}
    if kind == "realloc":
        buf = fields.get("buffer")       # "internalK": the node's K-th scratch buffer
        t = inst.internals[int(buf[8:])] if buf else inst.outputs[fields.get("output", 0)]
        return {"shape": layout(t).shape, "bytes": layout(t).nbytes, "capacity": Capacity(t)}
    past, new = in_l                     # kv_cache
    shape = layout(inst.outputs[0]).shape
    axis = norm_axis(inst.node.attrs["axis"], len(shape))
    return {"bytes_copied": new.nbytes, "capacity": past.phys[axis], "length": shape[axis]}


def symbolic(device: list, state: list, log: list) -> dict:
    """Inside the variant's trace (its Session): (node, kind, occurrence) -> {field: its
    symbolic value} for the moving fields of the dirty device nodes' events in `log` (the
    partial replay traced), so that each value is a variable of the generated function."""
    layouts = {id(o): v for o, attr, v in state if attr == "layout"}
    inputs = {id(o): v for o, attr, v in state if attr == "in_layouts"}
    nodes = {i.node.name: i for i in device}
    seen: Counter = Counter()
    out = {}
    for name, kind, _, _, fields in log:
        inst = nodes.get(name)
        if inst is None:
            continue
        key = (name, kind, seen[name, kind])
        seen[name, kind] += 1
        names = _moving_fields(kind, fields)
        if not names:
            continue
        values = _moving(inst, kind, fields, inputs[id(inst)], lambda t: layouts.get(id(t), t.layout))
        out[key] = {f: values[f] for f in names}
    return out


def template(device: list, moving: dict, log: list, env: dict) -> tuple | None:
    """(the template a base's infer_end carries, the variables its values name) for a variant
    (`moving`: its `symbolic` fields) bound from the partial replay whose events are `log`
    (`env`: the variant's variables for it), or None when an event has moving fields the trace
    did not see or a value is not what the variant computes."""
    nodes = {i.node.name for i in device}
    seen: Counter = Counter()
    variables: dict = {}                 # variable name (or Capacity tensor) -> its index in `values`
    spec = []
    for name, kind, _, _, fields in log:
        if name not in nodes:
            continue
        key = (name, kind, seen[name, kind])
        seen[name, kind] += 1
        names = _moving_fields(kind, fields)
        if not names and key not in moving:
            continue                     # (most events: nothing moves)
        values = moving.get(key, {})
        if set(names) != set(values):
            return None
        for field, v in values.items():
            if v.__class__ is Capacity:
                if v.tensor.capacity != fields[field]:
                    return None
                spec.append([name, kind, key[2], field, {"$": variables.setdefault(v.tensor, len(variables))}])
                continue
            got, logged = substitute(v, env), fields[field]
            # (equal as they are, the common case, or as the JSON holds them: tuples as lists)
            if got != logged and _plain(got) != _plain(logged):
                return None
            if _has_sym(v):
                spec.append([name, kind, key[2], field, _encode(v, variables)])
    return {"nodes": sorted(nodes), "fields": spec}, list(variables)


REFUSED = "its events' fields are not what the trace computes"


def attach(c, log: list, env: dict, iteration: int, base_no: int) -> tuple | None:
    """Bind a compiled variant `c` (a plan or steps) to the traced inference `iteration` (the
    fast path's `base_no`-th base), whose events are `log`: (its template, what its device
    nodes' decisions count), or None when the template does not hold."""
    tpl = template(c.device, c.moving, log, env) if c.moving is not None else None
    if tpl is None:
        return None
    tpl, c.variables = tpl
    c.base = (iteration, base_no)
    return tpl, counts(c.device, log)


def values(c, env: dict) -> tuple:
    """What a compiled inference of variant `c` writes to the trace: (its base's iteration, the
    values of the variables its template names: the function's, and the capacities of the
    buffers bound now)."""
    return c.base[0], [env[n] if n.__class__ is str else n.capacity for n in c.variables]


def counts(device: list, log: list) -> Counter:
    """What the dirty device nodes' decisions in `log` added to the counters (a traced steady
    step records some of its decisions one by one, beside those its path counts)."""
    nodes = {i.node.name for i in device}
    c: Counter = Counter()
    for name, kind, action, reason, fields in log:
        if name in nodes:
            count(c, kind, action, reason, fields)
    return c


def _has_sym(v) -> bool:
    return v.__class__ is Sym or (isinstance(v, (tuple, list)) and any(_has_sym(x) for x in v))


def _encode(v, variables: dict):
    """`v` as JSON: a Sym as {"$": its variable's index}."""
    if v.__class__ is Sym:
        return {"$": variables.setdefault(v.name, len(variables))}
    if isinstance(v, (tuple, list)):
        return [_encode(x, variables) for x in v]
    return v if v is None else int(v)


def _plain(v):
    """A field's value as the trace's JSON holds it (tuples as lists, numpy ints as ints)."""
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v if v is None or isinstance(v, (str, float)) else int(v)
