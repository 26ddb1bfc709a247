"""PrimitiveInst: one node's runtime state; `execute()` is the flow of one node in the GPU
plugin's overall_flow.md (Figure 1), its steps as preprocessing.md describes them:

    update_shape -> valid fusion? -> update_impl -> update_weights -> realloc_if_needed
    -> set_arguments -> enqueue

The other ways a node runs are named steps `execute` dispatches to, each in one place: a host
shape-subgraph node (`run_host`), the unfused subgraph of a fusion the shapes made invalid
(`run_unfused`), a view, a runtime skip (runtime_skip.md), an input of an in-place concat
(`run_in_place`), a KV-cache append (kv_cache.md), an empty output. Every branch taken is a
decision, counted and traced through `Runtime.decisions`; the node's collaborators are the
runtime services (engine/runtime.py), never the network.
"""
from __future__ import annotations

import math
from operator import is_not

import numpy as np

from engine.bound_kernel import BoundKernel, offset_of
from engine.diagnose import shape_failure
from engine.fused_ops import fusion_valid, with_fused_ops
from engine.host_eval import host_outputs
from engine.kernels import KernelCall, compose_shape_info
from engine.layout import Layout, dtype_from_numpy
from engine.memo import Memo, values_key
from engine.memory import Tensor
from engine.ops.common import ShapeInferenceError, contiguous_strides, norm_axis
from engine.ops.movement import copy_call
from engine.shape_predictor import BufferState
from engine.weights import WeightsCache, weights_cache_capacity



def same_value(a: np.ndarray, b: np.ndarray) -> bool:
    """np.array_equal of two host values; integer and bool ones (shape math) by their bytes,
    several times cheaper, with the same answer (floats keep array_equal: NaN, -0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind in "iub":
        return a.tobytes() == b.tobytes()
    return bool(np.array_equal(a, b))


class PrimitiveInst:
    # what the flow reads back from the node's previous execution (a plan replay puts it back,
    # engine/fast_path); the rest is fixed or physical (kernel objects, memo tables, caches)
    STATE = ("in_layouts", "dep_state", "deps", "deps_key", "shape_changed", "shape_done_by_other",
             "unfuse_reason", "skip_now", "in_place_now", "bound", "internal_layouts", "internals",
             "pending", "want_weights", "weights_override", "kv_pad", "crop_at")

    BOUND_KEPT = 16                # kernel objects a node keeps for impls it may take back

    def __init__(self, node, runtime):
        self.node = node
        self.rt = runtime
        self.opdef = node.opdef
        self.inputs: list[Tensor | None] = []
        self.outputs: list[Tensor] = []
        self.in_layouts = None
        self.dep_state: dict = {}
        self.bound: list[BoundKernel] = []
        self._bound_cache: dict = {}   # (impl, kernel, position) -> BoundKernel, most recent last
        # pure functions of the shapes, remembered (engine/memo.py)
        self._layouts_memo = Memo()    # (in layouts, deps) -> (out layouts, unfuse reason)
        self._calls_memo = Memo()      # (in, out layouts, deps) -> (kernel calls, static variant)
        self._info_memo = Memo(64)     # (call, tensor offsets) -> (call, shape_info)
        # its class (engine/memo.py node_class; None: no class): nodes of one class share the
        # memo tables (load_passes.share_memos), keyed by it
        self.shape_class = None
        self.deps_key: tuple = ()
        self.shape_changed = False
        # fusion (engine/fusion.py): set at load on a node with fused ops
        self.fusion = None
        self.n_own = 0                 # inputs of the node itself (the rest are fused inputs)
        self.unfused: list = []        # the unfused subgraph's insts: producer, then fused ops
        self.unfuse_reason = ""        # non-empty while the current shapes invalidate the fusion
        self.kv_past = None            # a KV-cache concat fed back its own output (load_passes)
        self.kv_pad = None             # dims of its buffer region (the padded layout)
        # a fused attention that writes a KV-cache concat's new entries (load_passes.
        # kv_into_attention): on the concat, that attention; on the attention, the two concats
        self.append_by = None
        self.kv_from: tuple = ()
        self.skip_now = False          # runtime_skip holds for the current shapes
        self.crop_at = None            # in-place crop: the outputs' offsets in the input (None: copies)
        # runtime in-place concat (load_passes finds them): on the concat, its producers'
        # insts; on the first producer, the concat to run do_runtime_in_place_concat for
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
        self.step = -1                 # position in the execution order
        self.internal_layouts: tuple = ()   # scratch the current kernels need (KernelCall.internal)
        self.internals: list[Tensor] = []
        self.index_flag: Tensor | None = None   # an index op's slot of the index flags
        # set by run_unfused for the one execution that follows: this node writes the fused
        # node's output, whose layout the fused node's own update_shape may have rewritten
        self.outputs_rewritten = False

    # ---- helpers ------------------------------------------------------------------------
    def join_class(self, shape_class: int, memos) -> None:
        """Nodes of one class share the memo tables of their layouts and shape_info (and of
        their dynamic kernel calls: dynamic_calls_for), keyed by the class."""
        self.shape_class = shape_class
        self._layouts_memo, self._info_memo = memos.layouts, memos.info

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
        self.rt.decisions.record(kind, action, reason, self.node, **fields)

    def snapshot(self) -> list:
        """(object, state) of this node, its bound kernels and its internal buffers."""
        d = self.__dict__
        own = tuple(dict(d[k]) if k == "dep_state" else list(d[k]) if k == "internals" else d[k]
                    for k in self.STATE)
        return [(self, own)] + [(b, b.snapshot()) for b in self.bound] + \
            [(t, t.snapshot()) for t in self.internals]

    def restore(self, values: tuple) -> None:
        # one C-level update (no STATE name is a property): plan replays put back hundreds
        self.__dict__.update(zip(self.STATE, values))

    # ---- pure functions of the shapes (prebuild walks them too) ---------------------------
    def infer_layouts(self, in_layouts, deps) -> tuple[list, str]:
        """Output layouts for these inputs, and why the fusion is invalid for them ("": valid)."""
        own = in_layouts[:self.n_own] if self.fusion else in_layouts
        try:
            out_layouts = self.opdef.infer(self.node, own, deps)
        except (ShapeInferenceError, OverflowError) as e:  # the op's words name no node: say which
            raise shape_failure(self, self.rt.buffers, own, deps, e) from e
        if not self.fusion:
            return out_layouts, ""
        extra = dict(zip(self.fusion.extra, in_layouts[self.n_own:]))
        produced = own[0] if self.fusion.prologue else out_layouts[0]
        return out_layouts, fusion_valid(self.fusion, produced, extra, own, self.rt.impls.device_type)

    def dynamic_calls(self, ins, outs, deps) -> list:
        """The dynamic impl's kernel calls for these shapes (fused ops applied)."""
        own = ins[:self.n_own] if self.fusion else ins
        dev = {"device": self.rt.impls.device_type} if self.opdef.per_device else {}
        if self.kv_from:
            dev["kv_append"] = True
        calls = self.opdef.kernels(self.node, own, outs, deps, **dev)
        if self.fusion and not self.fusion.subgraph:
            calls = self._with_fused_ops(calls)
        return calls

    def static_for(self, ins, outs, deps) -> tuple:
        """The static variant of these shapes with its impl cache key (None, None: none)."""
        impls = self.rt.impls
        own = ins[:self.n_own] if self.fusion else ins
        v = impls.static_variant(self, own, outs, deps)
        if v is not None and any(l is not None and l.pad for l in ins):
            v = None                     # static tables describe dense tensors only
        if v is not None and self.fusion:
            v = self._fused_static(v, ins[self.n_own:])
        return v, (impls.static_key(self.node.op, v, ins, outs) if v is not None else None)

    def layouts_for(self, in_layouts, deps, deps_key: tuple) -> tuple[list, str]:
        """infer_layouts, remembered (prebuild's walk asks too: the flow then finds its answers)."""
        key = (self.shape_class, tuple(in_layouts), deps_key)
        hit = self._layouts_memo.get(key)
        return hit if hit is not None else self._layouts_memo.put(key, self.infer_layouts(in_layouts, deps))

    def dynamic_calls_for(self, ins, outs, deps, deps_key: tuple) -> list:
        """dynamic_calls, remembered in the class's table (None class: computed)."""
        if self.shape_class is None:
            return self.dynamic_calls(ins, outs, deps)
        key = (self.shape_class, tuple(ins), tuple(outs), deps_key)
        hit = self.rt.memos.calls.get(key)
        return hit if hit is not None else self.rt.memos.calls.put(key, self.dynamic_calls(ins, outs, deps))

    def _layouts_for(self, in_layouts, deps) -> tuple[list, str]:
        return self.layouts_for(in_layouts, deps, self.deps_key)

    def _calls_for(self, ins, outs, deps) -> tuple:
        key = (tuple(ins), tuple(outs), self.deps_key)
        hit = self._calls_memo.get(key)
        if hit is None:
            # the static variant stays the node's own (its weights, its impl cache key)
            calls = self.dynamic_calls_for(ins, outs, deps, self.deps_key)
            hit = self._calls_memo.put(key, (calls,) + self.static_for(ins, outs, deps))
        return hit

    def _shape_info_for(self, call, tensors, offsets) -> np.ndarray:
        # the memo holds the call, so its id names it while the entry lives
        hit = self._info_memo.get((id(call), offsets))
        if hit is None or hit[0] is not call:
            blocks = [(t.offset, call.dims.get(p, t.layout.shape)) for p, t in enumerate(tensors)]
            hit = self._info_memo.put((id(call), offsets), (call, compose_shape_info(blocks, call.params)))
        return hit[1]

    # ---- the flow -----------------------------------------------------------------------
    def execute(self) -> None:
        """overall_flow.md, Figure 1, for one node."""
        if self.node.host:
            return self.run_host()
        if self.concat_user is not None:
            # the first producer of an in-place concat runs the concat's runtime optimization
            self.concat_user.do_runtime_in_place_concat()
        self.update_shape()
        if self.unfuse_reason:             # "Valid fusion?" no
            return self.run_unfused()
        special = self._special_step()
        if special is not None:
            return special()
        outs = [t.layout for t in self.outputs]
        impl_changed = self.shape_changed and self.update_impl(self.in_layouts, outs, self.deps)
        if not self.shape_changed and self.pending is not None:
            impl_changed = self.poll_static()  # a static build finished: switch on this execution
        if impl_changed:
            self.update_weights()
        mem_changed = False if self._buffers_kept(impl_changed) else self.realloc_if_needed()
        self.set_arguments(impl_changed or mem_changed)
        self.enqueue()

    def _special_step(self):
        """The step that runs this node instead of its own kernels for these shapes, or None."""
        if self.opdef.view:
            return self.run_view
        if self.in_place_now:
            return self.run_in_place
        if self.shape_changed and self.opdef.runtime_skip and not self.fusion:
            outs = [t.layout for t in self.outputs]
            self.skip_now = self.in_layouts[0].pad is None and bool(
                self.opdef.runtime_skip(self.node, self.in_layouts, outs, self.deps))
        if self.skip_now:
            return self.run_runtime_skip
        if self.opdef.in_place_crop is not None and not self.fusion:
            if self.shape_changed:
                self._update_crop()
            if self.crop_at is not None:
                return self.run_in_place_crop
        if self.kv_past is not None:
            return self.run_kv_append
        if all(t.layout.count == 0 for t in self.outputs):
            return self.run_empty
        return None

    def _deps(self) -> tuple[dict, bool, int]:
        """Host values of the inputs shape inference reads (preprocessing.md's memory deps),
        whether any changed since the last inference, and how many needed a device read."""
        deps, changed, reads = {}, False, 0
        for i in self.opdef.shape_deps:
            t = self.inputs[i] if i < len(self.inputs) else None
            if t is None or t.layout is None:
                continue
            if t.host is None:
                self.rt.queue.read_to_host(t)
                reads += 1
            prev = self.dep_state.get(i)
            if prev is None or prev[0] != t.version:   # a new version may hold the same value
                changed |= prev is None or not np.array_equal(prev[1], t.host)
                self.dep_state[i] = (t.version, t.host)
            deps[i] = t.host
        return deps, changed, reads

    def update_shape(self, by_other: "PrimitiveInst | None" = None) -> None:
        """preprocessing.md's update_shape. `by_other`: an in-place concat infers this node's
        shape ahead of its execution; only a change is traced then, and the node's own
        update_shape is skipped (`done_by_other`)."""
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
        rewritten, self.outputs_rewritten = self.outputs_rewritten, False
        if rewritten and not self.shape_changed and not dynamic:
            # the skip stands where the fused node wrote what this node's own shapes give; else
            # the outputs' layouts move back to this node's, and its impl, buffers (the fused
            # runs may have reclaimed them) and arguments follow as on a shape change
            outs, _ = self._layouts_for(in_layouts, deps)
            rewritten = self.shape_changed = any(t.layout != l for t, l in zip(self.outputs, outs))
        if not self.shape_changed and not dynamic and not rewritten:
            if by_other is None:
                self._rec("update_shape", "skip",
                          "static_output" if self.node.static_output else "shape_unchanged")
            return
        reason = "first_run" if self.in_layouts is None else (
            "shape_changed" if in_layouts != self.in_layouts else
            "dynamic_output" if dynamic else "memory_deps_changed" if deps_changed else "output_rewritten")
        self.deps_key = values_key(deps) if deps else ()
        out_layouts, self.unfuse_reason = self._layouts_for(in_layouts, deps)
        self.in_layouts = in_layouts
        for t, l in zip(self.outputs, out_layouts):
            t.layout = l
        by = {"by": by_other.node.name} if by_other is not None else {}
        self._rec("update_shape", "infer", reason, device_reads=reads,
                  in_shapes=[l.shape if l else None for l in in_layouts],
                  out_shapes=[l.shape for l in out_layouts], **by)

    def update_impl(self, ins, outs, deps) -> bool:
        """Pick the impl for the new shapes (dynamic_impl.md, async_compilation.md). The node
        keeps its shape-agnostic impl (built once, shared through the impl cache) and runs it
        at once; for ops with a static variant, the static impl of these shapes is taken from
        the impl cache, or built (in the critical path with --no-async-compile / --impls
        static), or queued on the compile queue and switched to on a later execution
        (poll_static)."""
        calls, v, key = self._calls_for(ins, outs, deps)
        impls = [self._dynamic_impl(call) for call in calls]
        self.pending, self.want_weights = None, None
        if v is not None:
            name = f"{impls[0].name}/static[{v.tag}]"
            impl, how = self.rt.impls.find_static(key, name, self.node, v.weights)
            if impl is None:
                self.pending = (key, name, v) if how == "queued" else None
            else:
                if how == "hit":
                    self._rec("update_impl", "cache_hit", "static", impl=name, impl_kind="static")
                elif how == "ready":
                    self._rec_switch(impl, "static_ready")
                calls, impls, self.want_weights = [v.call], [impl], v.weights
        return self._bind(calls, impls)

    def _dynamic_impl(self, call):
        """This node's shape-agnostic impl of `call`: kept from an earlier shape, else from the
        impl cache (or built)."""
        key = (call.source, call.jit, len(call.args))   # the build bakes in NUM_TENSORS
        impl = self.dynamic_impls.get(key)
        if impl is None:
            impl = self.dynamic_impls[key] = self.rt.impls.dynamic(call, self.node)
        else:
            self._rec("update_impl", "keep", "dynamic", impl=impl.name, impl_kind="dynamic")
        return impl

    def _rec_switch(self, impl, reason) -> None:
        old = self.bound[0].impl.name if self.bound else ""
        self.rt.decisions.counters["switches"] += 1
        self._rec("update_impl", "switch", reason, old_impl=old, new_impl=impl.name,
                  impl_kind=impl.kind, compile_ms=round(impl.compile_ms, 3), critical=False)

    def poll_static(self) -> bool:
        """Same shapes as last time, a static build pending: take it if it is ready."""
        key, name, v = self.pending
        impl, still = self.rt.impls.poll_static(key, name, self.node)
        if impl is None:
            if not still:
                self.pending = None
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
                old.retarget(call)
                new.append(old)
            else:
                # a kernel object per (impl, kernel) is kept: creating one costs ~150 us in
                # pyopencl, and shapes that come back take their static impl back
                key = (id(impl), call.kernel, k)
                b = self._bound_cache.pop(key, None)
                if b is None or b.impl is not impl:
                    b = BoundKernel(call, impl, self.rt.impls.device_type == "cpu")
                else:
                    b.retarget(call)
                self._bound_cache[key] = b
                while len(self._bound_cache) > self.BOUND_KEPT:
                    del self._bound_cache[next(iter(self._bound_cache))]
                new.append(b)
                changed = True
        changed |= len(new) != len(self.bound)
        self.bound = new
        if changed:
            # a static impl the impl cache evicted is never taken again: a spare kernel of it
            # would keep its program (megabytes on a CPU runtime) past the cache's byte bound
            for key in [k for k, b in self._bound_cache.items()
                        if b.impl.evicted and b.impl.kind == "static" and b not in new]:
                del self._bound_cache[key]
        self.internal_layouts = next((c.internal for c in calls if c.internal), ())
        return changed

    def _with_fused_ops(self, calls: list) -> list:
        return with_fused_ops(calls, self.fusion, self.n_own)

    def _fused_static(self, v, extra_layouts):
        """The static variant with the fused ops. Static GEMM tables may fold batch dims into
        rows and round rows up (fake alignment), so there the fused inputs must vary along the
        last dim only (a bias), or have the output's own shape (a residual: the table gives it
        the output's baked dims, so it is read at the output's offsets, rows past the real ones
        never read); otherwise these shapes keep the dynamic impl."""
        first = len(v.call.args)
        if self.node.op in ("MatMul", "Gemm"):
            y_pos = first - 1
            y_count = math.prod(v.call.dims[y_pos])
            for j, l in enumerate(extra_layouts):
                if l.count == y_count and l.count > 1 and l.shape[-1] == v.call.dims[y_pos][-1]:
                    v.table_dims[first + j] = v.table_dims[y_pos]
                elif l.count != (l.shape[-1] if l.rank else 1):
                    return None
        v.call = self._with_fused_ops([v.call])[0]
        return v

    def update_weights(self) -> None:
        """After an impl change (preprocessing.md): give the impl its weights in the layout it
        wants. skip (no constant weights, or the original layout wanted and in use) | reset
        (back to the original) | cache_hit (a reordered copy kept in this node's LRU) |
        reinterpret (the original buffer already is that layout) | reorder (a reorder kernel
        into a reused or new buffer)."""
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
        buffers = self.rt.buffers
        if self.weights_cache is None:
            self.weights_cache = WeightsCache(weights_cache_capacity(
                w.layout.nbytes, self.rt.device.global_mem_size, buffers.used_bytes))
        t = self.weights_cache.get(wl)
        if t is not None:
            self.rt.queue.observer.touched(self.weights_cache, wl)   # its LRU order moved
            self._rec("update_weights", "cache_hit", layout=wl.name)
        elif wl.compatible:
            t = Tensor(f"{w.name}:{wl.name}", Layout(tuple(wl.shape), "f32"),
                       buf=buffers.device_buffer(w), offset=w.offset, constant=True)
            old = self.weights_cache.make_room(buffers.release)
            if old is not None:
                buffers.release(old)
            self.weights_cache.put(wl, t)
            self._rec("update_weights", "reinterpret", layout=wl.name)
        else:
            reuse = self.weights_cache.make_room(buffers.release)
            t = self.rt.impls.reorder_weights(self.node, w, wl, reuse)
            self.weights_cache.put(wl, t)
            self.rt.decisions.counters["weights_reordered_bytes"] += t.layout.nbytes
            self._rec("update_weights", "reorder", "reused_buffer" if t is reuse else "",
                      layout=wl.name, bytes=t.layout.nbytes, capacity=self.weights_cache.capacity)
        self.weights_override = t

    def _buffers_kept(self, impl_changed: bool) -> bool:
        """realloc_if_needed runs only for new shapes or a new impl, as the plugin's
        prepare_primitive ("only try update weight and realloc when impl is updated"): a
        repeated shape keeps its buffers without a decision (and without feeding the
        ShapePredictor's history); they are still live in this inference."""
        if self.shape_changed or impl_changed:
            return False
        owned = self._owned()
        if any(t.buf is None for t in owned) or len(self.internals) < len(self.internal_layouts):
            return False
        memory = self.rt.buffers.memory
        for t in owned:
            memory.note_live(t.name, t.layout.nbytes)
        return True

    def realloc_if_needed(self, reused=None) -> bool:
        """Output memory (preprocessing.md): reuse the buffer when the new size fits, else a
        buffer of the size the ShapePredictor asks for (memory_preallocation.md: its
        preallocation when it predicts and 90% of memory allows): a dead tensor's from the
        memory pool, or a new one. The impl's internal buffers (scratch) follow the same rules.
        `reused()`, when given, stands for each `realloc reuse` decision (a steady step counts
        them in bulk where no trace reads them)."""
        changed = False
        for k, t in enumerate(self.outputs):
            # an output other than the first says which (predictor-sim --from-trace replays
            # each buffer's requirements)
            changed |= self._realloc(t, reused) if k == 0 else self._realloc(t, reused, output=k)
        for k, l in enumerate(self.internal_layouts):
            t = self._internal(k)
            t.layout = l
            changed |= self._realloc(t, reused, buffer=f"internal{k}")
        return changed

    def _owned(self):
        """The buffers realloc_if_needed manages for this node: outputs, then internal buffers."""
        return [t for t in self.outputs if t.layout.count and not t.by_other] + \
            self.internals[:len(self.internal_layouts)]

    def _internal(self, k: int) -> Tensor:
        while len(self.internals) <= k:
            t = Tensor(f"{self.node.name}:internal{len(self.internals)}")
            self.rt.buffers.memory.add_scratch(t.name, self.step)
            self.internals.append(t)
        return self.internals[k]

    def _realloc(self, t: Tensor, reused=None, **label) -> bool:
        buffers, l = self.rt.buffers, t.layout
        if l.count == 0:
            return False
        if t.by_other:   # a slice of an in-place concat's buffer (set by the concat)
            self._rec("realloc", "by_other", bytes=l.nbytes, shape=l.shape, dtype=l.dtype)
            return False
        d = buffers.realloc_decision(t, l.shape, l.itemsize * 8)
        buffers.memory.note_live(t.name, l.nbytes)
        return self.carry_out(t, d, reused, label)

    def carry_out(self, t: Tensor, d, reused, label: dict) -> bool:
        """The policy's decision `d` for `t` (its layout set) carried out and recorded:
        a reuse, or a buffer of the size it asks for (realloc_if_needed)."""
        buffers, l = self.rt.buffers, t.layout
        if d.action == "reuse" and t.capacity:   # an owned buffer (not a view's alias)
            if reused is not None:
                reused()
            else:
                self._rec("realloc", "reuse", bytes=l.nbytes, capacity=t.capacity, shape=l.shape,
                          dtype=l.dtype, **label)
            return False
        nbytes, how, predicted = buffers.take_for(t, d, l.count, l.itemsize)
        decisions = self.rt.decisions
        if decisions.itemized:
            self._rec("realloc", how, "reclaim" if d.reclaimed else "", bytes=nbytes,
                      capacity=t.capacity, predicted=predicted, mode=d.mode, shape=l.shape,
                      dtype=l.dtype, **label)
        else:           # counted only (nothing reads them one by one)
            decisions.count_many(1, "realloc", how, "reclaim" if d.reclaimed else "", bytes=nbytes)
        return True

    def _arg_tensor(self, kind: str, i: int) -> Tensor:
        if kind == "internal":
            return self.internals[i]
        if kind == "flag":   # a subgraph's index nodes have no slot: theirs is never read
            return self.index_flag or self.rt.buffers.unread_flag()
        if kind == "in":
            if self.weights_override is not None and i == self.opdef.weights:
                return self.weights_override
            return self.inputs[i]
        return self.outputs[i]

    def set_arguments(self, force: bool) -> None:
        """Bind kernel arguments only when the impl or a buffer changed (overall_flow.md);
        rewrite the shape_info block (dynamic_impl.md) only when dims or offsets changed."""
        self._rec("set_args", "set" if self.bind_arguments(force) else "skip")

    def bind_arguments(self, force: bool, kept: list | None = None, image: bool = False) -> bool:
        """set_arguments' work, undecided: whether any kernel's arguments were set. `kept[k]`:
        kernel k's argument tensors are the ones bound (a steady step that kept the impl and the
        call's arguments: engine/fast_path/steady.py), so a shape change does not remake them.
        `image`: the shape_info blocks are written already for these dims (a compiled
        inference's image: engine/fast_path/growth.py), rewritten only where an offset moved.
        `force` with `kept`: every argument set again, the tensors kept (a growth moved buffers,
        not tensors)."""
        did_set = False
        for k, b in enumerate(self.bound):
            # the argument tensors change only with the impl, the weights or the internal
            # buffers (force) or with the call (a shape change)
            if b.tensors is None or (not (kept and kept[k]) and (force or self.shape_changed)):
                b.tensors = [self._arg_tensor(kind, i) for kind, i in b.call.args]
            offsets = tuple(map(offset_of, b.tensors))
            # shape_info depends on the call (replaced on a shape change) and the offsets only:
            # on a repeated shape nothing is recomposed or rewritten.
            if offsets != b.offsets or (not image and (b.info is None or self.shape_changed)):
                self._write_shape_info(b, self._shape_info_for(b.call, b.tensors, offsets), offsets)
            bufs = [b.slot.buf]
            bufs += map(self.rt.buffers.device_buffer, b.tensors)
            if force or b.arg_ids is None or any(map(is_not, bufs, b.arg_ids)):
                b.kernel.set_args(*bufs)
                b.arg_ids = bufs  # holding them keeps identities meaningful
                self.rt.queue.args_version += 1
                did_set = True
        return did_set

    def _write_shape_info(self, b: BoundKernel, info: np.ndarray, offsets: tuple) -> None:
        b.offsets = offsets
        # new dims come as a new array (the memo keeps one per call and offsets); an equal
        # array written again costs less than comparing them (np.array_equal: ~5 us a kernel)
        if info is not b.info:
            if b.slot is None or b.slot.nbytes < info.nbytes:
                b.slot = self.rt.queue.arena.slot(len(info))
                b.arg_ids = None
            b.slot.write(info)      # reaches the device at the queue's next flush
            b.info = info

    def enqueue(self) -> None:
        self.launch()
        self._rec("execute", "enqueue", kernels=len(self.bound))

    def launch(self) -> None:
        """The node's bound kernels go to the queue; its outputs hold new device values."""
        queue = self.rt.queue
        for b in self.bound:
            queue.launch(b.kernel, b.gws, b.lws, b)
        self._written()

    def _written(self) -> None:
        for t in self.outputs:
            t.version += 1
            t.dev_version = t.version
            t.host = None

    # ---- the other ways a node runs -----------------------------------------------------
    def run_host(self) -> None:
        """A shape-subgraph node: numpy (or onnx.reference) on host values, re-run only when
        its Shape sources saw a new shape."""
        node, rt = self.node, self.rt
        in_layouts = [t.layout if t is not None else None for t in self.inputs]
        if node.op == "Shape":
            if in_layouts == self.in_layouts:
                self._rec("update_shape", "skip", "shape_of_unchanged")
                return
            vals = host_outputs(node, in_layouts, [])
            prev = self.outputs[0].host
            self.in_layouts = in_layouts
            if prev is not None and same_value(prev, vals[0]):
                # e.g. Shape(start=1) when only the batch changed: its users see the same dims
                self._rec("update_shape", "infer", "shape_changed", value_unchanged=True,
                          out_shapes=[self.outputs[0].layout.shape])
                self._rec("execute", "host")
                return
            rt.shape_of_changed.add(node.name)
        else:
            if self.in_layouts is not None and in_layouts == self.in_layouts and \
                    not (node.shape_sources & rt.shape_of_changed):
                self._rec("update_shape", "skip", "static_output" if node.static_output
                          else "shape_of_subgraph_unchanged")
                return
            vals = self._host_values(in_layouts)
        self._host_outputs(in_layouts, vals)
        self.host_computed(self.rt.decisions.record)

    def host_computed(self, decide) -> None:
        """run_host's two decisions for a node that computed its values: `decide` is
        Decisions.record, or Decisions.write where a caller counted them at once."""
        decide("update_shape", "infer", "shape_changed", self.node,
               out_shapes=[t.layout.shape for t in self.outputs])
        decide("execute", "host", "", self.node)

    def host_step(self) -> bool:
        """run_host's work, undecided, for a node (not a Shape) whose Shape sources saw a new
        shape: False, nothing done, when they did not (a compiled step counts the decisions)."""
        if self.node.op == "Shape" or not (self.node.shape_sources & self.rt.shape_of_changed) or \
                self.rt.decisions.itemized:     # (its decisions are read one by one: the flow)
            return False
        in_layouts = [t.layout if t is not None else None for t in self.inputs]
        self._host_outputs(in_layouts, self._host_values(in_layouts))
        return True

    def _host_outputs(self, in_layouts, vals) -> None:
        self.in_layouts = in_layouts
        for t, v in zip(self.outputs, vals):
            if t.host is not None and (t.host is v or same_value(t.host, v)):
                continue     # same value: its device copy and its readers' deps stay valid
            t.host = v
            l, dtype = t.layout, dtype_from_numpy(v.dtype)
            if l is None or l.shape != v.shape or l.dtype != dtype or l.pad is not None:
                t.layout = Layout(tuple(int(d) for d in v.shape), dtype)   # else kept (a new value)
            t.version += 1

    def _host_values(self, in_layouts) -> list:
        args = []
        for t in self.inputs:
            if t is not None and t.host is None:
                self.rt.queue.read_to_host(t)
            args.append(None if t is None else t.host)
        try:
            return host_outputs(self.node, in_layouts, args)
        except Exception as e:  # numpy's words name no node: say which, and what limits it
            from engine.diagnose import node_failure
            raise node_failure(self, self.rt.buffers, args, e) from e

    def run_unfused(self) -> None:
        """overall_flow.md's "Valid fusion?" no: the unfused subgraph runs for these shapes.
        Its nodes that write the fused node's outputs check those outputs' layouts first: the
        fused node's update_shape may have set them since (for the fused op, which these shapes
        do not fit), and a skip would keep them (`output_rewritten`)."""
        for inst in self.unfused:
            if any(t is o for t in inst.outputs for o in self.outputs):
                inst.outputs_rewritten = True
        self._rec("fusion", "unfuse", self.unfuse_reason, ops=self.fusion.names(),
                  position=self.fusion.position)
        if self.kv_from:
            self._append_kv()
        for inst in self.unfused:
            inst.execute()

    def _append_kv(self) -> None:
        """An attention whose kernel appends the KV caches' new entries, running unfused: its
        subgraph reads the caches whole, so the copies the concats left to it come first."""
        n = len(self.inputs)
        calls = [c.append_call(src=("in", n - 2 + k), dst=("in", 1 + k))
                 for k, c in enumerate(self.kv_from) if c.inputs[1].layout.count]
        self._bind(calls, [self._dynamic_impl(c) for c in calls])
        self.set_arguments(False)
        self.enqueue()

    def run_view(self, reason: str = "view") -> None:
        """The output is the input's buffer under the output's layout: nothing to enqueue."""
        self.view_input()
        self._rec("realloc", "view")
        self._rec("execute", "skip", reason)

    def view_input(self) -> None:
        """run_view's work without its decisions (a steady step counts them in bulk)."""
        src, dst = self.inputs[0], self.outputs[0]
        self._as_slice(dst, src)
        # a host copy the input had is this output's value under the output's shape
        dst.host = None if src.host is None else src.host.reshape(dst.layout.shape)
        dst.version = src.version
        dst.dev_version = src.dev_version

    def _as_slice(self, t: Tensor, src: Tensor, at: int = 0) -> None:
        """`t` is the run of `src`'s buffer from element `at` (a view, a runtime skip, an
        in-place crop): a buffer of its own is not needed while it is."""
        buffers = self.rt.buffers
        if src.buf is None and src.layout.count:
            buffers.upload(src)
        if t.capacity:
            buffers.release(t)
            t.state = BufferState()
        t.buf, t.offset = src.buf, src.offset + at

    def run_runtime_skip(self) -> None:
        """runtime_skip.md: for these shapes the output is the input unchanged (a Transpose of
        unit dims, a no-op Slice or Expand): a view at run time."""
        self.run_view("runtime_skip")

    def _update_crop(self) -> None:
        """Whether the outputs can be slices of the input for these shapes; leaving that, they
        get buffers of their own again (realloc_if_needed)."""
        x = self.in_layouts[0]
        at = None if x.pad is not None or x.count == 0 else self.opdef.in_place_crop(
            self.node, self.in_layouts, [t.layout for t in self.outputs], self.deps)
        if at is None and self.crop_at is not None:
            for t in self.outputs:
                t.buf, t.offset = None, 0
        self.crop_at = at

    def run_in_place_crop(self) -> None:
        """The plugin's runtime in-place crop: each output is its run of the input's buffer
        (a Split of a decode step's fused QKV projection): nothing to enqueue."""
        for t, at in zip(self.outputs, self.crop_at):
            self._as_slice(t, self.inputs[0], at)
        self._written()
        self._rec("realloc", "view")
        self._rec("execute", "skip", "in_place_crop")

    def run_empty(self) -> None:
        """Every output is empty: nothing to run; buffers are kept for the next non-empty shape."""
        for t in self.outputs:
            t.host = None
            t.version += 1
        self._rec("realloc", "empty")
        self._rec("execute", "skip", "empty_output")

    def run_in_place(self) -> None:
        """The producers wrote the concat's output: nothing to enqueue."""
        self._written()
        self._rec("execute", "skip", "in_place")

    def run_kv_append(self) -> None:
        """KV-cache concat (past, new) -> present, with present fed back as the next past
        (kv_cache.md). The buffer keeps room along the sequence axis (a padded layout, sized by
        the ShapePredictor): while the room lasts and past is the previous present, only the
        new entries are written; otherwise the buffer is reallocated and both parts copied."""
        past, new = self.inputs
        out = self.outputs[0]
        l = Layout(out.layout.shape, out.layout.dtype)
        axis = norm_axis(self.node.attrs["axis"], l.rank)
        held = self.kv_pad if out.buf is not None else None
        # the predictor sees every step (its history must follow the growth), as in the plugin
        d = self.rt.buffers.realloc_decision(out, l.shape, l.itemsize * 8)
        fed = past.buf is not None and past.buf is out.buf and past.offset == out.offset and \
            past.layout.phys == held
        fits = held is not None and all(h == n for i, (h, n) in enumerate(zip(held, l.shape))
                                        if i != axis) and l.shape[axis] <= held[axis]
        if fed and fits:
            pad, reason, calls, copied = held, "", [], new.layout.nbytes
            self._rec("realloc", "reuse", bytes=l.nbytes, capacity=out.capacity, shape=l.shape,
                      dtype=l.dtype)
        else:
            reason = "first_run" if held is None else ("capacity" if fed else "not_fed_back")
            pad, calls = self._kv_realloc(l, axis, d)
            copied = past.layout.nbytes + new.layout.nbytes
        self.kv_pad = pad
        if new.layout.count and self.append_by is None:
            calls.append(self.append_call())
        out.layout = Layout(l.shape, l.dtype, pad=pad if pad != l.shape else None)
        self.rt.buffers.memory.note_live(out.name, l.nbytes)
        by = {"by": self.append_by.node.name} if self.append_by is not None else {}
        self._rec("kv_cache", "append" if not reason else "copy", reason, bytes_copied=copied,
                  capacity=pad[axis], length=l.shape[axis], **by)
        self.shape_changed = True          # the copies' offsets move every step
        # a new BoundKernel binds its arguments; a kept one re-binds only when a buffer changed
        self._bind(calls, [self._dynamic_impl(c) for c in calls])
        if not calls:                      # the attention appends (or nothing is new)
            self._written()
            self._rec("execute", "skip", "in_place")
            return
        self.set_arguments(False)
        self.enqueue()

    def append_call(self, src=("in", 1), dst=("out", 0)):
        """The copy of a KV-cache concat's new entries into its buffer's room (kv_pad)."""
        past, new = self.inputs
        l = self.outputs[0].layout
        axis = norm_axis(self.node.attrs["axis"], l.rank)
        ost = contiguous_strides(self.kv_pad)
        return copy_call(self.node, l.dtype, new.layout.shape, contiguous_strides(new.layout.phys),
                         0, ost, past.layout.shape[axis] * ost[axis], src=src, dst=dst)

    def _kv_realloc(self, l: Layout, axis: int, d) -> tuple[tuple, list]:
        """A new KV buffer with room along `axis` as the predictor asks (when it would keep the
        buffer, as after a new sequence's first step, the same room again); the past's copy
        into it. The buffer's state follows, so the predictor sees the room it really has."""
        past = self.inputs[0]
        out = self.outputs[0]
        per = l.count // l.shape[axis] if l.shape[axis] else 0
        want = d.alloc_elems if d.action != "reuse" else out.state.cap_elems
        cap = max(l.shape[axis], want // per if per else 0)
        pad = tuple(cap if i == axis else x for i, x in enumerate(l.shape))
        nbytes = max(1, int(np.prod(pad))) * l.itemsize
        self.rt.buffers.give(out, nbytes)    # never pooled: the buffer outlives the inference
        out.state.take(int(np.prod(pad)))
        self._rec("realloc", "alloc", bytes=nbytes, capacity=nbytes, predicted=d.predicted,
                  mode=d.mode, shape=l.shape, dtype=l.dtype)
        calls = [copy_call(self.node, l.dtype, past.layout.shape, contiguous_strides(past.layout.phys),
                           0, contiguous_strides(pad), 0)] if past.layout.count else []
        return pad, calls

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
                self.rt.buffers.release(t)
                t.state = BufferState()
            t.buf, t.offset, t.by_other = out.buf, off, True
            offsets.append(off - out.offset)
            off += t.layout.count
        self.in_place_now = True
        self._rec("in_place_concat", "apply", inputs=[t.name for t in self.inputs], offsets=offsets)


def _in_place_fallback(node, out: Layout) -> str:
    """Why the concat's inputs cannot write into its buffer for these shapes ("" when they
    can): each input's region must be one contiguous run of the output."""
    axis = norm_axis(node.attrs["axis"], out.rank)
    if out.count == 0:
        return "empty_output"
    if any(d != 1 for d in out.shape[:axis]):
        return "not_contiguous"
    return ""
