"""Shape values the model fixes (engine/static_dims.py): Gather(Shape(t), constant index) over
dims ONNX inference knows folds to a constant, and the shape math after it too; a dim that
varies keeps its Gather. Values against onnxruntime over changing shapes."""
import numpy as np
import onnx
from onnx import TensorProto, helper

from engine import Network, build_program
from tests.conftest import run_vs_ort

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(opset: int) -> onnx.ModelProto:
    """y = x / sqrt(x.shape[-1]) * x.shape[1]: the last dim is declared (8), the second is not;
    the Shape of the second read starts at 1 where the opset allows (start attribute)."""
    start = {"start": 1} if opset >= 15 else {}
    idx1 = 0 if start else 1
    nodes = [helper.make_node("Shape", ["x"], ["sx"], name="shape_last"),
             helper.make_node("Gather", ["sx", "minus1"], ["d"], name="last_dim", axis=0),
             helper.make_node("Cast", ["d"], ["df"], name="cast", to=F),
             helper.make_node("Sqrt", ["df"], ["sd"], name="sqrt"),
             helper.make_node("Div", ["x", "sd"], ["xs"], name="div"),
             helper.make_node("Shape", ["x"], ["sx2"], name="shape_mid", **start),
             helper.make_node("Gather", ["sx2", "i1"], ["m"], name="mid_dim", axis=0),
             helper.make_node("Cast", ["m"], ["mf"], name="cast_mid", to=F),
             helper.make_node("Mul", ["xs", "mf"], ["y"], name="mul")]
    g = helper.make_graph(nodes, "dims", [helper.make_tensor_value_info("x", F, ["a", "b", 8])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [helper.make_tensor("minus1", I64, [], [-1]), helper.make_tensor("i1", I64, [], [idx1])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def test_a_declared_dim_folds_a_varying_one_stays(device):
    for opset in (13, 17):
        model = _model(opset)
        prog = build_program(model)
        names = {n.name for n in prog.nodes}
        assert not names & {"shape_last", "last_dim", "cast", "sqrt"}, names   # folded away
        assert {"shape_mid", "mid_dim"} <= names                               # b varies
        rng = np.random.default_rng(opset)
        seq = [{"x": rng.standard_normal((a, b, 8)).astype(np.float32)} for a, b in [(1, 3), (2, 5), (1, 1)]]
        run_vs_ort(model, seq, device, rtol=1e-6, atol=1e-6, net=Network(prog, device))
