"""ONNX's own node tests (onnx.backend.test, category `node`) for every op the engine claims,
through dyncli's ONNX backend (dyncli/backend.py).

In scope: every node test whose graph uses only supported ops (dyncli/conformance.py), minus
the explicit exclusions there (each with its reason). All networks share one OpenCL context and
one impl cache (the backend's), so a kernel (source, jit) is built once for the whole module.
`python -m dyncli.conformance` writes the figures `dyncli ops` prints.
"""
import unittest

import numpy as np

import pytest

from dyncli import conformance
from dyncli.backend import DynCliBackend

CASES = conformance.node_cases()
RUN = [c for c in CASES if conformance.excluded_reason(c.name) is None]
EXCLUDED = [c for c in CASES if conformance.excluded_reason(c.name) is not None]
# excluded for an element type: the case cannot even be fed (no such device type)
TYPE_REASONS = {"float16", "bfloat16", "sub-byte", "string"}


def _type_exclusion(name):
    why = conformance.excluded_reason(name)
    return any(why.startswith(t) or t in why.split(":")[0] for t in TYPE_REASONS)


@pytest.mark.parametrize("case", RUN, ids=[c.name for c in RUN])
def test_node(case):
    if case.name in conformance.KNOWN_FAILURES:   # counted as failed in the figure
        with pytest.raises(Exception):
            conformance.run_case(case)
        return
    conformance.run_case(case)


def test_scope_covers_the_new_ops():
    """Every op the engine claims has node tests that run (none is in scope by exclusions only)."""
    ops = {op for c in RUN for op in conformance.graph_ops(c.model)}
    wanted = {"GatherElements", "Range", "Trilu", "Split", "Tile", "Pad", "Not", "And", "Or", "Xor",
              "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "IsNaN", "IsInf", "Neg", "Abs",
              "Exp", "Log", "Reciprocal", "Min", "Max", "Clip", "Gelu", "Softplus", "HardSigmoid",
              "HardSwish", "LeakyRelu", "Elu", "PRelu", "ReduceSum", "ReduceMax", "ReduceMin",
              "ReduceProd", "ReduceL2", "ArgMax", "ArgMin", "CumSum", "ScatterND",
              "ScatterElements", "Einsum", "If", "Loop", "Scan"}
    assert wanted <= ops, sorted(wanted - ops)
    assert len(RUN) >= 600


@pytest.mark.parametrize("case", [c for c in EXCLUDED if not _type_exclusion(c.name)],
                         ids=[c.name for c in EXCLUDED if not _type_exclusion(c.name)])
def test_excluded_case_still_fails(case):
    """An exclusion stands for a missing feature: once the case passes, drop the exclusion."""
    with pytest.raises(Exception):
        conformance.run_case(case)


def test_results_file_matches_the_selection():
    """The results `dyncli ops` prints were written for today's selection and exclusions."""
    doc = conformance.load_results()
    assert doc is not None, "run `python -m dyncli.conformance` to write dyncli/node_tests.json"
    assert set(doc["cases"]) == {c.name for c in CASES}
    for c in CASES:
        want = "excluded" if conformance.excluded_reason(c.name) else \
            "failed" if c.name in conformance.KNOWN_FAILURES else "passed"
        assert doc["cases"][c.name]["status"] == want, c.name


def test_onnx_backend_test_runner():
    """onnx.backend.test.BackendTest drives the backend (a few cases; test_node runs them all)."""
    from onnx.backend.test import BackendTest
    names = ["test_gather_elements_negative_indices", "test_tril", "test_clip_default_int8_min",
             "test_range_float_type_positive_delta", "test_einsum_batch_matmul"]
    bt = BackendTest(DynCliBackend, __name__)
    for n in names:
        bt.include(f"^{n}_cpu$")
    suite = unittest.TestSuite()
    for case in bt.test_cases.values():
        for t in unittest.defaultTestLoader.loadTestsFromTestCase(case):
            if t._testMethodName in {f"{n}_cpu" for n in names}:
                suite.addTest(t)
    res = unittest.TextTestRunner(verbosity=0, stream=open("/dev/null", "w")).run(suite)
    assert res.testsRun == len(names)
    assert not res.failures and not res.errors and not res.skipped, (res.failures, res.errors)


def test_dyncli_ops_prints_the_recorded_figures():
    import json
    from typer.testing import CliRunner
    from dyncli.cli import app
    from engine.ops import supported_ops
    r = CliRunner().invoke(app, ["ops", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    recorded = conformance.summary(conformance.load_results())
    assert doc["node_tests"] == recorded and recorded["run"] == len(RUN)
    rows = {row["op"]: row for row in doc["ops"]}
    assert sorted(rows) == supported_ops()
    assert rows["Gelu"]["opsets"][0] == 20 and rows["Gelu"]["passed"] == rows["Gelu"]["total"] > 0
    assert "bool" in rows["And"]["dtypes"]
    r = CliRunner().invoke(app, ["ops"])
    assert r.exit_code == 0 and f"{recorded['passed']}/{recorded['run']} passed" in r.output
    r = CliRunner().invoke(app, ["ops", "--op", "Det"])
    assert r.exit_code == 2 and "not a supported op" in r.output


def test_backend_supports_model_and_runs_with_engine_options():
    from onnx import TensorProto, helper
    from dyncli import backend

    def model(op):
        g = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

    assert backend.DynCliBackend.supports_model(model("Abs"))
    assert not backend.DynCliBackend.supports_model(model("Det"))
    x = np.array([-1.5, 0.0, 2.0], np.float32)
    (y,) = backend.run(model("Neg"), [x], device="CPU", impls="dynamic", memory_pool=False)
    np.testing.assert_array_equal(y, -x)
    rep = backend.prepare(model("Abs"), "CPU")
    for n in (3, 7, 3):   # one prepared model over several shapes
        v = np.linspace(-1, 1, n).astype(np.float32)
        np.testing.assert_array_equal(rep.run({"x": v})[0], np.abs(v))
