"""Steady steps (engine/fast_path/steady.py): a partial replay's dirty nodes whose shapes only
moved (a decode step's KV appends and attentions) take the flow's path compiled for their
class. With the fast path on and off, decode loops give bit-identical outputs, the same
counters and the same decision events, fields included (shapes, capacities, bytes); the
`plan partial` events say how many nodes took a steady step, so a test fails if none did."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import build_program
from tests.models import gpt2_decoder, gpt2_decoder_step, kv_decoder_step
from tests.test_partial_replay import KV_FEEDBACK, SETTINGS, _decode_steps, _run, _same
from traces import TraceWriter
from traces.reader import read_trace

LAYERS, HEADS, D_HEAD = 3, 2, 16


def _gpt2_steps(prompt: int, tokens: int, mask: bool = False, seed: int = 0):
    """A GPT-2 decode: `prompt` tokens from an empty past, then `tokens` single-token steps
    fed back (`mask`: the attention_mask input of gpt2_decoder_step, growing)."""
    rng = np.random.default_rng(seed)
    steps, total = [], 0
    for k, n in enumerate([prompt] + [1] * tokens):
        total += n
        feeds = {"input_ids": rng.integers(0, 50, (1, n)).astype(np.int64)}
        if mask:
            feeds["attention_mask"] = np.ones((1, total), np.int64)
        if k == 0:
            feeds.update({f"past_{kind}_{i}": np.zeros((1, HEADS, 0, D_HEAD), np.float32)
                          for i in range(LAYERS) for kind in ("key", "value")})
        steps.append((feeds, k > 0))
    return steps


GPT2_FEEDBACK = {f"present_{k}_{i}": f"past_{k}_{i}" for i in range(LAYERS) for k in ("key", "value")}


def _tiny_gpt2():
    return build_program(gpt2_decoder(layers=LAYERS, d_model=HEADS * D_HEAD, heads=HEADS, vocab=50,
                                      max_pos=64))


def _events(path, it):
    """The decision events of inference `it` in a trace file, as the reader expands them, node
    by node in their order (a partial replay's clean nodes come after the dirty ones), fields
    included (measured times, the time stamp and the replay mark aside)."""
    _, events = read_trace(str(path))
    by_node: dict = {}
    for e in events:
        if e.get("iter") == it and e["kind"] not in ("infer_start", "infer_end", "plan"):
            by_node.setdefault(e["node"], []).append(
                {k: v for k, v in e.items() if k not in ("ts", "replayed") and not k.endswith("_ms")})
    return by_node


@pytest.mark.parametrize("predictor", ["adaptive", "openvino"])
def test_a_gpt2_decode_takes_steady_steps_with_the_flows_decisions(tmp_path, device, predictor):
    """40 tokens after a 3-token prompt, the KV caches growing past their room several times:
    the steady steps' events are the flow's, field by field, in the flow's order; so are those
    the reader expands from a traced run's compiled steps (engine/fast_path/step_events.py)."""
    prog = _tiny_gpt2()
    steps = _gpt2_steps(3, 40)
    paths = {}
    for run in ("steady", "compiled", "flow"):
        paths[run] = tmp_path / f"{run}.jsonl"
        w = TraceWriter(str(paths[run]), {"model": "gpt2"})
        _run(prog, steps, device, run != "flow", GPT2_FEEDBACK, trace=w, predictor=predictor,
             compile_plans="off" if run == "steady" else "partial")
        w.close()
    plans = [e for e in read_trace(str(paths["steady"]))[1] if e["kind"] == "plan"]
    # every layer's attention and its two KV appends, in the steps where the caches had room
    assert max(e.get("steady", 0) for e in plans) == 3 * LAYERS
    assert sum(1 for e in plans if e.get("steady") == 3 * LAYERS) >= 20
    plans = [e for e in read_trace(str(paths["compiled"]))[1] if e["kind"] == "plan"]
    assert sum(1 for e in plans if "template_of" in e) >= 20
    for i in range(len(steps)):
        flow = _events(paths["flow"], i)
        assert _events(paths["steady"], i) == flow, f"inference {i}"
        assert _events(paths["compiled"], i) == flow, f"inference {i}"


def test_a_gpt2_decode_without_a_trace_counts_the_same(device):
    """No trace: steady steps write no events and count their decisions in bulk; the counters
    are the flow's."""
    prog = _tiny_gpt2()
    steps = _gpt2_steps(2, 30)
    on = _run(prog, steps, device, True, GPT2_FEEDBACK, trace=None)
    off = _run(prog, steps, device, False, GPT2_FEEDBACK)
    assert on[1] == off[1]
    for a, b in zip(on[0], off[0]):
        for name in b:
            assert np.array_equal(a[name], b[name]), name


def test_the_flow_takes_over_where_a_steady_step_does_not_hold(device):
    """A decode with a growing attention_mask and a causal mask (gpt2_decoder_step): chunks of
    several tokens between single tokens change more than the KV length; the steps where the
    guards fail run the flow, and on and off agree."""
    layers = 2
    prog = build_program(gpt2_decoder_step(layers=layers))
    fb = {f"present_{k}_{i}": f"past_{k}_{i}" for i in range(layers) for k in ("key", "value")}
    rng = np.random.default_rng(3)
    steps, total = [], 0
    for k, n in enumerate([3, 1, 1, 1, 2, 1, 1, 1, 1, 3, 1, 1, 1]):
        total += n
        feeds = {"input_ids": rng.integers(0, 100, (1, n)).astype(np.int64),
                 "attention_mask": np.ones((1, total), np.int64)}
        if k == 0:
            feeds.update({v: np.zeros((1, 2, 0, 16), np.float32) for v in fb.values()})
        steps.append((feeds, k > 0))
    plans = _same(prog, steps, device, fb)
    assert any(e.get("steady") for e in plans)


@SETTINGS
@given(chunks=st.lists(st.sampled_from([1, 1, 1, 1, 2, 3]), min_size=6, max_size=24),
       predictor=st.sampled_from(["adaptive", "openvino"]), fused=st.booleans())
def test_random_decodes_with_steady_steps(device, chunks, predictor, fused):
    """Random chunked decodes through the attention fused (it appends the caches: steady KV
    appends and attentions) and unfused (its nodes run as they are), both predictors."""
    prog = build_program(kv_decoder_step(), attention=fused)
    _same(prog, _decode_steps([2] + chunks), device, KV_FEEDBACK, predictor=predictor)
