"""JSON Lines trace reader: validates the header and each line, streams events."""
from __future__ import annotations

import json
import warnings
from typing import Iterator

from traces.schema import CORE_FIELDS, KINDS, SCHEMA_VERSION


class TraceError(ValueError):
    pass


def read_trace(path: str) -> tuple[dict, Iterator[dict]]:
    """Return (header, events). Events are read lazily; a truncated last line (a killed run)
    is dropped with a warning, any other bad line raises TraceError naming its number."""
    f = open(path, encoding="utf-8")
    first = f.readline()
    try:
        header = json.loads(first)
    except json.JSONDecodeError as e:
        f.close()
        raise TraceError(f"{path}:1: not a dyncli trace header ({e.msg})") from None
    if header.get("kind") != "header" or header.get("schema") != SCHEMA_VERSION:
        f.close()
        raise TraceError(f"{path}:1: expected a header with schema {SCHEMA_VERSION}")

    def events() -> Iterator[dict]:
        with f:
            lineno = 1
            pending = None
            for line in f:
                lineno += 1
                if pending is not None:
                    raise pending
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    if not line.endswith("\n"):  # last line cut short by a kill
                        warnings.warn(f"{path}:{lineno}: truncated last line ignored")
                        return
                    raise TraceError(f"{path}:{lineno}: not JSON ({e.msg})") from None
                missing = [k for k in CORE_FIELDS if k not in rec]
                if missing or rec["kind"] not in KINDS:
                    raise TraceError(f"{path}:{lineno}: bad event (missing {missing} "
                                     f"or unknown kind {rec.get('kind')!r})")
                yield rec

    return header, events()
