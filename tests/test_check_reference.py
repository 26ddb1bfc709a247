"""--check's reference: an onnxruntime older than the onnx that wrote the model refuses its IR
version outright; the model is checked declared at the newest IR version that runtime reads,
and the run says so in one line."""
from __future__ import annotations

import numpy as np
import onnx
from typer.testing import CliRunner

from dyncli.check import Reference
from dyncli.cli import app
from tests.models import mlp


def test_a_newer_ir_version_is_checked_at_the_runtime_s_newest():
    m = mlp()
    m.ir_version = 99                       # newer than any onnxruntime reads
    ref = Reference(m)
    assert ref.ir_declared is not None and ref.ir_declared < 99
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    assert ref.run({"x": x})["y"].shape == (3, 10)


def test_the_run_says_it_in_one_line(tmp_path):
    m = mlp()
    m.ir_version = 99
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    r = CliRunner().invoke(app, ["run", str(path), "--shapes", "x:3x32", "--check", "--trace", "none", "-q"])
    assert r.exit_code == 0, r.output
    lines = [line for line in r.output.splitlines() if "reads IR versions up to" in line]
    assert len(lines) == 1 and "IR 99" in lines[0]
