"""The fast path's pieces on their own (engine/fast_path): the signature, the rule that says an
inference of the flow may become a plan, the observer door the services report through, and
the snapshot/restore each node, kernel and tensor owns."""
from __future__ import annotations

from collections import Counter

import numpy as np

from engine import Network, build_program
from engine.bound_kernel import BoundKernel
from engine.device_queue import Observer
from engine.fast_path import FastPath, signature
from engine.fast_path.plans import resource_free
from tests.models import mlp


def test_signature_is_shapes_and_dtypes_plus_values_read_as_shapes():
    a = {"x": np.zeros((2, 3), np.float32), "t": np.array([3, 2], np.int64)}
    b = {"x": np.ones((2, 3), np.float32), "t": np.array([2, 3], np.int64)}
    assert signature(a) == signature(b)                  # data does not matter
    assert signature(a, frozenset({"t"})) != signature(b, frozenset({"t"}))   # values read as shapes do
    assert signature(a) != signature({"x": a["x"].astype(np.float16), "t": a["t"]})
    assert signature(a) != signature({"x": np.zeros((3, 2), np.float32), "t": a["t"]})


def test_resource_free_counts_only_decisions_that_keep_resources(device):
    net = Network(build_program(mlp()), device, impls="dynamic")
    free = Counter({"update_shape.skip": 3, "realloc.reuse": 2, "execute.enqueue": 3, "kernels": 3})
    assert resource_free(net.insts, free)
    assert not resource_free(net.insts, free + Counter({"realloc.alloc": 1}))
    assert not resource_free(net.insts, free + Counter({"update_impl.build": 1}))
    assert not resource_free(net.insts, free + Counter({"device_reads": 1}))
    net.insts[0].pending = ("key", "name", None)        # a static build not taken yet
    assert not resource_free(net.insts, free)


def test_services_report_launches_and_predictor_calls_through_one_observer(device):
    seen = []

    class Spy(Observer):
        def launched(self, bound, kernel, gws, lws):
            seen.append(("launch", bound.call.kernel))

        def predicted(self, tensor, shape, bits):
            seen.append(("predict", tensor.name, tuple(shape)))

    net = Network(build_program(mlp()), device, impls="dynamic", fast_path=False)
    net.queue.observer = Spy()
    net.infer({"x": np.ones((3, 32), np.float32)})
    launches = [s for s in seen if s[0] == "launch"]
    assert len(launches) == net.counters["kernels"] > 0
    predicted = {s[1] for s in seen if s[0] == "predict"}
    assert "y" in predicted and all(s[2][0] == 3 for s in seen if s[0] == "predict" and s[1] == "y")


def test_a_network_with_the_fast_path_observes_through_it(device):
    net = Network(build_program(mlp()), device, impls="dynamic")
    assert isinstance(net.fast, FastPath) and net.queue.observer is net.fast
    off = Network(build_program(mlp()), device, impls="dynamic", fast_path=False)
    assert off.fast is None and type(off.queue.observer) is Observer


def test_nodes_kernels_and_tensors_snapshot_and_restore_their_own_state(device):
    net = Network(build_program(mlp()), device, impls="dynamic", fast_path=False)
    net.infer({"x": np.ones((3, 32), np.float32)})
    inst = next(i for i in net.insts if i.bound)
    state = inst.snapshot()
    assert state[0][0] is inst and any(obj is inst.bound[0] for obj, _ in state)
    before = [(obj, obj.snapshot() if obj is not inst else s) for obj, s in state]
    out = inst.outputs[0]
    t_state = out.snapshot()
    net.infer({"x": np.ones((5, 32), np.float32)})     # moves layouts, calls, shape_info
    assert inst.in_layouts[0].shape == (5, 32) and out.layout.shape[0] == 5
    for obj, s in state:
        obj.restore(s)
    out.restore(t_state)
    assert inst.in_layouts[0].shape == (3, 32) and out.layout.shape[0] == 3
    assert [(obj, obj.snapshot() if obj is not inst else s) for obj, s in inst.snapshot()][1:] == before[1:]


def test_a_bound_kernels_restore_sets_each_field_of_its_state_in_order():
    """BoundKernel.restore unpacks its state at once: each of STATE's fields gets its own value."""
    b = object.__new__(BoundKernel)
    b.slot = None                       # (read when it is collected)
    values = tuple(object() for _ in BoundKernel.STATE)
    b.restore(values)
    assert b.snapshot() == values and all(getattr(b, k) is v for k, v in zip(BoundKernel.STATE, values))
