"""Static Transposes (CPUs, from TRANSPOSE_STATIC_MIN elements: dims and strides baked into
copy_strided) against onnxruntime, over shape sequences on one Network that cross the size
threshold (smaller copies keep the shape-agnostic impl), for the perms of a heads split, a
full reversal and a 2-D transpose, float32 and float16."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from engine import Network, build_program
from engine.ops.movement import TRANSPOSE_STATIC_MIN
from tests.conftest import run_vs_ort


def _model(perm, rank, dtype):
    dims = [f"d{i}" for i in range(rank)]
    g = helper.make_graph([helper.make_node("Transpose", ["x"], ["y"], perm=perm)], "t",
                          [helper.make_tensor_value_info("x", dtype, dims)],
                          [helper.make_tensor_value_info("y", dtype, [dims[p] for p in perm])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


CASES = [([0, 2, 1, 3], [(1, 128, 12, 32), (1, 7, 12, 32), (2, 33, 4, 40), (1, 128, 12, 32)]),
         ([3, 2, 1, 0], [(3, 5, 7, 9), (5, 9, 11, 13), (2, 3, 4, 5)]),
         ([1, 0], [(65, 70), (3, 5), (130, 33)])]


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16])
@pytest.mark.parametrize("perm,shapes", CASES)
def test_static_transpose_matches_ort(device, perm, shapes, dtype):
    model = _model(perm, len(perm), dtype)
    net = Network(build_program(model), device, async_compile=False)
    net.impls.device_type = "cpu"
    rng = np.random.default_rng(len(perm))
    np_dt = np.float32 if dtype == TensorProto.FLOAT else np.float16
    for s in shapes:
        run_vs_ort(model, [{"x": rng.standard_normal(s).astype(np_dt)}], rtol=0, atol=0, net=net)
        kind = net.insts[0].bound[0].impl.kind
        assert kind == ("static" if np.prod(s) >= TRANSPOSE_STATIC_MIN else "dynamic"), s
