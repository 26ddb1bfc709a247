"""What goes into a trace file, in front of the writer (the writer's encoding is its own):
`--trace-level decisions` (`DecisionsOnly`), `--trace none` (`NoTrace`) and the lock that keeps
two runs from writing one trace (`TraceLock`)."""
from __future__ import annotations

import fcntl
import os
import time

# `--trace-level decisions`: the kinds kept (docs/trace-schema.md "Trace levels"): the runtime's
# decisions and the per-inference records; per-node `set_args`, `execute` and `compile` are left
# out (their counts stay in each infer_end's `counters`).
DECISION_KINDS = frozenset({"header", "infer_start", "update_shape", "update_impl", "update_weights",
                            "realloc", "in_place_concat", "fusion", "kv_cache", "control", "plan",
                            "infer_end",
                            "check", "run_end"})
TRACE_LEVELS = ("all", "decisions")


class DecisionsOnly:
    """Wraps a writer: `event()` passes only DECISION_KINDS on; everything else is the writer's."""

    def __init__(self, writer):
        self._w = writer

    def event(self, kind: str, *args, **fields) -> None:
        if kind in DECISION_KINDS:
            self._w.event(kind, *args, **fields)

    @property
    def iter(self) -> int:
        return self._w.iter

    @iter.setter
    def iter(self, value: int) -> None:
        self._w.iter = value

    @property
    def spent_s(self) -> float:      # (the writer's clock, which the accounting also sets)
        return self._w.spent_s

    @spent_s.setter
    def spent_s(self, value: float) -> None:
        self._w.spent_s = value

    def __getattr__(self, name):
        return getattr(self._w, name)


class NoTrace:
    """`--trace none`: the writer's interface, writing nothing (so the engine builds no event
    for it: engine/decisions.py)."""
    path = "none"
    keeps_nothing = True

    def __init__(self):
        self.iter = -1

    def event(self, *args, **fields) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class TraceBusy(RuntimeError):
    """Another live process writes this trace."""


class TraceLock:
    """Keeps two runs from writing one trace file, whatever names they give it. Two locks:

    - `REALPATH.lock` next to the trace's real path (symlinks resolved), holding the writer's
      pid, created exclusively: a lock whose process is gone (a killed run) is taken over, a
      live one refuses (TraceBusy, naming the pid);
    - an exclusive flock(2) on the trace file itself, held open until release: it belongs to
      the file (its inode), so a hard link, which resolves to another path, is refused too. The
      kernel drops it when the process dies.
    """

    def __init__(self, trace_path: str):
        self.trace = str(trace_path)
        self.path = os.path.realpath(self.trace) + ".lock"
        self._held = False
        self._fd: int | None = None

    def acquire(self) -> None:
        self._acquire_pid_file()
        try:
            self._lock_file()
        except BaseException:
            self.release()
            raise

    def _lock_file(self) -> None:
        """flock the trace file (created empty when missing, never truncated here: the writer
        truncates it once the lock is held)."""
        fd = os.open(self.trace, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise TraceBusy(f"{self.trace} is a trace file another run is writing (under another "
                            "name: a hard link); give this run another --trace") from None
        self._fd = fd

    def _acquire_pid_file(self) -> None:
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                pid = _lock_pid(self.path)
                if pid is None and _young(self.path):   # its run is writing its pid now
                    pid = 0
                if pid == 0 or pid is not None and _alive(pid):
                    raise TraceBusy(f"{self.trace} is being written by another run (pid {pid or '?'}); "
                                    f"give this run another --trace, or remove {self.path} if that "
                                    "run is gone") from None
                try:
                    os.unlink(self.path)   # stale: its run was killed
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            self._held = True
            return
        raise TraceBusy(f"{self.trace}: could not take the lock {self.path}")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)   # drops the flock
            self._fd = None
        if self._held:
            self._held = False
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def _lock_pid(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as f:
            return int(f.read().strip() or -1)
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process: alive
        return True
    return True


def _young(path: str) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime < 5
    except OSError:
        return False
