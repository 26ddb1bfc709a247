"""The trace format: writer/reader round trip, killed and corrupted files, the schema doc."""
import json
import os
import warnings

import pytest

from traces import TraceError, TraceWriter, read_trace
from traces.schema import KINDS, render_markdown

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write(path):
    w = TraceWriter(path, {"model": "m.onnx", "device": "d", "options": {}})
    for it in range(3):
        w.iter = it
        w.event("infer_start", shapes={"x": [1, it]})
        w.event("update_shape", "n1", "Relu", "skip", "shape_unchanged")
        w.event("infer_end", latency_ms=1.0, counters={})
        w.flush()
    w.close()


def test_round_trip(tmp_path):
    p = tmp_path / "t.jsonl"
    _write(p)
    header, events = read_trace(str(p))
    assert header["schema"] == 1 and header["model"] == "m.onnx"
    ev = list(events)
    assert [e["iter"] for e in ev] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert ev[1] == {**ev[1], "kind": "update_shape", "node": "n1", "op": "Relu", "action": "skip",
                     "reason": "shape_unchanged"}


def test_truncated_last_line_is_dropped_with_warning(tmp_path):
    p = tmp_path / "t.jsonl"
    _write(p)
    data = p.read_text()
    p.write_text(data[:-25])  # a kill in the middle of the last line
    header, events = read_trace(str(p))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ev = list(events)
    assert len(ev) == 8 and any("truncated" in str(x.message) for x in w)


def test_corrupt_middle_line_names_line_number(tmp_path):
    p = tmp_path / "t.jsonl"
    _write(p)
    lines = p.read_text().splitlines(keepends=True)
    lines[4] = "{not json\n"
    p.write_text("".join(lines))
    header, events = read_trace(str(p))
    with pytest.raises(TraceError, match=r":5: not JSON"):
        list(events)


def test_not_a_trace(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"kind": "infer_start"}) + "\n")
    with pytest.raises(TraceError, match="header"):
        read_trace(str(p))


def test_schema_doc_is_generated_from_schema():
    with open(os.path.join(ROOT, "docs", "trace-schema.md")) as f:
        assert f.read() == render_markdown()
    for kind in KINDS:
        assert f"`{kind}`" in render_markdown()
