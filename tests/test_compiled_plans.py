"""Compiled plans (engine/fast_path/compiled.py): a whole inference of steady steps traced once
on symbolic dims and called for new signatures decides what the flow decides and computes
what it computes.

Random (batch, length) sequences (growth past the buffers, shrink, repeats, batch changes) run
with the fast path on (compiled plans, whole plans, steady steps) and off (the flow);
each inference's outputs are bit-identical and its counters (every decision, the live and peak
bytes) equal, the outputs match onnxruntime, and compiled plans must have served inferences."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import Network, build_program
from engine.fast_path import NOT_DECISIONS
from tests.models import bert_encoder
from tests.test_partial_replay import SETTINGS
from tests.test_shape_functions import BERT, _bert_steps

# the flow's inferences that build the first compiled plan: the first inference, then a shorter
# length that every node takes its steady step for and that fits the buffers
WARM = [(1, 41), (1, 40)]


def _run(prog, steps, device, fast: bool, kind: str, predictor: str = "adaptive", paths=None):
    """The command line's default policy (adaptive) unless told: the plugin's reclaim rule
    reallocates on most shrinks, and a compiled plan serves only inferences that keep their
    buffers. `paths`: a list that gets what served each inference (Compiled, Replay, Flow)."""
    net = Network(prog, device, impls="dynamic", fast_path=fast, predictor=predictor,
                  compile_plans="all" if fast else "off")
    net.impls.device_type = kind
    outs, counters = [], []
    for feeds, _ in steps:
        outs.append({k: np.array(v) for k, v in net.infer(feeds).items()})
        c = net.counters
        counters.append({k: v for k, v in c.items() if k not in NOT_DECISIONS})
        if paths is not None:
            paths.append("C" if c.get("plan.compiled") else "R" if c.get("plan.replay") else "F")
    return net, outs, counters


# unfused, the attention's Transposes take runtime skips (the flow): no plan compiles
@pytest.mark.parametrize("kind,fusion", [("gpu", True), ("cpu", True)])
@given(shapes=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 140)), min_size=4, max_size=8))
@SETTINGS
def test_compiled_plans_decide_and_compute_as_the_flow(device, kind, fusion, shapes):
    import onnxruntime as ort
    model = bert_encoder(**BERT)
    prog = build_program(model, fusion=fusion)
    steps = _bert_steps(WARM + [(1, 39)] + shapes)      # 39: compiled (the other tests say)
    net, on, c_on = _run(prog, steps, device, True, kind)
    _, off, c_off = _run(prog, steps, device, False, kind)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for i, ((feeds, _), a, b) in enumerate(zip(steps, on, off)):
        for name in b:
            assert np.array_equal(a[name], b[name]), f"inference {i} output {name}"
        assert c_on[i] == c_off[i], f"inference {i}"
        np.testing.assert_allclose(a["last_hidden_state"], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    cp = net.fast.compiled
    assert cp.built >= 1 and cp.runs >= 1, cp.summary()
    # plans bound by a flow (another batch) count as the one bound after the first inference did
    assert cp.counts_differ == 0


def test_a_compiled_inference_is_counted_and_leaves_the_flow_its_state(device):
    """Every length of one batch runs the compiled plan (one `plan.compiled` each), a length
    past the buffers too (growth.py: the flow's realloc decisions for the buffers that do not
    keep, the arguments naming them set again), and the next lengths run it on the new
    buffers; a batch change then runs the flow, which reads the nodes' state the compiled
    inferences left (put back lazily) and decides as the flow alone does."""
    prog = build_program(bert_encoder(**BERT))
    steps = _bert_steps(WARM + [(1, 39), (1, 150), (1, 38), (2, 20), (1, 37), (1, 160)])
    _, off, c_off = _run(prog, steps, device, False, "gpu")
    net = Network(prog, device, impls="dynamic", predictor="adaptive", compile_plans="all")
    net.impls.device_type = "gpu"
    compiled = []
    for k, (feeds, _) in enumerate(steps):
        out = net.infer(feeds)
        assert np.array_equal(out["last_hidden_state"], off[k]["last_hidden_state"]), k
        assert {n: v for n, v in net.counters.items() if n not in NOT_DECISIONS} == c_off[k], k
        compiled.append(net.counters.get("plan.compiled", 0))
    assert compiled == [0, 1, 1, 1, 1, 0, 1, 1], compiled
    # 150 grew buffers, 160 the graph inputs' (the policy's extra held the others)
    assert c_off[3].get("realloc.alloc", 0) > 0, c_off[3]
    for k in (3, 7):
        assert c_off[k].get("realloc.external.alloc", 0) > 0 and c_off[k].get("set_args.set", 0) > 0, c_off[k]


def test_a_growth_under_the_plugins_policy_decides_as_the_flow(device):
    """The plugin's ShapePredictor (no grouped decisions: growth_decisions asks it call by
    call, and repeats the calls it surely keeps at the end): compiled growths allocate, and
    every inference computes and counts what the flow does."""
    prog = build_program(bert_encoder(**BERT))
    steps = _bert_steps(WARM + [(1, 39), (1, 100), (1, 38), (1, 150), (1, 37), (1, 36), (1, 155)])
    _, off, c_off = _run(prog, steps, device, False, "gpu", predictor="openvino")
    net = Network(prog, device, impls="dynamic", predictor="openvino", compile_plans="all")
    net.impls.device_type = "gpu"
    grown = 0
    for k, (feeds, _) in enumerate(steps):
        out = net.infer(feeds)
        assert np.array_equal(out["last_hidden_state"], off[k]["last_hidden_state"]), k
        assert {n: v for n, v in net.counters.items() if n not in NOT_DECISIONS} == c_off[k], k
        grown += bool(net.counters.get("plan.compiled") and net.counters.get("realloc.alloc"))
    assert grown >= 2, grown


def test_a_growth_the_device_cannot_give_leaves_a_state_the_next_inferences_run_from(device, monkeypatch):
    """A counted growth that raises midway (the device cannot give a new buffer: forced on the
    second) has moved some buffers and given back the one it failed for: the variant's
    snapshot, which the next flow puts back, names the buffers those tensors hold in the
    memory pool (none for the last), and the policy's record of that one holds no buffer (its
    decision had recorded the size asked for, which a later inference would have reused: a
    kernel then wrote past the buffer and PoCL's heap broke). The inferences after it compute
    and count what the flow does after the same failure."""
    from engine.diagnose import DeviceMemoryError
    from engine.fast_path import growth
    from engine.memory_pool import MemoryPool
    prog = build_program(bert_encoder(**BERT))
    steps = _bert_steps(WARM + [(1, 39), (1, 150), (1, 38), (1, 150), (1, 160), (1, 37)])
    real = MemoryPool.alloc

    def run(fast: bool):
        net = Network(prog, device, impls="dynamic", predictor="adaptive", compile_plans="all" if fast else "off",
                      fast_path=fast)
        net.impls.device_type = "gpu"
        made, outs, counts = [], [], []

        def alloc(self, ctx, nbytes, holder, constant=False):
            if holder not in prog.inputs:     # (a node's buffer, not an input's)
                made.append(holder)
                if failing[0] and len(made) >= 2 and holder == made[1]:   # (its exact size too)
                    raise DeviceMemoryError("forced")
            return real(self, ctx, nbytes, holder, constant)
        monkeypatch.setattr(MemoryPool, "alloc", alloc)
        for k, (feeds, _) in enumerate(steps):
            failing = [k == 3]
            made.clear()
            if k == 3:
                with pytest.raises(DeviceMemoryError):
                    net.infer(feeds)
                if fast:      # (checked before the next flow puts the snapshot back)
                    (c,) = [c for cands in net.fast.compiled.table.values() for c in cands]
                    pool, snap = net.buffers.memory, dict((id(o), v) for o, v in growth.snapshot_of(c))
                    failed = net.buffers.tensors.get(made[-1]) or next(
                        t for i in net.insts for t in i.internals if t.name == made[-1])
                    assert failed.buf is None and not failed.state.has_buffer, made
                    assert id(failed) not in snap or snap[id(failed)][1] is None, made
                    for t in [t for i in net.insts for t in list(i.outputs) + i.internals]:
                        if id(t) in snap and t.capacity:
                            assert snap[id(t)][1] is t.buf and t.name in pool._blocks[id(t.buf)].holders, t.name
                continue
            outs.append(np.array(net.infer(feeds)["last_hidden_state"]))
            counts.append({n: v for n, v in net.counters.items() if n not in NOT_DECISIONS})
        monkeypatch.setattr(MemoryPool, "alloc", real)
        return outs, counts
    on, c_on = run(True)
    off, c_off = run(False)
    for i, (a, b) in enumerate(zip(on, off, strict=True)):
        assert np.array_equal(a, b), i
        assert c_on[i] == c_off[i], i
    sess_feeds = [f for k, (f, _) in enumerate(steps) if k != 3]
    import onnxruntime as ort
    sess = ort.InferenceSession(bert_encoder(**BERT).SerializeToString(), providers=["CPUExecutionProvider"])
    for f, a in zip(sess_feeds, on):
        np.testing.assert_allclose(a, sess.run(None, f)[0], rtol=1e-4, atol=1e-4)


def test_a_growth_after_an_empty_input_or_one_at_an_offset_is_not_counted():
    """An empty tensor among those that moved before a growth (a graph input, a host value) is
    bound to the network's dummy buffer by the flow (Buffers.device_buffer), one at an offset
    other than 0 changes a shape_info block: such a growth binds node by node (growth.grow),
    as does a variant with no table."""
    from engine.fast_path import growth
    from engine.layout import Layout
    from engine.memory import Tensor

    class Variant:
        growth_table = []
    full, empty, moved = Tensor("a", Layout((1, 8), "i64")), Tensor("b", Layout((1, 0), "i64")), Tensor("c", Layout((4,)))
    moved.offset = 4
    assert growth.counted(Variant, [full])
    assert not growth.counted(Variant, [full, empty])
    assert not growth.counted(Variant, [moved])
    Variant.growth_table = None
    assert not growth.counted(Variant, [full])


def _as_the_flow(on, off, c_on, c_off) -> None:
    """Each inference's output and decisions, fast path on, as the flow's."""
    for i, (a, b) in enumerate(zip(on, off, strict=True)):
        assert np.array_equal(a["last_hidden_state"], b["last_hidden_state"]), i
        assert c_on[i] == c_off[i], i


@pytest.mark.parametrize("table", [True, False])
def test_an_untraced_growth_leaves_the_nodes_state_waiting(device, monkeypatch, table):
    """An untraced growth reads and sets no node's state but the buffers it moves and the
    arguments naming them (growth.grow_counted): the state stays waiting (Pending), put back by
    the next flow only. Where the variant's table does not hold (a kernel's tensor at an offset
    other than 0: forced here), the state is put back first and each node binds its arguments
    (growth.grow). Every inference computes and counts what the flow does."""
    from engine.fast_path import compiled, growth
    prog = build_program(bert_encoder(**BERT))
    steps = _bert_steps(WARM + [(1, 39), (1, 100), (1, 38), (1, 150), (1, 150), (1, 37), (1, 20)])
    _, off, c_off = _run(prog, steps, device, False, "gpu")
    if not table:
        monkeypatch.setattr(growth, "table", lambda c: None)
    put_back, ways = [], []
    snapshot_back = compiled.Pending._snapshot_back
    monkeypatch.setattr(compiled.Pending, "_snapshot_back", lambda self: (put_back.append(1), snapshot_back(self))[1])
    for name in ("grow", "grow_counted"):
        monkeypatch.setattr(growth, name, lambda *a, f=getattr(growth, name), name=name: (ways.append(name), f(*a))[1])
    paths, at_growth = [], []
    net = Network(prog, device, impls="dynamic", predictor="adaptive", compile_plans="all")
    net.impls.device_type = "gpu"
    on, c_on = [], []
    for feeds, _ in steps:
        put_back.clear()
        grown = len(ways)
        on.append({k: np.array(v) for k, v in net.infer(feeds).items()})
        c = net.counters
        c_on.append({k: v for k, v in c.items() if k not in NOT_DECISIONS})
        paths.append("C" if c.get("plan.compiled") else "R" if c.get("plan.replay") else "F")
        if len(ways) > grown:
            at_growth.append(len(put_back))
    _as_the_flow(on, off, c_on, c_off)
    # 100 and 150 grow, compiled; 150 again is the variant's first repeat: the flow, which
    # reads the state the growth left waiting (and teaches the repeat's counts)
    assert "".join(paths[3:]) == "CCCFCC", "".join(paths)
    assert ways == (["grow_counted"] * 2 if table else ["grow"] * 2), ways
    assert at_growth == ([0, 0] if table else [1, 1]), at_growth


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_a_traced_run_writes_its_compiled_inferences_as_the_flows_events(device, tmp_path, kind):
    """A traced run's compiled inference writes one `plan compiled` event; the reader expands it
    into its base's device-node events with the moving fields filled (step_events.py), which
    are the flow's, fields included. A transition of compiled inferences met a second time is
    recorded as a whole plan, as in an untraced run: its replays' `plan replay` events carry the
    template and values of the inference they stand for, and expand to its events too."""
    from tests.test_steady_steps import _events
    from traces import TraceWriter
    prog = build_program(bert_encoder(**BERT))
    lengths = WARM + [(1, 39), (1, 30), (1, 35), (1, 30), (1, 35), (1, 30), (2, 20), (1, 30), (1, 35), (1, 30),
                      (1, 150), (1, 38), (1, 37), (1, 20), (2, 30), (2, 31), (1, 33)]
    paths, compiled, replayed = {}, [], []
    for fast in (True, False):
        paths[fast] = tmp_path / f"{fast}.jsonl"
        net = Network(prog, device, impls="dynamic", fast_path=fast, predictor="adaptive",
                      compile_plans="all", trace=TraceWriter(str(paths[fast]), {}))
        net.impls.device_type = kind
        for feeds, _ in _bert_steps(lengths):
            net.infer(feeds)
            if fast:
                compiled.append(net.counters.get("plan.compiled", 0))
                replayed.append(net.counters.get("plan.replay", 0))
        net.trace.close()
    assert sum(compiled) >= 5, compiled
    # 30 -> 35 and 35 -> 30 recorded when met again (6, 7), replayed after the batch of 2 (10, 11)
    assert sum(replayed) == replayed[10] + replayed[11] == 2, replayed
    for i in range(len(lengths)):
        assert _events(paths[True], i) == _events(paths[False], i), f"inference {i}"


@pytest.mark.parametrize("which", ["base", "template"])
def test_a_traced_run_replays_no_plan_whose_events_a_reader_no_longer_holds(device, which):
    """A reader keeps the last 64 plan bases and the last 64 templates: once as many were written
    after a plan's base (here counted up by hand), or after the template its compiled
    inference expands from, the plan is not replayed; the inference is compiled again."""
    from traces import MemoryTrace
    from traces.schema import PLAN_BASES_KEPT, TEMPLATE_BASES_KEPT
    prog = build_program(bert_encoder(**BERT))
    net = Network(prog, device, impls="dynamic", predictor="adaptive", compile_plans="all", trace=MemoryTrace())
    net.impls.device_type = "gpu"
    paths = []
    for k, (feeds, _) in enumerate(_bert_steps(WARM + [(1, 30), (1, 35)] * 4 + [(1, 30)])):
        if k == 7:              # before the first replay
            assert paths[5:] == ["C", "C"]
            if which == "base":
                net.fast.bases += PLAN_BASES_KEPT
            else:
                net.fast.templates += TEMPLATE_BASES_KEPT
        net.infer(feeds)
        paths.append("C" if net.counters.get("plan.compiled") else "R" if net.counters.get("plan.replay") else "F")
    # 30 -> 35 and 35 -> 30 recorded at their second meeting (5, 6); the first two replays
    # refused (7, 8: recorded again; a stale template also sends its variant to the flow,
    # which binds it anew), the next two served (9, 10)
    assert "".join(paths) == ("FCCCCCCCCRR" if which == "base" else "FCCCCCCFCRR"), "".join(paths)


def test_a_traced_run_binds_and_rebinds_as_an_untraced_one(device, tmp_path):
    """Batch 1 and batch 2 (two variants of the same kernels: a batch of 1 broadcasts) back and
    forth, growing past the buffers twice: a traced run binds the other batch's variant beside
    the one its flow checked, compiles the growths and binds both variants again to the new
    buffers, as an untraced run does; its compiled inferences expand to the flow's events (a
    growth's moved nodes write theirs), the capacities of the new buffers included (they are
    values of each compiled inference, step_events.Capacity), and count what the flow does."""
    from tests.test_steady_steps import _events
    from traces import TraceWriter
    prog = build_program(bert_encoder(**BERT))
    lengths = WARM + [(1, 39), (2, 20), (2, 19), (1, 30), (2, 15), (1, 35), (1, 150), (1, 38), (2, 18),
                      (1, 37), (2, 17), (1, 160), (2, 16), (1, 36), (2, 15)]
    paths, compiled, counted, nets = {}, {}, {}, {}
    for name, fast, traced in (("traced", True, True), ("untraced", True, False), ("flow", False, True)):
        paths[name] = tmp_path / f"{name}.jsonl"
        net = Network(prog, device, impls="dynamic", fast_path=fast, predictor="adaptive",
                      compile_plans="all" if fast else "off",
                      trace=TraceWriter(str(paths[name]), {}) if traced else None)
        net.impls.device_type = "gpu"
        compiled[name], counted[name], nets[name] = [], [], net
        for feeds, _ in _bert_steps(lengths):
            net.infer(feeds)
            compiled[name].append(net.counters.get("plan.compiled", 0))
            counted[name].append({k: v for k, v in net.counters.items() if k not in NOT_DECISIONS})
        if traced:
            net.trace.close()
    assert counted["traced"] == counted["flow"] == counted["untraced"]
    # both bound the plan after the first inference (build_ahead; a traced run's second one
    # writes its nodes' events and bases the template on them) and compile a length past the
    # buffers, 150 and 160 (growth.py: a traced one writes the moved nodes' events itself)
    assert compiled["traced"] == compiled["untraced"], compiled
    assert compiled["traced"][1] == compiled["traced"][8] == compiled["traced"][13] == 1, compiled
    assert nets["traced"].fast.compiled.counts_differ == 0
    # after each growth (150, 160) the next lengths of both batches are compiled at once
    assert all(compiled["traced"][i] for i in (9, 10, 11, 12, 14, 15, 16)), (compiled, lengths)
    for i in range(len(lengths)):
        assert _events(paths["traced"], i) == _events(paths["flow"], i), f"inference {i}"


def test_a_guard_that_fails_falls_back_to_the_flow(device):
    """Batch 2 fails a guard of the plan traced at batch 1 (a batch of 1 broadcasts): the flow
    runs after the host nodes the attempt ran and decides as the flow alone; it keeps every
    resource (2 x 20 tokens fit the buffers of 41), so it traces a second variant, which serves
    the next batch-2 lengths; a batch-1 length then finds the first again. Lengths 8 to 41 cross
    the attention's rows-per-block choices (query_rows) and need no variant of their own: the
    choice is a value of the traced function (symbolic.piecewise), not a guard."""
    prog = build_program(bert_encoder(**BERT))
    lengths = [(1, 41), (1, 40), (1, 39), (2, 20), (2, 19), (2, 18), (1, 8), (2, 17), (1, 30)]
    steps = _bert_steps(lengths)
    net = Network(prog, device, impls="dynamic", predictor="adaptive", compile_plans="all")
    net.impls.device_type = "gpu"
    ref = Network(prog, device, impls="dynamic", predictor="adaptive", fast_path=False)
    ref.impls.device_type = "gpu"
    compiled = []
    for feeds, _ in steps:
        got, want = net.infer(feeds), ref.infer(feeds)
        assert np.array_equal(got["last_hidden_state"], want["last_hidden_state"])
        assert {k: v for k, v in net.counters.items() if k not in NOT_DECISIONS} == \
            {k: v for k, v in ref.counters.items() if k not in NOT_DECISIONS}
        compiled.append(net.counters.get("plan.compiled", 0))
    assert compiled == [0, 1, 1, 0, 1, 1, 1, 1, 1]
    assert net.fast.compiled.built == 2


def test_the_plan_traced_after_the_first_inference_serves_the_second(device):
    """An untraced run traces and binds its plan right after the model's first inference
    (build_ahead), with the counts of an inference of steady steps: the second length is
    compiled already, deciding and computing as the flow does; a flow that binds a plan later
    (another batch) counts what it was bound with (counts_differ)."""
    prog = build_program(bert_encoder(**BERT))
    # (batch 2 at a new length within the buffers: at the length before, the position rows, which
    # have no batch dim, would keep their dims, and only an inference whose every device node
    # sees new dims binds a plan)
    steps = _bert_steps([(1, n) for n in (41, 40, 39, 30, 20)] + [(2, 19), (2, 10), (1, 12)])
    _, off, c_off = _run(prog, steps, device, False, "gpu")
    net = Network(prog, device, impls="dynamic", predictor="adaptive", compile_plans="all")
    net.impls.device_type = "gpu"
    built, runs = [], []
    for k, (feeds, _) in enumerate(steps):
        out = net.infer(feeds)
        assert np.array_equal(out["last_hidden_state"], off[k]["last_hidden_state"]), k
        assert {n: v for n, v in net.counters.items() if n not in NOT_DECISIONS} == c_off[k], k
        built.append(net.fast.compiled.built)
        runs.append(net.counters.get("plan.compiled", 0))
        if k == 0:      # the policy's grouping of its calls made there too (group_ahead)
            fn = next(iter(net.fast.compiled.table.values()))[0].fn
            assert net.buffers.predictor._plans[id(fn)][0] is fn
    # batch 2 is a guard that fails: its first length traces its own variant
    assert built == [1, 1, 1, 1, 1, 2, 2, 2], built
    assert runs == [0, 1, 1, 1, 1, 0, 1, 1], runs
    assert net.fast.compiled.counts_differ == 0


def test_the_state_the_first_inference_left_serves_only_the_next(device):
    """The plan bound after the first inference finds the state that inference left (compiled.
    ahead: no walk over the nodes at the second length); with another batch's flow right
    after the first inference, or later, every inference still decides and counts as the flow
    does."""
    prog = build_program(bert_encoder(**BERT))
    for lengths in ([(1, 41), (2, 20), (1, 40), (1, 39)], [(1, 41), (1, 40), (2, 20), (1, 39)]):
        steps = _bert_steps(lengths)
        _, off, c_off = _run(prog, steps, device, False, "gpu")
        net, on, c_on = _run(prog, steps, device, True, "gpu")
        for k in range(len(steps)):
            assert np.array_equal(on[k]["last_hidden_state"], off[k]["last_hidden_state"]), (lengths, k)
            assert c_on[k] == c_off[k], (lengths, k)


def test_a_structure_refused_twice_is_not_traced_again(device, monkeypatch):
    """A trace that escapes (here every one) is tried after the model's first inference (not
    counted: build_ahead), then twice per input structure, then the flow's inferences stop
    paying for it; the reason is kept for `dyncli bench --json`."""
    from engine.fast_path import compiled
    from engine.symbolic import Escape
    tries = []

    def refuse(*a):
        tries.append(1)
        raise Escape("a dim was hashed")
    monkeypatch.setattr(compiled, "_build", refuse)
    prog = build_program(bert_encoder(**BERT))
    net, on, c_on = _run(prog, _bert_steps([(1, n) for n in (41, 40, 39, 38, 37, 36)]), device, True, "gpu")
    assert len(tries) == 1 + compiled.MAX_REFUSALS == 3
    assert net.fast.compiled.summary() == {"built": 0, "runs": 0, "refused": "Escape: a dim was hashed"}


def test_a_kernel_whose_traced_arguments_differ_from_its_bound_ones_refuses_the_plan(device, monkeypatch):
    """A variant binds each kernel to the tensors the node is bound to when it is traced, and a
    growth re-binds them by position (growth.table): an op's symbolic answer that names its
    arguments in another order than the bound call (here the first two of one node's first
    kernel, swapped at every trace) refuses the plan, and every inference is the flow's."""
    from dataclasses import replace

    from engine.fast_path import compiled
    answer, swapped = compiled.op_answer, []

    def other_order(inst, *a):
        out, unfuse, calls = answer(inst, *a)
        if calls and len(calls[0].args) >= 2 and swapped in ([], [inst.node.name]):
            swapped[:] = [inst.node.name]
            args = calls[0].args
            calls = [replace(calls[0], args=(args[1], args[0]) + args[2:])] + list(calls[1:])
        return out, unfuse, calls
    monkeypatch.setattr(compiled, "op_answer", other_order)
    prog = build_program(bert_encoder(**BERT))
    steps = _bert_steps([(1, n) for n in (41, 40, 39, 60, 38)])
    net, on, c_on = _run(prog, steps, device, True, "gpu")
    _, off, c_off = _run(prog, steps, device, False, "gpu")
    assert swapped and c_on == c_off
    for a, b in zip(on, off):
        assert np.array_equal(a["last_hidden_state"], b["last_hidden_state"])
    summary = net.fast.compiled.summary()
    assert summary["built"] == 0 and summary["runs"] == 0 and "its impl" in summary["refused"], summary


def test_repeated_shapes_and_cycles_still_replay_whole_plans(device):
    """A repeated signature is no compiled inference (the flow records its plan, replayed from
    then on), and a compiled transition met again is recorded as a whole plan: with compiled
    plans on, a run that cycles between lengths replays as it did without them."""
    prog = build_program(bert_encoder(**BERT))
    lengths = [41, 40, 39, 39, 39, 38, 39, 38, 39, 38]
    net, on, c_on = _run(prog, _bert_steps([(1, n) for n in lengths]), device, True, "gpu")
    _, off, c_off = _run(prog, _bert_steps([(1, n) for n in lengths]), device, False, "gpu")
    assert c_on == c_off
    for a, b in zip(on, off):
        assert np.array_equal(a["last_hidden_state"], b["last_hidden_state"])
    net2 = Network(prog, device, impls="dynamic", predictor="adaptive", compile_plans="all")
    net2.impls.device_type = "gpu"
    paths = []
    for feeds, _ in _bert_steps([(1, n) for n in lengths]):
        net2.infer(feeds)
        c = net2.counters
        paths.append("C" if c.get("plan.compiled") else "R" if c.get("plan.replay") else "F")
    # 40 and 39 compiled; 39 again: the flow, which records it; then its replay. 39 -> 38 and
    # 38 -> 39 compiled the first time, compiled and recorded the second, replayed the third
    assert paths == ["F", "C", "C", "F", "R", "C", "C", "C", "C", "R"], paths


def test_a_template_refused_in_a_traced_run_drops_its_variant(device, tmp_path, monkeypatch):
    """A traced run keeps a variant only when its template holds (step_events.py); one refused
    (here the plan bound after the first inference, at the second, which ran compiled and
    wrote its events) is dropped and counted as a refused trace, and the next inference of the
    flow traces again: no variant stays in the table unbound."""
    from engine.fast_path import step_events
    from traces import TraceWriter
    real, calls = step_events.template, []

    def refuse_the_first(*a):
        calls.append(1)
        return None if len(calls) == 1 else real(*a)
    monkeypatch.setattr(step_events, "template", refuse_the_first)
    prog = build_program(bert_encoder(**BERT))
    net = Network(prog, device, impls="dynamic", predictor="adaptive", compile_plans="all",
                  trace=TraceWriter(str(tmp_path / "t.jsonl"), {}))
    net.impls.device_type = "gpu"
    for feeds, _ in _bert_steps(WARM + [(1, 39), (1, 38), (1, 37)]):
        net.infer(feeds)
    cp = net.fast.compiled
    assert list(cp.refusals.values()) == [1] and cp.built == 2 and cp.runs == 3, cp.summary()
    assert all(c.epoch == net.fast.epoch for cs in cp.table.values() for c in cs)


def _positions_model():
    """y = table[ids[:, :n]] + x[..., None] for x [1, n]: the positions a host value (Shape ->
    Slice of a constant) that a device Gather reads as indices (an index check reads them
    after the inference: an io tensor of the plans), and a device view (Unsqueeze) of the
    graph input, whose host value it shares."""
    from onnx import TensorProto, helper
    i64 = lambda name, vals, dims: helper.make_tensor(name, TensorProto.INT64, dims, vals)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["len"], axis=0),
             helper.make_node("Unsqueeze", ["len", "zero1"], ["len1"]),
             helper.make_node("Slice", ["ids", "zero1", "len1", "one1"], ["pos"]),
             helper.make_node("Gather", ["table", "pos"], ["emb"], axis=0),
             helper.make_node("Unsqueeze", ["x", "minus1"], ["x3"]),
             helper.make_node("Add", ["emb", "x3"], ["y"])]
    g = helper.make_graph(nodes, "positions",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"]),
                           helper.make_tensor_value_info("table", TensorProto.FLOAT, [512, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n", 4])],
                          [i64("one", [1], []), i64("zero1", [0], [1]), i64("one1", [1], [1]),
                           i64("minus1", [-1], [1]), i64("ids", list(range(512)), [1, 512])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@given(lengths=st.lists(st.integers(1, 300), min_size=3, max_size=8))
@SETTINGS
def test_host_values_and_views_of_inputs_follow_a_compiled_growth(device, lengths):
    """A compiled inference past the buffers (growth.py) with a host value a device kernel
    reads (uploaded to a grown buffer by its reader) and a view of a graph input whose buffer
    grew (its readers bound to the new one): bit-identical to the flow, the same decisions,
    the reference's values; compiled inferences served (a length past the buffers among
    them, the first three fixed so)."""
    prog = build_program(_positions_model())
    rng = np.random.default_rng(0)
    table = rng.standard_normal((512, 4)).astype(np.float32)
    steps = [({"x": rng.standard_normal((1, n)).astype(np.float32), "table": table}, None)
             for n in [41, 40, 150] + lengths]
    net, on, c_on = _run(prog, steps, device, True, "gpu")
    _, off, c_off = _run(prog, steps, device, False, "gpu")
    for i, ((feeds, _), a, b) in enumerate(zip(steps, on, off)):
        assert np.array_equal(a["y"], b["y"]), f"inference {i}"
        assert c_on[i] == c_off[i], f"inference {i}"
        n = feeds["x"].shape[1]
        np.testing.assert_allclose(a["y"], table[:n][None] + feeds["x"][..., None], rtol=1e-6)
    assert net.fast.compiled.runs >= 2, net.fast.compiled.summary()


def test_a_compiled_inference_after_a_replay_reads_the_state_the_plan_leaves(device, monkeypatch):
    """A new length after a whole plan's replay: the guard reads the state the plan left (the
    nodes' keys) kept with the plan, read once when it was recorded (its state never changes),
    and so does the next new length after the same plan: neither reads the nodes; both
    compiled, deciding and computing as the flow does. Only flows read the nodes' state (as
    they end, for what comes next)."""
    from engine.fast_path import compiled
    prog = build_program(bert_encoder(**BERT))
    # 30 -> 20 a third time is its plan's replay (inferences 7 and 10), 25 and 15 new after it
    lengths = WARM + [(1, 30), (1, 20), (1, 30), (1, 20), (1, 30), (1, 20), (1, 25), (1, 30), (1, 20), (1, 15)]
    steps = _bert_steps(lengths)
    _, off, c_off = _run(prog, steps, device, False, "gpu")
    net = Network(prog, device, impls="dynamic", predictor="adaptive", compile_plans="all")
    net.impls.device_type = "gpu"
    reads = []
    keys = compiled.node_keys
    monkeypatch.setattr(compiled, "node_keys", lambda device: reads.append(len(how)) or keys(device))
    how, plans = [], []
    for k, (feeds, _) in enumerate(steps):
        out = net.infer(feeds)
        assert np.array_equal(out["last_hidden_state"], off[k]["last_hidden_state"]), k
        assert {n: v for n, v in net.counters.items() if n not in NOT_DECISIONS} == c_off[k], k
        how.append("compiled" if net.counters.get("plan.compiled") else
                   "replay" if net.counters.get("plan.replay") else "flow")
        plans.append(net.fast.restore)
    assert how[7:] == ["replay", "compiled", "compiled", "replay", "compiled"], how
    assert plans[7] is plans[10] and plans[7].leaves is not None
    # the guard's reads of the nodes' state: not after the replays at 7 and 10; at flows only
    assert 8 not in reads and 11 not in reads and reads, reads
    assert all(how[k] == "flow" for k in reads), (reads, how)
    # the plan's device nodes' part waited for them; they put back only what their own state
    # does not set (the views of host values), not the part (replay._put_back, compiled.rest_of)
    rests = [r for _, r in plans[7].rest.values()]
    assert rests and all(len(r) <= len(plans[7].split[1]) // 10 for r in rests), \
        ([len(r) for r in rests], len(plans[7].split[1]))


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_a_plan_recorded_from_a_compiled_inference_leaves_the_flow_its_state(device, monkeypatch, kind):
    """A compiled transition met a second time is recorded from what the compiled inference
    answered, its state put back as the inference's own is (compiled.Pending), not snapshot
    node by node. Its replays, and the flows, compiled inferences and growths after them (another
    batch, a length past the buffers), decide and compute as with the fast path off."""
    from engine.fast_path import replay
    recorded = []
    plan_of = replay.FastPath._plan_of_compiled
    monkeypatch.setattr(replay.FastPath, "_plan_of_compiled",
                        lambda self, *a: recorded.append(a[:2]) or plan_of(self, *a))
    prog = build_program(bert_encoder(**BERT))
    # six lengths twice (the second time, each transition compiled and recorded), then each
    # three times (the flow records the repeated signature from the state a replay or a
    # compiled inference left, then replays), another batch, a length past the buffers
    lengths = [(1, n) for n in (41, 40, 39, 38, 37, 36)]
    seq = lengths + lengths + [x for x in lengths for _ in range(3)] + \
        [(1, 39), (1, 38), (2, 38), (1, 39), (1, 90), (1, 39), (1, 38), (1, 39), (1, 38)]
    steps = _bert_steps(seq)
    paths = []
    net, on, c_on = _run(prog, steps, device, True, kind, paths=paths)
    _, off, c_off = _run(prog, steps, device, False, kind)
    for i, (a, b) in enumerate(zip(on, off)):
        assert np.array_equal(a["last_hidden_state"], b["last_hidden_state"]), f"inference {i}"
        assert c_on[i] == c_off[i], f"inference {i}"
    assert len(recorded) >= 2, (recorded, paths)
    # recorded compiled transitions served again, and flows after them
    assert "R" in paths[12:] and "F" in paths[12:], paths


@given(seq=st.lists(st.sampled_from([(1, 38), (1, 39), (1, 40), (2, 39), (1, 60), (1, 140)]),
                    min_size=8, max_size=14))
@SETTINGS
def test_lengths_met_again_and_again_decide_and_compute_as_the_flow(device, seq):
    """A few (batch, length) pairs drawn again and again: compiled transitions recorded and
    replayed among flows, growths and batch changes, each inference as with the fast path
    off (outputs bit-identical, every decision counted alike)."""
    prog = build_program(bert_encoder(**BERT))
    steps = _bert_steps(WARM + seq)
    _, on, c_on = _run(prog, steps, device, True, "gpu")
    _, off, c_off = _run(prog, steps, device, False, "gpu")
    for i, (a, b) in enumerate(zip(on, off)):
        assert np.array_equal(a["last_hidden_state"], b["last_hidden_state"]), f"inference {i}"
        assert c_on[i] == c_off[i], f"inference {i}"


def test_replays_of_compiled_transitions_around_unfused_runs_decide_as_the_flow(device):
    """A fused attention whose mask grows the scores' batch runs unfused for those shapes.
    Transitions recorded (from compiled inferences, or from the flow) and replayed before and
    after such runs decide and compute as with the fast path off and as onnxruntime: a replay
    leaves the unfused subgraph's nodes as the flow does (the inference it stands for ran none
    of them: a plan put them back as they were when recorded), and an unfused run
    infers the shapes of the nodes that write the fused node's output again (the fused runs in
    between rewrote its layout: the flow kept the fused op's batch and wrote a wrong output)."""
    import onnxruntime as ort
    from tests.models import masked_attention
    model = masked_attention(mask_dims=("mb", 1, "s", "l"))
    prog = build_program(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)

    def step(mb, s, l):
        feeds = {n: rng.standard_normal((1, 2, s if n == "q" else l, 8)).astype(np.float32)
                 for n in ("q", "k", "v")}
        feeds["mask"] = rng.standard_normal((mb, 1, s, l)).astype(np.float32)
        return feeds, False

    # fused lengths in a cycle (their transitions compiled, recorded, replayed); an unfused
    # run (new buffers: a new epoch); the cycle recorded again; an unfused run that fits the
    # buffers (the epoch stands); the cycle's plans replayed (the flow's plans put the unfused
    # nodes back as they were when recorded); the same unfused shape again (its nodes' update_shape
    # reads that state)
    cycle = [(1, 3, 7), (1, 3, 6), (1, 3, 5)]
    dims = [(1, 3, 8)] + cycle * 3 + [(2, 3, 6)] + cycle * 3 + [(2, 3, 5)] + cycle * 2 + \
        [(2, 3, 5)] + cycle + [(2, 3, 5)] * 3 + cycle
    steps = [step(*d) for d in dims]
    paths = []
    net, on, c_on = _run(prog, steps, device, True, "gpu", paths=paths)
    _, off, c_off = _run(prog, steps, device, False, "gpu")
    # whole plans recorded by the flow only (no compiled plans): the same
    flow_plans = Network(prog, device, impls="dynamic", predictor="adaptive", compile_plans="off")
    flow_plans.impls.device_type = "gpu"
    for i, (feeds, _) in enumerate(steps):
        out = flow_plans.infer(feeds)
        assert np.array_equal(out["y"], off[i]["y"]), f"inference {i}"
        assert +Counter({k: v for k, v in flow_plans.counters.items() if k not in NOT_DECISIONS}) == \
            +Counter(c_off[i]), f"inference {i}, flow's plans"
    for i, (a, b) in enumerate(zip(on, off)):
        for name in b:
            assert np.array_equal(a[name], b[name]), f"inference {i} output {name}"
        # (a steady step leaves out a sum that is 0, device_reads, which the flow writes)
        assert +Counter(c_on[i]) == +Counter(c_off[i]), f"inference {i}"
        ref = sess.run(None, steps[i][0])[0]
        assert a["y"].shape == ref.shape, f"inference {i}"
        np.testing.assert_allclose(a["y"], ref, rtol=1e-4, atol=1e-4)
    unfused = [i for i, c in enumerate(c_on) if any(k.startswith("fusion.unfuse") for k in c)]
    assert unfused and "R" in paths[:unfused[0]] and "R" in paths[unfused[0] + 1:], (paths, unfused)
    assert net.fast.compiled.runs > 0


@pytest.mark.parametrize("fast", [False, True])
def test_an_unfused_run_after_fused_ones_that_reclaimed_its_output_takes_a_buffer_for_it(device, fast):
    """The plugin's policy reclaims the fused node's output buffer while the fused runs need
    little; an unfused run whose node writing that output re-infers its shape
    (output_rewritten) also takes a buffer for it, as on a shape change (it kept the reclaimed
    one and wrote past its end). Outputs as onnxruntime's, with the fast path off and on."""
    import onnxruntime as ort
    from tests.models import masked_attention
    model = masked_attention(mask_dims=("mb", 1, "s", "l"))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    net = Network(build_program(model), device, impls="dynamic", fast_path=fast, predictor="openvino",
                  compile_plans="all" if fast else "off")
    net.impls.device_type = "gpu"
    rng = np.random.default_rng(5)
    rewritten = 0
    for mb, s, l in [(2, 40, 5)] + [(1, 2, 5)] * 3 + [(1, 2, 4)] * 3 + [(2, 40, 5)] * 2:
        feeds = {n: rng.standard_normal((1, 2, s if n == "q" else l, 8)).astype(np.float32)
                 for n in ("q", "k", "v")}
        feeds["mask"] = rng.standard_normal((mb, 1, s, l)).astype(np.float32)
        out = net.infer(feeds)["y"]
        rewritten += net.counters.get("update_shape.infer.output_rewritten", 0)
        ref = sess.run(None, feeds)[0]
        assert out.shape == ref.shape
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
        y = net.tensors["y"]
        assert y.capacity >= y.layout.nbytes, (y.capacity, y.layout)
    assert rewritten >= 1


def _sliced_positions_model(start: int, step: int):
    """y = table[ids[:, start:n:step]] for x [1, n]: the positions a Slice of a 64-entry
    constant by the input's length (the shape subgraph's function slices it: host_values.py),
    clamped past its end."""
    from onnx import TensorProto, helper
    i64 = lambda name, vals, dims: helper.make_tensor(name, TensorProto.INT64, dims, vals)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["len"], axis=0),
             helper.make_node("Unsqueeze", ["len", "zero1"], ["len1"]),
             helper.make_node("Slice", ["ids", "start1", "len1", "one1", "step1"], ["pos"]),
             helper.make_node("Gather", ["table", "pos"], ["y"], axis=0)]
    g = helper.make_graph(nodes, "sliced_positions",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"]),
                           helper.make_tensor_value_info("table", TensorProto.FLOAT, [64, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None, 4])],
                          [i64("one", [1], []), i64("zero1", [0], [1]), i64("one1", [1], [1]),
                           i64("start1", [start], [1]), i64("step1", [step], [1]),
                           i64("ids", list(range(64)), [1, 64])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("start,step", [(0, 1), (3, 2), (-60, 1)])
@given(lengths=st.lists(st.integers(1, 90), min_size=3, max_size=8))
@SETTINGS
def test_the_shape_subgraphs_function_slices_positions_as_the_flow(device, start, step, lengths):
    """Compiled inferences whose shape subgraph is its own generated function (a Slice of a
    constant by the input's length, past the constant's end too; a shorter one's positions
    already on the device: Buffers.upload): bit-identical to the flow, the same decisions,
    onnxruntime's values; the function served."""
    import onnxruntime as ort
    model = _sliced_positions_model(start, step)
    prog = build_program(model)
    rng = np.random.default_rng(0)
    table = rng.standard_normal((64, 4)).astype(np.float32)
    steps = [({"x": np.zeros((1, n), np.float32), "table": table}, None) for n in [41, 40, 39] + lengths]
    net, on, c_on = _run(prog, steps, device, True, "gpu")
    _, off, c_off = _run(prog, steps, device, False, "gpu")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for i, ((feeds, _), a, b) in enumerate(zip(steps, on, off)):
        assert np.array_equal(a["y"], b["y"]), f"inference {i}"
        assert c_on[i] == c_off[i], f"inference {i}"
        np.testing.assert_array_equal(a["y"], sess.run(None, feeds)[0])
    fns = list(net.fast.compiled.host_fns.values())
    assert len(fns) == 1 and fns[0] is not None and fns[0].runs >= 1, fns


def test_the_device_holds_a_value_at_the_start_of_the_one_uploaded_only_in_a_constants_memory(device):
    """Buffers.upload leaves the device as it is for a view of a constant that starts where the
    value last uploaded does and is no longer (the shorter length's positions); a longer one,
    one elsewhere in the constant, or an array of no constant's memory is written."""
    net = Network(build_program(_sliced_positions_model(0, 1)), device)
    ids = net.tensors["ids"].host
    held = net.buffers._held
    assert held(ids[:, :10], ids[:, :30]) and held(ids[:, :30], ids[:, :30])
    assert not held(ids[:, :31], ids[:, :30])               # longer
    assert not held(ids[:, 2:10], ids[:, :30])              # elsewhere
    own = ids.copy()
    assert not held(own[:, :10], own[:, :30])               # no constant's memory
    assert not held(ids[:, :10], None)


def test_a_replayed_plans_device_part_waits_for_what_comes_after_it(device, monkeypatch):
    """A whole plan recorded by the flow (a repeated length) puts back its device nodes' part
    only when the next inference needs it (replay._put_back): a compiled length after its
    replay puts back only what its own state does not set (a few entries of a hundred), a
    flow after it the whole part; every inference decides and computes as with the fast path
    off."""
    from engine.fast_path import compiled
    prog = build_program(bert_encoder(**BERT))
    # the flow of 25 at 5 (made one: no repeat of the compiled 25 before) leaves the nodes in a
    # state the plan of 30 (recorded at 3) does not; the compiled 30 at 6 leaves its state
    # lazily, the plan's replay at 7 too: 25 at 8, made a flow too, decides from the plan's
    # state (30), put back then
    lengths = WARM + [(1, 30), (1, 30), (1, 25), (1, 25), (1, 30), (1, 30), (1, 25), (1, 30), (1, 30), (1, 20)]
    steps = _bert_steps(lengths)
    _, off, c_off = _run(prog, steps, device, False, "gpu")
    run = compiled.CompiledPlans.run
    monkeypatch.setattr(compiled.CompiledPlans, "run",
                        lambda self: 0 if self.fast.decisions.trace.iter in (5, 8) else run(self))
    paths = []
    net, on, c_on = _run(prog, steps, device, True, "gpu", paths=paths)
    _as_the_flow(on, off, c_on, c_off)
    assert "".join(paths[3:]) == "FCFCRFCRC", "".join(paths)
    plan = net.fast.put_back_plan
    assert plan is not None and plan.key[0] == plan.key[1] and len(plan.split[1]) > 50, plan
    rests = [r for _, r in plan.rest.values()]
    assert len(rests) == 1 and len(rests[0]) <= len(plan.split[1]) // 10, (len(rests[0]), len(plan.split[1]))


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_a_repeat_of_a_compiled_length_counts_as_the_flows_repeat(device, kind):
    """A length met again right after its compiled inference: the first such repeat runs the
    flow (every node skips), which the variant learns its counts from; later ones of other
    lengths repeat the compiled launches counted so (CompiledPlans._repeat), their plans
    recorded at once and replayed on the next repeat; a repeat after a growth too (an untraced
    growth leaves its state waiting, as a compiled inference does); another batch runs as
    before. Each decides and computes as with the fast path off."""
    import onnxruntime as ort
    model = bert_encoder(**BERT)
    prog = build_program(model)
    lengths = WARM + [(1, 30), (1, 30), (1, 25), (1, 25), (1, 25), (1, 20), (1, 20), (1, 150), (1, 150),
                      (2, 12), (2, 12), (1, 33), (1, 33), (1, 30), (1, 30)]
    steps = _bert_steps(lengths)
    paths = []
    net, on, c_on = _run(prog, steps, device, True, kind, paths=paths)
    _, off, c_off = _run(prog, steps, device, False, kind)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for i, ((feeds, _), a, b) in enumerate(zip(steps, on, off)):
        assert np.array_equal(a["last_hidden_state"], b["last_hidden_state"]), i
        assert c_on[i] == c_off[i], i
        np.testing.assert_allclose(a["last_hidden_state"], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    # 3: the flow's repeat (learned); 5, 8, 10, 14, 16: repeats of compiled lengths, 10 right
    # after a growth; 6: their plan's replay
    assert paths[2:] == list("CFCCRCCCCFFCCCC"), "".join(paths)
    assert net.fast.compiled.repeats == 5, net.fast.compiled.summary()
    # their plans, as the flow's of a repeat: no predictor call, no cache hit to make again
    repeats = [p for k, p in net.fast.plans.items() if k[0] == k[1]]
    assert repeats and all(not p.reallocs and not p.touches for p in repeats), len(repeats)


@pytest.mark.parametrize("kept", [64, 1])
def test_a_traced_repeat_of_a_compiled_length_stands_for_the_flows_repeat(device, tmp_path, monkeypatch, kept):
    """In a traced run a repeat of a compiled length writes one `plan repeat` event standing for
    the node events of the flow it learned its counts from (the inputs' events are its own);
    the reader expands it into the events the flow writes for that repeat, field by field, and
    it counts what the flow does. Its plan is recorded; a replay of it names that flow too. With the reader keeping one base only, a repeat whose learned
    flow is no longer held (the 33's, after the growth's flow) runs the flow again (a stale
    reference would not read)."""
    from tests.test_steady_steps import _events
    from traces import TraceWriter
    from traces.reader import PlanBases, read_trace
    monkeypatch.setattr("engine.fast_path.compiled.PLAN_BASES_KEPT", kept)
    monkeypatch.setattr("engine.fast_path.replay.PLAN_BASES_KEPT", kept)
    monkeypatch.setattr(PlanBases, "KEEP", kept)
    prog = build_program(bert_encoder(**BERT))
    lengths = WARM + [(1, 30), (1, 30), (1, 25), (1, 25), (1, 25), (1, 20), (1, 36), (1, 37), (1, 38),
                      (1, 39), (1, 20), (1, 150), (1, 150), (1, 33), (1, 33), (2, 12), (2, 12)]
    paths, counted = {}, {}
    for fast in (True, False):
        paths[fast] = tmp_path / f"{fast}.jsonl"
        net = Network(prog, device, impls="dynamic", fast_path=fast, predictor="adaptive",
                      compile_plans="all", trace=TraceWriter(str(paths[fast]), {}))
        net.impls.device_type = "gpu"
        counted[fast] = []
        for feeds, _ in _bert_steps(lengths):
            net.infer(feeds)
            counted[fast].append({k: v for k, v in net.counters.items() if k not in NOT_DECISIONS})
        net.trace.close()
        if fast:
            repeats = net.fast.compiled.repeats
    assert counted[True] == counted[False]
    for i in range(len(lengths)):
        assert _events(paths[True], i) == _events(paths[False], i), f"inference {i}"
    events = [e for e in read_trace(str(paths[True]))[1] if e["kind"] == "plan"]
    plans = [e["iter"] for e in events if e["action"] == "repeat"]
    replays = [(e["iter"], e.get("repeat_of")) for e in events if e["action"] == "replay"]
    # the 25 and the 33 after their compiled inferences; the 25's repeat is recorded and
    # replayed next, its event naming the flow the repeat stood for (3), unless the reader
    # keeps one base only; the batch of 2 is another variant, which has learned none
    assert plans == ([5, 16] if kept == 64 else [5]), plans
    assert replays[:1] == ([(6, 3)] if kept == 64 else []), replays
    assert repeats == len(plans)


@pytest.mark.parametrize("traced", [False, True])
def test_a_repeat_after_the_replay_of_a_compiled_transition_repeats_its_launches(device, tmp_path, traced):
    """A length met again right after the replay of a plan recorded from a compiled inference
    (35 after 30 -> 35, the third time) repeats that inference's launches, counted as the
    flow's repeat, instead of running the flow, and is recorded as its plan (the next repeat
    replays it). Outputs, counts and, traced, the events the reader expands are the flow's."""
    import onnxruntime as ort
    from tests.test_steady_steps import _events
    from traces import TraceWriter
    model = bert_encoder(**BERT)
    prog = build_program(model)
    lengths = WARM + [(1, 30), (1, 30), (1, 35), (1, 30), (1, 35), (1, 30), (1, 35), (1, 35), (1, 35), (1, 30)]
    steps = _bert_steps(lengths)
    outs, counts, paths, nets = {}, {}, {}, {}
    for fast in (True, False):
        paths[fast] = tmp_path / f"{fast}.jsonl"
        net = nets[fast] = Network(prog, device, impls="dynamic", fast_path=fast, predictor="adaptive",
                                   compile_plans="all" if fast else "off",
                                   trace=TraceWriter(str(paths[fast]), {}) if traced else None)
        net.impls.device_type = "gpu"
        outs[fast], counts[fast], served = [], [], []
        for feeds, _ in steps:
            outs[fast].append(net.infer(feeds)["last_hidden_state"].copy())
            counts[fast].append({k: v for k, v in net.counters.items() if k not in NOT_DECISIONS})
            c = net.counters
            served.append("C" if c.get("plan.compiled") else "R" if c.get("plan.replay") else "F")
        if traced:
            net.trace.close()
        if fast:
            # 3: the flow's repeat (learned); 6, 7: 30 -> 35, 35 -> 30 recorded; 8: replayed;
            # 9: the repeat after it, recorded; 10: replayed; 11: 35 -> 30 replayed
            assert "".join(served) == "FCCFCCCCRCRR", "".join(served)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for i, (feeds, _) in enumerate(steps):
        assert np.array_equal(outs[True][i], outs[False][i]), i
        assert counts[True][i] == counts[False][i], i
        np.testing.assert_allclose(outs[True][i], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
        if traced:
            assert _events(paths[True], i) == _events(paths[False], i), f"inference {i}"


def test_a_flow_repeating_after_a_replay_teaches_the_variant_its_repeat(device):
    """The first repeat of the run comes right after the replay of a plan recorded from a
    compiled inference, before the variant has learned a repeat's counts: the flow runs it, and
    the variant learns from it (the nodes' state is that compiled inference's), so the next
    repeat of a compiled length (the 25) repeats its launches. Counts are the flow's."""
    prog = build_program(bert_encoder(**BERT))
    lengths = WARM + [(1, 30), (1, 35), (1, 30), (1, 35), (1, 30), (1, 35), (1, 35), (1, 25), (1, 25)]
    steps = _bert_steps(lengths)
    paths = []
    net, _, c_on = _run(prog, steps, device, True, "gpu", paths=paths)
    _, _, c_off = _run(prog, steps, device, False, "gpu")
    assert c_on == c_off
    # 5, 6: 30 -> 35 and 35 -> 30 recorded; 7: replayed; 8: the flow's repeat (learned); 10: served
    assert "".join(paths) == "FCCCCCCRFCC", "".join(paths)
    assert net.fast.compiled.repeats == 1


def test_a_plan_recorded_by_an_inference_whose_outputs_were_not_read_is_not_replayed(device, monkeypatch):
    """The fast path records while the device runs the kernels, before the outputs are read:
    when reading them fails (a device error), the plan it recorded (the repeated 30's) is not
    replayed by the next inference, which decides as the flow does after such a failure."""
    from engine.device_queue import DeviceQueue
    prog = build_program(bert_encoder(**BERT))
    steps = _bert_steps(WARM + [(1, 30), (1, 30), (1, 30), (1, 30), (1, 30)])
    net = Network(prog, device, impls="dynamic", predictor="adaptive", compile_plans="all")
    net.impls.device_type = "gpu"
    read = DeviceQueue.read_status

    def fails(self):
        if net.iter == 3:
            raise RuntimeError("the device failed")
        return read(self)
    monkeypatch.setattr(DeviceQueue, "read_status", fails)
    paths = []
    for k, (feeds, _) in enumerate(steps):
        if k == 3:
            with pytest.raises(RuntimeError):
                net.infer(feeds)
            paths.append("X")
            continue
        net.infer(feeds)
        paths.append("C" if net.counters.get("plan.compiled") else "R" if net.counters.get("plan.replay") else "F")
    # 3 recorded 30's plan, then failed; 4 runs the flow (a new epoch: no transition known),
    # 5 the flow of the repeat, 6 replays what 5 recorded
    assert "".join(paths) == "FCCXFFR", "".join(paths)


def test_a_traced_runs_template_base_counts_in_the_trace_part(device, tmp_path, monkeypatch):
    """The first compiled inference of a traced run writes its nodes' events and checks the
    variant's template against them (compiled._write_base): work done only for the trace, so
    its time is the `trace` part of that inference, not `flow`; the parts still sum to the
    latency. (The template check is slowed here by a known 60 ms.)"""
    import time

    from engine.fast_path import step_events
    from traces import TraceWriter
    attach = step_events.attach

    def slow_attach(*a, **k):
        time.sleep(0.06)
        return attach(*a, **k)
    monkeypatch.setattr(step_events, "attach", slow_attach)
    net = Network(build_program(bert_encoder(**BERT)), device, impls="dynamic", predictor="adaptive",
                  compile_plans="all", trace=TraceWriter(str(tmp_path / "t.jsonl"), {}))
    net.impls.device_type = "gpu"
    for i, (feeds, _) in enumerate(_bert_steps(WARM + [(1, 30)])):
        net.infer(feeds)
        if net.counters.get("plan.compiled"):
            break
    assert i == 1 and net.counters.get("plan.compiled"), "the second inference is compiled: the base"
    parts = net.time_ms
    assert parts["trace"] >= 60 and parts["flow"] < 60, parts
    assert abs(sum(parts.values()) - net.counters["latency_ms"]) <= 0.1 * net.counters["latency_ms"] + 0.01


def test_preparing_trace_counts_the_events_written_inside_once():
    """accounting.preparing_trace: the block's time is added to the writer's, its events' own
    time not twice; a sink without a clock is left alone."""
    import time

    from engine.accounting import preparing_trace
    from traces.sinks import DecisionsOnly, NoTrace

    class Clocked:
        spent_s = 1.0

        def event(self, *a, **k):
            self.spent_s += 5.0          # an event's own time, inside the block

    w = Clocked()
    t0 = time.perf_counter()
    with preparing_trace(w):
        t1 = time.perf_counter()
        w.event()
        inner = time.perf_counter() - t1
    outer = time.perf_counter() - t0
    assert 1.0 + inner <= w.spent_s <= 1.0 + outer
    with preparing_trace(NoTrace()):
        pass
    # `--trace-level decisions` wraps the writer: the block's time reaches the writer's clock,
    # which every later inference's `trace` part reads
    wrapped = DecisionsOnly(Clocked())
    with preparing_trace(wrapped):
        wrapped.event("update_shape")
    assert "spent_s" not in vars(wrapped) and wrapped._w.spent_s == wrapped.spent_s < 6.0
    wrapped.event("update_shape")
    assert wrapped.spent_s == wrapped._w.spent_s >= 6.0
