"""Network: one executable instance of a Program on an OpenCL device (seed: cldnn::network).
It owns the context and queue, every tensor's memory, the impl cache, the ShapePredictor and
the trace sink, and runs inferences node by node."""
from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pyopencl as cl

from engine.device import describe, select_device
from engine.diagnose import DeviceMemoryError, nbytes_text
from engine.compile_queue import CompileQueue
from engine.impl_cache import IMPL_MODES, ImplCache, static_worth
from engine.kernels import Impl, ImplParams, StaticVariant, compile_program, dynamic_key, impl_name
from engine.layout import Layout, dtype_from_numpy, np_dtype
from engine.memory import Tensor
from engine.memory_pool import MemoryPool, tensor_lifetimes
from engine.plan import FastPath, signature
from engine.prebuild import start_builds
from engine.primitive_inst import PrimitiveInst
from engine.shape_info_arena import ShapeInfoArena
from engine.program import ModelError, Program
from engine.predictors import make_predictor
from engine.shape_predictor import PreallocSettings


_COUNTER_KEYS: dict = {}   # (kind, action, reason) -> the counter names it increments


class NullTrace:
    iter = -1

    def event(self, *a, **k):
        pass

    def flush(self):
        pass


class Network:
    def __init__(self, program: Program, device: cl.Device | None = None, trace=None,
                 prealloc: PreallocSettings = PreallocSettings(), impl_cache_capacity: int = 300,
                 predictor: str = "openvino", feedback: dict | None = None,
                 impls: str = "auto", async_compile: bool = True, compile_workers: int = 1,
                 profile: bool = False, memory_pool: bool = True, fast_path: bool = True,
                 prebuild_workers: int = 8, context: cl.Context | None = None,
                 impl_cache: ImplCache | None = None):
        if impls not in IMPL_MODES:
            raise ValueError(f"impls must be one of {', '.join(IMPL_MODES)}, not {impls!r}")
        self.program = program
        self.device = device or select_device()
        # many small networks (the ONNX backend's node tests) may share one context and one
        # impl cache: a kernel built for one serves them all
        self.ctx = context or cl.Context([self.device])
        self.device_type = "cpu" if self.device.type & cl.device_type.CPU else "gpu"
        self.queue = cl.CommandQueue(
            self.ctx, properties=cl.command_queue_properties.PROFILING_ENABLE if profile else 0)
        self.impl_mode = impls
        # --impls static builds every static impl in the critical path, as --no-async-compile does
        self.async_compile = async_compile and impls == "auto"
        self.compile_workers = compile_workers
        self._compile_queue: CompileQueue | None = None
        self._failed_static: set = set()      # keys whose static build failed: dynamic stays
        self.trace = trace or NullTrace()
        # output preallocation policy (engine/predictors.py); --prealloc tunes "openvino"
        self.predictor = make_predictor(predictor, prealloc, self.device.global_mem_size)
        self.impls = impl_cache if impl_cache is not None else ImplCache(impl_cache_capacity)
        self.iter = -1
        self.counters: Counter = Counter()
        self.shape_of_changed: set = set()
        self._keep: list = []
        self._dummy = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, 64)
        # kernels are not enqueued as the flow decides them: they wait in `launches` behind
        # one write of the shape_info arena (flush), done before anything else touches the queue
        self.arena = ShapeInfoArena(self.ctx, self.device)
        self.launches: list = []
        self.flush_every = self.FLUSH_EVERY[self.device_type]
        self.profile = profile
        self.events: list = []         # with profile=True: this inference's kernel events
        self.blocked_s = 0.0           # this inference's time blocked on the device (reads, finish)
        # lists while engine/plan.py records an inference: launches, predictor calls
        self.log_launches: list | None = None
        self.log_reallocs: list | None = None

        self.tensors: dict[str, Tensor] = {}
        for name, v in program.constants.items():  # includes constants made by fusion
            v = np.require(v, requirements="C")
            self.tensors[name] = Tensor(name, Layout(v.shape, dtype_from_numpy(v.dtype)),
                                        host=v, constant=True)
        for name in program.inputs:
            self.tensors[name] = Tensor(name)
        for node in program.nodes:
            for o in node.outputs:
                self.tensors.setdefault(o, Tensor(o))
        self.insts = [self._inst(n) for n in program.nodes if n.fused_into is None]
        for step, inst in enumerate(self.insts):
            for i in inst.family():
                i.step = step
        # --feedback OUT:IN: output OUT of inference i is input IN of inference i + 1, on device
        self.feedback = dict(feedback or {})
        for out, inp in self.feedback.items():
            if out not in program.outputs or inp not in program.inputs:
                raise ModelError(f"feedback {out}:{inp}: {out!r} must be a graph output and "
                                 f"{inp!r} a graph input")
            inst = next((i for i in self.insts if out in i.node.outputs), None)
            if inst is not None and _kv_append_ok(program, inst.node, inp):
                inst.kv_past = inp
        # inputs that alias their KV-cache concat's buffer instead of taking a copy
        self.kv_pasts = {i.kv_past for i in self.insts if i.kv_past is not None}
        # device memory: lifetimes over the execution order; graph inputs (external memory) and
        # KV-cache buffers (kept across inferences) never enter the pool
        life = tensor_lifetimes(self.insts, program.inputs, program.outputs)
        for concat, producers, first in _in_place_concats(program, self.insts):
            concat.in_place_producers = producers
            self.insts[first].concat_user = concat
            life[concat.outputs[0].name][0] = first   # its buffer is written from there on
        pinned = set(program.inputs) | {i.outputs[0].name for i in self.insts if i.kv_past is not None}
        self.memory = MemoryPool(life, set(life) - pinned, enabled=memory_pool)
        # plan replay of repeated input signatures (engine/plan.py); None: the flow runs always
        self.fast = FastPath(self) if fast_path else None
        # (source, jit) -> future of a build started ahead of the node that needs it
        # (engine/prebuild.py, before the first inference's flow)
        self.prebuilt: dict = {}
        self.prebuild_workers = prebuild_workers
        self._prebuilt_for: set = set()     # input shapes prebuild walked already
        self.memory.limits = (self.device.global_mem_size, self.device.max_mem_alloc_size)

    def _inst(self, node, unfused: bool = False) -> PrimitiveInst:
        inst = PrimitiveInst(node, self)
        inputs = list(node.inputs)
        while inputs and not inputs[-1]:
            inputs.pop()
        inst.inputs = [self.tensors[i] if i else None for i in inputs]
        inst.outputs = [self.tensors[o] for o in node.outputs]
        f = node.fusion
        if f is not None and not unfused:
            # the fused node reads the fused ops' extra inputs and writes the chain's output;
            # its unfused subgraph is kept ready for shapes that make the fusion invalid
            inst.fusion = f
            inst.n_own = len(inputs)
            if f.subgraph:   # an internal op standing for the nodes it replaced (engine/attention_fusion.py)
                inst.unfused = [self._inst(op.node) for op in f.ops]
                return inst
            if f.prologue:   # the fused ops run on the chain's base, the node's new input 0
                inst.inputs[0] = self.tensors[f.base]
            inst.inputs += [self.tensors[i] for i in f.extra]
            inst.outputs = [self.tensors[f.out]]
            own, ops = [self._inst(node, unfused=True)], [self._inst(op.node) for op in f.ops]
            inst.unfused = ops + own if f.prologue else own + ops
        return inst

    @property
    def device_name(self) -> str:
        return describe(self.device)

    # ---- decisions ----------------------------------------------------------------------
    def record(self, kind: str, action: str, reason: str = "", node=None, **fields) -> None:
        c = self.counters
        keys = _COUNTER_KEYS.get((kind, action, reason))
        if keys is None:
            keys = _COUNTER_KEYS[(kind, action, reason)] = \
                (f"{kind}.{action}",) + ((f"{kind}.{action}.{reason}",) if reason else ())
        for k in keys:
            c[k] += 1
        if kind == "realloc" and action == "alloc":
            c["bytes_allocated"] += fields.get("bytes", 0)
        elif kind == "execute" and action == "enqueue":
            c["kernels"] += fields.get("kernels", 0)
        elif kind == "update_shape":
            c["device_reads"] += fields.get("device_reads", 0)
        elif kind == "kv_cache":
            c["kv_bytes_copied"] += fields.get("bytes_copied", 0)
        self.trace.event(kind, node.name if node else "", node.op if node else "", action, reason,
                         **fields)

    # ---- memory -------------------------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        return self.memory.used_bytes

    def release(self, t: Tensor) -> None:
        if t.capacity:
            self.memory.release(t.buf, t.name)
        t.buf, t.capacity = None, 0

    def give_buffer(self, t: Tensor, nbytes: int, exact: int | None = None) -> str:
        """Point `t` at a buffer of at least `nbytes` (its old one released): a dead tensor's
        from the memory pool (`from_pool`; only for tensors the pool serves) or a new one
        (`alloc`). A new buffer the device cannot give is tried again at `exact` bytes (the
        need without the predictor's extra) before failing with a DeviceMemoryError that names
        the tensor and its node."""
        self.release(t)
        taken = self.memory.take(t.name, nbytes)
        if taken is not None:
            t.buf, t.capacity = taken
        else:
            try:
                t.buf = self.memory.alloc(self.ctx, nbytes, t.name, constant=t.constant)
            except DeviceMemoryError as e:
                if exact is None or exact >= nbytes:
                    raise self._memory_error(t, nbytes, e) from None
                try:
                    t.buf = self.memory.alloc(self.ctx, exact, t.name, constant=t.constant)
                except DeviceMemoryError as e2:
                    raise self._memory_error(t, exact, e2) from None
                nbytes = exact
            t.capacity = nbytes
        t.offset = 0
        return "alloc" if taken is None else "from_pool"

    def _memory_error(self, t: Tensor, nbytes: int, why: Exception) -> DeviceMemoryError:
        prod = self.program.producers.get(t.name)
        by = f"output of node {prod[0].name} ({prod[0].op})" if prod else (
            "graph input" if t.name in self.program.inputs else "constant" if t.constant else "buffer")
        shape = f" ({'x'.join(map(str, t.layout.shape))} {t.layout.dtype})" if t.layout is not None else ""
        return DeviceMemoryError(f"tensor {t.name} ({by}) needs {nbytes_text(nbytes)}{shape}: {why}")

    def keep(self, obj) -> None:
        """Host arrays of non-blocking copies must outlive the copy: kept until the inference ends."""
        self._keep.append(obj)

    # ---- the queue ----------------------------------------------------------------------
    # On a GPU, kernels wait for at most this many others before a flush sends them (with one
    # arena write): the device starts on the first ones while the flow decides the rest (one
    # flush per inference left an H100 idle through the whole flow of a decode step). A CPU
    # device runs them on the cores the flow needs: one flush at the end there.
    FLUSH_EVERY = {"gpu": 32, "cpu": 1 << 30}

    def launch(self, kernel: cl.Kernel, gws: tuple, lws: tuple | None, bound=None) -> None:
        """A kernel the flow decided to run: enqueued at the next flush. `bound`: the node's
        _Bound it belongs to (its arguments and shape_info, for a plan to record)."""
        self.launches.append((kernel, gws, lws))
        if self.log_launches is not None:
            self.log_launches.append((bound, kernel, gws, lws, bound and bound.arg_ids,
                                      bound and bound.info))
        if len(self.launches) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Write the shape_info arena's dirty spans, then enqueue the waiting kernels. Called
        before any other command goes on the queue (copies, reads), so the order on the
        in-order queue is the order the flow decided."""
        self.arena.flush(self.queue, self.keep)
        if self.launches:
            enqueue = cl.enqueue_nd_range_kernel
            q = self.queue
            if self.profile:
                self.events += [enqueue(q, k, g, l) for k, g, l in self.launches]
            else:
                for k, g, l in self.launches:
                    enqueue(q, k, g, l)
            self.launches = []

    def upload(self, t: Tensor) -> None:
        """Put a host value on the device (constants once, shape-subgraph values when changed)."""
        nbytes = t.host.nbytes
        if t.buf is None or t.capacity < nbytes:
            self.give_buffer(t, nbytes)
        if nbytes:
            # no flush first: the kernels still waiting do not read this buffer (host values
            # and inputs never come from the memory pool; their readers come later)
            arr = np.require(t.host, requirements="C")
            cl.enqueue_copy(self.queue, t.buf, arr, is_blocking=False)
            self.keep(arr)
        t.dev_src = t.host
        t.offset = 0
        t.dev_version = t.version

    def device_buffer(self, t: Tensor) -> cl.Buffer:
        if t.layout is None or t.layout.count == 0:
            return self._dummy
        if t.host is not None and t.dev_version != t.version:
            self.upload(t)
        return t.buf

    def read_to_host(self, t: Tensor) -> np.ndarray:
        l = t.layout
        arr = np.empty(l.phys, dtype=np_dtype(l.dtype))
        if l.count:
            self.flush()
            t0 = time.perf_counter()
            cl.enqueue_copy(self.queue, arr, t.buf, src_offset=t.offset * l.itemsize, is_blocking=True)
            self.blocked_s += time.perf_counter() - t0
        if l.pad:
            arr = np.ascontiguousarray(arr[tuple(slice(0, d) for d in l.shape)])
        t.host = arr
        return arr

    # ---- impls --------------------------------------------------------------------------
    @property
    def compile_queue(self) -> CompileQueue:
        """The background compile queue, started on first use (`wait_idle()` for tests)."""
        if self._compile_queue is None:
            self._compile_queue = CompileQueue(self.compile_workers)
        return self._compile_queue

    def _count_compile(self, ms: float, static: bool, critical: bool) -> None:
        c = self.counters
        c["compiles"] += 1
        c["static_compiles"] += int(static)
        c["compile_ms"] += ms
        if critical:
            c["compile_ms_critical"] += ms

    def _put_impl(self, key, impl, node) -> None:
        for _, old in self.impls.put(key, impl):
            self.record("update_impl", "evict", node=node, impl=old.name, impl_kind=old.kind)

    def get_impl(self, call, node) -> Impl:
        """The dynamic (shape-agnostic) impl of `call`: impl cache, else built now."""
        jit = call.jit + (("NUM_TENSORS", len(call.args)),)
        key = dynamic_key(call.source, jit)
        impl = self.impls.get(key)
        if impl is not None:
            self.record("update_impl", "cache_hit", "dynamic", node, impl=impl.name, impl_kind="dynamic")
            return impl
        built = self.prebuilt.pop((call.source, jit), None)
        try:
            prg, ms = built.result() if built is not None else compile_program(self.ctx, call.source, jit)
        except cl.RuntimeError as e:
            raise ModelError(f"kernel build failed for node {node.name} ({call.source}): {e}") from None
        impl = Impl(impl_name(call.source, jit), "dynamic", prg, ms)
        self._put_impl(key, impl, node)
        self._count_compile(ms, False, built is None)
        extra = {"prebuilt": True} if built is not None else {}
        self.record("update_impl", "build", "dynamic", node, impl=impl.name, impl_kind="dynamic",
                    compile_ms=round(ms, 3), critical=built is None, **extra)
        return impl

    def static_variant(self, inst, ins, outs, deps) -> StaticVariant | None:
        """The op's static variant for these shapes, if this run builds static impls for it."""
        fn = inst.opdef.static
        if fn is None or self.impl_mode == "dynamic" or \
                (self.impl_mode == "auto" and not static_worth(self.device_type, inst.node.op)):
            return None
        consts = {i for i, t in enumerate(inst.inputs) if t is not None and t.constant}
        dev = {"device": self.device_type} if inst.opdef.per_device else {}
        return fn(inst.node, ins, outs, deps, consts, **dev)

    def static_key(self, inst, v: StaticVariant, ins: list, outs: list) -> ImplParams:
        call = v.call
        dims = []
        for p, (kind, i) in enumerate(call.args):
            l = ins[i] if kind == "in" else outs[i]
            dims.append(tuple(v.table_dims.get(p, call.dims.get(p, l.shape))))
        jit = call.jit + (("NUM_TENSORS", len(call.args)),)
        return ImplParams("static", inst.node.op, call.source, jit, tuple(dims), tuple(v.table_params))

    def _build_static(self, key: ImplParams):
        return compile_program(self.ctx, key.source, key.jit + (("SHAPE_INFO_INIT", key.table()),),
                             dynamic=False)

    def find_static(self, key: ImplParams, name: str, node) -> tuple[Impl | None, str]:
        """A static impl for `key`: ("hit") from the impl cache, ("ready") a finished background
        build, ("built") built now when compiles are synchronous; else (None, "queued") with
        the build submitted to the compile queue (deduplicated)."""
        if key in self._failed_static:
            return None, "failed"
        impl = self.impls.get(key)
        if impl is not None:
            return impl, "hit"
        impl = self.take_static(key, name, node)
        if impl is not None:
            return impl, "ready"
        if not self.async_compile:
            try:
                prg, ms = self._build_static(key)
            except cl.RuntimeError as e:
                self._failed_static.add(key)
                self.record("update_impl", "fallback", "build_failed", node, impl=name,
                            error=str(e)[:200])
                return None, "failed"
            impl = Impl(name, "static", prg, ms)
            self._put_impl(key, impl, node)
            self._count_compile(ms, True, True)
            self.record("update_impl", "build", "static", node, impl=name, impl_kind="static",
                        compile_ms=round(ms, 3), critical=True)
            return impl, "built"
        fresh = self.compile_queue.submit(key, lambda: self._build_static(key))
        self.record("update_impl", "queue", "static" if fresh else "already_queued", node,
                    impl=name, impl_kind="static")
        return None, "queued"

    def take_static(self, key: ImplParams, name: str, node) -> Impl | None:
        """Pick up a finished background build of `key` (into the impl cache); None if none."""
        if self._compile_queue is None:
            return None
        done = self._compile_queue.take(key)
        if done is None:
            return None
        prg, ms, err = done
        if err is not None:
            self._failed_static.add(key)
            self.record("update_impl", "fallback", "build_failed", node, impl=name, error=str(err)[:200])
            return None
        impl = Impl(name, "static", prg, ms)
        self._put_impl(key, impl, node)
        self._count_compile(ms, True, False)
        return impl

    # ---- inference ----------------------------------------------------------------------
    def set_input(self, name: str, value: np.ndarray) -> None:
        t = self.tensors[name]
        value = np.require(value, requirements="C")
        t.layout = Layout(tuple(int(d) for d in value.shape), dtype_from_numpy(value.dtype))
        t.host = value
        t.version += 1
        action = "reuse" if t.buf is not None and t.capacity >= value.nbytes else "alloc"
        self.upload(t)
        self.memory.note_live(name, value.nbytes)
        self.record("realloc", "external", action, _InputNode(name), bytes=value.nbytes)

    def feed_back(self, name: str, src: Tensor, value: np.ndarray | None) -> None:
        """Input `name` takes output `src` of the previous inference without leaving the device:
        the KV-cache concat that produced it keeps appending into that buffer (alias); any other
        input gets a device-to-device copy into its own buffer (the producer may overwrite its
        output buffer before every reader of the input has run)."""
        t = self.tensors[name]
        t.layout, t.version = src.layout, t.version + 1
        t.host = value
        if name in self.kv_pasts:
            if t.capacity:
                self.release(t)
            t.buf, t.offset = src.buf, src.offset
            reason, nbytes = "feedback_alias", 0
        elif src.layout.pad is not None:  # a padded KV buffer fed to some other input
            return self.set_input(name, value if value is not None else self.read_to_host(src))
        else:
            nbytes = src.layout.nbytes
            if t.buf is None or t.capacity < nbytes:
                self.give_buffer(t, nbytes)
            t.offset = 0
            if nbytes:
                self.flush()
                cl.enqueue_copy(self.queue, t.buf, src.buf, byte_count=nbytes,
                                src_offset=src.offset * src.layout.itemsize, dst_offset=0)
            reason = "feedback_copy"
            self.memory.note_live(name, nbytes)
        t.dev_version = t.version
        self.record("realloc", "external", reason, _InputNode(name), bytes=nbytes)

    def infer(self, feeds: dict, fed_back: dict | None = None, outputs=None) -> dict:
        """One inference. `fed_back` maps inputs to the previous inference's outputs that feed
        them on the device (--feedback); `feeds` still holds their host values when known.
        `outputs`: the graph outputs to bring to the host (default all; a decode loop leaves
        out the KV cache it feeds back, which would otherwise be read whole every step)."""
        fed_back = fed_back or {}
        want = self.program.outputs if outputs is None else [o for o in self.program.outputs if o in outputs]
        self.iter += 1
        self.trace.iter = self.iter
        t0 = time.perf_counter()
        self.blocked_s, self.events = 0.0, []
        fast = self.fast if self.fast is not None and not self.fast.blocker else None
        sig = signature(feeds, fast.by_value) if fast is not None else None
        plan = fast.find(sig) if fast is not None else None
        if plan is not None:
            return self._replay(plan, feeds, t0, want)
        self.counters = Counter()
        self.shape_of_changed = set()
        self.memory.begin_inference()
        self.trace.event("infer_start", shapes={k: list(np.shape(v)) for k, v in feeds.items()})
        if self.prebuild_workers > 1:
            shapes = tuple((k, np.shape(v)) for k, v in feeds.items())
            if shapes not in self._prebuilt_for:   # a new signature: its new impls, in parallel
                self._prebuilt_for.add(shapes)
                start_builds(self, feeds)
        if fast is not None:
            fast.begin_flow(sig)
        for name in self.program.inputs:
            if name in fed_back:
                self.feed_back(name, self.tensors[fed_back[name]], feeds.get(name))
                continue
            if name not in feeds:
                raise ModelError(f"no value for input {name!r}")
            self.set_input(name, feeds[name])
        for inst in self.insts:
            inst.execute()
        self.flush()
        outs = {}
        for name in want:
            t = self.tensors[name]
            if t.host is None:
                self.read_to_host(t)
            outs[name] = t.host
        self.finish()
        latency = (time.perf_counter() - t0) * 1e3
        self.counters["latency_ms"] = latency
        # device memory of activations at its peak, next to what the live tensors needed
        self.counters["peak_bytes"] = self.memory.peak_bytes
        self.counters["live_bytes_lower_bound"] = self.memory.live_lower_bound()
        base = {"plan_base": True} if fast is not None and fast.end_flow(self.counters) else {}
        self.trace.event("infer_end", latency_ms=round(latency, 3),
                         out_shapes=self.output_shapes(), counters=dict(self.counters), **base)
        self.trace.flush()
        return outs

    def finish(self) -> None:
        """Wait for the inference's commands; the host arrays kept for them can go."""
        t0 = time.perf_counter()
        self.queue.finish()
        self.blocked_s += time.perf_counter() - t0
        self._keep.clear()

    def device_ms(self) -> float:
        """Summed kernel time of the last inference (profile=True: OpenCL profiling events)."""
        return sum(e.profile.end - e.profile.start for e in self.events) * 1e-6

    def output_shapes(self) -> dict:
        return {k: list(self.tensors[k].layout.shape) for k in self.program.outputs}

    def _replay(self, plan, feeds: dict, t0: float, want: list) -> dict:
        """The fast path (engine/plan.py): the plan of this transition, standing for the
        decisions of the inference it was recorded from."""
        outs = self.fast.replay(plan, feeds, want)
        self.finish()
        latency = (time.perf_counter() - t0) * 1e3
        self.counters = Counter(plan.counters)
        self.counters["latency_ms"] = latency
        why = "same_signature" if plan.key[0] == plan.key[1] else "transition"
        self.counters["plan.replay"] = self.counters[f"plan.replay.{why}"] = 1
        tr = self.trace      # the same three records whatever the sink (no-op sinks ignore them)
        tr.event("infer_start", shapes={k: list(np.shape(v)) for k, v in feeds.items()})
        tr.event("plan", "", "", "replay", why, of_iter=plan.of_iter, kernels=len(plan.launches))
        tr.event("infer_end", latency_ms=round(latency, 3), out_shapes=self.output_shapes(),
                 counters=dict(self.counters))
        tr.flush()
        return outs


class _InputNode:
    """Graph inputs appear in the trace as nodes of op "Parameter" (OpenVINO's name)."""
    op = "Parameter"

    def __init__(self, name):
        self.name = name


def _kv_append_ok(prog, node, past: str) -> bool:
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


def _in_place_concats(prog, insts) -> list:
    """(concat inst, producers' insts, first producer's step) for every Concat that may run in
    place (the plugin's can_be_optimized at run time): every input produced by a device node
    of its own (one output, used by this concat alone, not a view, a concat or a graph output)
    whose inputs all exist before the first of them runs, so the concat can infer every
    producer's shape then. Whether the regions are contiguous depends
    on the shapes: decided at run time (primitive_inst.do_runtime_in_place_concat)."""
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
            if p is None or p.node.host or p.opdef.view or p.opdef.runtime_skip or \
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
