"""Buffers of one network: every tensor, the device memory behind it (the memory pool) and the
preallocation policy that sizes new buffers (the ShapePredictor of the GPU plugin's
memory_preallocation.md, or another policy of engine/predictors.py)."""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from engine.accounting import mark, since
from engine.device_queue import DeviceQueue
from engine.diagnose import DeviceMemoryError, nbytes_text
from engine.layout import Layout, dtype_from_numpy
from engine.memory import Tensor
from engine.memory_pool import MemoryPool


class Buffers:
    def __init__(self, program, queue: DeviceQueue, predictor, device: cl.Device):
        self.program = program
        self.queue = queue
        self.ctx = queue.ctx
        self.predictor = predictor
        self.memory: MemoryPool | None = None    # set by the network once lifetimes are known
        self._dummy = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, 64)
        self.limits = (device.global_mem_size, device.max_mem_alloc_size)
        self.tensors: dict[str, Tensor] = {}
        self.alloc_s = 0.0             # time spent making buffers (the network resets it)
        self._unread_flag: Tensor | None = None
        # the memory of the constants' host values (their owners, by id): nothing writes it
        self._fixed: dict = {}
        # the shape subgraph's values: their buffers take nothing but uploads (no pool, no
        # kernel writes them; a control-flow body's carried values are written by kernels)
        self._host_values = {o for node in program.nodes if node.host for o in node.outputs}
        for name, v in program.constants.items():  # includes constants made by fusion
            v = np.require(v, requirements="C")
            self.tensors[name] = Tensor(name, Layout(v.shape, dtype_from_numpy(v.dtype)),
                                        host=v, constant=True)
            owner = _owner(v)
            self._fixed[id(owner)] = owner
        for name in program.inputs:
            self.tensors[name] = Tensor(name)
        for node in program.nodes:
            for o in node.outputs:
                self.tensors.setdefault(o, Tensor(o))

    def unread_flag(self) -> Tensor:
        """A slot of index flags nobody reads (engine/index_flags.py): the index kernels of
        nodes the index checks do not cover (a control-flow subgraph's) write there."""
        if self._unread_flag is None:
            self._unread_flag = Tensor("unread_index_flag", Layout((4,), "i32"), constant=True,
                                       buf=cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, 16))
        return self._unread_flag

    def use_pool(self, pool: MemoryPool) -> None:
        self.memory = pool
        pool.limits = self.limits

    @property
    def used_bytes(self) -> int:
        return self.memory.used_bytes

    def realloc_decision(self, t: Tensor, shape: tuple, bits: int):
        """The preallocation policy's decision for `t` at `shape` (it sees every call: its
        history is what it predicts from)."""
        d = t.state.realloc_if_needed(self.predictor, t.name, shape, bits, self.used_bytes)
        self.queue.observer.predicted(t, shape, bits)
        return d

    def release(self, t: Tensor) -> None:
        if t.capacity:
            self.memory.release(t.buf, t.name)
        t.buf, t.capacity = None, 0

    def give(self, t: Tensor, nbytes: int, exact: int | None = None) -> str:
        """Point `t` at a buffer of at least `nbytes` (its old one released): a dead tensor's
        from the memory pool (`from_pool`; only for tensors the pool serves) or a new one
        (`alloc`). A new buffer the device cannot give is tried again at `exact` bytes (the
        need without the predictor's extra) before failing with a DeviceMemoryError that names
        the tensor and its node."""
        t0 = mark()
        try:
            return self._give(t, nbytes, exact)
        finally:
            self.alloc_s += since(t0)

    def take_for(self, t: Tensor, d, count: int, itemsize: int) -> tuple:
        """A buffer of the size the policy's decision `d` asks for (at least `count` elements
        of `itemsize` bytes) given to `t`: (its bytes, "alloc" or "from_pool", whether the
        policy's extra is in it). The predictor's record of `t`'s buffer follows (a pooled
        buffer may be larger)."""
        nbytes = max(d.alloc_elems, count) * itemsize
        try:
            how = self.give(t, nbytes, exact=count * itemsize)
        except DeviceMemoryError:
            # (its old buffer given back already: the decision's record of the size asked for
            # would otherwise let a later inference reuse a buffer it does not hold)
            t.state.drop()
            raise
        predicted = d.predicted
        if how == "alloc" and t.capacity < nbytes:   # the extra was dropped to fit the device
            nbytes, predicted = t.capacity, False
        t.state.take(t.capacity // itemsize)
        return nbytes, how, predicted

    def _give(self, t: Tensor, nbytes: int, exact: int | None) -> str:
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
        prog = self.program
        prod = prog.producers.get(t.name)
        by = f"output of node {prod[0].name} ({prod[0].op})" if prod else (
            "graph input" if t.name in prog.inputs else "constant" if t.constant else "buffer")
        shape = f" ({'x'.join(map(str, t.layout.shape))} {t.layout.dtype})" if t.layout is not None else ""
        return DeviceMemoryError(f"tensor {t.name} ({by}) needs {nbytes_text(nbytes)}{shape}: {why}")

    def upload(self, t: Tensor) -> None:
        """Put a host value on the device (constants once, shape-subgraph values when changed),
        unless the device holds it already: a shape-subgraph value at the start of the one last
        uploaded, both views of a constant (a shorter length's position ids: the table's first
        entries)."""
        nbytes = t.host.nbytes
        if t.buf is None or t.capacity < nbytes:
            self.give(t, nbytes)
        elif t.offset == 0 and t.name in self._host_values and self._held(t.host, t.dev_src):
            t.dev_src, t.dev_version = t.host, t.version     # (its bytes: what replays compare)
            return
        if nbytes:
            # no flush first: the kernels still waiting do not read this buffer (host values
            # and inputs never come from the memory pool; their readers come later)
            self.queue.write(t.buf, t.host)
        t.dev_src = t.host
        t.offset = 0
        t.dev_version = t.version

    def _held(self, v: np.ndarray, prev) -> bool:
        """Whether `v`'s bytes are the first of `prev`'s, both in a constant's memory."""
        if prev is None or v.base is None or prev.dtype != v.dtype or v.nbytes > prev.nbytes or \
                not (v.flags.c_contiguous and prev.flags.c_contiguous):
            return False
        owner = _owner(v)
        return owner is _owner(prev) and id(owner) in self._fixed and \
            v.__array_interface__["data"][0] == prev.__array_interface__["data"][0]

    def device_buffer(self, t: Tensor) -> cl.Buffer:
        """The buffer a kernel argument binds for `t` (uploading a changed host value first)."""
        if t.layout is None or t.layout.count == 0:
            return self._dummy
        if t.host is not None and t.dev_version != t.version:
            self.upload(t)
        return t.buf


def _owner(v: np.ndarray) -> np.ndarray:
    """The array whose memory `v` views (itself when it owns its memory)."""
    while isinstance(v.base, np.ndarray):
        v = v.base
    return v
