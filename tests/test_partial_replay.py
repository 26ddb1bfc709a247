"""Partial replay (engine/fast_path/partial.py): a new signature whose changes reach only some
nodes runs the flow for those alone. With the fast path on and off, every sequence gives
bit-identical outputs and the same decisions per inference (counters, and trace events once
the reader expands them); random sequences (hypothesis) cover growth, shrink, cycles, batch
changes, decode with feedback over chunked and single-token steps, and shapes read from
values."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from engine import Network, build_program
from engine.fast_path import NOT_DECISIONS
from tests.models import encoder_block, gpt2_decoder_step, kv_decoder_step, masked_attention
from traces import MemoryTrace, TraceWriter
from traces.reader import read_trace

SETTINGS = settings(max_examples=6, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _decisions(events, it):
    return Counter((e["kind"], e["node"], e["action"], e["reason"]) for e in events
                   if e["iter"] == it and e["kind"] not in ("infer_start", "infer_end", "plan"))


def _run(prog, steps, device, fast, feedback=None, trace=None, **kw):
    """steps: [(feeds, feed back?)]; returns outputs, decision counters, trace events."""
    trace = trace if trace is not None else MemoryTrace()
    kw.setdefault("impls", "dynamic")
    net = Network(prog, device, trace=trace, fast_path=fast, feedback=feedback, **kw)
    outs, counters = [], []
    back = {v: k for k, v in (feedback or {}).items()}
    for feeds, fed in steps:
        o = net.infer(feeds, fed_back=back if fed else None)
        outs.append({k: np.array(v) for k, v in o.items()})
        counters.append({k: v for k, v in net.counters.items() if k not in NOT_DECISIONS})
    return outs, counters, trace


def _same(prog, steps, device, feedback=None, **kw):
    """Runs `steps` with the fast path on and off; asserts equal outputs and decisions;
    returns the plan events of the run with it on."""
    on = _run(prog, steps, device, True, feedback, **kw)
    off = _run(prog, steps, device, False, feedback, **kw)
    for i, (a, b) in enumerate(zip(on[0], off[0])):
        for name in b:
            assert np.array_equal(a[name], b[name]), f"inference {i} output {name}"
    assert on[1] == off[1]
    for i in range(len(steps)):
        assert _decisions(on[2].events, i) == _decisions(off[2].events, i), f"inference {i}"
    return [e for e in on[2].events if e["kind"] == "plan"]


def _decode_steps(chunks, d_model=32, heads=2, seed=0):
    """A KV decode: the first chunk from an empty past, the rest fed back."""
    rng = np.random.default_rng(seed)
    d_head = d_model // heads
    empty = np.zeros((1, heads, 0, d_head), np.float32)
    steps = []
    for k, n in enumerate(chunks):
        feeds = {"x": rng.standard_normal((1, n, d_model)).astype(np.float32)}
        if k == 0:
            feeds.update(past_k=empty, past_v=empty)
        steps.append((feeds, k > 0))
    return steps


KV_FEEDBACK = {"present_k": "past_k", "present_v": "past_v"}


def test_a_decode_replays_only_the_nodes_its_kv_length_reaches(device):
    """Every step after the second runs the flow for the KV appends, the attention and the
    shape values only; the clean nodes repeat the base's decisions."""
    steps = _decode_steps([1] * 14)
    plans = _same(build_program(kv_decoder_step()), steps, device, KV_FEEDBACK)
    partial = {e["iter"]: e for e in plans if e["action"] == "partial"}
    assert sorted(partial) == list(range(2, 14))
    assert all(e["reason"] == "" and e["upto"] > 0 for e in partial.values())


def test_a_gpt2_style_decode_with_a_mask_and_positions(device):
    """Range positions, a causal mask from Trilu, the attention_mask fed each step (its length
    grows): the host values change every step, their readers take the new upload."""
    layers, heads, d_head = 2, 2, 16
    prog = build_program(gpt2_decoder_step(layers=layers))
    fb = {f"present_{k}_{i}": f"past_{k}_{i}" for i in range(layers) for k in ("key", "value")}
    rng = np.random.default_rng(4)
    steps, total = [], 0
    for k, n in enumerate([3, 1, 1, 2, 1, 1, 1, 1]):
        total += n
        feeds = {"input_ids": rng.integers(0, 100, (1, n)).astype(np.int64),
                 "attention_mask": np.ones((1, total), np.int64)}
        if k == 0:
            feeds.update({v: np.zeros((1, heads, 0, d_head), np.float32) for v in fb.values()})
        steps.append((feeds, k > 0))
    plans = _same(prog, steps, device, fb)
    # steps 1, 3 and 4 change the new-token count (nearly every node: no plan); step 2 and 5
    # record one (a one-token step after a one-token step), 6 and 7 replay it
    assert {e["iter"] for e in plans if e["action"] == "partial"} == {6, 7}


def test_a_trace_file_expands_partial_replays(tmp_path, device):
    """In a file a partial replay is the dirty nodes' events and one `plan partial` event;
    the reader adds the clean nodes' events from the base, so the file counts the same
    decisions as the flow's."""
    prog = build_program(kv_decoder_step())
    steps = _decode_steps([2, 1, 1, 1, 1, 1])
    files = {}
    for fast in (True, False):
        path = tmp_path / f"{fast}.jsonl"
        w = TraceWriter(str(path), {"model": "kv"})
        _run(prog, steps, device, fast, KV_FEEDBACK, trace=w)
        w.close()
        _, events = read_trace(str(path))
        files[fast] = list(events)
    assert any(e["kind"] == "plan" and e["action"] == "partial" for e in files[True])
    for i in range(len(steps)):
        assert _decisions(files[True], i) == _decisions(files[False], i), f"inference {i}"


def test_changes_beyond_the_base_run_the_flow(device):
    """A base recorded while only the sequence length changed does not serve a batch change:
    the new input change is not among the base's, so the flow runs."""
    model = encoder_block(vocab=1000, d_model=32, heads=2, ff=64)
    rng = np.random.default_rng(2)

    def feeds(b, s):
        return ({"input_ids": rng.integers(0, 1000, (b, s)).astype(np.int64),
                 "attention_mask": np.ones((b, s), np.int64)}, False)
    plans = _same(build_program(model), [feeds(1, 8), feeds(1, 8), feeds(1, 8), feeds(2, 8)], device)
    assert not any(e["iter"] == 3 for e in plans)


def _value_model() -> onnx.ModelProto:
    """A Reshape whose target is a graph input (a shape read from a value), then a MatMul."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.linspace(-1, 1, 16).astype(np.float32))
    g = helper.make_graph([helper.make_node("Reshape", ["x", "target"], ["r"], name="Reshape"),
                           helper.make_node("MatMul", ["r", "w"], ["m"], name="MatMul"),
                           helper.make_node("Relu", ["m"], ["y"], name="Relu"),
                           helper.make_node("Sigmoid", ["z"], ["u"], name="Sigmoid")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
                           helper.make_tensor_value_info("target", TensorProto.INT64, [2]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, ["k", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("u", TensorProto.FLOAT, None)], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@SETTINGS
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3)), min_size=4, max_size=10))
def test_random_value_dependent_sequences(device, rows_k):
    """Shapes read from a value input change while another input's shape does not, and the
    other way round."""
    prog = build_program(_value_model())
    rng = np.random.default_rng(0)
    steps = [({"x": rng.standard_normal(4 * rows).astype(np.float32),
               "target": np.array([rows, 4], np.int64),
               "z": rng.standard_normal((k, 3)).astype(np.float32)}, False) for rows, k in rows_k]
    _same(prog, steps, device)


_PATTERNS = {
    "growth": lambda d: sorted(d), "shrink": lambda d: sorted(d, reverse=True),
    "cycle": lambda d: (d[:3] * 3)[:len(d) + 3], "as_drawn": lambda d: d,
}


@SETTINGS
@given(st.sampled_from(sorted(_PATTERNS)),
       st.lists(st.tuples(st.sampled_from([1, 2]), st.integers(2, 12)), min_size=3, max_size=8))
def test_random_encoder_sequences(device, pattern, dims):
    """Growth, shrink, cycles and batch changes through a fused encoder (fused epilogues and
    attention; a padding mask)."""
    prog = build_program(encoder_block(vocab=1000, d_model=32, heads=2, ff=64))
    rng = np.random.default_rng(1)
    steps = [({"input_ids": rng.integers(0, 1000, (b, s)).astype(np.int64),
               "attention_mask": (rng.random((b, s)) > 0.2).astype(np.int64)}, False)
             for b, s in _PATTERNS[pattern](dims)]
    _same(prog, steps, device)


@SETTINGS
@given(st.lists(st.integers(1, 4), min_size=3, max_size=12), st.booleans())
def test_random_decodes(device, chunks, restart):
    """Decode with feedback over chunked and single-token steps; `restart` begins a second
    sequence from an empty past halfway (the KV buffers are kept, the lengths fall)."""
    steps = _decode_steps(chunks)
    if restart and len(chunks) > 3:
        steps += _decode_steps(chunks[: len(chunks) // 2], seed=5)
    _same(build_program(kv_decoder_step()), steps, device, KV_FEEDBACK)


@pytest.mark.parametrize("predictor", ["openvino", "adaptive"])
def test_kv_growth_past_the_predicted_capacity_keeps_the_plan(device, predictor):
    """Long decode: the KV buffers are reallocated several times as the cache outgrows what
    the predictor asked for; the dirty KV nodes make those decisions themselves and the plan
    keeps serving the steps between them."""
    steps = _decode_steps([1] * 40)
    plans = _same(build_program(kv_decoder_step()), steps, device, KV_FEEDBACK, predictor=predictor)
    assert len([e for e in plans if e["action"] == "partial"]) >= 36


def test_every_inference_says_where_its_time_went(device, tmp_path):
    """infer_end's time_ms: every part present, none negative, and the parts sum to the
    latency within 10% (flow is what the measured parts leave), in memory and in the file."""
    prog = build_program(kv_decoder_step())
    path = tmp_path / "t.jsonl"
    w = TraceWriter(str(path), {"model": "kv"})
    _run(prog, _decode_steps([3, 1, 1, 1]), device, True, KV_FEEDBACK, trace=w)
    w.close()
    _, events = read_trace(str(path))
    ends = [e for e in events if e["kind"] == "infer_end"]
    assert len(ends) == 4
    from engine.accounting import PARTS
    for e in ends:
        parts = e["time_ms"]
        assert set(parts) == set(PARTS)
        assert all(v >= 0 for v in parts.values())
        assert abs(sum(parts.values()) - e["latency_ms"]) <= 0.1 * e["latency_ms"] + 0.01
    assert ends[-1]["time_ms"]["trace"] > 0       # this run wrote a trace
    # recording a plan after the outputs are read is part of the latency, in a part of its own
    assert any(e["time_ms"]["record"] > 0 for e in ends if e.get("plan_base"))


def test_a_garbage_collection_inside_an_inference_is_a_part_of_its_own(device, monkeypatch):
    """A pause of Python's collector (a full collection walks every object of the network)
    shows as `gc`, not as the flow's own time, and the parts still sum to the latency."""
    import gc
    net = Network(build_program(kv_decoder_step()), device, feedback=dict(KV_FEEDBACK))
    steps = _decode_steps([3, 1])
    net.infer(steps[0][0])
    set_inputs = net.inputs.set

    def collecting(feeds, fed_back):
        gc.collect()               # a full collection, inside the inference
        set_inputs(feeds, fed_back)
    monkeypatch.setattr(net.inputs, "set", collecting)
    net.infer(steps[1][0], fed_back={v: k for k, v in KV_FEEDBACK.items()})
    parts = net.time_ms
    assert parts["gc"] > 0
    assert abs(sum(parts.values()) - net.counters["latency_ms"]) <= 0.1 * net.counters["latency_ms"] + 0.01


def test_a_collection_inside_another_part_is_counted_once(device, monkeypatch):
    """A collector pause inside a measured part (here the prebuild walk of a new signature) is
    the `gc` part's, taken out of that part (accounting.since): the parts still sum to the
    latency, not to the latency plus the pause."""
    import gc

    import engine.impl_manager as im
    net = Network(build_program(kv_decoder_step()), device)
    walk = im.start_builds
    garbage = [{"k": [i]} for i in range(300_000)]   # a collection that takes a while

    def collecting(*a):
        gc.collect()
        return walk(*a)
    monkeypatch.setattr(im, "start_builds", collecting)
    net.infer(_decode_steps([3])[0][0])
    parts = net.time_ms
    assert parts["gc"] > 0.1 * net.counters["latency_ms"], parts    # the pause is a sizeable part
    assert parts["prebuild"] < parts["gc"], parts
    assert abs(sum(parts.values()) - net.counters["latency_ms"]) <= 0.1 * net.counters["latency_ms"] + 0.01
    del garbage


def test_transitions_that_switch_between_cached_static_impls_replay(device, static_gemms):
    """Static impls built in the critical path for some shapes, the shape-agnostic impl for the
    others: a transition switches impls through the impl cache (and the weights cache) without
    building anything, so it is replayed, its cache hits repeated in the LRU orders; decisions
    and outputs equal the flow's."""
    model = encoder_block(vocab=1000, d_model=32, heads=2, ff=64)
    rng = np.random.default_rng(3)
    steps = [({"input_ids": rng.integers(0, 1000, (1, s)).astype(np.int64),
               "attention_mask": np.ones((1, s), np.int64)}, False) for s in [8, 16, 24] * 5]
    plans = _same(build_program(model), steps, device, impls="auto", async_compile=False)
    assert any(e["action"] == "replay" and e["reason"] == "transition" for e in plans)
    hits = _run(build_program(model), steps, device, True, impls="auto", async_compile=False)[1]
    assert sum(c.get("update_impl.cache_hit.static", 0) for c in hits) > 0   # switches happened


def _target_through_views() -> onnx.ModelProto:
    """A Reshape whose target input reaches it through two device views (Unsqueeze, Squeeze):
    the views hand the value on without a device read."""
    g = helper.make_graph([helper.make_node("Unsqueeze", ["target", "ax"], ["u"], name="U"),
                           helper.make_node("Squeeze", ["u", "ax"], ["t2"], name="S"),
                           helper.make_node("Reshape", ["x", "t2"], ["r"], name="R"),
                           helper.make_node("Relu", ["r"], ["y"], name="Relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [24]),
                           helper.make_tensor_value_info("target", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [helper.make_tensor("ax", TensorProto.INT64, [1], [0])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_shape_value_reaching_its_reader_through_views(device):
    """Whole plans key on the target's value (it reaches the Reshape through views), and a
    partial replay runs the views again (their readers see the new value)."""
    x = np.arange(24, dtype=np.float32)
    steps = [({"x": x, "target": np.array(t, np.int64)}, False)
             for t in ([4, 6], [4, 6], [4, 6], [6, 4], [6, 4], [4, 6], [6, 4], [3, 8], [3, 8])]
    on = _run(build_program(_target_through_views()), steps, device, True)
    assert [o["y"].shape for o in on[0]] == [(4, 6)] * 3 + [(6, 4)] * 2 + [(4, 6), (6, 4)] + [(3, 8)] * 2
    _same(build_program(_target_through_views()), steps, device)


@pytest.mark.parametrize("predictor", ["adaptive", "openvino"])
def test_a_second_sequence_appends_into_the_room_the_first_one_made(device, predictor):
    """After a decode, a new sequence starts from an empty past: its first step copies into a
    buffer with the room the predictor keeps, and the steps after it append (before, under the
    adaptive policy the buffer's state kept the old room while the new buffer was exact, so
    every later step copied the whole cache)."""
    steps = _decode_steps([1] * 30) + _decode_steps([1] * 12, seed=5)
    on = _run(build_program(kv_decoder_step()), steps, device, True, KV_FEEDBACK, predictor=predictor)
    copies = [c.get("kv_cache.copy", 0) for c in on[1]]
    assert copies[30] == 2                         # the new sequence's first step: k and v
    # then no more copies than the first sequence made over the same lengths (growth only)
    assert sum(copies[31:]) <= sum(copies[1:12])


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.integers(1, 4),
                          st.integers(1, 9)), min_size=3, max_size=9))
def test_random_fused_and_unfused_sequences(device, dims):
    """A fused attention whose mask may grow the scores' batch: the fusion is undone for those
    shapes (fusion unfuse, the subgraph runs) and taken again after; batch, query and key
    lengths change at random, repeats included."""
    prog = build_program(masked_attention(mask_dims=("mb", 1, "s", "l")))
    rng = np.random.default_rng(6)
    steps = []
    for qb, mb, s, l in dims + dims[:2]:
        feeds = {n: rng.standard_normal((qb, 2, s if n == "q" else l, 8)).astype(np.float32)
                 for n in ("q", "k", "v")}
        feeds["mask"] = rng.standard_normal((mb, 1, s, l)).astype(np.float32)
        steps.append((feeds, False))
    _same(prog, steps, device)
