"""The trace lock: a second run given a trace a live run writes (by its name, a symlink or a
hard link: the lock follows the file, not the name) is refused before it writes a byte, and the
live run's trace stays whole; the lock of a killed run is taken over."""
import os
import signal
import subprocess
import sys
import time

import onnx
import pytest
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


def test_second_run_on_the_same_file_refuses_by_any_name(tmp_path):
    model, trace = tmp_path / "mlp.onnx", tmp_path / "t.jsonl"
    onnx.save(mlp(), model)
    (tmp_path / "sym.jsonl").symlink_to(trace)
    first = subprocess.Popen([sys.executable, "-m", "dyncli", "run", str(model), "--shapes", "2x32*100000",
                              "--trace", str(trace), "-q", "--impls", "dynamic"], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (trace.exists() and '"infer_end"' in trace.read_text()):
            time.sleep(0.2)
        assert os.path.exists(f"{trace}.lock")
        os.link(trace, tmp_path / "hard.jsonl")
        busy = (f"is being written by another run (pid {first.pid}); give this run another --trace, "
                f"or remove {trace}.lock if that run is gone")
        for name, says in (("t.jsonl", busy), ("sym.jsonl", busy),
                           ("hard.jsonl", "is a trace file another run is writing (under another name: "
                                          "a hard link); give this run another --trace")):
            r = runner.invoke(app, ["run", str(model), "--shapes", "2x32", "--trace", str(tmp_path / name)])
            assert r.exit_code == 2 and "Traceback" not in r.output, r.output
            lines = [line for line in r.stderr.splitlines() if line.strip()]
            assert lines == [f"error: {tmp_path / name} {says}"], r.stderr
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(60)
    assert first.returncode == 130
    _, evs = read_trace(str(trace))
    evs = list(evs)   # one writer only: every line parses, the run ended once
    assert [e["kind"] for e in evs].count("run_end") == 1 and evs[-1]["action"] == "interrupted"
    assert not os.path.exists(f"{trace}.lock")


def test_stale_lock_of_a_killed_run_is_taken_over(tmp_path):
    trace = tmp_path / "t.jsonl"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "t.jsonl.lock").write_text(str(dead.pid))
    model = tmp_path / "mlp.onnx"
    onnx.save(mlp(), model)
    r = runner.invoke(app, ["run", str(model), "--shapes", "2x32", "--trace", str(trace), "--impls", "dynamic"])
    assert r.exit_code == 0, r.output
    assert not os.path.exists(f"{trace}.lock")
    lock = TraceLock(str(trace))
    lock.acquire()
    assert open(lock.path).read() == str(os.getpid())
    lock.release()


def test_a_flush_cut_by_ctrl_c_leaves_whole_lines(tmp_path):
    """Ctrl-C inside a flush's write (part of the lines on disk) must not leave a cut line in
    the middle of the trace: the next flush (the run's `run_end`) writes those lines again
    from where the whole ones end, each once."""
    from traces import TraceWriter

    class CutOnce:
        def __init__(self, f):
            self.f, self.cut = f, False

        def write(self, data):
            if not self.cut and len(data) > 40:
                self.cut = True
                self.f.write(data[:len(data) // 2])
                self.f.flush()
                raise KeyboardInterrupt
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

    path = tmp_path / "t.jsonl"
    w = TraceWriter(path, {"model": "m"})
    w._f = CutOnce(w._f)
    for k in range(5):
        w.event("execute", f"n{k}", "Relu", "enqueue", kernels=1)
    with pytest.raises(KeyboardInterrupt):
        w.flush()
    w.event("run_end", action="interrupted")
    w.close()
    evs = list(read_trace(str(path))[1])
    assert [e.get("node") for e in evs if e["kind"] == "execute"] == [f"n{k}" for k in range(5)]
    assert [e["kind"] for e in evs][-1] == "run_end"
