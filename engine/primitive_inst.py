"""PrimitiveInst: one node's runtime state; `execute()` is seed 002's Figure 1.

    update_shape -> (empty output? skip) -> update_impl -> update_weights -> realloc_if_needed
    -> set_arguments -> enqueue

Every branch taken is reported to the network (`net.record`), which counts it and writes it to
the trace.
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from engine.fusion import fused_jit, fusion_valid
from engine.kernels import KernelCall, compose_shape_info, round_up
from engine.layout import Layout, dtype_from_numpy
from engine.memo import Memo, values_key
from engine.memory import Tensor
from engine.shape_predictor import BufferState
from engine.weights import WeightsCache, run_reorder, weights_cache_capacity


def work_sizes(call: KernelCall) -> tuple:
    """Global/local sizes for this execution (update_dispatch_data). 1-D kernels get a fixed
    work-group of 64 so a new global size never changes the local size: PoCL specialises a
    kernel per local size, and GPUs want a fixed group anyway; kernels bounds-check."""
    lws = call.lws or ((64,) if len(call.gws) == 1 else None)
    gws = tuple(round_up(g, l) for g, l in zip(call.gws, lws)) if lws else call.gws
    return gws, lws


class _Bound:
    """One kernel of this node's current impl with its bound arguments."""
    __slots__ = ("call", "kernel", "impl", "info", "slot", "arg_ids", "offsets", "gws", "lws",
                 "tensors")

    def __init__(self, call: KernelCall, impl):
        self.call, self.impl = call, impl
        self.kernel = cl.Kernel(impl.program, call.kernel)  # per node: arguments stay bound
        self.info = None
        self.slot = None               # its shape_info block in the network's arena
        self.tensors = None            # the tensors bound to its arguments (after shape_info)
        self.arg_ids = None
        self.offsets = None
        self.gws, self.lws = work_sizes(call)


class PrimitiveInst:
    def __init__(self, node, net):
        self.node = node
        self.net = net
        self.opdef = node.opdef
        self.inputs: list[Tensor | None] = []
        self.outputs: list[Tensor] = []
        self.in_layouts = None
        self.dep_state: dict = {}
        self.bound: list[_Bound] = []
        self._bound_cache: dict = {}   # (impl, kernel, position) -> _Bound, most recent last
        # pure functions of the shapes, remembered (engine/memo.py)
        self._infer_memo = Memo()      # (in layouts, deps) -> (out layouts, unfuse reason)
        self._calls_memo = Memo()      # (in, out layouts, deps) -> (kernel calls, static variant)
        self._info_memo = Memo(64)     # (call, tensor offsets) -> (call, shape_info)
        self.deps_key: tuple = ()
        self.shape_changed = False
        # fusion (engine/fusion.py): set by the network on a producer with fused ops
        self.fusion = None
        self.n_own = 0                 # inputs of the node itself (the rest are fused inputs)
        self.unfused: list = []        # the unfused subgraph's insts: producer, then fused ops
        self.unfuse_reason = ""        # non-empty while the current shapes invalidate the fusion
        self.kv_past = None            # a KV-cache concat fed back its own output (network.py)
        self.kv_pad = None             # dims of its buffer region (the padded layout)
        self.skip_now = False          # runtime_skip holds for the current shapes
        # runtime in-place concat (network.py plans it): on the concat, its producers' insts;
        # on the first producer, the concat to run do_runtime_in_place_concat for
        self.in_place_producers: list | None = None
        self.in_place_now = False      # the concat's inputs write into its buffer this time
        self.concat_user = None
        self.shape_done_by_other = False
        self.deps: dict = {}
        self.dynamic_impls: dict = {}  # (source, jit, #tensors) -> this node's shape-agnostic impls
        self.pending = None            # (key, name, variant) of a static build not yet taken
        self.want_weights = None       # WeightsLayout the current impl wants (None: original)
        self.weights_override = None   # the reordered (or reinterpreted) weights bound instead
        self.weights_cache: WeightsCache | None = None
        self.step = -1                 # position in the execution order (the network sets it)
        self.internal_layouts: tuple = ()   # scratch the current kernels need (KernelCall.internal)
        self.internals: list[Tensor] = []

    # ---- helpers ------------------------------------------------------------------------
    def family(self) -> list["PrimitiveInst"]:
        """This inst and every inst of its unfused subgraph, nested ones too (a fused
        attention's fallback Softmax has an unfused prologue of its own)."""
        out, todo = [], [self]
        while todo:
            i = todo.pop()
            out.append(i)
            todo += i.unfused
        return out

    def _rec(self, kind, action, reason="", **fields):
        self.net.record(kind, action, reason, self.node, **fields)

    def _deps(self) -> tuple[dict, bool, int]:
        """Host values of the inputs shape inference reads (the seed's memory deps), whether
        any changed since the last inference, and how many needed a device read."""
        deps, changed, reads = {}, False, 0
        for i in self.opdef.shape_deps:
            t = self.inputs[i] if i < len(self.inputs) else None
            if t is None or t.layout is None:
                continue
            if t.host is None:
                self.net.read_to_host(t)
                reads += 1
            prev = self.dep_state.get(i)
            if prev is None or prev[0] != t.version:   # a new version may hold the same value
                changed |= prev is None or not np.array_equal(prev[1], t.host)
                self.dep_state[i] = (t.version, t.host)
            deps[i] = t.host
        return deps, changed, reads

    # ---- the flow -----------------------------------------------------------------------
    def update_shape(self, by_other: "PrimitiveInst | None" = None) -> None:
        """Seed 000's update_shape. `by_other`: an in-place concat infers this node's shape
        ahead of its execution; only a change is traced then, and the node's own update_shape
        is skipped (`done_by_other`)."""
        node = self.node
        if self.shape_done_by_other:
            self.shape_done_by_other = False
            self._rec("update_shape", "skip", "done_by_other")
            return
        in_layouts = [t.layout if t is not None else None for t in self.inputs]
        deps, deps_changed, reads = self._deps()
        self.shape_changed = in_layouts != self.in_layouts or deps_changed
        self.deps = deps
        self.shape_done_by_other = by_other is not None
        # an op whose output shape depends on data is never skipped (the plugin's
        # generates_dynamic_output); shape_changed still says whether its output layout moved
        dynamic = self.opdef.dynamic_output and in_layouts == self.in_layouts
        if not self.shape_changed and not dynamic:
            if by_other is None:
                self._rec("update_shape", "skip",
                          "static_output" if node.static_output else "shape_unchanged")
            return
        reason = "first_run" if self.in_layouts is None else (
            "shape_changed" if in_layouts != self.in_layouts else
            "dynamic_output" if dynamic else "memory_deps_changed")
        self.deps_key = values_key(deps) if deps else ()
        key = (tuple(in_layouts), self.deps_key)
        hit = self._infer_memo.get(key)
        out_layouts, self.unfuse_reason = hit if hit is not None else \
            self._infer_memo.put(key, self._infer(in_layouts, deps))
        self.in_layouts = in_layouts
        for t, l in zip(self.outputs, out_layouts):
            t.layout = l
        by = {"by": by_other.node.name} if by_other is not None else {}
        self._rec("update_shape", "infer", reason, device_reads=reads,
                  in_shapes=[l.shape if l else None for l in in_layouts],
                  out_shapes=[l.shape for l in out_layouts], **by)

    def _infer(self, in_layouts, deps) -> tuple[list, str]:
        """Output layouts for these inputs, and why the fusion is invalid for them ("": valid)."""
        own = in_layouts[:self.n_own] if self.fusion else in_layouts
        out_layouts = self.opdef.infer(self.node, own, deps)
        if not self.fusion:
            return out_layouts, ""
        extra = dict(zip(self.fusion.extra, in_layouts[self.n_own:]))
        produced = own[0] if self.fusion.prologue else out_layouts[0]
        return out_layouts, fusion_valid(self.fusion, produced, extra, own)

    def execute(self) -> None:
        node, net = self.node, self.net
        if node.host:
            return self._execute_host([t.layout if t is not None else None for t in self.inputs])
        if self.concat_user is not None:
            # the first producer of an in-place concat runs the concat's runtime optimization
            self.concat_user.do_runtime_in_place_concat()
        self.update_shape()
        in_layouts, deps = self.in_layouts, self.deps
        if self.unfuse_reason:
            # seed 002 "Valid fusion?" no: run the unfused subgraph for these shapes
            self._rec("fusion", "unfuse", self.unfuse_reason, ops=self.fusion.names(),
                      position=self.fusion.position)
            for inst in self.unfused:
                inst.execute()
            return
        outs = [t.layout for t in self.outputs]

        if self.opdef.view:
            return self._execute_view()
        if self.in_place_now:
            return self._execute_in_place()
        if self.shape_changed and self.opdef.runtime_skip and not self.fusion:
            self.skip_now = in_layouts[0].pad is None and bool(
                self.opdef.runtime_skip(node, in_layouts, outs, deps))
        if self.skip_now:
            return self._execute_view("runtime_skip")
        if self.kv_past is not None:
            return self._execute_kv_append()
        if all(l.count == 0 for l in outs):
            for t in self.outputs:  # buffers are kept for the next non-empty shape
                t.host = None
                t.version += 1
            self._rec("realloc", "empty")
            self._rec("execute", "skip", "empty_output")
            return

        impl_changed = self.shape_changed and self.update_impl(in_layouts, outs, deps)
        if not self.shape_changed and self.pending is not None:
            impl_changed = self.poll_static()  # a static build finished: switch on this execution
        if impl_changed:
            self.update_weights()
        # realloc_if_needed only for new shapes or a new impl, as the plugin's prepare_primitive
        # ("only try update weight and realloc when impl is updated"): a repeated shape keeps
        # its buffers without a decision (and without feeding the ShapePredictor's history)
        owned = None if self.shape_changed or impl_changed else self._owned()
        if owned is None or any(t.buf is None for t in owned) or \
                len(self.internals) < len(self.internal_layouts):
            mem_changed = self.realloc_if_needed()
        else:   # same shapes, same buffers: still live in this inference
            mem_changed = False
            for t in owned:
                net.memory.note_live(t.name, t.layout.nbytes)
        self.set_arguments(impl_changed or mem_changed)
        for b in self.bound:
            net.launch(b.kernel, b.gws, b.lws, b)
        for t in self.outputs:
            t.version += 1
            t.dev_version = t.version
            t.host = None
        self._rec("execute", "enqueue", kernels=len(self.bound))

    def _execute_host(self, in_layouts) -> None:
        """Shape subgraph: numpy (onnx.reference) on host values, re-run only when its Shape
        sources saw a new shape."""
        node, net = self.node, self.net
        if node.op == "Shape":
            if in_layouts == self.in_layouts:
                self._rec("update_shape", "skip", "shape_of_unchanged")
                return
            from engine.ops.shape_ops import shape_value
            vals = [shape_value(node, in_layouts[0].shape)]
            prev = self.outputs[0].host
            self.in_layouts = in_layouts
            if prev is not None and np.array_equal(prev, vals[0]):
                # e.g. Shape(start=1) when only the batch changed: its users see the same dims
                self._rec("update_shape", "infer", "shape_changed", value_unchanged=True,
                          out_shapes=[self.outputs[0].layout.shape])
                self._rec("execute", "host")
                return
            net.shape_of_changed.add(node.name)
        else:
            if self.in_layouts is not None and in_layouts == self.in_layouts and \
                    not (node.shape_sources & net.shape_of_changed):
                self._rec("update_shape", "skip", "static_output" if node.static_output
                          else "shape_of_subgraph_unchanged")
                return
            args = []
            for t in self.inputs:
                if t is not None and t.host is None:
                    net.read_to_host(t)
                args.append(None if t is None else t.host)
            try:
                vals = node.run_host(args)
            except Exception as e:  # numpy's words name no node: say which, and what limits it
                from engine.diagnose import node_failure
                raise node_failure(self, net, args, e) from e
        self.in_layouts = in_layouts
        for t, v in zip(self.outputs, vals):
            if t.host is not None and (t.host is v or (t.host.dtype == v.dtype and
                                                        np.array_equal(t.host, v))):
                continue     # same value: its device copy and its readers' deps stay valid
            t.host = v
            t.layout = Layout(tuple(int(d) for d in v.shape), dtype_from_numpy(v.dtype))
            t.version += 1
        self._rec("update_shape", "infer", "shape_changed",
                  out_shapes=[t.layout.shape for t in self.outputs])
        self._rec("execute", "host")

    def _execute_view(self, reason: str = "view") -> None:
        src, dst = self.inputs[0], self.outputs[0]
        if src.buf is None and src.layout.count:
            self.net.upload(src)
        if reason != "view" and dst.capacity:   # its own buffer is not needed while skipped
            self.net.release(dst)
            dst.state = BufferState()
        dst.buf, dst.offset = src.buf, src.offset
        # a host copy the input had is this output's value under the output's shape
        dst.host = None if src.host is None else src.host.reshape(dst.layout.shape)
        dst.version = src.version
        dst.dev_version = src.dev_version
        self._rec("realloc", "view")
        self._rec("execute", "skip", reason)

    def _execute_kv_append(self) -> None:
        """KV-cache concat (past, new) -> present, with present fed back as the next past. The
        buffer keeps room along the sequence axis (a padded layout, sized by the ShapePredictor):
        while the room lasts and past is the previous present, only the new entries are written;
        otherwise the buffer is reallocated and both parts copied (the GPU plugin's kv-cache)."""
        from engine.ops.common import contiguous_strides, norm_axis
        from engine.ops.movement import copy_call
        net, node = self.net, self.node
        past, new = self.inputs
        out = self.outputs[0]
        l = Layout(out.layout.shape, out.layout.dtype)
        axis = norm_axis(node.attrs["axis"], l.rank)
        lp = past.layout.shape[axis]
        held = self.kv_pad if out.buf is not None else None
        # the predictor sees every step (its history must follow the growth), as in the plugin
        d = out.state.realloc_if_needed(net.predictor, out.name, l.shape, l.itemsize * 8,
                                        net.used_bytes)
        fed = past.buf is not None and past.buf is out.buf and past.offset == out.offset and \
            past.layout.phys == held
        fits = held is not None and all(h == n for i, (h, n) in enumerate(zip(held, l.shape))
                                        if i != axis) and l.shape[axis] <= held[axis]
        if fed and fits:
            pad, reason = held, ""
            calls = []
            copied = new.layout.nbytes
            self._rec("realloc", "reuse", bytes=l.nbytes, capacity=out.capacity, shape=l.shape,
                      dtype=l.dtype)
        else:
            reason = "first_run" if held is None else ("capacity" if fed else "not_fed_back")
            per = l.count // l.shape[axis] if l.shape[axis] else 0
            cap = max(l.shape[axis], d.alloc_elems // per if per else 0)
            pad = tuple(cap if i == axis else x for i, x in enumerate(l.shape))
            nbytes = max(1, int(np.prod(pad))) * l.itemsize
            net.give_buffer(out, nbytes)    # never pooled: the buffer outlives the inference
            self._rec("realloc", "alloc", bytes=nbytes, capacity=nbytes, predicted=d.predicted,
                      mode=d.mode, shape=l.shape, dtype=l.dtype)
            calls = [copy_call(node, l.dtype, past.layout.shape, contiguous_strides(past.layout.phys),
                               0, contiguous_strides(pad), 0)] if past.layout.count else []
            copied = past.layout.nbytes + new.layout.nbytes
        ost = contiguous_strides(pad)
        if new.layout.count:
            calls.append(copy_call(node, l.dtype, new.layout.shape,
                                   contiguous_strides(new.layout.phys), 0, ost, lp * ost[axis],
                                   src=("in", 1)))
        self.kv_pad = pad
        out.layout = Layout(l.shape, l.dtype, pad=pad if pad != l.shape else None)
        net.memory.note_live(out.name, l.nbytes)
        self._rec("kv_cache", "append" if not reason else "copy", reason, bytes_copied=copied,
                  capacity=pad[axis], length=l.shape[axis])
        self.shape_changed = True          # the copies' offsets move every step
        # a new _Bound binds its arguments; a kept one re-binds only when a buffer changed
        self._bind(calls, [self._dynamic_impl(c) for c in calls])
        self.set_arguments(False)
        for b in self.bound:
            net.launch(b.kernel, b.gws, b.lws, b)
        out.version += 1
        out.dev_version = out.version
        out.host = None
        self._rec("execute", "enqueue", kernels=len(self.bound))

    def do_runtime_in_place_concat(self) -> None:
        """The runtime in-place concat (the plugin's do_runtime_in_place_concat), run when the
        concat's first producer is about to execute: shape inference for every producer and
        for the concat; when each input's region of the output is contiguous for these shapes,
        the concat's realloc_if_needed now and every producer's output a slice of that buffer
        (the concat then enqueues nothing); otherwise the concat copies, and says why."""
        for p in self.in_place_producers:
            p.update_shape(by_other=self)
        self.update_shape(by_other=self)
        out = self.outputs[0]
        reason = _in_place_fallback(self.node, out.layout)
        if reason:
            if self.in_place_now:
                for t in self.inputs:        # the producers get buffers of their own again
                    t.buf, t.offset, t.by_other = None, 0, False
                    t.state = BufferState()
            self.in_place_now = False
            self._rec("in_place_concat", "fallback", reason)
            return
        self.realloc_if_needed()
        offsets, off = [], out.offset
        for t in self.inputs:
            if not t.by_other:
                self.net.release(t)
                t.state = BufferState()
            t.buf, t.offset, t.by_other = out.buf, off, True
            offsets.append(off - out.offset)
            off += t.layout.count
        self.in_place_now = True
        self._rec("in_place_concat", "apply", inputs=[t.name for t in self.inputs], offsets=offsets)

    def _execute_in_place(self) -> None:
        """The producers wrote the concat's output: nothing to enqueue."""
        out = self.outputs[0]
        out.version += 1
        out.dev_version = out.version
        out.host = None
        self._rec("execute", "skip", "in_place")

    def update_impl(self, ins, outs, deps) -> bool:
        """Pick the impl for the new shapes (seed 002). The node keeps its shape-agnostic impl
        (built once, shared through the impl cache) and runs it at once; for ops with a static
        variant, the static impl of these shapes is taken from the impl cache, or built (in the
        critical path with --no-async-compile / --impls static), or queued on the compile queue
        and switched to on a later execution (poll_static)."""
        net, node = self.net, self.node
        mkey = (tuple(ins), tuple(outs), self.deps_key)
        hit = self._calls_memo.get(mkey)
        calls, v, key = hit if hit is not None else \
            self._calls_memo.put(mkey, self._kernel_calls(ins, outs, deps))
        impls = [self._dynamic_impl(call) for call in calls]
        self.pending, self.want_weights = None, None
        if v is not None:
            name = f"{impls[0].name}/static[{v.tag}]"
            impl, how = net.find_static(key, name, node)
            if impl is None:
                self.pending = (key, name, v) if how == "queued" else None
            else:
                if how == "hit":
                    self._rec("update_impl", "cache_hit", "static", impl=name, impl_kind="static")
                elif how == "ready":
                    self._rec_switch(impl, "static_ready")
                calls, impls, self.want_weights = [v.call], [impl], v.weights
        return self._bind(calls, impls)

    def _kernel_calls(self, ins, outs, deps) -> tuple:
        """The dynamic impl's kernel calls for these shapes (fused ops applied), and the static
        variant with its impl cache key (None, None when these shapes get none)."""
        net = self.net
        own = ins[:self.n_own] if self.fusion else ins
        dev = {"device": net.device_type} if self.opdef.per_device else {}
        calls = self.opdef.kernels(self.node, own, outs, deps, **dev)
        if self.fusion and not self.fusion.subgraph:
            calls = self._with_fused_ops(calls)
        v = net.static_variant(self, own, outs, deps)
        if v is not None and any(l is not None and l.pad for l in ins):
            v = None                     # static tables describe dense tensors only
        if v is not None and self.fusion:
            v = self._fused_static(v, ins[self.n_own:])
        return calls, v, (net.static_key(self, v, ins, outs) if v is not None else None)

    def _dynamic_impl(self, call):
        """This node's shape-agnostic impl of `call`: kept from an earlier shape, else from the
        impl cache (or built)."""
        key = (call.source, call.jit, len(call.args))   # the build bakes in NUM_TENSORS
        impl = self.dynamic_impls.get(key)
        if impl is None:
            impl = self.dynamic_impls[key] = self.net.get_impl(call, self.node)
        else:
            self._rec("update_impl", "keep", "dynamic", impl=impl.name, impl_kind="dynamic")
        return impl

    def _rec_switch(self, impl, reason) -> None:
        old = self.bound[0].impl.name if self.bound else ""
        self.net.counters["switches"] += 1
        self._rec("update_impl", "switch", reason, old_impl=old, new_impl=impl.name,
                  impl_kind=impl.kind, compile_ms=round(impl.compile_ms, 3), critical=False)

    def poll_static(self) -> bool:
        """Same shapes as last time, a static build pending: take it if it is ready (from the
        compile queue, or from the impl cache when another node took it first)."""
        key, name, v = self.pending
        net = self.net
        impl = net.impls.get(key) if key in net.impls else net.take_static(key, name, self.node)
        if impl is None:
            if key in net._failed_static:
                self.pending = None
            elif not net.compile_queue.pending(key):  # evicted before this node took it
                net.find_static(key, name, self.node)
            return False
        self.pending = None
        self._rec_switch(impl, "static_ready")
        self.want_weights = v.weights
        return self._bind([v.call], [impl])

    def _bind(self, calls, impls) -> bool:
        new, changed = [], False
        for k, (call, impl) in enumerate(zip(calls, impls)):
            old = self.bound[k] if k < len(self.bound) else None
            if old is not None and old.impl is impl and old.call.kernel == call.kernel:
                old.call = call
                old.gws, old.lws = work_sizes(call)
                new.append(old)
            else:
                # a kernel object per (impl, kernel) is kept: creating one costs ~150 us in
                # pyopencl, and shapes that come back take their static impl back
                key = (id(impl), call.kernel, k)
                b = self._bound_cache.pop(key, None)
                if b is None or b.impl is not impl:
                    b = _Bound(call, impl)
                else:
                    b.call, (b.gws, b.lws) = call, work_sizes(call)
                self._bound_cache[key] = b
                while len(self._bound_cache) > 16:
                    del self._bound_cache[next(iter(self._bound_cache))]
                new.append(b)
                changed = True
        changed |= len(new) != len(self.bound)
        self.bound = new
        self.internal_layouts = next((c.internal for c in calls if c.internal), ())
        return changed

    def _with_fused_ops(self, calls: list) -> list:
        """The kernel that writes the output also applies the fused ops (FUSED_OPS hook); for a
        prologue, the kernel that reads input 0 applies them on each read (PROLOGUE_OPS)."""
        ref = ("in", 0) if self.fusion.prologue else ("out", 0)
        k = max(i for i, c in enumerate(calls) if ref in c.args)
        c = calls[k]
        first = len(c.args)
        extra = tuple(("in", self.n_own + j) for j in range(len(self.fusion.extra)))
        calls[k] = KernelCall(c.source, c.kernel, c.jit + fused_jit(self.fusion, c.args.index(ref), first),
                              c.args + extra, c.params, c.gws, c.lws, c.dims)
        return calls

    def _fused_static(self, v, extra_layouts):
        """The static variant with the fused ops. Static GEMM tables may fold batch dims into
        rows and round rows up (fake alignment), so there the fused inputs must vary along the
        last dim only (a bias); otherwise these shapes keep the dynamic impl."""
        if self.node.op in ("MatMul", "Gemm") and any(
                l.count != (l.shape[-1] if l.rank else 1) for l in extra_layouts):
            return None
        v.call = self._with_fused_ops([v.call])[0]
        return v

    def update_weights(self) -> None:
        """After an impl change (seed 000): give the impl its weights in the layout it wants.
        skip (no constant weights, or the original layout wanted and in use) | reset (back to
        the original) | cache_hit (a reordered copy kept in this node's LRU) | reinterpret (the
        original buffer already is that layout) | reorder (a reorder kernel into a reused or new
        buffer)."""
        net = self.net
        idx = self.opdef.weights
        w = self.inputs[idx] if idx is not None and idx < len(self.inputs) else None
        if w is None or not w.constant:
            self._rec("update_weights", "skip", "no_weights")
            return
        wl = self.want_weights
        if wl is None:
            if self.weights_override is not None:
                self.weights_override = None
                self._rec("update_weights", "reset", layout="original")
            else:
                self._rec("update_weights", "skip", "original_layout")
            return
        if self.weights_cache is None:
            self.weights_cache = WeightsCache(weights_cache_capacity(
                w.layout.nbytes, net.device.global_mem_size, net.used_bytes))
        t = self.weights_cache.get(wl)
        if t is not None:
            self._rec("update_weights", "cache_hit", layout=wl.name)
        elif wl.compatible:
            buf = net.device_buffer(w)
            t = Tensor(f"{w.name}:{wl.name}", Layout(tuple(wl.shape), "f32"), buf=buf,
                       offset=w.offset, constant=True)
            old = self.weights_cache.make_room(net.release)
            if old is not None:
                net.release(old)
            self.weights_cache.put(wl, t)
            self._rec("update_weights", "reinterpret", layout=wl.name)
        else:
            reuse = self.weights_cache.make_room(net.release)
            t = run_reorder(net, self.node, w, wl, reuse)
            self.weights_cache.put(wl, t)
            net.counters["weights_reordered_bytes"] += t.layout.nbytes
            self._rec("update_weights", "reorder", "reused_buffer" if t is reuse else "",
                      layout=wl.name, bytes=t.layout.nbytes, capacity=self.weights_cache.capacity)
        self.weights_override = t

    def _arg_tensor(self, kind: str, i: int) -> Tensor:
        if kind == "internal":
            return self.internals[i]
        if kind == "in":
            if self.weights_override is not None and i == self.opdef.weights:
                return self.weights_override
            return self.inputs[i]
        return self.outputs[i]

    def realloc_if_needed(self) -> bool:
        """Output memory (seed 000): reuse the buffer when the new size fits, else a buffer of
        the size the ShapePredictor asks for (its preallocation when it predicts and 90% of
        memory allows): a dead tensor's from the memory pool, or a new one. The impl's internal
        buffers (scratch) follow the same rules (seed 000 step 9)."""
        changed = False
        for t in self.outputs:
            changed |= self._realloc(t)
        for k, l in enumerate(self.internal_layouts):
            t = self._internal(k)
            t.layout = l
            changed |= self._realloc(t, buffer=f"internal{k}")
        return changed

    def _owned(self):
        """The buffers realloc_if_needed manages for this node: outputs, then internal buffers."""
        return [t for t in self.outputs if t.layout.count and not t.by_other] + \
            self.internals[:len(self.internal_layouts)]

    def _internal(self, k: int) -> Tensor:
        while len(self.internals) <= k:
            t = Tensor(f"{self.node.name}:internal{len(self.internals)}")
            self.net.memory.add_scratch(t.name, self.step)
            self.internals.append(t)
        return self.internals[k]

    def _realloc(self, t: Tensor, **label) -> bool:
        net, l = self.net, t.layout
        if l.count == 0:
            return False
        if t.by_other:   # a slice of an in-place concat's buffer (set by the concat)
            self._rec("realloc", "by_other", bytes=l.nbytes, shape=l.shape, dtype=l.dtype)
            return False
        d = t.state.realloc_if_needed(net.predictor, t.name, l.shape, l.itemsize * 8, net.used_bytes)
        if net.log_reallocs is not None:   # a plan replays this call (the predictor's history)
            net.log_reallocs.append((t, l.shape, l.itemsize * 8))
        net.memory.note_live(t.name, l.nbytes)
        if d.action == "reuse" and t.capacity:   # an owned buffer (not a view's alias)
            self._rec("realloc", "reuse", bytes=l.nbytes, capacity=t.capacity, shape=l.shape,
                      dtype=l.dtype, **label)
            return False
        nbytes = max(d.alloc_elems, l.count) * l.itemsize
        how = net.give_buffer(t, nbytes, exact=l.count * l.itemsize)
        if how == "alloc" and t.capacity < nbytes:   # the extra was dropped to fit the device
            nbytes, d.predicted = t.capacity, False
        t.state.take(t.capacity // l.itemsize)   # a pooled buffer may be larger
        self._rec("realloc", how, "reclaim" if d.reclaimed else "", bytes=nbytes,
                  capacity=t.capacity, predicted=d.predicted, mode=d.mode, shape=l.shape,
                  dtype=l.dtype, **label)
        return True

    def set_arguments(self, force: bool) -> None:
        """Bind kernel arguments only when the impl or a buffer changed (seed 002); rewrite the
        shape_info buffer only when the dims or offsets changed."""
        net = self.net
        did_set = False
        for b in self.bound:
            call = b.call
            # the argument tensors change only with the impl, the weights or the internal
            # buffers (force) or with the call (a shape change)
            if force or self.shape_changed or b.tensors is None:
                b.tensors = [self._arg_tensor(kind, i) for kind, i in call.args]
            tensors = b.tensors
            offsets = tuple(t.offset for t in tensors)
            # shape_info depends on the call (replaced on a shape change) and the offsets only:
            # on a repeated shape nothing is recomposed or rewritten.
            if b.info is None or self.shape_changed or offsets != b.offsets:
                # the memo holds the call, so its id names it while the entry lives
                hit = self._info_memo.get((id(call), offsets))
                if hit is None or hit[0] is not call:
                    blocks = [(t.offset, call.dims.get(p, t.layout.shape)) for p, t in enumerate(tensors)]
                    hit = self._info_memo.put((id(call), offsets),
                                              (call, compose_shape_info(blocks, call.params)))
                info = hit[1]
                b.offsets = offsets
                if b.info is None or not (info is b.info or np.array_equal(info, b.info)):
                    if b.slot is None or b.slot.nbytes < info.nbytes:
                        b.slot = net.arena.slot(len(info))
                        b.arg_ids = None
                    b.slot.write(info)      # reaches the device at the network's next flush
                    b.info = info
            bufs = [b.slot.buf] + [net.device_buffer(t) for t in tensors]
            if force or b.arg_ids is None or any(x is not y for x, y in zip(bufs, b.arg_ids)):
                b.kernel.set_args(*bufs)
                b.arg_ids = bufs  # holding them keeps identities meaningful
                did_set = True
        self._rec("set_args", "set" if did_set else "skip")


def _in_place_fallback(node, out: Layout) -> str:
    """Why the concat's inputs cannot write into its buffer for these shapes ("" when they
    can): each input's region must be one contiguous run of the output."""
    from engine.ops.common import norm_axis
    axis = norm_axis(node.attrs["axis"], out.rank)
    if out.count == 0:
        return "empty_output"
    if any(d != 1 for d in out.shape[:axis]):
        return "not_contiguous"
    return ""
