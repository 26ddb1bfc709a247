"""Runtime tensors: where a value lives (device buffer and/or host array) and its layout."""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np
import pyopencl as cl

from engine.layout import Layout
from engine.shape_predictor import BufferState


@dataclass(eq=False)
class Tensor:
    """One tensor of the running network. A device value is (buf, offset in elements); a host
    value is an ndarray. Views share their source's buffer. `version` changes whenever the
    value may have changed, so users can tell whether a host dep needs re-reading."""
    name: str
    layout: Layout | None = None
    buf: cl.Buffer | None = None
    offset: int = 0
    host: np.ndarray | None = None
    version: int = 0
    dev_version: int = -1          # version the device copy holds (uploads of host values)
    capacity: int = 0              # bytes of `buf` owned by this tensor (0 for views)
    constant: bool = False
    by_other: bool = False         # a slice of an in-place concat's buffer (realloc `by_other`)
    # realloc_if_needed state (max size seen, predictor history key) of the buffer: per tensor,
    # so a fused node and its unfused fallback manage one buffer
    state: BufferState = field(default_factory=BufferState)
    dev_src: object = None         # the host array last uploaded into `buf` (plan replays)

    # what the flow reads back from the previous inference (a plan replay puts it back): all
    # but `dev_src` (physical: what the device holds now) and the fixed `name` and `constant`
    STATE = ("layout", "buf", "offset", "host", "version", "dev_version", "capacity", "by_other",
             "state")

    def snapshot(self) -> tuple:
        return _STATE_OF(self.__dict__)     # (one C call: a growth takes a hundred of them)

    def restore(self, values: tuple) -> None:
        # one C-level update (no STATE name is a property): plan replays put back hundreds
        self.__dict__.update(zip(self.STATE, values))

    def moved_into(self, values: tuple) -> tuple:
        """Snapshot `values` (STATE's order) with this tensor's buffer as it is now: the buffer,
        offset, capacity and predictor state; the rest as they were (a growth moves buffers
        and changes nothing else of a tensor: engine/fast_path/growth.py rebound)."""
        layout, _, _, host, version, dev_version, _, by_other, _ = values
        return layout, self.buf, self.offset, host, version, dev_version, self.capacity, by_other, self.state


_STATE_OF = itemgetter(*Tensor.STATE)
