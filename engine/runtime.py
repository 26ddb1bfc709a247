"""The runtime services a node's flow uses, made by the network and handed to every
PrimitiveInst: the device queue, the buffers, the impls and the decisions log."""
from __future__ import annotations

from dataclasses import dataclass, field

import pyopencl as cl

from engine.buffers import Buffers
from engine.decisions import Decisions
from engine.device_queue import DeviceQueue
from engine.impl_manager import ImplManager
from engine.memo import SharedMemos


@dataclass
class Runtime:
    device: cl.Device
    queue: DeviceQueue
    buffers: Buffers
    impls: ImplManager
    decisions: Decisions
    # Shape nodes whose value changed in this inference: the host nodes they feed re-run
    shape_of_changed: set = field(default_factory=set)
    # the pure functions' memo tables nodes of one class share (engine/memo.py)
    memos: SharedMemos = field(default_factory=SharedMemos)
