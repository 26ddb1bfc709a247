"""`dyncli predictor-sim` and the preallocation policies of engine/predictors.py: the plugin's
pinned figures through the command, the adaptive policy's acceptance figures, every built-in
pattern, the oracle's minimality, trace replay against the run itself, and bad input."""
import itertools
import json
import os
import random

import numpy as np
import pytest
from typer.testing import CliRunner

from dyncli.cli import app
from dyncli.sim_patterns import PATTERNS, parse_pattern
from engine import Network, build_program
from hypothesis import given, settings
from hypothesis import strategies as st
from engine.predictors import AdaptivePredictor, AdaptiveSettings, OraclePredictor, make_predictor
from engine.shape_predictor import BufferState, simulate
from tests.conftest import run_vs_ort
from tests.models import kv_decoder_step
from traces import read_trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENCODER = os.path.join(ROOT, "examples", "encoder.onnx")
MIB = 2 ** 20
KV = "1x32x{128..2048}x128"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def sim_json(*args) -> dict:
    r = invoke("predictor-sim", *args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


# --- the documented figures through the command ---------------------------------------------------

def test_openvino_pinned_figures_through_the_command():
    p = sim_json("--shapes", KV, "--dtype", "f16", "--policy", "openvino")["policies"]["openvino"]
    assert p["reallocations"] == 177
    assert round(p["bytes_allocated"] / MIB, 1) == 1501.8
    assert round(p["peak_slack_bytes"] / MIB, 2) == 0.08
    p = sim_json("--shapes", "4x32x{128..2048}x128", "--policy", "openvino")["policies"]["openvino"]
    assert p["reallocations"] == 31 and round(p["bytes_allocated"] / MIB, 1) == 696.8


def test_adaptive_acceptance_on_kv_growth():
    doc = sim_json("--shapes", KV, "--policy", "adaptive", "--policy", "openvino")
    a = doc["policies"]["adaptive"]
    assert a["reallocations"] <= 12
    assert a["bytes_allocated"] <= 100 * MIB
    assert a["peak_slack_ratio"] <= 0.5
    # the same figure recomputed from every step of the API's replay
    shapes = [(1, 32, L, 128) for L in range(128, 2049)]
    r = simulate(shapes, 16, AdaptivePredictor())
    assert r.reallocations == a["reallocations"] and r.total_allocated_bytes == a["bytes_allocated"]
    assert all(s.capacity_bytes - s.required_bytes <= 0.5 * s.required_bytes for s in r.steps)
    assert all(s.capacity_bytes >= s.required_bytes for s in r.steps)
    assert a["reallocations"] < doc["policies"]["openvino"]["reallocations"]


@pytest.mark.parametrize("name", list(PATTERNS))
def test_every_pattern_adaptive_beats_openvino_within_1_5x(name):
    doc = sim_json("--pattern", name)
    ov, ad, none, orc = (doc["policies"][p] for p in ("openvino", "adaptive", "none", "oracle"))
    assert ad["reallocations"] <= ov["reallocations"]
    assert ad["peak_capacity_bytes"] <= 1.5 * ad["peak_required_bytes"]
    assert ad["peak_capacity_over_required"] <= 1.5
    # exact sizes never exceed the peak; the oracle never reallocates more than exact sizes do
    assert none["peak_capacity_bytes"] == none["peak_required_bytes"]
    assert orc["reallocations"] <= min(none["reallocations"], ad["reallocations"])
    assert len({p["peak_required_bytes"] for p in doc["policies"].values()}) == 1


def test_summary_table_shows_the_comparison():
    r = invoke("predictor-sim", "--pattern", "llm-decode:end=400")
    assert r.exit_code == 0, r.output
    for text in ("policies side by side", "reallocations", "bytes allocated (total)", "peak capacity",
                 "peak slack", "mean slack ratio", "openvino", "adaptive", "oracle", "none",
                 "capacity vs required"):
        assert text in r.output
    # step tables list the iterations where something happened
    assert "adaptive: " in r.output and "reallocation(s) over 273 steps" in r.output


def test_json_structure_and_every():
    doc = sim_json("--pattern", "periodic:values=4/16/8,cycles=3,hidden=8", "--dtype", "f32", "--every", "1")
    assert doc["source"]["kind"] == "pattern" and doc["source"]["steps"] == 9
    assert doc["source"]["spec"] == "periodic:values=4/16/8,cycles=3,hidden=8"
    assert set(doc["policies"]) == {"openvino", "none", "adaptive", "oracle"}
    for fig in doc["policies"].values():
        for k in ("reallocations", "bytes_allocated", "peak_capacity_bytes", "peak_required_bytes",
                  "peak_slack_bytes"):
            assert isinstance(fig[k], int)
        assert isinstance(fig["mean_slack_ratio"], float)
        assert [s["iter"] for s in fig["steps"]] == list(range(9))  # --every 1: every step
        assert fig["steps"][0]["required_bytes"] == 4 * 8 * 4
        assert sum(s["action"] == "alloc" for s in fig["steps"]) == fig["reallocations"]
    assert doc["policies"]["none"]["peak_capacity_bytes"] == 16 * 8 * 4
    # without --every only the allocations are listed
    doc = sim_json("--pattern", "periodic:values=4/16/8,cycles=3,hidden=8", "--policy", "none")
    assert [s["action"] for s in doc["policies"]["none"]["steps"]] == ["alloc"] * doc["policies"]["none"]["reallocations"]


# --- policies ------------------------------------------------------------------------------------

def _feed(pol, needs, bits=8):
    buf = BufferState()
    return [buf.realloc_if_needed(pol, "b", (n,), bits) for n in needs], buf


def test_adaptive_keeps_the_buffer_across_a_reset_and_releases_far_lower():
    _, _, shapes = parse_pattern("shrink-regrow:prompts=128/64,decode=512,heads=2,head_dim=8")
    r = simulate(shapes, 16, AdaptivePredictor())
    second = r.steps[513:]
    assert second[0].shape[2] == 64 and all(s.action == "reuse" for s in second)
    ov = simulate(shapes, 16, make_predictor("openvino"))
    assert ov.steps[513].action == "alloc" and ov.steps[513].reclaimed
    # a drop that stays 10x below the buffer, long past the last cycle's length: released
    ds, buf = _feed(AdaptivePredictor(), list(range(100, 200)) + [5] * 300)
    rel = [i for i, d in enumerate(ds) if d.reclaimed]
    assert len(rel) == 1 and rel[0] > 100 and buf.held_elems < 50


def test_adaptive_remembers_a_period_max():
    ds, buf = _feed(AdaptivePredictor(), [10, 1000, 50, 300] * 20)
    assert sum(d.action == "alloc" for d in ds) <= 3 and buf.held_elems == 1500


def test_adaptive_large_steps_and_doubling_horizon():
    # +64 rows of 16 KiB each per step: far above the plugin's 2-per-dim and 16 KiB limits
    shapes = [(1, 64 * k, 8192) for k in range(1, 200)]
    r = simulate(shapes, 16, AdaptivePredictor(AdaptiveSettings(slack_cap=10.0)))
    steady = [s for s in r.steps if s.mode == "steady" and s.action == "alloc"]
    grants = [(s.capacity_bytes - s.required_bytes) // (64 * 8192 * 2) for s in steady]
    assert grants[:4] == [10, 20, 40, 80]
    assert r.reallocations < simulate(shapes, 16, make_predictor("openvino")).reallocations


def test_adaptive_respects_the_90_percent_rule():
    pol = AdaptivePredictor(device_mem_bytes=1000)
    ds, buf = _feed(pol, [100, 200, 300, 400], bits=8)
    assert [d.alloc_elems for d in ds if d.action == "alloc"][-1] <= 900
    assert all(not d.predicted for d in ds if d.alloc_elems > 450)


def _min_reallocs(needs, limit):
    """Exhaustive search over every policy that reallocates only when the buffer is too small and
    allocates a size in [need, limit(need)] (sizes that matter are future requirements)."""
    best = [len(needs) + 1]

    def go(t, cap, count):
        if count >= best[0]:
            return
        if t == len(needs):
            best[0] = count
            return
        n = needs[t]
        if cap >= n:
            return go(t + 1, cap, count)
        for c in sorted({x for x in needs[t:] if n <= x <= limit(n)} | {n}):
            go(t + 1, c, count + 1)

    go(0, 0, 0)
    return best[0]


def test_oracle_is_the_lower_bound_for_its_slack():
    rng = random.Random(3)
    for _ in range(300):
        needs = [rng.randint(1, 40) for _ in range(rng.randint(1, 9))]
        cap = rng.choice([0.0, 0.25, 0.5, 1.0])
        r = simulate([(n,) for n in needs], 8, OraclePredictor({"buf": [(n,) for n in needs]}, cap))
        assert r.reallocations == _min_reallocs(needs, lambda n: n + int(n * cap)), (needs, cap)
        assert all(s.capacity_bytes <= s.required_bytes + int(s.required_bytes * cap)
                   for s in r.steps if s.action == "alloc")


def test_oracle_refuses_the_engine():
    with pytest.raises(ValueError, match="predictor-sim only"):
        make_predictor("oracle")


# --- trace replay ---------------------------------------------------------------------------------

@pytest.mark.parametrize("predictor", ["openvino", "adaptive"])
def test_from_trace_replays_what_the_run_did(tmp_path, predictor):
    trace = tmp_path / "t.jsonl"
    r = invoke("run", ENCODER, "--shapes", "input_ids:1x{8..20},attention_mask:1x{8..20}",
               "--shapes", "input_ids:2x6,attention_mask:2x6", "--predictor", predictor, "--trace", trace,
               "--no-memory-pool")   # a pooled buffer can be larger than the request: not replayable
    assert r.exit_code == 0, r.output
    _, events = read_trace(str(trace))
    run_allocs = sum(e["counters"].get("realloc.alloc", 0) for e in events if e["kind"] == "infer_end")
    doc = sim_json("--from-trace", trace)
    assert doc["source"]["run_predictor"] == predictor
    assert doc["source"]["run_allocations"] == run_allocs > 0
    assert doc["policies"][predictor]["reallocations"] == run_allocs
    for node, n in doc["nodes"].items():
        assert n["reallocations"][predictor] == n["run_allocations"], node
        assert n["reallocations"]["none"] >= n["reallocations"]["oracle"]
    table = invoke("predictor-sim", "--from-trace", trace, "--policy", "openvino")
    assert table.exit_code == 0 and "run's own allocations" in table.output


# --- run --predictor -----------------------------------------------------------------------------

def _decode_feeds(steps, rng):
    return [{"x": rng.standard_normal((1, 1, 32), dtype=np.float32),
             "past_k": rng.standard_normal((1, 2, p, 16), dtype=np.float32),
             "past_v": rng.standard_normal((1, 2, p, 16), dtype=np.float32)} for p in range(1, steps + 1)]


def test_run_with_adaptive_predictor_matches_ort_and_reallocates_less(device):
    model = kv_decoder_step()
    allocs = {}
    for name in ("openvino", "adaptive"):
        feeds = _decode_feeds(120, np.random.default_rng(0))
        net = Network(build_program(model), device, predictor=name)
        total = 0
        for f in feeds:
            run_vs_ort(model, [f], net=net)
            total += net.counters["realloc.alloc"]
        allocs[name] = total
    assert allocs["adaptive"] < allocs["openvino"], allocs


# --- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("args, msg", [
    ([], "exactly one of"),
    (["--shapes", "1x4", "--pattern", "random"], "exactly one of"),
    (["--pattern", "zigzag"], "unknown pattern"),
    (["--pattern", "random:n=0"], "n must be"),
    (["--pattern", "random:speed=3"], "bad parameter"),
    (["--pattern", "random:low=9,high=3"], "above high"),
    (["--pattern", "llm-decode:end=9999999"], "more than"),
    (["--pattern", "batch-jump:batches=1/x"], "batches must be"),
    (["--shapes", "1x{4..}"], "--shapes"),
    (["--shapes", "1x4", "--dtype", "f17"], "unknown element type"),
    (["--shapes", "1x4", "--policy", "magic"], "unknown policy"),
    (["--shapes", "1x4", "--prealloc", "1 2 3"], "--prealloc"),
    (["--shapes", "1x4", "--every", "-1"], "--every"),
    (["--shapes", "1x4", "--slack-cap", "-1"], "--slack-cap"),
    (["--shapes", "1x4", "--device-memory", "lots"], "--device-memory"),
    (["--shapes", "1x4", "--shapes", "1x5", "--shapes", "1x4x4"], "Rank mismatch"),
    (["--from-trace", "/nonexistent/t.jsonl"], "no such file"),
    (["--from-trace", __file__], "not a dyncli trace"),
    (["--from-trace", ROOT], "cannot read"),
    (["--pattern", "random", "--node", "nope"], "--node"),
])
def test_bad_input_exits_2_with_one_line(args, msg):
    r = invoke("predictor-sim", *args)
    assert r.exit_code == 2, r.output
    assert msg in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


def test_plot_writes_png_or_says_matplotlib_is_missing(tmp_path):
    out = tmp_path / "p.png"
    r = invoke("predictor-sim", "--pattern", "llm-decode:end=300", "--plot", out)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert r.exit_code == 2 and "--plot needs matplotlib: pip install 'dyncli[plot]'" in r.output and not out.exists()
        assert len(r.output.strip().splitlines()) == 1
    else:
        assert r.exit_code == 0, r.output
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_rejects_unknown_predictor():
    r = invoke("run", ENCODER, "--shapes", "input_ids:1x8,attention_mask:1x8", "--predictor", "oracle")
    assert r.exit_code == 2 and "unknown policy 'oracle'" in r.output


_LENGTHS = st.sampled_from([0, 1, 2, 3, 4, 5, 6, 40, 41, 300])
_STEP = st.one_of(
    # a plan's calls in one go: some of the buffers (others absent), all with one length
    st.tuples(st.just("replay"), st.lists(st.integers(0, 4), min_size=1, max_size=5, unique=True).flatmap(
        lambda ids: _LENGTHS.map(lambda n: [(k, n) for k in ids]))),
    # ... or each with its own
    st.tuples(st.just("replay"), st.lists(st.tuples(st.integers(0, 4), _LENGTHS), min_size=1, max_size=5,
                                          unique_by=lambda c: c[0])),
    # the flow's call for one buffer
    st.tuples(st.just("one"), st.tuples(st.integers(0, 4), _LENGTHS)),
    # a whole plan replayed again: the same list of calls each time (replay_plan)
    st.tuples(st.just("plan"), st.integers(0, 3)),
    # a compiled inference whose buffers move: its calls decided in order (growth_decisions)
    st.tuples(st.just("growth"), st.lists(st.tuples(st.integers(0, 4), _LENGTHS), min_size=1, max_size=5,
                                          unique_by=lambda c: c[0])),
    st.tuples(st.just("growth"), st.lists(st.integers(0, 4), min_size=1, max_size=5, unique=True).flatmap(
        lambda ids: _LENGTHS.map(lambda n: [(k, n) for k in ids]))))
# the whole plans' calls: (buffer, length) each
_PLANS = [[(0, 40), (1, 40), (2, 40), (3, 40), (4, 40)], [(0, 3), (1, 3), (2, 3)],
          [(2, 41), (3, 41), (4, 300)], [(0, 300), (1, 300), (2, 300), (3, 300), (4, 300)]]


@given(st.lists(_STEP, min_size=1, max_size=60))
@settings(max_examples=150, deadline=None)
def test_adaptive_replay_keeps_the_history_and_decisions_of_one_call_at_a_time(steps):
    """AdaptivePredictor.replay (a plan replay's predictor calls in one go) leaves every
    buffer and its history as `realloc` called once per buffer does: growth, shrinks, reclaims,
    with buffers that share a history (equal so far, the same shape now) observed once and
    split again where they part (another length, a call without the others, one growing: two
    of the buffers hold bytes, whose slack differs from the floats'); where every buffer surely
    keeps, `observe_kept` (a compiled plan's calls) leaves what replay would, and a whole
    plan's calls replayed again (`replay_plan`, its grouping and capacities kept) do too; a
    compiled growth's calls decided in order (`growth_decisions`, the memory used growing with
    each allocation: the 90% rule refuses some extra) decide as `realloc` does."""
    import math
    import types
    from engine.predictors import AdaptivePredictor, _Track, growth_decisions, surely_keeps
    from engine.shape_predictor import BufferState
    # a short window: the reclaim of a buffer 10x too large comes within a sequence; 4 MiB of
    # device memory, of which growth steps find 3 MiB used by others
    one, many = (AdaptivePredictor(AdaptiveSettings(memory_window=6), 4 << 20) for _ in range(2))
    bufs1 = [BufferState() for _ in range(5)]
    bufs2 = [BufferState() for _ in range(5)]
    tensors = [types.SimpleNamespace(state=b) for b in bufs2]
    plans = [[(tensors[k], f"b{k}", (1, n, 256), 256 * n, [8, 8, 32, 32, 32][k]) for k, n in p] for p in _PLANS]
    variants: dict = {}
    for how, arg in steps:
        calls = arg if how in ("replay", "growth") else [arg]
        bits = [8, 8, 32, 32, 32]
        if how == "plan":
            calls = _PLANS[arg]
        if how == "growth":
            _growth_step(one, many, bufs1, tensors, calls, bits, growth_decisions)
        else:
            for k, n in calls:
                bufs1[k].realloc_if_needed(one, f"b{k}", (1, n, 256), bits[k], 1 << 20)
        if how == "plan":
            many.replay_plan(plans[arg], 1 << 20)
        elif how == "replay":
            batch = [(bufs2[k], f"b{k}", (1, n, 256), 256 * n, bits[k]) for k, n in calls]
            if all(surely_keeps(many, b, need, name) for b, name, _, need, _ in batch):
                # what a compiled plan calls then: the same buffers in one order are one
                # variant, whose grouping is kept while it holds
                variant = variants.setdefault(tuple(k for k, _ in calls), object())
                many.observe_kept([(tensors[k], *call[1:]) for (k, _), call in zip(calls, batch)], variant)
            else:
                many.replay(batch, 1 << 20)
        elif how == "one":
            k, n = arg
            bufs2[k].realloc_if_needed(many, f"b{k}", (1, n, 256), bits[k], 1 << 20)
        for b1, b2 in zip(bufs1, bufs2):
            assert (b1.cap_elems, b1.held_elems, b1.has_buffer) == (b2.cap_elems, b2.held_elems, b2.has_buffer)
        assert set(one._tracks) == set(many._tracks)
        for name, t1 in one._tracks.items():
            t2 = many._tracks[name]
            assert [getattr(t1, a) for a in _Track.HISTORY] == [getattr(t2, a) for a in _Track.HISTORY]
            assert list(t1.recent) == list(t2.recent)
        # a shared track is shared by exactly the ids that name it
        users = {}
        for t in many._tracks.values():
            users[id(t)] = users.get(id(t), 0) + 1
        assert all(t.users == users[id(t)] for t in many._tracks.values())


def _growth_step(one, many, bufs1, tensors, calls, bits, growth_decisions) -> None:
    """A growth's calls: `realloc` one at a time for `one`, growth_decisions for `many`, each
    with the memory used then (3 MiB of others, and the buffers' own)."""
    def used(bufs):
        return (3 << 20) + sum(b.held_elems * ((bits[k] + 7) // 8) for k, b in enumerate(bufs))
    batch = [(tensors[k], f"b{k}", (1, n, 256), 256 * n, bits[k]) for k, n in calls]
    g = growth_decisions(many, batch)
    for j, (k, n) in enumerate(calls):
        d1 = bufs1[k].realloc_if_needed(one, f"b{k}", (1, n, 256), bits[k], used(bufs1))
        if g.keeps(j):
            assert d1.action == "reuse", (j, d1)
        else:
            assert g.decide(j, used([t.state for t in tensors])) == d1, (j, d1)
    g.finish()


def test_a_growth_where_one_of_two_sharers_grows_moves_only_its_track():
    """Two buffers of one history whose capacities differ (bytes and floats: a steady step
    of 40 lengths gives them different slack) share a track until one of them must grow; a
    compiled growth then moves that one's horizon only, as realloc one at a time does."""
    import types
    from engine.predictors import AdaptivePredictor, _Track, growth_decisions
    from engine.shape_predictor import BufferState
    one, many = AdaptivePredictor(), AdaptivePredictor()
    bits = {"a": 8, "b": 32}
    b1 = {k: BufferState() for k in "ab"}
    t2 = {k: types.SimpleNamespace(state=BufferState()) for k in "ab"}
    mixed = 0
    for n in (1, 41, 81, 121, 161, 201, 241, 281, 321, 361):
        decided = [b1[k].realloc_if_needed(one, k, (1, n, 256), bits[k], 1 << 20) for k in "ab"]
        ta, tb = many._tracks.get("a"), many._tracks.get("b")
        one_history = ta is not None and tb is not None and ta.same_as(tb)    # (one track then)
        g = growth_decisions(many, [(t2[k], k, (1, n, 256), 256 * n, bits[k]) for k in "ab"])
        mixed += one_history and g.keeps(0) != g.keeps(1)
        assert [g.decide(j, 1 << 20) for j in range(2)] == decided, n
        for k in "ab":
            assert [getattr(one._tracks[k], a) for a in _Track.HISTORY] == \
                [getattr(many._tracks[k], a) for a in _Track.HISTORY], (n, k)
    assert mixed, "no step had one sharer grow and the other keep"


def test_a_compiled_variants_kept_grouping_parts_where_its_buffers_see_two_shapes():
    """observe_kept keeps a compiled variant's grouping while no track changes; its buffers
    that shared a history and now see two lengths (both keep) part, each observing its own,
    as realloc one at a time does."""
    import types
    from engine.predictors import AdaptivePredictor, _Track
    from engine.shape_predictor import BufferState
    one, many = AdaptivePredictor(), AdaptivePredictor()
    b1 = {k: BufferState() for k in "ab"}
    t2 = {k: types.SimpleNamespace(state=BufferState()) for k in "ab"}
    variant = object()
    for k in "ab":
        b1[k].realloc_if_needed(one, k, (1, 100), 32)
    many.replay([(t2[k].state, k, (1, 100), 100, 32) for k in "ab"], 0)
    # (after 70 and 60 their histories differ: two tracks from then on)
    for lengths, shared in (((90, 90), True), ((80, 80), True), ((70, 60), False), ((50, 50), False)):
        for k, n in zip("ab", lengths):
            assert b1[k].realloc_if_needed(one, k, (1, n), 32).action == "reuse"
        many.observe_kept([(t2[k], k, (1, n), n, 32) for k, n in zip("ab", lengths)], variant)
        for k in "ab":
            assert [getattr(one._tracks[k], a) for a in _Track.HISTORY] == \
                [getattr(many._tracks[k], a) for a in _Track.HISTORY], (lengths, k)
            assert list(one._tracks[k].recent) == list(many._tracks[k].recent), (lengths, k)
        # the grouping is kept with the variant (one track observed for both while they agree)
        assert many._plans[id(variant)][0] is variant
        assert (many._tracks["a"] is many._tracks["b"]) == shared, lengths


def test_buffers_with_one_history_share_a_track_until_they_part():
    """Two buffers that always saw the same lengths are observed once per replay; one called
    alone (the flow) gets its own copy, the other keeps the shared one's history."""
    from engine.predictors import AdaptivePredictor
    from engine.shape_predictor import BufferState
    p, a, b = AdaptivePredictor(), BufferState(), BufferState()
    for n in (40, 39, 38):
        p.replay([(a, "a", (1, n), n, 32), (b, "b", (1, n), n, 32)], 1 << 20)
    assert p._tracks["a"] is p._tracks["b"] and p._tracks["a"].users == 2
    b.realloc_if_needed(p, "b", (1, 37), 32, 1 << 20)
    assert p._tracks["a"] is not p._tracks["b"]
    assert p._tracks["a"].t == 3 and p._tracks["b"].t == 4 and p._tracks["a"].users == 1


@settings(max_examples=80, deadline=None)
@given(needs=st.lists(st.integers(1, 4096), min_size=2, max_size=60),
       policy=st.sampled_from(["adaptive", "openvino"]))
def test_surely_keeps_never_promises_a_buffer_the_policy_then_drops(needs, policy):
    """predictors.surely_keeps (what a compiled plan checks before making the policy's calls in
    one go) answers True only where the policy's own decision is then `reuse`; for the adaptive
    policy it also sees a short requirement after long ones in its window."""
    from engine.predictors import surely_keeps
    p = make_predictor(policy)
    buf = BufferState()
    for need in needs:
        sure = surely_keeps(p, buf, need, "b")
        d = buf.realloc_if_needed(p, "b", (need,), 32)
        if sure:
            assert d.action == "reuse", (need, d)
    if policy == "adaptive" and needs[0] >= 400:
        # a requirement 10x below the first right after it: the window holds the first
        q, b2 = make_predictor("adaptive"), BufferState()
        b2.realloc_if_needed(q, "b", (needs[0],), 32)
        assert surely_keeps(q, b2, needs[0] // 20, "b")


def test_shared_buffers_that_both_grow_move_their_own_horizons():
    """Two buffers sharing a history (the same lengths so far) that both grow in one replay
    (a steady step: each reallocation moves the horizon of its own history) decide as they
    would one call at a time: a byte buffer beside a float one, lengths 1..5 then 300."""
    from engine.predictors import AdaptivePredictor
    from engine.shape_predictor import BufferState
    one, many = AdaptivePredictor(), AdaptivePredictor()
    b1 = {k: BufferState() for k in "ab"}
    b2 = {k: BufferState() for k in "ab"}
    bits = {"a": 8, "b": 32}
    for n in (1, 2, 3, 4, 5, 300, 301, 600):
        for k in "ab":
            b1[k].realloc_if_needed(one, k, (1, n, 256), bits[k], 1 << 30)
        many.replay([(b2[k], k, (1, n, 256), 256 * n, bits[k]) for k in "ab"], 1 << 30)
        assert [b1[k].cap_elems for k in "ab"] == [b2[k].cap_elems for k in "ab"], n
