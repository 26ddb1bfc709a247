"""Python's cyclic garbage collector and a running network.

A network's long-lived objects (its nodes, memo tables, the fast path's plans with their
snapshots of every node's state) are hundreds of thousands of tracked objects, and every
collection of the oldest generation walks them all: on the MiniLM-width test BERT (PoCL host,
session 9) such a collection took 70-130 ms, and one landing in the timed pass of `dyncli
bench` raised a 200-inference mean on the H200 by 0.3-0.6 ms with the median unchanged.
What exists once the network is built and warm is frozen (gc.freeze: the collector no longer
walks it; reference counting still frees it), as Python servers do after warm-up, and let go
when the command's inferences are done: `dyncli bench` before its timed passes, `dyncli run`
after its first inference (which builds most of what the network keeps).
"""
from __future__ import annotations

import gc
from contextlib import contextmanager


def freeze_long_lived() -> None:
    """What exists now lives as long as the command's inferences: the collector stops walking
    it (gc.unfreeze lets it go)."""
    gc.collect()
    gc.freeze()


@contextmanager
def long_lived_frozen():
    freeze_long_lived()
    try:
        yield
    finally:
        gc.unfreeze()
