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


def test_fed_back_aliases_are_one_line_read_as_one_event_per_input(tmp_path):
    """A decode step's caches fed back are written as one `realloc external feedback_alias`
    line naming them; the reader (and the in-memory trace) gives one event per input, node and
    op as the flow would; a line whose `inputs` is not an array of names is refused."""
    from traces import MemoryTrace
    p = tmp_path / "t.jsonl"
    w = TraceWriter(str(p), {"model": "m.onnx"})
    mem = MemoryTrace()
    for sink in (w, mem):
        sink.iter = 0
        sink.event("realloc", "", "", "external", "feedback_alias", inputs=["past_k", "past_v"], bytes=0)
    w.close()
    want = [("past_k", "Parameter", 0), ("past_v", "Parameter", 0)]
    assert [(e["node"], e["op"], e["bytes"]) for e in read_trace(str(p))[1]] == want
    assert [(e["node"], e["op"], e["bytes"]) for e in mem.events] == want
    assert all("inputs" not in e for e in mem.events)
    lines = p.read_text().splitlines()
    lines[1] = lines[1].replace('["past_k","past_v"]', '"past_k"')
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=r":2: bad event: inputs is not an array of strings"):
        list(read_trace(str(p))[1])


def test_a_template_base_is_kept_past_the_plain_bases_until_newer_templates_push_it_out():
    """A compiled plan serves lengths long after the inference that bound it: the reader keeps
    the last TEMPLATE_BASES_KEPT bases with a template besides the last PLAN_BASES_KEPT bases."""
    from traces.reader import PlanBases
    from traces.schema import PLAN_BASES_KEPT, TEMPLATE_BASES_KEPT
    bases = PlanBases()

    def base(it: int, template=None) -> None:
        bases.see({"kind": "update_shape", "iter": it, "node": f"n{it}"})
        bases.see({"kind": "infer_end", "iter": it, "plan_base": True, "template": template})
    base(0, {"nodes": ["n0"], "fields": []})
    for it in range(1, PLAN_BASES_KEPT + 5):
        base(it)
    assert bases.events(1) is None                      # a plain base: pushed out
    assert [e["node"] for e in bases.events(0)] == ["n0"]
    assert bases.template(0) == {"nodes": ["n0"], "fields": []}
    first = PLAN_BASES_KEPT + 5
    for it in range(first, first + TEMPLATE_BASES_KEPT):
        base(it, {"nodes": [f"n{it}"], "fields": []})
    assert bases.events(0) is None and bases.template(0) is None
    assert bases.template(first)["nodes"] == [f"n{first}"]
