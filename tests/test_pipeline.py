"""The preprocessing pipeline's decisions (issue 3), read from the trace of real runs; every
run's outputs are compared with onnxruntime as well."""
import numpy as np

from engine import Network, PreallocSettings, build_program
from tests.conftest import run_vs_ort
from tests.models import encoder_block, mlp
from traces import MemoryTrace


def _encoder_feeds(rng, b, s):
    return {"x": rng.standard_normal((b, s, 64)).astype(np.float32),
            "mask": (rng.random((b, s)) > 0.2).astype(np.float32)}


def _traced(model, device, prealloc=PreallocSettings()):
    trace = MemoryTrace()
    return Network(build_program(model), device, trace=trace, prealloc=prealloc), trace


def test_repeated_shape_skips_every_update_shape_and_set_args(device):
    rng = np.random.default_rng(0)
    net, trace = _traced(encoder_block(), device)
    run_vs_ort(encoder_block(), [_encoder_feeds(rng, 2, 7), _encoder_feeds(rng, 2, 7)], device,
               rtol=2e-4, atol=2e-5, net=net)
    shapes = trace.of(1, "update_shape")
    assert shapes and all(e["action"] == "skip" for e in shapes)
    by_op = {e["reason"] for e in shapes if e["op"] == "Shape"}
    assert by_op == {"shape_of_unchanged"}
    assert {e["reason"] for e in shapes if e["op"] != "Shape"} <= {
        "shape_unchanged", "shape_of_subgraph_unchanged"}
    assert not trace.of(1, "realloc", "alloc")
    assert net.counters.get("bytes_allocated", 0) == 0
    set_args = trace.of(1, "set_args")
    assert set_args and all(e["action"] == "skip" for e in set_args)
    assert not trace.of(1, "update_impl")


def _reshape_by_shape_of() -> "onnx.ModelProto":
    """y = Relu(Reshape(x, concat([-1], Shape(x, start=1) * [1, 1]))): a shape subgraph whose
    Shape source reads only the non-batch dims."""
    from onnx import TensorProto, helper, numpy_helper
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="Shape_tail", start=1),
        helper.make_node("Mul", ["s", "ones"], ["s1"], name="Mul_shape"),
        helper.make_node("Concat", ["minus1", "s1"], ["target"], name="Concat_target", axis=0),
        helper.make_node("Relu", ["x"], ["r"], name="Relu"),
        helper.make_node("Reshape", ["r", "target"], ["y"], name="Reshape"),
    ]
    inits = [numpy_helper.from_array(np.array([1, 1], np.int64), "ones"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    g = helper.make_graph(nodes, "reshape_by_shape_of",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 8])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_shape_subgraph_unchanged_when_only_batch_changes(device):
    rng = np.random.default_rng(1)
    model = _reshape_by_shape_of()
    net, trace = _traced(model, device)
    seq = [{"x": rng.standard_normal((b, s, 8)).astype(np.float32)} for b, s in [(1, 5), (3, 5), (3, 6)]]
    run_vs_ort(model, seq, device, net=net)
    us = {e["node"]: e for e in trace.of(1, "update_shape")}
    assert us["Shape_tail"]["action"] == "infer" and us["Shape_tail"]["value_unchanged"]
    for name in ("Mul_shape", "Concat_target"):
        assert (us[name]["action"], us[name]["reason"]) == ("skip", "shape_of_subgraph_unchanged")
    assert us["Relu"]["action"] == us["Reshape"]["action"] == "infer"
    # a new sequence length reaches the subgraph: it runs again
    us2 = {e["node"]: e for e in trace.of(2, "update_shape")}
    assert us2["Mul_shape"]["action"] == us2["Concat_target"]["action"] == "infer"


def test_growth_by_one_preallocates_ten_steps_ahead(device):
    rng = np.random.default_rng(2)
    lengths = list(range(8, 24))
    seq = [_encoder_feeds(rng, 1, s) for s in lengths]
    net, trace = _traced(encoder_block(), device)
    run_vs_ort(encoder_block(), seq, device, rtol=2e-4, atol=2e-5, net=net)
    allocs = [len(trace.of(i, "realloc", "alloc")) for i in range(len(lengths))]
    predicted = [i for i in range(len(lengths))
                 if any(e.get("predicted") for e in trace.of(i, "realloc", "alloc"))]
    # three growths (nothing -> 8 -> 9 -> 10) fill the history of 3 with a fixed step: the
    # buffers of 10 are allocated 10 steps ahead (room up to 20)
    assert predicted[:1] == [2], (allocs, predicted)
    assert all(a > 0 for a in allocs[:3])
    assert allocs[3:13] == [0] * 10, allocs     # 11..20 reuse every buffer
    assert allocs[13] > 0 and predicted[1] == 13

    off, trace_off = _traced(encoder_block(), device, PreallocSettings.parse("0 0 0 1.0"))
    run_vs_ort(encoder_block(), seq, device, rtol=2e-4, atol=2e-5, net=off)
    allocs_off = [len(trace_off.of(i, "realloc", "alloc")) for i in range(len(lengths))]
    assert all(a > 0 for a in allocs_off), allocs_off
    assert not any(e.get("predicted") for e in trace_off.events)


def test_shrink_reuses_and_a_tenth_reclaims(device):
    rng = np.random.default_rng(3)
    net, trace = _traced(mlp(), device)
    seq = [{"x": rng.standard_normal((b, 32)).astype(np.float32)} for b in (200, 50, 19, 21)]
    run_vs_ort(mlp(), seq, device, net=net)
    assert not trace.of(1, "realloc", "alloc")          # 50 of 200: reuse
    assert trace.of(1, "realloc", "reuse")
    reclaimed = trace.of(2, "realloc", "alloc")          # 19 < 200 / 10: give the memory back
    assert reclaimed and all(e["reason"] == "reclaim" for e in reclaimed)
    assert net.used_bytes < sum(e["bytes"] for e in trace.of(0, "realloc", "alloc"))
