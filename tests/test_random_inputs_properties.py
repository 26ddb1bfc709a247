"""Property tests: garbage given to any spec option is one line and exit 2, never a
traceback; random shape sequences (growth, shrink, repeats, zero-size dims) on generated models
equal onnxruntime at every inference. Example counts are kept small for CI."""
import os
import tempfile

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dyncli.cli import app
from engine import Network, build_program
from tests.conftest import run_vs_ort
from tests.models import masked_attention, mlp

runner = CliRunner()
MODEL_DIR = tempfile.mkdtemp(prefix="dyncli-prop-")
MLP = os.path.join(MODEL_DIR, "mlp.onnx")
onnx.save(mlp(), MLP)

# text near the grammars (digits, separators, ranges, brackets, names) and anything at all
SPEC_ALPHABET = "0123456789x{}.,:*[]?- scalarx_idmask/\"'\\\t"
garbage = st.one_of(st.text(alphabet=SPEC_ALPHABET, max_size=30), st.text(max_size=20))
FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _one_line_or_ok(args: list) -> None:
    r = runner.invoke(app, ["run", MLP, "--trace", "none", "-q", *args])
    assert "Traceback" not in r.output, (args, r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.exception)
    if r.exit_code != 0:
        assert r.exit_code == 2, (args, r.output)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, r.stderr)


# Each option's garbage next to a second option that fails later, so that garbage which
# happens to be valid still ends the run before it executes anything.
GARBAGE_ARGS = {
    "--shapes": lambda t: ["--shapes", t, "--shapes-file", os.path.join(MODEL_DIR, "none.json")],
    "--model-shape": lambda t: ["--shapes", "2x32", "--model-shape", t, "--prealloc", "bad"],
    "--input-range": lambda t: ["--shapes", "2x32", "--input-range", t, "--trace-level", "bad"],
    "--prealloc": lambda t: ["--shapes", "2x32", "--prealloc", t, "--trace-level", "bad"],
    "--expect": lambda t: ["--shapes", "2x32", "--expect", t, "--trace-level", "bad"],
}


@pytest.mark.parametrize("option", list(GARBAGE_ARGS))
@FAST
@given(text=garbage)
def test_garbage_option(option, text):
    _one_line_or_ok(GARBAGE_ARGS[option](text))


@FAST
@given(st.one_of(garbage, st.binary(max_size=40).map(lambda b: b.decode("latin-1"))))
def test_garbage_shapes_file(content):
    path = os.path.join(MODEL_DIR, "shapes.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(content)
    _one_line_or_ok(["--shapes-file", path, "--prealloc", "bad"])


# ---- random shape sequences against onnxruntime ------------------------------------------
def _seq(draw_dims):
    """A shape sequence with growth, shrink and repeats: a list of dims with some repeated."""
    return st.lists(st.tuples(draw_dims, st.integers(1, 2)), min_size=1, max_size=5).map(
        lambda xs: [d for d, times in xs for _ in range(times)])


@settings(max_examples=8, deadline=None)
@given(_seq(st.integers(0, 12)))
def test_mlp_random_batches_match_onnxruntime(device, batches):
    model = mlp()
    rng = np.random.default_rng(len(batches))
    feeds = [{"x": rng.standard_normal((b, 32)).astype(np.float32)} for b in batches]
    net = Network(build_program(model), device, impls="dynamic")
    run_vs_ort(model, feeds, net=net, check_nonconstant=False)


@settings(max_examples=6, deadline=None)
@given(_seq(st.tuples(st.integers(1, 2), st.integers(0, 6), st.integers(1, 9))))
def test_attention_random_shapes_match_onnxruntime(device, shapes):
    model = masked_attention()
    rng = np.random.default_rng(len(shapes))
    feeds = []
    for b, s, l in shapes:
        f = {"q": (b, 2, s, 8), "k": (b, 2, l, 8), "v": (b, 2, l, 8), "mask": (b, 1, 1, l)}
        feeds.append({n: rng.standard_normal(d).astype(np.float32) for n, d in f.items()})
    net = Network(build_program(model), device, impls="dynamic")
    run_vs_ort(model, feeds, net=net, check_nonconstant=False)
