"""The impls of one network (update_impl's services): the implementations cache, builds of
shape-agnostic impls (in the critical path, or ahead of it: engine/prebuild.py), static builds
and their background queue (the GPU plugin's async_compilation.md), and the reorder of weights
into the layout a static impl wants (update_weights, preprocessing.md)."""
from __future__ import annotations

import os
import weakref
from concurrent.futures import Future
from functools import partial

import numpy as np
import pyopencl as cl

from engine.accounting import mark, since
from engine.buffers import Buffers
from engine.compile_queue import CompileQueue
from engine.decisions import Decisions
from engine.graph import ModelError
from engine.impl_cache import IMPL_MODES, ImplCache, give_back_freed_heap, static_worth
from engine.kernels import (Impl, ImplParams, StaticVariant, compile_program, dynamic_key, impl_name,
                            program_bytes)
from engine.memory import Tensor
from engine.ops.matmul import M_ALIGN
from engine.prebuild import start_builds
from engine.weights import reorder_call, run_reorder


# `--impls auto` on a CPU: GEMMs below this many multiply-adds keep the shape-agnostic impl.
# There a static kernel saves a few microseconds a launch (PoCL, scripts/bench_gemm.py: a
# batched 12x128x32x128 ran 92 us dynamic, 81 static) while switching to it costs its first
# launch's specialisation (PoCL with empty caches: 355 ms of the README encoder's inference
# that switched its 8x64x64 GEMMs, against 4 ms warm) and sends the next inferences back through
# the flow; from 32x1536x384 on, static saves 27-40% of the kernel.
CPU_STATIC_MIN_MACS = 1 << 20


def _macs(v: StaticVariant) -> int:
    m, n, k, nb = v.table_params[:4]
    return m * n * k * max(nb, 1)


def _matmul_macs_bound(ins, outs) -> int:
    """At least the _macs of any static variant of a MatMul of these shapes (its rows are
    rounded up to M_ALIGN), so that a variant surely below the threshold is not made first (a
    decode step's small GEMMs ask for new shapes every token)."""
    a = ins[0].shape
    m, k = (a[-2] if len(a) > 1 else 1), (a[-1] if a else 1)
    return outs[0].count // max(m, 1) * (m + M_ALIGN) * k


def build_static(ctx: cl.Context, cache: ImplCache, prebuilt: dict, key: ImplParams, weights=None,
                 optimize: bool = True):
    """The static program of `key`; in the background, also the reorder program of the weight
    layout it wants (into `prebuilt` unless `cache` has it), so that the switch to it builds
    nothing in the critical path (on PoCL with empty caches that build took 102 ms of the
    switching inference). Queued builds call this with the manager's parts, never the manager:
    a network that is gone is collected while its build runs, and its queued builds dropped
    (the network's finalizer stops the queue)."""
    built = compile_program(ctx, key.source, key.jit + (("SHAPE_INFO_INIT", key.table()),), dynamic=False,
                            optimize=optimize)
    if weights is not None and not weights.compatible:
        call = reorder_call(weights)
        jit = call.jit + (("NUM_TENSORS", len(call.args)),)
        if dynamic_key(call.source, jit) not in cache and (call.source, jit) not in prebuilt:
            done: Future = Future()
            prebuilt[(call.source, jit)] = done
            try:
                done.set_result(compile_program(ctx, call.source, jit, optimize=optimize))
            except Exception as e:  # noqa: BLE001 - raised where the flow takes it
                done.set_exception(e)
    return built


class ImplManager:
    def __init__(self, buffers: Buffers, decisions: Decisions, device_type: str, mode: str = "auto",
                 async_compile: bool = True, compile_workers: int = 1, prebuild_workers: int = 8,
                 cache: ImplCache | None = None, cache_capacity: int = 300):
        if mode not in IMPL_MODES:
            raise ValueError(f"impls must be one of {', '.join(IMPL_MODES)}, not {mode!r}")
        self.buffers = buffers
        self.ctx = buffers.ctx
        self.decisions = decisions
        self.device_type = device_type
        self.mode = mode
        # --impls static builds every static impl in the critical path, as --no-async-compile does
        self.async_compile = async_compile and mode == "auto"
        self.compile_workers = compile_workers
        # many small networks (the ONNX backend's node tests) may share one impl cache
        self.cache = cache if cache is not None else ImplCache(cache_capacity)
        self._compile_queue: CompileQueue | None = None
        self._busy = False             # an inference is in flight (in_flight)
        self.failed: set = set()       # keys whose static build failed: dynamic stays
        # static keys the impl cache evicted: not built again (a run whose shapes want more
        # static impls than the cache holds would otherwise rebuild them in turn for ever, each
        # switch sending the next inferences back through the flow)
        self.evicted: set = set()
        # smaller GEMMs keep the dynamic impl under --impls auto (tests of the static path set 0)
        self.static_min_macs = CPU_STATIC_MIN_MACS if device_type == "cpu" else 0
        # (source, jit) -> future of a build started ahead of the node that needs it
        self.prebuilt: dict = {}
        # more build threads than cores only take turns with each other (and, on a CPU
        # device, with the kernels): a CPU device gets one per core
        self.prebuild_workers = min(prebuild_workers, max(2, os.cpu_count() or 1)) \
            if device_type == "cpu" else prebuild_workers
        self._prebuilt_for: set = set()     # input shapes prebuild walked already
        self.wait_s = 0.0              # time the flow waited for builds (the network resets it)
        # walks of new signatures in a row that found nothing to build: after two, new
        # signatures are not walked until a build lands in the critical path again (a walk
        # costs a pass of shape inference over every node: ~20 ms of a first-seen BERT length
        # on the H100's host, for nothing once every kernel is built)
        self._idle_walks = 0
        self.prebuild_s = 0.0          # ... spent walking a new signature for prebuild
        # whether builds optimize, where a script says so (one timing a GPU kind's kernels on a
        # CPU device); None: the rule of `optimize`. Set it, and device_type, before the first
        # inference: the impl cache's keys do not hold it (a cache shared by networks of both
        # kinds on a CPU device hands each the other's builds: slower kernels, the same values)
        self.optimized: bool | None = None

    def __len__(self) -> int:
        return len(self.cache)

    @property
    def optimize(self) -> bool:
        """Whether builds optimize: not those of a GPU kind's kernels on a CPU device (tests,
        and scripts that time the host's part, check or time nothing else of them there). PoCL
        spends most of a cold build optimizing: a GPU kind's GEMV took 6-7 s against 1.2
        unoptimized, the suite's largest cost with empty caches; CPU kernels keep it."""
        if self.optimized is not None:
            return self.optimized
        return self.device_type != "gpu" or not self.ctx.devices[0].type & cl.device_type.CPU

    def in_flight(self, busy: bool) -> None:
        """An inference starts or ends: background builds wait for the end on a CPU device."""
        self._busy = busy
        if self._compile_queue is not None:
            self._compile_queue.in_flight(busy)

    @property
    def compile_queue(self) -> CompileQueue:
        """The background compile queue, started on first use (`wait_idle()` for tests)."""
        if self._compile_queue is None:
            self._compile_queue = CompileQueue(self.compile_workers, self.device_type == "cpu")
            # made by the first static build an inference asks for: that inference is in
            # flight, so the build waits for its end as later ones do (it took a core from
            # the first inference's kernels on a CPU device)
            self._compile_queue.in_flight(self._busy)
            # a network that is gone needs none of its queued builds: they would only take
            # the cores from the next one (on a 2-core CPU, minutes of a test suite)
            weakref.finalize(self, self._compile_queue.stop)
        return self._compile_queue

    def prebuild(self, insts, tensors, feeds: dict, bound: bool = False) -> None:
        """Before the flow of a new input signature: its new impls, built in parallel.
        `bound`: a compiled plan serves the signature with kernels all built (the fast path's),
        where the walk would find nothing: counted as such a walk, not made (2 ms on a BERT)."""
        if self.prebuild_workers <= 1:
            return
        shapes = tuple((k, np.shape(v)) for k, v in feeds.items())
        if shapes not in self._prebuilt_for and self._idle_walks < 2:
            t0 = mark()
            self._prebuilt_for.add(shapes)
            found = 0 if bound else start_builds(self, insts, tensors, feeds)
            self._idle_walks = 0 if found else self._idle_walks + 1
            self.prebuild_s += since(t0)

    def _count_compile(self, ms: float, static: bool, critical: bool) -> None:
        c = self.decisions.counters
        c["compiles"] += 1
        c["static_compiles"] += int(static)
        c["compile_ms"] += ms
        if critical:
            c["compile_ms_critical"] += ms

    def _put(self, key, impl, node) -> None:
        impl.nbytes = program_bytes(impl.program, self.ctx.devices[0])
        evicted = self.cache.put(key, impl)
        for old_key, old, why in evicted:
            old.evicted = True
            if old.kind == "static":
                self.evicted.add(old_key)
            self.decisions.record("update_impl", "evict", why, node=node, impl=old.name,
                                  impl_kind=old.kind, bytes=old.nbytes)
        if evicted:
            # the last references but a node's current kernels (spare ones are dropped at the
            # node's next change of kernels): their programs are freed here
            del old, evicted
            give_back_freed_heap()

    def _cached(self, key):
        """The impl cache's entry for `key` (None on a miss); a hit is reported to the queue's
        observer: it moves the entry in the LRU order, which a plan replay must repeat."""
        impl = self.cache.get(key)
        if impl is not None:
            self.buffers.queue.observer.touched(self.cache, key)
        return impl

    # ---- shape-agnostic impls -----------------------------------------------------------
    def dynamic(self, call, node) -> Impl:
        """The dynamic (shape-agnostic) impl of `call`: impl cache, else built now."""
        jit = call.jit + (("NUM_TENSORS", len(call.args)),)
        key = dynamic_key(call.source, jit)
        impl = self._cached(key)
        if impl is not None:
            self.decisions.record("update_impl", "cache_hit", "dynamic", node, impl=impl.name,
                                  impl_kind="dynamic")
            return impl
        built = self.prebuilt.pop((call.source, jit), None)
        t0 = mark()
        try:
            prg, ms = built.result() if built is not None else \
                compile_program(self.ctx, call.source, jit, optimize=self.optimize)
        except cl.RuntimeError as e:
            raise ModelError(f"kernel build failed for node {node.name} ({call.source}): {e}") from None
        finally:
            self.wait_s += since(t0)
        impl = Impl(impl_name(call.source, jit), "dynamic", prg, ms)
        self._put(key, impl, node)
        self._count_compile(ms, False, built is None)
        if built is None:
            self._idle_walks = 0       # a build the walks did not foresee: walk again
        extra = {"prebuilt": True} if built is not None else {}
        self.decisions.record("update_impl", "build", "dynamic", node, impl=impl.name,
                              impl_kind="dynamic", compile_ms=round(ms, 3), critical=built is None,
                              **extra)
        return impl

    # ---- static impls -------------------------------------------------------------------
    def builds_static(self, inst) -> bool:
        """Whether this run ever builds a static impl for `inst`'s op (the mode, and under
        `--impls auto` the op's measured `static_on`): where it does not, the node's flow
        keeps its shape-agnostic impl for every shape."""
        return inst.opdef.static is not None and self.mode != "dynamic" and \
            (self.mode == "static" or static_worth(self.device_type, inst.node.op))

    def static_variant(self, inst, ins, outs, deps) -> StaticVariant | None:
        """The op's static variant for these shapes, if this run builds static impls for it."""
        if not self.builds_static(inst):
            return None
        fn = inst.opdef.static
        if self.mode == "auto" and inst.node.op == "MatMul" and _matmul_macs_bound(ins, outs) < self.static_min_macs:
            return None    # below the threshold whatever the rows' alignment: not worth building
        consts = {i for i, t in enumerate(inst.inputs) if t is not None and t.constant}
        dev = {"device": self.device_type} if inst.opdef.per_device else {}
        v = fn(inst.node, ins, outs, deps, consts, **dev)
        if v is not None and self.mode == "auto" and inst.node.op in ("MatMul", "Gemm", "gemm_split") and \
                _macs(v) < self.static_min_macs:
            return None
        return v

    @staticmethod
    def static_key(op: str, v: StaticVariant, ins: list, outs: list) -> ImplParams:
        call = v.call
        dims = []
        for p, (kind, i) in enumerate(call.args):
            l = ins[i] if kind == "in" else outs[i]
            dims.append(tuple(v.table_dims.get(p, call.dims.get(p, l.shape))))
        jit = call.jit + (("NUM_TENSORS", len(call.args)),)
        return ImplParams("static", op, call.source, jit, tuple(dims), tuple(v.table_params))

    def _build_static(self, key: ImplParams, weights=None):
        """The static program of `key` (build_static)."""
        return build_static(self.ctx, self.cache, self.prebuilt, key, weights, self.optimize)

    def find_static(self, key: ImplParams, name: str, node, weights=None) -> tuple[Impl | None, str]:
        """A static impl for `key`: ("hit") from the impl cache, ("ready") a finished background
        build, ("built") built now when compiles are synchronous; else (None, "queued") with
        the build submitted to the compile queue (deduplicated)."""
        if key in self.failed:
            return None, "failed"
        impl = self._cached(key)
        if impl is not None:
            return impl, "hit"
        impl = self.take_static(key, name, node)
        if impl is not None:
            return impl, "ready"
        if key in self.evicted:
            self.decisions.record("update_impl", "fallback", "evicted", node, impl=name)
            return None, "evicted"
        if not self.async_compile:
            return self._build_static_now(key, name, node)
        fresh = self.compile_queue.submit(key, partial(build_static, self.ctx, self.cache, self.prebuilt,
                                                       key, weights, self.optimize))
        self.decisions.record("update_impl", "queue", "static" if fresh else "already_queued", node,
                              impl=name, impl_kind="static")
        return None, "queued"

    def _build_static_now(self, key: ImplParams, name: str, node) -> tuple[Impl | None, str]:
        t0 = mark()
        try:
            prg, ms = self._build_static(key)
        except cl.RuntimeError as e:
            self.failed.add(key)
            self.decisions.record("update_impl", "fallback", "build_failed", node, impl=name,
                                  error=str(e)[:200])
            return None, "failed"
        finally:
            self.wait_s += since(t0)
        impl = Impl(name, "static", prg, ms)
        self._put(key, impl, node)
        self._count_compile(ms, True, True)
        self.decisions.record("update_impl", "build", "static", node, impl=name, impl_kind="static",
                              compile_ms=round(ms, 3), critical=True)
        return impl, "built"

    def take_static(self, key: ImplParams, name: str, node) -> Impl | None:
        """Pick up a finished background build of `key` (into the impl cache); None if none."""
        if self._compile_queue is None:
            return None
        done = self._compile_queue.take(key)
        if done is None:
            return None
        prg, ms, err = done
        if err is not None:
            self.failed.add(key)
            self.decisions.record("update_impl", "fallback", "build_failed", node, impl=name,
                                  error=str(err)[:200])
            return None
        impl = Impl(name, "static", prg, ms)
        self._put(key, impl, node)
        self._count_compile(ms, True, False)
        return impl

    def poll_static(self, key: ImplParams, name: str, node) -> tuple[Impl | None, bool]:
        """A pending static build of `key`: (its impl, True) once ready (from the compile
        queue, or from the impl cache when another node took it first); (None, still
        pending?) otherwise (no, when it failed); a build evicted before this node took it is submitted again."""
        impl = self._cached(key) if key in self.cache else self.take_static(key, name, node)
        if impl is not None:
            return impl, False
        if key in self.failed:
            return None, False
        if not self.compile_queue.pending(key):
            self.find_static(key, name, node)
        return None, True

    # ---- weights ------------------------------------------------------------------------
    def reorder_weights(self, node, w: Tensor, wl, reuse: Tensor | None) -> Tensor:
        """The reorder kernel into `reuse`'s buffer when it is big enough, else a new one."""
        return run_reorder(self, self.buffers, node, w, wl, reuse)
