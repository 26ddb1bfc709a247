"""The fast path (engine/fast_path) changes no output and no decision: the same sequence run with
plan replay on and off gives bit-identical outputs and the same decisions per inference, in
memory and in trace files."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from engine import Network, build_program
from engine.fast_path import NOT_DECISIONS
from tests.models import encoder_block, kv_decoder_step, mlp
from traces import MemoryTrace
from traces.reader import TraceError, read_trace

SEQ = [8, 8, 8, 16, 16, 8, 8, 24, 24, 24, 16, 16, 16, 16]


def _feeds(seq_lens, seed=0):
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(0, 1000, (1, s)).astype(np.int64),
             "attention_mask": (rng.random((1, s)) > 0.2).astype(np.int64)} for s in seq_lens]


def _run(model, feeds, device, fast, **kw):
    trace = MemoryTrace()
    net = Network(build_program(model), device, trace=trace, fast_path=fast, **kw)
    outs, counters = [], []
    for f in feeds:
        outs.append(net.infer(f))
        counters.append({k: v for k, v in net.counters.items() if k not in NOT_DECISIONS})
    return outs, counters, trace


def _decisions(trace, it):
    return Counter((e["kind"], e["node"], e["action"], e["reason"]) for e in trace.events
                   if e["iter"] == it and e["kind"] not in ("infer_start", "infer_end", "plan"))


@pytest.mark.parametrize("kw", [{"impls": "dynamic"}, {"impls": "auto", "async_compile": False}],
                         ids=["dynamic", "static-sync"])
def test_same_outputs_and_decisions_on_and_off(device, kw, static_gemms):
    model = encoder_block(vocab=1000, d_model=32, heads=2, ff=64)
    feeds = _feeds(SEQ)
    out_on, cnt_on, tr_on = _run(model, feeds, device, True, **kw)
    out_off, cnt_off, tr_off = _run(model, feeds, device, False, **kw)
    for i, (a, b) in enumerate(zip(out_on, out_off)):
        for name in a:
            assert np.array_equal(a[name], b[name]), f"inference {i} output {name}"
    assert cnt_on == cnt_off
    for i in range(len(SEQ)):
        assert _decisions(tr_on, i) == _decisions(tr_off, i), f"inference {i}"
    replays = [e["iter"] for e in tr_on.events if e["kind"] == "plan"]
    # a signature's plan is armed by a flow run that changed nothing (its second in a row);
    # each later repeat replays it until the signature changes
    assert replays == [2, 9, 12, 13]
    assert not any(e["kind"] == "plan" for e in tr_off.events)
    # a replay stands for the decisions of the inference it was recorded from
    of = {e["iter"]: e["of_iter"] for e in tr_on.events if e["kind"] == "plan"}
    assert of == {2: 1, 9: 8, 12: 11, 13: 11}
    assert all(e["kind"] == "update_shape" and e["action"] == "skip" or e["kind"] != "update_shape"
               for e in tr_on.events if e.get("replayed"))


def test_replay_reads_new_input_values(device):
    """Same signature, new data: the replay uploads the inputs and reads fresh outputs."""
    model = mlp()
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((3, 32)).astype(np.float32)} for _ in range(4)]
    out_on, _, tr = _run(model, feeds, device, True, impls="dynamic")
    out_off, _, _ = _run(model, feeds, device, False, impls="dynamic")
    assert [e["iter"] for e in tr.events if e["kind"] == "plan"] == [2, 3]
    for a, b in zip(out_on, out_off):
        assert np.array_equal(a["y"], b["y"])
    assert not np.array_equal(out_on[2]["y"], out_on[3]["y"])


def test_fast_path_blocked_with_feedback(device):
    model = kv_decoder_step()
    net = Network(build_program(model), device, feedback={"present_k": "past_k", "present_v": "past_v"},
                  impls="dynamic")
    assert net.fast.blocker == "feedback"


def test_trace_file_expands_replays(tmp_path, device):
    """In a trace file a replay is one event; the reader expands it into its base's decisions,
    so every view counts the same with the fast path on and off."""
    from dyncli.runner import RunOptions, execute_run
    from traces.summary import summarise
    model = tmp_path / "enc.onnx"
    import onnx
    onnx.save(encoder_block(vocab=1000, d_model=32, heads=2, ff=64), model)
    sums, sizes = {}, {}
    for fast in (True, False):
        path = tmp_path / f"{fast}.jsonl"
        execute_run(RunOptions(model=str(model), shapes=["input_ids:1x8,attention_mask:1x8*4",
                                                          "input_ids:1x16,attention_mask:1x16*3"],
                               trace=str(path), impls="dynamic", fast_path=fast))
        _, events = read_trace(str(path))
        evs = list(events)
        sums[fast] = Counter((e["iter"], e["kind"], e["action"], e["reason"]) for e in evs
                             if e["kind"] not in ("plan", "infer_start", "infer_end"))
        sizes[fast] = path.stat().st_size
        result = summarise(str(path))
        assert result["inferences"] == 7, result.keys()
    assert sums[True] == sums[False]
    assert sizes[True] < sizes[False] * 0.75


def test_reader_refuses_a_replay_of_an_unknown_base(tmp_path):
    import json
    from traces.schema import SCHEMA_VERSION
    path = tmp_path / "bad.jsonl"
    lines = [{"kind": "header", "schema": SCHEMA_VERSION, "tool": "dyncli"},
             {"kind": "plan", "iter": 3, "node": "", "op": "", "action": "replay",
              "reason": "same_signature", "ts": 0.1, "of_iter": 1, "kernels": 4}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    _, events = read_trace(str(path))
    with pytest.raises(TraceError, match="not a plan base"):
        list(events)


def test_inputs_read_as_values_are_part_of_the_signature(device):
    """A Reshape target fed as a graph input: same shape, new value, no replay."""
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Reshape", ["x", "target"], ["r"], name="Reshape"),
                           helper.make_node("Relu", ["r"], ["y"], name="Relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6]),
                           helper.make_tensor_value_info("target", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(7).standard_normal((4, 6)).astype(np.float32)
    feeds = [{"x": x, "target": np.array(t, np.int64)} for t in ([3, 8], [3, 8], [3, 8], [8, 3])]
    outs, _, tr = _run(model, feeds, device, True, impls="dynamic")
    assert [o["y"].shape for o in outs] == [(3, 8), (3, 8), (3, 8), (8, 3)]
    assert [e["iter"] for e in tr.events if e["kind"] == "plan"] == [2]


@pytest.mark.parametrize("predictor", ["openvino", "adaptive"])
def test_transitions_between_known_shapes_replay(device, predictor):
    """A sequence cycling through known shapes: once a transition ran through the flow without
    changing a resource, it is replayed; outputs and decisions equal the flow's every time."""
    model = encoder_block(vocab=1000, d_model=32, heads=2, ff=64)
    seq = [8, 16, 24] * 4 + [16, 8, 24, 8]
    feeds = _feeds(seq, seed=3)
    out_on, cnt_on, tr_on = _run(model, feeds, device, True, impls="dynamic", predictor=predictor)
    out_off, cnt_off, tr_off = _run(model, feeds, device, False, impls="dynamic", predictor=predictor)
    for i, (a, b) in enumerate(zip(out_on, out_off)):
        assert np.array_equal(a["y"], b["y"]), f"inference {i}"
    assert cnt_on == cnt_off
    for i in range(len(seq)):
        assert _decisions(tr_on, i) == _decisions(tr_off, i), f"inference {i}"
    why = {e["iter"]: e["reason"] for e in tr_on.events if e["kind"] == "plan"}
    # the first cycle grows every buffer; the second and third run each transition through
    # the flow (a transition is recorded the second time, so that policies which reallocate
    # often do not pay for plans they never replay); from the fourth on they are replayed
    assert set(range(9, 12)) <= set(why) and set(why.values()) == {"transition"}
    assert not set(range(9)) & set(why)
    assert 12 not in why and 13 not in why     # 24 -> 16 and 16 -> 8 were never seen


def test_transitions_seen_once_are_bounded_over_many_lengths(device, monkeypatch):
    """A run of many lengths meets up to their square of transitions; those the flow ran once
    (recorded as a plan the second time) are kept up to a bound, and repeated transitions still
    replay."""
    from onnx import TensorProto, helper
    monkeypatch.setattr("engine.fast_path.replay.SEEN_KEPT", 64)
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    net = Network(build_program(model), device, impls="dynamic")
    rng = np.random.default_rng(0)
    lengths = [40] + [int(s) for s in rng.integers(25, 41, 400)] + [32, 36] * 4   # no reclaim
    replays = 0
    for s in lengths:
        x = rng.standard_normal((1, s)).astype(np.float32)
        assert np.array_equal(net.infer({"x": x})["y"], np.maximum(x, 0))
        assert len(net.fast.seen) <= 64
        replays += net.counters.get("plan.replay", 0)
    assert net.fast.epoch <= 2 and replays >= 4, (net.fast.epoch, replays)
