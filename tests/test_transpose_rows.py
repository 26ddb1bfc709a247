"""CPU Transposes by rows (cl/movement.cl copy_rows: a work-item per row of the output's last
dim) against onnxruntime, over shape sequences on one Network (rows of 1 to 70 elements), for
the perms of a heads split (rows contiguous on both sides), a full reversal and a 2-D transpose
(rows strided in the source), float32 and float16; the GPU kind keeps copy_strided."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from engine import Network, build_program
from tests.conftest import run_vs_ort


def _model(perm, dtype):
    dims = [f"d{i}" for i in range(len(perm))]
    g = helper.make_graph([helper.make_node("Transpose", ["x"], ["y"], perm=perm)], "t",
                          [helper.make_tensor_value_info("x", dtype, dims)],
                          [helper.make_tensor_value_info("y", dtype, [dims[p] for p in perm])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


# input shapes; the output's last dim is the input's dim perm[-1]
CASES = [([0, 2, 1, 3], [(1, 128, 12, 32), (1, 7, 12, 7), (2, 33, 4, 1), (1, 5, 3, 9), (1, 128, 12, 32)]),
         ([3, 2, 1, 0], [(9, 5, 7, 3), (7, 5, 11, 13), (8, 3, 4, 5)]),
         ([1, 0], [(65, 70), (7, 5), (130, 33)])]


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16])
@pytest.mark.parametrize("perm,shapes", CASES)
def test_transpose_rows_match_ort(device, perm, shapes, dtype, kind):
    model = _model(perm, dtype)
    net = Network(build_program(model), device)
    net.impls.device_type = kind
    rng = np.random.default_rng(len(perm))
    np_dt = np.float32 if dtype == TensorProto.FLOAT else np.float16
    for s in shapes:
        run_vs_ort(model, [{"x": rng.standard_normal(s).astype(np_dt)}], rtol=0, atol=0, net=net)
        assert net.insts[0].bound[0].call.kernel == ("copy_rows" if kind == "cpu" else "copy_strided"), s
