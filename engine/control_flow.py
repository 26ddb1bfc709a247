"""ControlInst: an If or Loop node (Scan runs as a Loop, engine/subgraphs.py) of a network.

Its decision is taken on the host: the condition and the trip count are host values, read back
from the device when a kernel computed them (counted as device reads, as shape deps are). Each
subgraph was built once at load as a program of its own (`build_program` on the subgraph, the
outer-scope values it reads as inputs) whose instances run on the parent's services: the same
queue (so the device sees one order), buffers, impls and decisions. Their node names are
`<control node>/<then|else|body>/<node>`, so the trace tells which subgraph every decision
belongs to; the control decision itself is a `control` event (`branch` then/else, `iterate`
with why the loop stopped).

Values cross on the device: outer values are aliased (a subgraph never writes them), a Loop's
carried values are copied into the body inputs' own buffers (the body may write its output
where it reads), its scan outputs are gathered slice by slice and copied into the node's
outputs at the end, as a branch's outputs are.
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl

from engine.diagnose import InferenceError
from engine.layout import Layout, dtype_from_numpy, dtype_from_onnx, np_dtype
from engine.memory import Tensor
from engine.primitive_inst import PrimitiveInst
from engine.program import build_program
from engine.subgraphs import BODIES, outer_names, sub_model

# outer constants up to this size become the subgraph's own constants (folded, host shape math
# there); larger ones (weights) are read through the outer tensor's buffer
CONST_BYTES = 1 << 16


class Body:
    """One subgraph's program, tensors (named `<prefix><name>` for the memory pool and the
    preallocation history) and instances."""

    def __init__(self, prog, formal: list, prefix: str, make_insts):
        self.prog = prog
        self.tensors = {}
        for name, v in prog.constants.items():
            v = np.require(v, requirements="C")
            self.tensors[name] = Tensor(prefix + name, Layout(v.shape, dtype_from_numpy(v.dtype)),
                                        host=v, constant=True)
        for name in list(prog.inputs) + [o for n in prog.nodes for o in n.outputs]:
            self.tensors.setdefault(name, Tensor(prefix + name))
        self.insts = make_insts(prog, self.tensors)
        self.inputs = [self.tensors[name] for name in formal]
        self.outputs = [self.tensors[o] for o in prog.outputs]
        self.outer: list = []          # (its input, the outer tensor it reads)

    def run(self) -> None:
        for inst in self.insts:
            inst.execute()


def _prefix(prog, prefix: str) -> None:
    """Node names of a subgraph's program under their control node's (a nested control node
    builds its own subgraphs later, under its name as prefixed here)."""
    seen = set()
    for n in prog.nodes:
        for m in [n] + ([op.node for op in n.fusion.ops] if n.fusion is not None else []):
            if id(m) not in seen:
                seen.add(id(m))
                m.name = prefix + m.name
                # the Shape nodes a host node re-runs for are named as they are now
                m.shape_sources = frozenset(prefix + x for x in m.shape_sources)


class ControlInst(PrimitiveInst):
    def __init__(self, node, runtime):
        super().__init__(node, runtime)
        self.bodies: dict[str, Body] = {}
        self._stage: dict = {}        # scan output k -> (buffer, bytes) its slices gather in
        self._held: dict = {}         # carried value k held while the body inputs are written
        self._placed = False

    def build_bodies(self, make_insts) -> None:
        """Each subgraph's program and instances (at load; `make_insts(prog, tensors)` makes a
        network's instances, nested control nodes included)."""
        node = self.node
        # by the names the subgraphs read (load passes may rename the node's inputs since)
        names = list(node.proto.input) + [x for x in node.outer if x not in node.proto.input]
        by_name = dict(zip(names, self.inputs))
        for key, attr in BODIES[node.op]:
            g = node.attrs[attr]
            consts = {x: by_name[x].host for x in outer_names(g) if by_name.get(x) is not None
                      and by_name[x].constant and by_name[x].host.nbytes <= CONST_BYTES}
            prog = build_program(sub_model(g, node, consts), f"{node.name}/{key}", subgraph=True)
            _prefix(prog, f"{node.name}/{key}/")
            formal = [vi.name for vi in g.input]
            body = Body(prog, formal, f"{node.name}/{key}/", make_insts)
            body.outer = [(body.tensors[x], by_name[x]) for x in prog.inputs if x not in formal]
            self.bodies[key] = body

    # ---- the flow -----------------------------------------------------------------------
    def execute(self) -> None:
        if not self._placed:   # the subgraphs' nodes run within this node's step
            for body in self.bodies.values():
                for inst in body.insts:
                    for i in inst.family():
                        i.step = self.step
            self._placed = True
        queue = self.rt.queue
        queue.in_order += 1        # a Loop runs its kernels again: no write may overtake them
        try:
            self.run_if() if self.node.op == "If" else self.run_loop()
        finally:
            queue.in_order -= 1

    def _inferred(self, reads: int, layouts: list) -> None:
        """The node's update_shape: its outputs' layouts, known once its subgraph ran (and
        before their realloc decisions, as any node's)."""
        self._rec("update_shape", "infer", "dynamic_output", device_reads=reads,
                  in_shapes=[t.layout.shape if t is not None and t.layout else None for t in self.inputs],
                  out_shapes=[l.shape for l in layouts])

    def _value(self, t: Tensor) -> tuple[np.ndarray, int]:
        """A condition's or trip count's host value, and 1 when it took a device read."""
        if t.host is not None:
            return t.host, 0
        v = self.rt.queue.read_to_host(t)
        # not kept on the tensor: a partial replay runs its producer again without clearing it
        t.host = None
        return v, 1

    def run_if(self) -> None:
        cond, reads = self._value(self.inputs[0])
        key = "then" if bool(np.asarray(cond).reshape(-1)[0]) else "else"
        self._rec("control", "branch", key, device_reads=reads)
        body = self.bodies[key]
        self._bind_outer(body)
        body.run()
        self._inferred(reads, [t.layout for t in body.outputs])
        for src, dst in zip(body.outputs, self.outputs):
            self._hand_out(src, dst)

    def run_loop(self) -> None:
        """ONNX Loop: while i < M (when given) and cond (when given): the body runs on
        (i, cond, carried), its outputs (cond, carried, scan slices)."""
        body, node = self.bodies["body"], self.node
        m_t, c_t = (self.inputs + [None, None])[:2]
        reads = 0
        limit = None
        if m_t is not None:
            v, r = self._value(m_t)
            limit, reads = int(np.asarray(v).reshape(-1)[0]), reads + r
        cond = True
        if c_t is not None:
            v, r = self._value(c_t)
            cond, reads = bool(np.asarray(v).reshape(-1)[0]), reads + r
        n_carried = len(body.inputs) - 2
        carried = self.inputs[2:2 + n_carried]
        self._bind_outer(body)
        reverse = set(node.attrs.get("scan_output_reverse", ()))
        n_scan = self._n_scan = len(body.outputs) - 1 - n_carried
        slices: list = [None] * n_scan
        i = 0
        while (limit is None or i < limit) and cond:
            self._feed_host(body.inputs[0], np.array(i, np.int64))
            self._feed_host(body.inputs[1], np.array(cond, np.bool_))
            self._carry_all(body, carried)
            body.run()
            for k, y in enumerate(body.outputs[1 + n_carried:]):
                slot = limit - 1 - i if k in reverse else i
                slices[k] = self._gather(k, y, slot, slices[k], limit)
            carried = body.outputs[1:1 + n_carried]
            if c_t is not None:
                v, r = self._value(body.outputs[0])
                cond, reads = bool(np.asarray(v).reshape(-1)[0]), reads + r
            i += 1
        why = "cond_false" if not cond else "trip_count"
        self._rec("control", "iterate", why, iterations=i, device_reads=reads)
        stacked = [self._scan_layout(k, i, slices[k]) for k in range(n_scan)]
        self._inferred(reads, [t.layout for t in carried] + stacked)
        for src, dst in zip(carried, self.outputs):
            self._hand_out(src, dst)
        for k, dst in enumerate(self.outputs[n_carried:]):
            self._scan_out(k, dst, stacked[k])

    # ---- values across the boundary -------------------------------------------------------
    def _bind_outer(self, body: Body) -> None:
        """The subgraph's outer-scope inputs alias the outer tensors (read only there)."""
        buffers = self.rt.buffers
        for dst, src in body.outer:
            if dst.capacity:
                buffers.release(dst)
            dst.layout, dst.host, dst.offset = src.layout, src.host, src.offset
            dst.buf = src.buf
            dst.version += 1
            fresh = src.buf is not None and src.dev_version == src.version
            dst.dev_version = dst.version if fresh else -1
            if not fresh:
                dst.buf = None   # uploaded into a buffer of its own if a kernel reads it

    def _feed_host(self, t: Tensor, value: np.ndarray) -> None:
        if t is None:
            return
        if t.host is not None and t.host.dtype == value.dtype and np.array_equal(t.host, value) \
                and t.layout is not None:
            return      # the same value: its readers' deps stay valid
        self.rt.queue.flush()   # its buffer may still be read by the last iteration's kernels
        t.layout = Layout(tuple(value.shape), dtype_from_numpy(value.dtype))
        t.host, t.version = value, t.version + 1

    def _carry_all(self, body: Body, carried: list) -> None:
        """The body inputs take the carried values. One that is another body input passed
        through (a swap: (a, b) -> (b, a)) is copied out first, before its input is written."""
        pairs = list(zip(body.inputs[2:], carried))
        ins = {id(t) for t in body.inputs}
        for k, (dst, src) in enumerate(pairs):
            if src is not dst and id(src) in ins:
                tmp = self._held.setdefault(k, Tensor(f"{self.node.name}:carried{k}"))
                self._carry(tmp, src)
                pairs[k] = (dst, tmp)
        for dst, src in pairs:
            self._carry(dst, src)

    def _carry(self, dst: Tensor, src: Tensor) -> None:
        """`dst` (a body input) takes `src`'s value in a buffer of its own."""
        if dst is src:
            return
        self.rt.queue.flush()
        l = Layout(src.layout.shape, src.layout.dtype)
        dst.layout, dst.version = l, dst.version + 1
        if src.host is not None:     # uploaded when a kernel reads it
            dst.host = src.host
            return
        dst.host = None
        if dst.buf is None or dst.capacity < l.nbytes:
            self.rt.buffers.give(dst, max(l.nbytes, 1))
        if l.nbytes:
            self._copy(dst.buf, 0, src.buf, src.offset * l.itemsize, l.nbytes)
        dst.dev_version = dst.version

    def _copy(self, dst, dst_off: int, src, src_off: int, nbytes: int) -> None:
        """A device-to-device copy in the flow's order (after every kernel decided so far)."""
        q = self.rt.queue
        q.flush()
        cl.enqueue_copy(q.cl_queue, dst, src, byte_count=nbytes, src_offset=src_off, dst_offset=dst_off)

    def _hand_out(self, src: Tensor, dst: Tensor) -> None:
        """A subgraph's output becomes the node's output `dst` (its own buffer: a copy)."""
        dst.layout = Layout(src.layout.shape, src.layout.dtype)
        dst.version += 1
        if dst.layout.count == 0:
            dst.host = np.empty(dst.layout.shape, np_dtype(dst.layout.dtype))
            return
        self._realloc(dst)
        if src.host is not None:     # now: a pooled buffer's last readers may still be queued
            dst.host = src.host
            self.rt.queue.flush()
            self.rt.buffers.upload(dst)
            return
        self._copy(dst.buf, dst.offset * dst.layout.itemsize, src.buf,
                   src.offset * src.layout.itemsize, dst.layout.nbytes)
        dst.host, dst.dev_version = None, dst.version

    def _gather(self, k: int, y: Tensor, slot: int, layout, limit) -> Layout:
        """Slice `slot` of scan output k: `y` copied into its gathering buffer, which grows by
        doubling (a while loop's length is known only at its end)."""
        l = Layout(y.layout.shape, y.layout.dtype)
        if layout is not None and layout != l:
            raise InferenceError(f"Loop node {self.node.name}: scan output {k} has shape "
                                 f"{list(l.shape)} in one iteration, {list(layout.shape)} in another")
        if not l.nbytes:
            return l
        need = (slot + 1) * l.nbytes
        buf, cap = self._stage.get(k, (None, 0))
        if cap < need:
            n = max(need, 2 * cap, (limit or 0) * l.nbytes if limit and limit < 1 << 16 else 0)
            memory = self.rt.buffers.memory
            new = memory.alloc(self.rt.buffers.ctx, n, f"{self.node.name}:scan{k}")
            if buf is not None:
                self._copy(new, 0, buf, 0, cap)
                memory.release(buf, f"{self.node.name}:scan{k}")
            buf, cap = self._stage[k] = (new, n)
        self._copy(buf, slot * l.nbytes, self.rt.buffers.device_buffer(y), y.offset * l.itemsize, l.nbytes)
        return l

    def _scan_layout(self, k: int, n: int, l: Layout | None) -> Layout:
        """Scan output k: `n` slices of layout `l` stacked along a new first axis."""
        if l is None:    # no iteration: the body's declared dims, unknown ones 0 (as onnxruntime)
            vi = self.node.attrs["body"].output[len(self.node.attrs["body"].output) - self._n_scan + k]
            elem = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
            l = Layout(elem, dtype_from_onnx(vi.type.tensor_type.elem_type) or "f32")
        return Layout((n,) + l.shape, l.dtype)

    def _scan_out(self, k: int, dst: Tensor, layout: Layout) -> None:
        dst.layout = layout
        dst.version += 1
        if layout.count == 0:
            dst.host = np.empty(layout.shape, np_dtype(layout.dtype))
            return
        self._realloc(dst)
        self._copy(dst.buf, dst.offset * dst.layout.itemsize, self._stage[k][0], 0, dst.layout.nbytes)
        dst.host, dst.dev_version = None, dst.version
