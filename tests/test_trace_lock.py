"""The trace lock follows the file, not the name: a second run given a symlink or a hard link to
a trace a live run writes is refused before it writes a byte, and the live run's trace stays
whole."""
import os
import signal
import subprocess
import sys
import time

import onnx
from typer.testing import CliRunner

from dyncli.cli import app
from tests.models import mlp
from traces import read_trace
from traces.sinks import TraceBusy, TraceLock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
runner = CliRunner()


def test_lock_refuses_other_names_of_the_same_file(tmp_path):
    trace = tmp_path / "t.jsonl"
    first = TraceLock(str(trace))
    first.acquire()
    try:
        (tmp_path / "sym.jsonl").symlink_to(trace)
        os.link(trace, tmp_path / "hard.jsonl")
        for other in ("sym.jsonl", "hard.jsonl"):
            lock = TraceLock(str(tmp_path / other))
            try:
                lock.acquire()
            except TraceBusy as e:
                assert str(tmp_path / other) in str(e)
            else:
                raise AssertionError(f"{other} was not refused")
            assert not lock._held and lock._fd is None   # a refused lock leaves nothing behind
    finally:
        first.release()
    again = TraceLock(str(tmp_path / "hard.jsonl"))   # free once the first is released
    again.acquire()
    again.release()
    assert sorted(os.listdir(tmp_path)) == ["hard.jsonl", "sym.jsonl", "t.jsonl"]


def test_second_run_through_a_link_is_refused(tmp_path):
    model, trace = tmp_path / "mlp.onnx", tmp_path / "t.jsonl"
    onnx.save(mlp(), model)
    first = subprocess.Popen([sys.executable, "-m", "dyncli", "run", str(model), "--shapes", "2x32*100000",
                              "--trace", str(trace), "-q", "--impls", "dynamic"], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (trace.exists() and '"infer_end"' in trace.read_text()):
            time.sleep(0.2)
        (tmp_path / "sym.jsonl").symlink_to(trace)
        os.link(trace, tmp_path / "hard.jsonl")
        for other, says in (("sym.jsonl", f"is being written by another run (pid {first.pid})"),
                            ("hard.jsonl", "is a trace file another run is writing")):
            r = runner.invoke(app, ["run", str(model), "--shapes", "2x32", "--trace", str(tmp_path / other)])
            assert r.exit_code == 2, r.output
            lines = [line for line in r.stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and says in lines[0] and "Traceback" not in r.output, r.output
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(60)
    assert first.returncode == 130
    _, evs = read_trace(str(trace))
    evs = list(evs)   # one writer only: every line parses, the run ended once
    assert [e["kind"] for e in evs].count("run_end") == 1 and evs[-1]["action"] == "interrupted"
    assert [e["kind"] for e in evs].count("header") == 0
