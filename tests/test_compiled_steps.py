"""Compiled steps (engine/fast_path/compiled_steps.py): a partial replay's dirty device nodes
(a decode step's KV appends and attentions) traced once on symbolic dims, the KV length and
the cache's room parameters, decide what the flow decides and compute what it computes.

Decode loops run with the fast path on (the default: compiled steps, partial replays, steady
steps) and off (the flow): every inference's outputs are bit-identical and its counters (every
decision, KV bytes appended, live and peak bytes) equal, and compiled steps must have served
inferences; traced, the events the reader expands from them are the flow's."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import Network, build_program
from engine.fast_path import NOT_DECISIONS
from tests.models import kv_decoder_step
from tests.test_partial_replay import KV_FEEDBACK, SETTINGS, _decode_steps
from tests.test_steady_steps import GPT2_FEEDBACK, _gpt2_steps, _tiny_gpt2

# the GPU kind's decodes build a GEMV per row count and fused epilogue: one quad a step
pytestmark = pytest.mark.usefixtures("gemv_one_quad")


def _run(prog, steps, device, feedback, fast: bool, kind: str = "cpu", predictor: str = "adaptive",
         **kw):
    net = Network(prog, device, impls="dynamic", fast_path=fast, feedback=feedback, predictor=predictor,
                  **kw)
    net.impls.device_type = kind
    back = {v: k for k, v in feedback.items()}
    outs, counters, compiled = [], [], []
    for feeds, fed in steps:
        o = net.infer(feeds, fed_back=back if fed else None)
        outs.append({k: np.array(v) for k, v in o.items()})
        counters.append({k: v for k, v in net.counters.items() if k not in NOT_DECISIONS})
        compiled.append(bool(net.counters.get("plan.compiled")))
    return net, outs, counters, compiled


def _same(prog, steps, device, feedback, **kw):
    """On and off agree inference by inference; returns the run with the fast path on and
    which of its inferences were compiled."""
    net, on, c_on, compiled = _run(prog, steps, device, feedback, True, **kw)
    _, off, c_off, _ = _run(prog, steps, device, feedback, False, **kw)
    for i, (a, b) in enumerate(zip(on, off)):
        for name in b:
            assert np.array_equal(a[name], b[name]), f"inference {i} output {name}"
        assert c_on[i] == c_off[i], f"inference {i}"
    return net, on, compiled


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
@pytest.mark.parametrize("predictor", ["adaptive", "openvino"])
def test_a_gpt2_decode_runs_compiled_steps_as_the_flow(device, kind, predictor):
    """Thirty tokens: the fed-back steps after the prompt run the flow (they grow the caches and
    record the partial plan), the next its steady steps (traced), and from then on the compiled
    steps serve every token whose caches keep their room; caches that grow take the flow, and
    a later step binds the same function to the new buffers without a new trace. The logits
    match onnxruntime."""
    import onnxruntime as ort
    from tests.models import gpt2_decoder
    from tests.test_steady_steps import D_HEAD, HEADS, LAYERS
    prog = _tiny_gpt2()
    steps = _gpt2_steps(2, 30)
    net, on, compiled = _same(prog, steps, device, GPT2_FEEDBACK, kind=kind, predictor=predictor)
    cs = net.fast.steps
    # per growth of the caches: the flow's reallocation, and the step after it (steady steps
    # again) binds the variants to the new buffers
    assert compiled[:3] == [False, False, False] and sum(compiled) >= 20, compiled
    assert cs.runs == sum(compiled)
    assert 1 <= cs.built <= 3, cs.summary()          # a variant per cache structure at most
    model = gpt2_decoder(layers=LAYERS, d_model=HEADS * D_HEAD, heads=HEADS, vocab=50, max_pos=64)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    pasts = {f"past_{k}_{i}": np.zeros((1, HEADS, 0, D_HEAD), np.float32)
             for i in range(LAYERS) for k in ("key", "value")}
    for (feeds, _), got in zip(steps, on):
        ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {**feeds, **pasts})))
        np.testing.assert_allclose(got["logits"], ref["logits"], rtol=1e-4, atol=1e-4)
        pasts = {f"past_{k}_{i}": ref[f"present_{k}_{i}"] for i in range(LAYERS) for k in ("key", "value")}


@SETTINGS
@given(chunks=st.lists(st.sampled_from([1, 1, 1, 1, 1, 2, 3]), min_size=8, max_size=28),
       predictor=st.sampled_from(["adaptive", "openvino"]), kind=st.sampled_from(["cpu", "gpu"]))
def test_random_decodes_with_compiled_steps(device, chunks, predictor, kind):
    """Random chunked decodes through the fused attention: chunks of several tokens change more
    than the KV length (the guards or the boundary fail, the partial replay or the flow runs),
    caches grow past their room; on and off agree on every inference."""
    prog = build_program(kv_decoder_step())
    _same(prog, _decode_steps([2] + chunks), device, KV_FEEDBACK, kind=kind, predictor=predictor)


@SETTINGS
@given(chunks=st.lists(st.sampled_from([1, 1, 1, 1, 1, 2, 4]), min_size=10, max_size=30),
       kind=st.sampled_from(["cpu", "gpu"]))
def test_random_gpt2_decodes_with_compiled_steps(device, chunks, kind):
    """GPT-2 decodes of random chunks: a chunk of several tokens changes the positions' shape
    math (the host values the function computes) and the attention's shapes; on and off agree."""
    rng = np.random.default_rng(len(chunks))
    steps = [(dict(_gpt2_steps(2, 0)[0][0]), False)]
    for n in chunks:
        steps.append(({"input_ids": rng.integers(0, 50, (1, n)).astype(np.int64)}, True))
    _same(_tiny_gpt2(), steps, device, GPT2_FEEDBACK, kind=kind)


def test_after_a_chunk_the_same_function_serves_the_new_base(device):
    """A chunk of three tokens sends the decode through the flow, which records a new partial
    plan; its steps are served by the function traced before the chunk (no new trace), bound
    to the new plan's blocks and host checks."""
    rng = np.random.default_rng(0)
    steps = [(dict(_gpt2_steps(2, 0)[0][0]), False)]
    for n in [1] * 8 + [3] + [1] * 10:
        steps.append(({"input_ids": rng.integers(0, 50, (1, n)).astype(np.int64)}, True))
    net, _, compiled = _same(_tiny_gpt2(), steps, device, GPT2_FEEDBACK)
    assert sum(compiled[:9]) >= 3 and sum(compiled[10:]) >= 5, compiled
    assert net.fast.steps.built == 1, net.fast.steps.summary()


def test_a_step_that_diverges_after_its_host_nodes_ran_counts_them_once(device, monkeypatch):
    """A compiled step computes the host nodes, then finds a device node's boundary differing
    from the base's (made to happen here at one step: a check that fails): the partial replay
    goes on with the flow from there and must not run those host nodes a second time (their
    decisions would count twice)."""
    from engine.fast_path import compiled_steps, partial
    steps = _gpt2_steps(2, 20)
    state = {"armed": False, "checks": 0, "done": False}
    real_holds, real_apply = partial.holds, compiled_steps.CompiledSteps._apply

    def holds(checks, buffers):         # the chosen step's second check fails
        if state["armed"]:
            state["checks"] += 1
            if state["checks"] == 2:
                state["armed"], state["done"] = False, True
                return False
        return real_holds(checks, buffers)

    def apply(self, plan, d, c, got):   # the chosen step (after six compiled ones) is not compiled
        if not state["done"] and self.runs >= 6:
            state["armed"] = True
            return False
        return real_apply(self, plan, d, c, got)
    monkeypatch.setattr(partial, "holds", holds)
    monkeypatch.setattr(compiled_steps, "holds", holds)
    monkeypatch.setattr(compiled_steps.CompiledSteps, "_apply", apply)
    net, on, c_on, compiled = _run(_tiny_gpt2(), steps, device, GPT2_FEEDBACK, True)
    monkeypatch.undo()
    _, off, c_off, _ = _run(_tiny_gpt2(), steps, device, GPT2_FEEDBACK, False)
    assert state["done"]
    for i, (a, b) in enumerate(zip(on, off)):
        assert np.array_equal(a["logits"], b["logits"]), i
        assert c_on[i] == c_off[i], f"inference {i}"


def test_compiled_steps_serve_a_decode_and_can_be_turned_off(device):
    prog = build_program(kv_decoder_step())
    steps = _decode_steps([2] + [1] * 14)
    net, _, compiled = _same(prog, steps, device, KV_FEEDBACK)
    assert sum(compiled) >= 6 and net.fast.steps.built <= 2, (compiled, net.fast.steps.summary())
    net, _, _, compiled = _run(prog, steps, device, KV_FEEDBACK, True, compile_plans="off")
    assert net.fast.steps is None and not any(compiled)


@pytest.mark.parametrize("level", ["all", "decisions"])
def test_a_traced_decode_takes_compiled_steps_that_the_reader_expands(device, tmp_path, level):
    """A traced run's compiled step writes one `plan` event with its values; the reader expands
    it into its dirty nodes' events (engine/fast_path/step_events.py), which are the flow's,
    fields included, at both trace levels. A bad value is refused with its line."""
    import json

    from tests.test_steady_steps import _events
    from traces import TraceWriter
    from traces.reader import TraceError, read_trace
    from traces.sinks import DecisionsOnly
    prog = build_program(kv_decoder_step())
    steps = _decode_steps([2] + [1] * 12 + [3] + [1] * 6)
    paths, compiled = {}, None
    for fast in (True, False):
        paths[fast] = tmp_path / f"{fast}.jsonl"
        w = TraceWriter(str(paths[fast]), {})
        _, _, _, ran = _run(prog, steps, device, KV_FEEDBACK, fast,
                            trace=w if level == "all" else DecisionsOnly(w))
        w.close()
        compiled = compiled or ran
    assert sum(compiled) >= 10, compiled
    for i in range(len(steps)):
        assert _events(paths[True], i) == _events(paths[False], i), f"inference {i}"
    good = paths[True].read_text().splitlines()
    k = next(k for k, line in enumerate(good) if '"template_of":' in line)
    base = next(b for b, line in enumerate(good) if '"template":' in line)

    def refused(n: int, edit, match: str) -> None:
        lines = list(good)
        rec = json.loads(lines[n])
        edit(rec)
        lines[n] = json.dumps(rec)
        paths[True].write_text("\n".join(lines) + "\n")
        with pytest.raises(TraceError, match=f":{k + 1}: bad compiled inference: {match}"):
            list(read_trace(str(paths[True]))[1])
    refused(k, lambda r: r.update(values=r["values"][:1]), "a template names value")
    refused(base, lambda r: r["template"].update(nodes=3), "its template is not")
    refused(base, lambda r: r["template"]["fields"][0].__setitem__(3, "iter"), "a template field is not")
    refused(k, lambda r: r.update(template_of=k + 100), "inference .* is not the base")
    refused(k, lambda r: r.update(written=[3]), "written is not an array of node names")
