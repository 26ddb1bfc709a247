"""Network: one executable instance of a Program on an OpenCL device (the GPU plugin's
cldnn::network). It composes the runtime services (engine/runtime.py: the device queue, the
buffers, the impls, the decisions log) with the program's primitive instances, and runs an
inference: inputs in, every node's flow (PrimitiveInst.execute) in order, outputs out. A
repeated input signature may instead replay a plan (engine/fast_path, its one door)."""
from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pyopencl as cl

from engine.accounting import Accounting
from engine.buffers import Buffers
from engine.decisions import Decisions
from engine.device import select_device
from engine.device_queue import DeviceQueue
from engine.fast_path import FastPath, signature
from engine.fast_path.plans import value_inputs
from engine.graph_inputs import GraphInputs
from engine.impl_cache import ImplCache
from engine.impl_manager import ImplManager
from engine.index_checks import IndexChecks
from engine.load_passes import (in_place_concats, instantiate, kv_appends, kv_into_attention,
                                share_memos, tensor_lifetimes)
from engine.memory import Tensor
from engine.memory_pool import MemoryPool
from engine.predictors import make_predictor
from engine.program import Program
from engine.runtime import Runtime
from engine.shape_predictor import PreallocSettings


class Network:
    def __init__(self, program: Program, device: cl.Device | None = None, trace=None,
                 prealloc: PreallocSettings = PreallocSettings(), impl_cache_capacity: int = 300,
                 predictor: str = "openvino", feedback: dict | None = None,
                 impls: str = "auto", async_compile: bool = True, compile_workers: int = 1,
                 profile: bool = False, memory_pool: bool = True, fast_path: bool = True,
                 prebuild_workers: int = 8, context: cl.Context | None = None,
                 impl_cache: ImplCache | None = None, compile_plans: str = "partial"):
        self.program = program
        self.device = device or select_device()
        # many small networks (the ONNX backend's node tests) may share a context and impl cache
        self.ctx = context or cl.Context([self.device])
        device_type = "cpu" if self.device.type & cl.device_type.CPU else "gpu"
        self.decisions = Decisions(trace)
        self.queue = DeviceQueue(self.ctx, self.device, device_type, profile)
        # output preallocation policy (engine/predictors.py); --prealloc tunes "openvino"
        self.buffers = Buffers(program, self.queue, make_predictor(
            predictor, prealloc, self.device.global_mem_size), self.device)
        # the device kind picks kernel variants (tests set impls.device_type to run GPU ones)
        self.impls = ImplManager(self.buffers, self.decisions, device_type, impls,
                                 async_compile, compile_workers, prebuild_workers, impl_cache,
                                 impl_cache_capacity)
        self.rt = Runtime(self.device, self.queue, self.buffers, self.impls, self.decisions)
        self.accounting = Accounting(self.queue, self.buffers, self.impls, self.decisions.trace)
        self.insts = instantiate(program, self.buffers.tensors, self.rt)
        self.index_checks = IndexChecks(self.insts)   # indices out of range refused, not clamped
        self.iter = -1
        self.time_ms: dict = {}        # the last inference's time by part (engine/accounting.py)
        self.feedback = dict(feedback or {})
        self.kv_pasts = kv_appends(program, self.insts, self.feedback)
        kv_into_attention(program, self.insts)
        share_memos(self.insts, self.rt.memos)   # a transformer's layers answer each other's shapes
        # inputs whose host values shape inference reads, kept from one inference to the next
        # (to tell a new value): a copy, so a caller refilling its array in place is seen
        self.by_value = value_inputs(self.insts, program.inputs)
        self.inputs = GraphInputs(program, self.buffers, self.decisions, self.by_value, self.kv_pasts)
        self._plan_memory(memory_pool)
        # plan replay of repeated input signatures (engine/fast_path); None: the flow runs always
        self.fast = FastPath(program, self.insts, self.buffers, self.queue, self.decisions, self.by_value,
                             self.index_checks.tensors, bool(self.feedback), compile_plans) if fast_path else None
        if self.fast is not None:
            self.queue.observer = self.fast

    def _plan_memory(self, enabled: bool) -> None:
        """Device memory: lifetimes over the execution order; graph inputs (external memory)
        and KV-cache buffers (kept across inferences) never enter the pool."""
        prog = self.program
        life = tensor_lifetimes(self.insts, prog.inputs, prog.outputs)
        for concat, producers, first in in_place_concats(prog, self.insts):
            concat.in_place_producers = producers
            self.insts[first].concat_user = concat
            life[concat.outputs[0].name][0] = first   # its buffer is written from there on
        pinned = set(prog.inputs) | {i.outputs[0].name for i in self.insts if i.kv_past is not None}
        self.buffers.use_pool(MemoryPool(life, set(life) - pinned, enabled=enabled))

    # ---- what callers read --------------------------------------------------------------
    @property
    def device_type(self) -> str:
        return self.impls.device_type

    @property
    def counters(self):
        return self.decisions.counters

    @property
    def trace(self):
        return self.decisions.trace

    @property
    def tensors(self) -> dict[str, Tensor]:
        return self.buffers.tensors

    @property
    def memory(self) -> MemoryPool:
        return self.buffers.memory

    @property
    def blocked_s(self) -> float:     # this inference's time blocked on the device
        return self.queue.blocked_s

    def device_ms(self) -> float:     # summed kernel time (profile=True)
        return self.queue.device_ms()

    def output_shapes(self) -> dict:
        return {k: list(self.tensors[k].layout.shape) for k in self.program.outputs}

    # ---- inference ----------------------------------------------------------------------
    def infer(self, feeds: dict, fed_back: dict | None = None, outputs=None) -> dict:
        """One inference. `fed_back` maps inputs to the previous inference's outputs that feed
        them on the device (--feedback); `feeds` still holds their host values when known.
        `outputs`: the graph outputs to bring to the host (default all; a decode loop leaves
        out the KV cache it feeds back, which would otherwise be read whole every step)."""
        want = self.program.outputs if outputs is None else [o for o in self.program.outputs if o in outputs]
        self.iter += 1
        self.trace.iter = self.iter
        t0 = time.perf_counter()
        self.queue.begin_inference()
        self.accounting.begin()
        self.impls.in_flight(True)
        fast, fed_back = self.fast, fed_back or {}
        sig = signature(feeds, self.by_value) if fast is not None else None
        plan = fast.find(sig) if fast is not None else None
        if plan is not None:
            return self.index_checks.after(self._replay(plan, feeds, t0, want))
        partial = fast.partial_for(feeds, fed_back) if fast is not None else None
        self.decisions.begin()
        self.rt.shape_of_changed.clear()
        self.memory.begin_inference()
        self.trace.event("infer_start", shapes={k: list(np.shape(v)) for k, v in feeds.items()})
        if fast is None or partial is not None:
            self.impls.prebuild(self.insts, self.tensors, feeds)
        if fast is not None:
            fast.begin_flow(sig, feeds, fed_back, partial)
        self.inputs.set(feeds, fed_back)
        if partial is not None:
            upto = fast.run_partial()    # the dirty nodes' flow between repeated blocks
        else:
            upto = None
            if fast is not None:         # (its prebuild walk once a compiled plan did not serve)
                fast.run_flow(lambda bound: self.impls.prebuild(self.insts, self.tensors, feeds, bound))
                fast.trace_ahead()       # the first time: while the device runs the kernels
            else:
                for inst in self.insts:  # the reference: every node's flow
                    inst.execute()
        self.queue.flush()
        c = self.counters
        c["latency_ms"] = 0.0            # (below: the counters keep their order)
        # device memory of activations at its peak, next to what the live tensors needed
        # (while the device still runs the last kernels)
        c["peak_bytes"] = self.memory.peak_bytes
        c["live_bytes_lower_bound"] = self.memory.live_lower_bound()
        # the fast path's recording reads no output: it goes while the device runs the kernels
        extra = self.accounting.recording(lambda: fast.end_flow(c, self.iter, upto)) if fast is not None else {}
        outs = self._outputs(want)
        if fast is not None:
            fast.ended()
        latency = (time.perf_counter() - t0) * 1e3
        c["latency_ms"] = latency
        self._end(latency, extra)
        return self.index_checks.after(outs)

    def _end(self, latency: float, extra: dict) -> None:
        self.impls.in_flight(False)
        self.time_ms = self.accounting.parts_ms(latency)
        if self.decisions.traced:            # nothing to build for a sink that keeps nothing
            tr = self.trace
            tr.event("infer_end", latency_ms=round(latency, 3), out_shapes=self.output_shapes(),
                     counters=dict(self.counters), time_ms=self.time_ms, **extra)
            tr.flush()

    def _outputs(self, want: list) -> dict:
        self.queue.read_status()
        outs = {}
        for name in want:
            t = self.tensors[name]
            if t.host is None:
                self.queue.read_to_host(t)
            outs[name] = t.host
        self.queue.finish()
        return outs

    def _replay(self, plan, feeds: dict, t0: float, want: list) -> dict:
        """The fast path: the plan of this transition, standing for the decisions of the
        inference it was recorded from."""
        outs = self.fast.replay(plan, feeds, want)
        self.queue.finish()
        latency = (time.perf_counter() - t0) * 1e3
        self.decisions.counters = c = Counter(plan.counters)
        c["latency_ms"] = latency
        why = "same_signature" if plan.key[0] == plan.key[1] else "transition"
        c["plan.replay"] = c[f"plan.replay.{why}"] = 1
        tr = self.trace      # the same three records whatever the sink (no-op sinks ignore them)
        tr.event("infer_start", shapes={k: list(np.shape(v)) for k, v in feeds.items()})
        tr.event("plan", "", "", "replay", why, of_iter=plan.of_iter, kernels=len(plan.launches), **plan.expands)
        self._end(latency, {})
        return outs

