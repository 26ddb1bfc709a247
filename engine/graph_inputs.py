"""Graph inputs, the plugin's external memory: a host value uploaded into the input's buffer,
or an output of the previous inference fed back on the device (--feedback), each with its
`realloc external` decision."""
from __future__ import annotations

import numpy as np

from engine.decisions import InputNode
from engine.fast_path.plans import input_array
from engine.layout import Layout, dtype_from_numpy
from engine.memory import Tensor
from engine.program import ModelError


class GraphInputs:
    def __init__(self, program, buffers, decisions, by_value: frozenset, kv_pasts: set):
        self.names = program.inputs
        self.tensors = buffers.tensors
        self.buffers, self.decisions = buffers, decisions
        self.by_value, self.kv_pasts = by_value, kv_pasts

    def set(self, feeds: dict, fed_back: dict) -> None:
        """Every graph input of an inference: from `feeds`, or fed back (`fed_back`: input ->
        the previous inference's output)."""
        aliased = []                    # (a decode step's 24 caches: counted at once, one line)
        for name in self.names:
            if name in fed_back:
                if self.feed_back(name, self.tensors[fed_back[name]], feeds.get(name)):
                    aliased.append(name)
                continue
            if name not in feeds:
                raise ModelError(f"no value for input {name!r}")
            self.set_input(name, feeds[name])
        if aliased:
            d = self.decisions
            d.count_many(len(aliased), "realloc", "external", "feedback_alias", bytes=0)
            if d.traced:                # the reader expands it into one event per input
                d.trace.event("realloc", "", "", "external", "feedback_alias", inputs=aliased, bytes=0)

    def set_input(self, name: str, value: np.ndarray) -> None:
        t = self.tensors[name]
        value = input_array(value, name in self.by_value)
        t.layout = Layout(tuple(int(d) for d in value.shape), dtype_from_numpy(value.dtype))
        t.host = value
        t.version += 1
        action = "reuse" if t.buf is not None and t.capacity >= value.nbytes else "alloc"
        self.buffers.upload(t)
        self.buffers.memory.note_live(name, value.nbytes)
        self.decisions.record("realloc", "external", action, InputNode(name), bytes=value.nbytes)

    def feed_back(self, name: str, src: Tensor, value: np.ndarray | None) -> bool:
        """Input `name` takes output `src` of the previous inference without leaving the device:
        the KV-cache concat that produced it keeps appending into that buffer (alias: True, for
        the caller to record with the others); any other input gets a device-to-device copy
        into its own buffer (the producer may overwrite its output buffer before every reader
        of the input has run)."""
        t = self.tensors[name]
        t.layout, t.version = src.layout, t.version + 1
        t.host = np.array(value) if value is not None and name in self.by_value else value
        if name in self.kv_pasts:
            if t.capacity:
                self.buffers.release(t)
            t.buf, t.offset = src.buf, src.offset
            t.dev_version = t.version
            return True
        if src.layout.pad is not None:  # a padded KV buffer fed to some other input
            self.set_input(name, value if value is not None else self.buffers.queue.read_to_host(src))
            return False
        nbytes = src.layout.nbytes
        if t.buf is None or t.capacity < nbytes:
            self.buffers.give(t, nbytes)
        t.offset = 0
        if nbytes:
            self.buffers.queue.copy(t.buf, src.buf, nbytes, src.offset * src.layout.itemsize)
        self.buffers.memory.note_live(name, nbytes)
        t.dev_version = t.version
        self.decisions.record("realloc", "external", "feedback_copy", InputNode(name), bytes=nbytes)
        return False
