"""`dyncli --version`, `dyncli inspect MODEL` (a model's inputs, outputs, opsets and ops without
running it) and `run --grid` through the command line."""
import json
import os
from collections import Counter
from importlib.metadata import version

import onnx
from onnx import TensorProto, helper
from typer.testing import CliRunner

from dyncli.cli import app

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENCODER = os.path.join(ROOT, "examples", "encoder.onnx")
runner = CliRunner()


def invoke(*args):
    r = runner.invoke(app, [str(a) for a in args])
    return r


def test_version():
    r = invoke("--version")
    assert r.exit_code == 0 and r.stdout == f"dyncli {version('dyncli')}\n"


def test_inspect_encoder_json_and_text():
    model = onnx.load(ENCODER)
    r = invoke("inspect", ENCODER, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert [(i["name"], i["dtype"], i["dims"]) for i in d["inputs"]] == \
        [("input_ids", "int64", ["batch", "seq"]), ("attention_mask", "int64", ["batch", "seq"])]
    assert [(o["name"], o["dtype"], o["dims"]) for o in d["outputs"]] == [("y", "float", ["batch", "seq", 64])]
    assert d["opsets"] == {"ai.onnx": 17} and d["nodes"] == len(model.graph.node)
    assert d["ops"] == dict(Counter(n.op_type for n in model.graph.node)) and d["unsupported"] == []
    assert d["initializers"] == len(model.graph.initializer)
    text = invoke("inspect", ENCODER).stdout.splitlines()
    assert "  input_ids       int64  batch x seq" in text and "  y  float  batch x seq x 64" in text
    assert "unsupported ops: none" in text


def test_inspect_names_unsupported_ops_and_shapeless_inputs(tmp_path):
    x = onnx.ValueInfoProto(name="x")
    x.type.tensor_type.elem_type = TensorProto.FLOAT   # no shape: any rank
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Multinomial", ["x"], ["a"], name="mn1"),
                           helper.make_node("Relu", ["a"], ["b"], name="r"),
                           helper.make_node("Multinomial", ["b"], ["y"], name="mn2")], "g", [x], [y])
    p = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    d = json.loads(invoke("inspect", p, "--json").stdout)
    assert d["inputs"] == [{"name": "x", "dtype": "float", "dims": None}]
    assert d["unsupported"] == [{"op": "Multinomial", "nodes": ["mn1", "mn2"]}]
    text = invoke("inspect", p).stdout
    assert "  x  float  any rank (no declared shape)" in text
    assert "unsupported ops (dyncli run refuses the model): Multinomial (2 nodes: mn1, mn2)" in text


def test_run_grid_through_the_cli(tmp_path):
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, ["a", "b"]) for n in "xy")
    p = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                                opset_imports=[helper.make_opsetid("", 17)]), p)
    r = invoke("run", p, "--shapes", "x:{1..2}x{3..4}", "--grid", "--check", "--json", "--trace", "none")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert [d["inputs"]["x"] for d in s["inferences_detail"]] == [[1, 3], [1, 4], [2, 3], [2, 4]]
    assert s["check"]["passed"] == 4
    assert "--grid" in runner.invoke(app, ["run", "--help"], env={"COLUMNS": "100"}).stdout
