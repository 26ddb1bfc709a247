"""Steady steps: the flow of a node compiled for the path it takes when a new signature only
moves its dims (a decode step's KV length, a new sequence length), class by class; a partial
replay's dirty nodes and every node of an inference of the flow take them (FastPath).

A dirty node of a decode step takes the same path every step: a KV-cache concat appends within
its room (kv_cache.md), an attention keeps its shape-agnostic kernel and rewrites its
shape_info (dynamic_impl.md), a view (Reshape) gives its input's buffer a new layout. What differs from step to step is numbers (layouts, the
shape_info block, the work sizes, the predictor's history), and the layers of a model ask the
same questions of the same shapes. So the answers are computed once per class of nodes
(engine/memo.py node_class) and input layouts in a step (a `Template`), with the flow's own
pure functions, and every member of the class applies them: a few assignments, its own
predictor call, its own shape_info block. Decisions are counted in bulk at the end of the step
and written to the trace only when something reads them.

Before a steady step changes anything it checks every condition under which
`PrimitiveInst.execute` would take that path (the shapes moved, no device read, the fusion
holds, no special step, the same kernels kept, the cache fed back its own buffer and still
within its room); when one does not hold it returns False and the node runs the flow. Past the
point where the path may still branch on resources (realloc_if_needed) it calls the flow's own
methods. So its decisions and outputs are the flow's: tests/test_steady_steps.py compares them,
the fast path on and off, over decode loops.
"""
from __future__ import annotations

from collections import Counter

from engine.bound_kernel import work_sizes
from engine.decisions import count
from engine.layout import Layout
from engine.memo import values_key
from engine.ops.common import norm_axis


def applier(inst):
    """The steady step of a node, or None when its flow has no compiled path (host nodes,
    crops, runtime skips, in-place concats, ops this run builds static impls for: the flow)."""
    op = inst.opdef
    if inst.node.host or inst.concat_user is not None or inst.in_place_producers is not None \
            or op.dynamic_output:
        return None
    if op.view:
        return view_step
    if inst.kv_past is not None:
        return kv_append if inst.append_by is not None and op.runtime_skip is None \
            and op.in_place_crop is None else None
    if inst.rt.impls.builds_static(inst) or ((op.runtime_skip or op.in_place_crop) and not inst.fusion):
        return None
    return kernel_step


class Template:
    """What a class of nodes does for one set of input layouts in this step."""
    __slots__ = ("ok", "out_layouts", "in_shapes", "out_shapes", "calls", "keys", "internal", "sizes",
                 "shape", "axis", "padded", "nbytes", "bits")


class SteadyRun:
    """The steady steps of one inference: the class templates of its shapes, and the decisions
    made, counted at `finish` (one Counter update per path, not per decision)."""

    def __init__(self, decisions, shape_fns):
        self.decisions = decisions
        self.shape_fns = shape_fns         # the compiled shape functions (shape_fns.py)
        # events are written only where a trace reads them; the decision log of an inference
        # the fast path records (partial.build) needs only to know which nodes took a step
        # (they are dirty whatever they decided): one mark per node instead of its events
        self.emit = decisions.traced
        self.marks = decisions.log if not self.emit else None
        self.templates: dict = {}
        self.paths: Counter = Counter()      # a path's events -> how often they were made
        self.members = 0                     # nodes that took a steady step
        self.summed: Counter = Counter()     # counters summed from fields (kv_bytes_copied)
        self.counted: Counter = Counter()    # what `finish` added to the counters

    def reused(self) -> None:
        """A `realloc reuse` decision, counted with the others at `finish`."""
        self.paths[_REUSE] += 1

    def took(self, inst) -> None:
        """`inst` took its steady step."""
        self.members += 1
        if self.marks is not None:
            self.marks.append((inst.node.name, "steady", "", "", None))

    def event(self, inst, kind, action, reason="", **fields) -> None:
        self.decisions.write(kind, action, reason, inst.node, **fields)

    def finish(self) -> None:
        c = Counter(self.summed)
        for events, n in self.paths.items():
            for k, v in _path_counts(events).items():
                c[k] += v * n
        self.decisions.counters.update(c)
        self.counted.update(c)
        self.paths.clear()
        self.summed.clear()


_PATHS: dict = {}     # a path's events -> what they add to the counters (summed fields aside)


def _path_counts(events: tuple) -> Counter:
    once = _PATHS.get(events)
    if once is None:
        once = _PATHS[events] = Counter()
        for kind, action, reason in events:
            count(once, kind, action, reason, {})
    return once


def _moved(inst) -> tuple | None:
    """The node's input layouts when they moved since its last execution (update_shape would
    infer, reason shape_changed) and no shape dep needs a device read; None otherwise."""
    if inst.shape_done_by_other or inst.in_layouts is None or inst.in_place_now:
        return None
    in_layouts = [t.layout if t is not None else None for t in inst.inputs]
    if in_layouts == inst.in_layouts:
        return None
    for i in inst.opdef.shape_deps:
        t = inst.inputs[i] if i < len(inst.inputs) else None
        if t is not None and t.layout is not None and t.host is None:
            return None
    return in_layouts


def _shapes(tpl: Template, in_layouts, out_layouts) -> None:
    tpl.out_layouts = out_layouts
    tpl.in_shapes = [l.shape if l else None for l in in_layouts]
    tpl.out_shapes = [l.shape for l in out_layouts]


def _infer(run: SteadyRun, inst, tpl: Template, in_layouts, deps, deps_key) -> None:
    """update_shape's effects and decision for moved input layouts (no device read)."""
    inst.shape_changed, inst.deps, inst.deps_key, inst.in_layouts = True, deps, deps_key, in_layouts
    inst.unfuse_reason = ""          # the fusion holds (checked)
    for t, l in zip(inst.outputs, tpl.out_layouts):
        t.layout = l
    if run.emit:
        run.event(inst, "update_shape", "infer", "shape_changed", device_reads=0,
                  in_shapes=tpl.in_shapes, out_shapes=tpl.out_shapes)


_KERNEL_PATH = (("update_shape", "infer", "shape_changed"),)
_REUSE = (("realloc", "reuse", ""),)
_VIEW_PATH = _KERNEL_PATH + (("realloc", "view", ""), ("execute", "skip", "view"))
_KEEP = ("update_impl", "keep", "dynamic")


def _class_template(inst, run: SteadyRun, in_layouts, make) -> tuple:
    """(deps, deps_key, the Template of the node's class for these input layouts and shape
    values): `make(inst, in_layouts, deps, deps_key)` once per class and inference."""
    if inst.opdef.shape_deps:
        deps, changed, _ = inst._deps()    # no device read (checked); a value change is a shape change too
        # values as they were: the node's key of them stands (update_shape keeps it current)
        deps_key = (values_key(deps) if deps else ()) if changed else inst.deps_key
    else:
        deps, deps_key = {}, ()
    key = (inst.shape_class, tuple(in_layouts), deps_key) if inst.shape_class is not None else None
    tpl = run.templates.get(key) if key is not None else None
    if tpl is None:
        tpl = make(inst, in_layouts, deps, deps_key, run.shape_fns)
        if key is not None:
            run.templates[key] = tpl
    return deps, deps_key, tpl


def _view_template(inst, in_layouts, deps, deps_key, shape_fns) -> Template:
    tpl = Template()
    out_layouts, unfuse, _ = shape_fns.answer(inst, in_layouts, deps, deps_key, False)
    tpl.ok = not unfuse
    _shapes(tpl, in_layouts, out_layouts)
    return tpl


def _kernel_template(inst, in_layouts, deps, deps_key, shape_fns) -> Template:
    tpl = Template()
    out_layouts, unfuse, calls = shape_fns.answer(inst, in_layouts, deps, deps_key, True)
    tpl.ok = calls is not None
    _shapes(tpl, in_layouts, out_layouts)
    if tpl.ok:
        tpl.calls = calls
        tpl.keys = [(c.source, c.jit, len(c.args)) for c in calls]
        # scratch (a split-K GEMM's partial sums) as the flow's _bind declares it
        tpl.internal = next((c.internal for c in calls if c.internal), ())
        tpl.sizes = None           # the calls' work sizes (BoundKernel.retarget's), once a class
    return tpl


def kernel_step(inst, run: SteadyRun) -> bool:
    """execute() of a device node whose input layouts moved and that keeps its shape-agnostic
    kernels (this run builds no static impl for its op): update_shape infer, update_impl keep, the flow's
    realloc_if_needed, then set_arguments (the flow's when a buffer changed) and enqueue."""
    in_layouts = _moved(inst)
    if in_layouts is None or inst.skip_now:
        return False
    deps, deps_key, tpl = _class_template(inst, run, in_layouts, _kernel_template)
    bound = inst.bound
    if not tpl.ok or len(tpl.calls) != len(bound):
        return False
    impls = inst.dynamic_impls
    kept = []
    for call, k, b in zip(tpl.calls, tpl.keys, bound):
        impl = impls.get(k)
        if impl is None or b.impl is not impl or b.call.kernel != call.kernel:
            return False
        kept.append(impl)
    # the flow's path from here on: no more branches before realloc_if_needed
    _infer(run, inst, tpl, in_layouts, deps, deps_key)
    if run.emit:
        for impl in kept:
            run.event(inst, *_KEEP, impl=impl.name, impl_kind="dynamic")
    run.paths[_KERNEL_PATH + (_KEEP,) * len(kept)] += 1
    inst.pending, inst.want_weights = None, None
    same = [b.tensors is not None and b.call.args == call.args for call, b in zip(tpl.calls, bound)]
    sizes = tpl.sizes
    if sizes is None:
        sizes = tpl.sizes = [work_sizes(call, b.cpu) for call, b in zip(tpl.calls, bound)]
    for call, b, (gws, lws) in zip(tpl.calls, bound, sizes):
        b.call, b.gws, b.lws = call, gws, lws
    inst.internal_layouts = tpl.internal
    # the flow's realloc_if_needed; a kept buffer is counted in bulk where no trace reads it
    # (the predictor still sees the call, the memory pool the live bytes)
    if inst.realloc_if_needed(None if run.emit else run.reused):
        inst.set_arguments(True)
    else:
        did_set = inst.bind_arguments(False, same)
        if run.emit:
            run.event(inst, "set_args", "set" if did_set else "skip")
        run.paths[_SET_ARGS[did_set]] += 1
    inst.launch()
    if run.emit:
        run.event(inst, "execute", "enqueue", kernels=len(bound))
    run.paths[_ENQUEUE] += 1
    run.summed["kernels"] += len(bound)
    run.took(inst)
    return True


def view_step(inst, run: SteadyRun) -> bool:
    """execute() of a view (Reshape, Squeeze, Flatten...) whose input layouts moved, its shape
    values on the host: update_shape infer, then the flow's run_view (the output is the input's
    buffer under the output's layout; nothing enqueued)."""
    in_layouts = _moved(inst)
    if in_layouts is None:
        return False
    deps, deps_key, tpl = _class_template(inst, run, in_layouts, _view_template)
    if not tpl.ok:
        return False
    _infer(run, inst, tpl, in_layouts, deps, deps_key)
    run.took(inst)
    if run.emit:
        run.paths[_KERNEL_PATH] += 1
        inst.run_view()
    else:                          # its two decisions counted with the path's
        run.paths[_VIEW_PATH] += 1
        inst.view_input()
    return True


_ENQUEUE = (("execute", "enqueue", ""),)
_SET_ARGS = {True: (("set_args", "set", ""),), False: (("set_args", "skip", ""),)}


def owned_buffers(inst) -> list:
    """(buffer, the label its realloc event carries) of each buffer realloc_if_needed asks
    for: the outputs, then the scratch buffers of the current call."""
    return [(t, {"output": k} if k else {}) for k, t in enumerate(inst.outputs)] + \
        [(inst.internals[k], {"buffer": f"internal{k}"}) for k in range(len(inst.internal_layouts))]


def write_head(decisions, inst, kernels: bool = True) -> None:
    """The events a traced steady step writes before realloc_if_needed: update_shape's, then
    (`kernels`) each kept kernel's update_impl."""
    decisions.write("update_shape", "infer", "shape_changed", inst.node, device_reads=0,
                    in_shapes=[l.shape if l else None for l in inst.in_layouts],
                    out_shapes=[t.layout.shape for t in inst.outputs])
    if kernels:
        for b in inst.bound:
            decisions.write(*_KEEP, inst.node, impl=b.impl.name, impl_kind="dynamic")


def write_events(decisions, inst, step) -> None:
    """The events a traced steady step of `inst` writes when it keeps its buffers and its
    kernels' arguments, for a compiled inference that stands for one (compiled._write_base);
    its layouts are put back. Written, not counted: the plan counts them (counts_of_steady)."""
    node = inst.node
    write_head(decisions, inst, step is kernel_step)
    if step is view_step:
        decisions.write("realloc", "view", "", node)
        decisions.write("execute", "skip", "view", node)
        return
    for t, label in owned_buffers(inst):
        l = t.layout
        if l.count:
            decisions.write("realloc", "reuse", "", node, bytes=l.nbytes, capacity=t.capacity,
                            shape=l.shape, dtype=l.dtype, **label)
    decisions.write("set_args", "skip", "", node)
    decisions.write("execute", "enqueue", "", node, kernels=len(inst.bound))


def counts_of_steady(device, steps, reused: int) -> Counter:
    """What an inference in which every node of `device` takes its step of `steps` (kernel or
    view steps), keeping its buffers (`reused` of them in all) and its kernels' arguments,
    counts: SteadyRun.counted for it, without running it (a plan bound before any such
    inference ran: compiled.CompiledPlans.build_ahead)."""
    paths: Counter = Counter()
    kernels = 0
    for inst, step in zip(device, steps):
        if step is view_step:
            paths[_VIEW_PATH] += 1
            continue
        n = len(inst.bound)
        kernels += n
        paths[_KERNEL_PATH + (_KEEP,) * n] += 1
        paths[_SET_ARGS[False]] += 1
        paths[_ENQUEUE] += 1
    paths[_REUSE] += reused
    c = Counter({"kernels": kernels})
    for events, n in paths.items():
        for k, v in _path_counts(events).items():
            c[k] += v * n
    return +c


_KV_PATH = (("update_shape", "infer", "shape_changed"), ("realloc", "reuse", ""),
            ("kv_cache", "append", ""), ("execute", "skip", "in_place"))


def _kv_template(inst, in_layouts, held) -> Template:
    tpl = Template()
    out_layouts, unfuse = inst.layouts_for(in_layouts, {}, ())
    _shapes(tpl, in_layouts, out_layouts)
    l = out_layouts[0]
    shape = l.shape
    axis = norm_axis(inst.node.attrs["axis"], len(shape))
    tpl.ok = not unfuse and len(held) == len(shape) and shape[axis] <= held[axis] and \
        all(h == n for i, (h, n) in enumerate(zip(held, shape)) if i != axis)
    tpl.shape, tpl.axis, tpl.nbytes, tpl.bits = shape, axis, l.nbytes, l.itemsize * 8
    # one layout object for every member: next step their pasts compare by identity
    tpl.padded = Layout(shape, l.dtype, pad=held if held != shape else None)
    return tpl


def kv_append(inst, run: SteadyRun) -> bool:
    """execute() of a KV-cache concat whose attention writes the new entries, fed back its own
    buffer and still within its room: update_shape infer, the predictor's call, realloc reuse,
    kv_cache append, nothing enqueued (PrimitiveInst.run_kv_append's first branch, which also
    unbinds the copy kernels of a step that grew the cache)."""
    in_layouts = _moved(inst)
    if in_layouts is None:
        return False
    past, new = inst.inputs
    out = inst.outputs[0]
    held = inst.kv_pad if out.buf is not None else None
    if held is None or past.buf is not out.buf or past.offset != out.offset or past.layout.phys != held:
        return False
    key = (inst.shape_class, tuple(in_layouts), held) if inst.shape_class is not None else None
    tpl = run.templates.get(key) if key is not None else None
    if tpl is None:
        tpl = _kv_template(inst, in_layouts, held)
        if key is not None:
            run.templates[key] = tpl
    if not tpl.ok:
        return False
    _infer(run, inst, tpl, in_layouts, {}, ())
    if inst.bound:                 # the copy of the step that grew the cache: the flow unbinds it
        inst._bind([], [])
    buffers = inst.rt.buffers
    buffers.realloc_decision(out, tpl.shape, tpl.bits)   # the predictor sees every step
    if run.emit:
        run.event(inst, "realloc", "reuse", bytes=tpl.nbytes, capacity=out.capacity,
                  shape=tpl.shape, dtype=tpl.padded.dtype)
    out.layout = tpl.padded
    buffers.memory.note_live(out.name, tpl.nbytes)
    copied = new.layout.nbytes
    if run.emit:
        run.event(inst, "kv_cache", "append", bytes_copied=copied, capacity=held[tpl.axis],
                  length=tpl.shape[tpl.axis], by=inst.append_by.node.name)
    inst.internal_layouts = ()
    inst._written()
    if run.emit:
        run.event(inst, "execute", "skip", "in_place")
    run.paths[_KV_PATH] += 1
    run.summed["kv_bytes_copied"] += copied
    run.summed["device_reads"] += 0
    run.took(inst)
    return True


def trace_ahead(insts, appliers, shape_fns) -> None:
    """Trace the shape function of each node a kernel or view step serves, for the input
    layouts and shape values it has now (engine/fast_path/shape_fns.py)."""
    for inst, step in zip(insts, appliers):
        if (step is kernel_step or step is view_step) and inst.in_layouts is not None:
            shape_fns.answer(inst, inst.in_layouts, inst.deps, inst.deps_key, step is kernel_step,
                             ahead=True)
