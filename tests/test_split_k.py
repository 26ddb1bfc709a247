"""Split-K GEMM and the internal buffers it needs (an impl's scratch follows the same
reuse rules as outputs, memory pool included). Compared with onnxruntime every inference."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import pytest

from tests.conftest import run_traced


@pytest.fixture(autouse=True)
def _split_k_on_every_device(monkeypatch):
    """Split-K runs on GPUs only (engine/ops/matmul.py SPLITK_DEVICES: on PoCL the register
    tile is faster); these tests follow its scratch buffers, so they ask for it everywhere, and
    leave GEMVs to it rather than to the GEMV kernel (GPUs, tests/test_gemv.py)."""
    monkeypatch.setattr("engine.ops.matmul.SPLITK_DEVICES", ("gpu", "cpu"))
    monkeypatch.setattr("engine.ops.matmul.GEMV_DEVICES", ())


def _two_matmuls() -> onnx.ModelProto:
    """x[b, m, 512] @ W1[512, 1024] + b1 -> Relu -> @ W2[1024, 512]: both GEMMs split K when m
    is small (8 and 16 splits: partial sums of the same size, 32 KiB per row)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((512, 1024)) / 16).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.1, 1024).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((1024, 512)) / 24).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="MatMul_1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="Add_bias"),
             helper.make_node("Relu", ["hb"], ["r"], name="Relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="MatMul_2")]
    g = helper.make_graph(nodes, "two_matmuls",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "m", 512])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "m", 512])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _gemm_trans_b() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((40, 768)).astype(np.float32) / 20, "w"),
             numpy_helper.from_array(rng.standard_normal(40).astype(np.float32), "c")]
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="Gemm", transB=1, alpha=0.5)],
                          "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", 768])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", 40])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _internal(trace, it):
    return [(e["node"], e["action"], e["buffer"]) for e in trace.of(it, "realloc") if "buffer" in e]


def test_split_k_scratch_is_reused_and_pooled(device):
    rng = np.random.default_rng(2)
    shapes = [(1, 1), (1, 1), (2, 2), (1, 3), (1, 9), (1, 1)]
    seq = [{"x": rng.standard_normal((b, m, 512)).astype(np.float32)} for b, m in shapes]
    net, trace = run_traced(_two_matmuls(), seq, device, atol=1e-4)
    # inference 0: the first GEMM allocates its partial sums; the second takes that buffer from
    # the pool (same size, the first GEMM is done with it)
    assert _internal(trace, 0) == [("MatMul_1", "alloc", "internal0"), ("MatMul_2", "from_pool", "internal0")]
    enq = {e["node"]: e["kernels"] for e in trace.of(0, "execute", "enqueue")}
    assert enq == {"MatMul_1": 2, "MatMul_2": 2}          # partial + reduce (bias, Relu fused)
    # the same shape: realloc_if_needed does not run (the plugin reallocates only after
    # update_impl), nothing allocated, arguments kept
    assert _internal(trace, 1) == []
    assert not trace.of(1, "realloc", "alloc") and not trace.of(1, "set_args", "set")
    # 2x2 rows need 4x the scratch: new buffers; 3 rows fit what 4 rows took
    assert {a for _, a, _ in _internal(trace, 2)} <= {"alloc", "from_pool"}
    assert [a for _, a, _ in _internal(trace, 3)] == ["reuse", "reuse"]
    # 9 rows: on a CPU the register-tiled kernel, no scratch; on a GPU the local-memory GEMM
    # still splits the second GEMM's long K (1024) across work-groups, its grid being small
    # (engine/ops/matmul.py), and keeps its scratch
    if net.impls.device_type == "cpu":
        assert _internal(trace, 4) == [] and {e["kernels"] for e in trace.of(4, "execute", "enqueue")} == {1}
    else:
        assert _internal(trace, 4) == [("MatMul_2", "reuse", "internal0")]
        assert {e["node"]: e["kernels"] for e in trace.of(4, "execute", "enqueue")} == {"MatMul_1": 1, "MatMul_2": 2}
    assert [a for _, a, _ in _internal(trace, 5)] == ["reuse", "reuse"]


def test_split_k_gemm_trans_b_alpha_bias(device):
    rng = np.random.default_rng(3)
    seq = [{"x": rng.standard_normal((m, 768)).astype(np.float32)} for m in (1, 4, 2, 16)]
    net, trace = run_traced(_gemm_trans_b(), seq, device, atol=1e-4)
    assert [len(_internal(trace, i)) for i in range(4)] == [1, 1, 1, 0]
