"""One-line messages for failures that reach the user: the one place that turns an OSError
into words (no exception class names; `--debug` shows the traceback)."""
from __future__ import annotations

import errno
import os

_WHY = {
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EISDIR: "it is a folder",
    errno.ENOTDIR: "a part of the path is not a folder",
    errno.ENOSPC: "no space left on the device",
    errno.EROFS: "the file system is read-only",
    errno.ENAMETOOLONG: "the name is too long",
    errno.EEXIST: "it already exists",
}


def os_error(doing: str, path, e: OSError) -> str:
    """'cannot DOING PATH: why', e.g. 'cannot write the trace /x/t.jsonl: the folder /x does
    not exist'."""
    path = os.fspath(path)
    if e.errno == errno.ENOENT:
        folder = os.path.dirname(os.path.abspath(path))
        why = "no such file" if os.path.isdir(folder) else f"the folder {folder} does not exist"
    else:
        why = _WHY.get(e.errno) or (e.strerror or str(e) or "unknown error").lower()
    return f"cannot {doing} {path}: {why}"
