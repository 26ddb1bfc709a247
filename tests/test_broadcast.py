"""engine/ops/common.broadcast is numpy's broadcasting rule in plain Python (every new shape of a
decode step asks for a few): the same result, or the same refusal, as np.broadcast_shapes."""
import numpy as np
from hypothesis import given, settings, strategies as st

from engine.ops.common import BroadcastError, broadcast

shapes = st.lists(st.lists(st.sampled_from([0, 1, 2, 3, 7]), max_size=6).map(tuple), min_size=1, max_size=4)


@settings(max_examples=400, deadline=None)
@given(shapes)
def test_broadcast_is_numpys(ss):
    try:
        want = tuple(np.broadcast_shapes(*ss))
    except ValueError:
        want = None
    try:
        got = broadcast(*ss)
    except BroadcastError:
        got = None
    assert got == want
    assert got is None or all(type(d) is int for d in got)
