"""Real-model patterns against onnxruntime over shape sequences, in float32 and in
float16 (weights, activations and the KV cache in half, as deployed decoders ship): the
BERT-family encoder with the sdpa-style mask of current transformers exports, and the GPT-2
style decode step with a KV cache fed back on the device (tests/models.py section 6). A torch
export test runs when torch is installed.
Tolerances by output type: tests/conftest.py assert_close_for."""
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from engine import Network, build_program
from tests.conftest import assert_close_for, ort_session, run_vs_ort
from tests.models import bert_sdpa_encoder, gpt2_decoder_step


def _bert_feeds(rng, shapes, vocab=100):
    seq = []
    for b, s in shapes:
        mask = np.ones((b, s), np.int64)
        for r in range(1, b):              # rows padded at the end, one fully padded when b > 2
            mask[r, s - min(s, 2 * r) if r < 2 else 0:] = 0
        seq.append({"input_ids": rng.integers(0, vocab, (b, s)).astype(np.int64), "attention_mask": mask})
    return seq


# growth, repeats, shrink, a batch jump, back to an earlier shape
BERT_SHAPES = [(1, 8), (1, 8), (2, 16), (2, 16), (3, 12), (1, 5), (2, 24), (1, 8)]


def _as_float32(model16, model32):
    """model32 (the same generator in float32) holding model16's half-rounded weights."""
    halves = {t.name: numpy_helper.to_array(t) for t in model16.graph.initializer}
    m = onnx.ModelProto()
    m.CopyFrom(model32)
    for t in m.graph.initializer:
        if halves[t.name].dtype == np.float16:
            t.CopyFrom(numpy_helper.from_array(halves[t.name].astype(np.float32), t.name))
    return m


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("opset", [17, 20])
def test_bert_sdpa_mask_encoder(device, opset, dtype):
    """float16 rows whose keys are all padding: the score bias finfo(half).min absorbs every
    score (-65504 + s rounds to -65504 or -inf), so the attention over them is uniform, as in
    float32; onnxruntime runs that Add in float32 (it casts around ops it has no half kernel
    for) and keeps the scores. Those rows, padding that nobody reads, are compared with
    onnxruntime's float32 run of the same half-rounded weights; every other row with its
    float16 run."""
    model = bert_sdpa_encoder(opset=opset, dtype=dtype)
    ops = {n.op_type for n in model.graph.node}
    assert {"Range", "GreaterOrEqual", "And", "IsNaN", "GatherElements", "Where"} <= ops
    # shape-agnostic impls only: static GEMM builds per shape would double the (cold) time
    net = Network(build_program(model), device, impls="dynamic")
    sess = ort_session(model)
    sess32 = ort_session(_as_float32(model, bert_sdpa_encoder(opset=opset))) if dtype == np.float16 else sess
    padded_rows = 0
    for i, feeds in enumerate(_bert_feeds(np.random.default_rng(opset), BERT_SHAPES)):
        got = net.infer(feeds)["last_hidden_state"]
        assert got.dtype == dtype
        want = sess.run(None, feeds)[0]
        empty = ~feeds["attention_mask"].any(axis=1)
        if empty.any():
            want[empty] = sess32.run(None, feeds)[0][empty].astype(dtype)
            padded_rows += int(empty.sum())
        assert_close_for(got, want, f"inference {i} {feeds['input_ids'].shape}")
        assert np.ptp(want) > 0
    assert padded_rows == 1
    if opset >= 20 and dtype == np.float32:   # the Gelu op runs in its MatMul's epilogue
        gelus = [n for n in net.program.nodes if n.op == "Gelu"]
        assert gelus and all(n.fused_into is not None and n.fused_into.op == "MatMul" for n in gelus)
    # the mask's GatherElements/And/IsNaN ran on the device, not folded or on the host; in
    # float32 the softmax's NaN guard (IsNaN, Where) runs inside the fused attention
    dev_ops = {i.node.op for i in net.insts if not i.node.host}
    assert {"GatherElements", "And", "Where"} <= dev_ops
    isnan = [n for n in net.program.nodes if n.op == "IsNaN"]
    assert isnan
    if dtype == np.float32:
        assert all(n.fused_into is not None and n.fused_into.op == "attention" for n in isnan)
        assert all(n.attrs["nan_guard"] for n in net.program.nodes if n.op == "attention")
    else:
        assert "IsNaN" in dev_ops


def test_model_at_a_newer_opset_runs_with_a_warning(device):
    """Opset 22 is past the engine's old limit of 21: it runs; ops whose schema at 22 was not
    checked would be named in a warning (none here: every op was checked up to onnx's newest)."""
    model = bert_sdpa_encoder(opset=22, layers=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prog = build_program(model)
    assert prog.warnings == []
    run_vs_ort(model, _bert_feeds(np.random.default_rng(3), [(1, 6), (2, 9)]), device, rtol=2e-4,
               atol=2e-5, net=Network(prog, device, impls="dynamic"))


def test_unchecked_op_version_is_named_in_a_warning():
    from engine.opsets import CHECKED
    model = bert_sdpa_encoder(opset=17, layers=1)
    model.opset_import[0].version = 99   # newer than onnx knows: nothing can have been checked
    with pytest.warns(UserWarning, match=r"opset 99: .*GatherElements.* not checked"):
        prog = build_program(model)
    assert "Range" in prog.warnings[0] and CHECKED["Range"] == 27


def _decoder_steps(rng, layers=2, heads=2, d_head=16, vocab=100, dtype=np.float32):
    """(feeds, continues) per step: prompts (empty past) and decode steps that continue."""
    plan = [(2, 5, False), (2, 1, True), (2, 1, True), (2, 1, True), (1, 3, False), (1, 1, True),
            (1, 2, True), (1, 3, False), (1, 1, True)]
    steps, past = [], 0
    for b, new, cont in plan:
        past = past if cont else 0
        total = past + new
        mask = np.ones((b, total), np.int64)
        if b > 1:
            mask[1, 0] = 0                    # a left-padded prompt row
        feeds = {"input_ids": rng.integers(0, vocab, (b, new)).astype(np.int64), "attention_mask": mask}
        for i in range(layers):
            for kv in ("key", "value"):
                feeds[f"past_{kv}_{i}"] = np.zeros((b, heads, 0, d_head), dtype)
        steps.append((feeds, cont))
        past = total
    return steps


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpt2_kv_cache_decode_with_feedback(device, dtype):
    layers = 2
    model = gpt2_decoder_step(layers=layers, dtype=dtype)
    ops = {n.op_type for n in model.graph.node}
    assert {"Trilu", "Range", "Split", "Not", "Where"} <= ops
    feedback = {f"present_{kv}_{i}": f"past_{kv}_{i}" for i in range(layers) for kv in ("key", "value")}
    net = Network(build_program(model), device, feedback=feedback, impls="dynamic")
    sess = ort_session(model)
    names = [o.name for o in sess.get_outputs()]
    ref_prev = None
    for k, (feeds, cont) in enumerate(_decoder_steps(np.random.default_rng(7), layers, dtype=dtype)):
        ort_feeds = dict(feeds)
        if cont:   # onnxruntime takes its own previous presents; the engine keeps them on device
            ort_feeds.update({inp: ref_prev[out] for out, inp in feedback.items()})
            fed = {inp: out for out, inp in feedback.items()}
            outs = net.infer({n: v for n, v in feeds.items() if n not in fed}, fed_back=fed)
        else:
            outs = net.infer(feeds)
        ref_prev = dict(zip(names, sess.run(None, ort_feeds)))
        for n in names:
            assert_close_for(outs[n], ref_prev[n], f"step {k} output {n}")
    # the present buffers were appended in place while decoding (the KV-cache path)
    assert any(i.kv_past is not None for i in net.insts)
    # the causal mask is shape math: Range, Trilu and its Slice run on the host (onnx.reference),
    # Not and And on the device (they read attention_mask); in float32 the mask's Where runs in
    # the fused attention's Softmax prologue, which appends the KV caches too (float16 chains
    # run unfused)
    host = {i.node.op for i in net.insts if i.node.host}
    dev = {i.node.op for i in net.insts if not i.node.host}
    assert {"Range", "Trilu", "ConstantOfShape"} <= host and {"Not", "And", "Split"} <= dev
    if dtype == np.float32:
        assert "attention" in dev and "Where" not in dev and all(i.kv_from for i in net.insts
                                                                  if i.node.op == "attention")
    else:
        assert "Where" in dev


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpt2_decode_through_the_cli(tmp_path, dtype):
    """`dyncli run --feedback present:past --check` over prompt and decode steps (float16 with
    --check's default half tolerance)."""
    from typer.testing import CliRunner
    from dyncli.cli import app
    layers = 1
    path = tmp_path / "gpt2.onnx"
    onnx.save(gpt2_decoder_step(layers=layers, dtype=dtype), path)
    fb = ",".join(f"present_{kv}_0:past_{kv}_0" for kv in ("key", "value"))
    shapes = ("input_ids:1x4,attention_mask:1x4,past_key_0:1x2x0x16,past_value_0:1x2x0x16",
              "input_ids:1x1,attention_mask:1x{5..8},past_key_0:1x2x{4..7}x16,past_value_0:1x2x{4..7}x16")
    args = ["run", str(path), "--feedback", fb, "--check", "--impls", "dynamic",
            "--trace", str(tmp_path / "t.jsonl")]
    for s in shapes:
        args += ["--shapes", s]
    res = CliRunner().invoke(app, args + ["--input-range", "attention_mask:1..2"])
    assert res.exit_code == 0, res.output
    assert "5 passed, 0 failed" in res.output


def test_torch_export_of_a_transformers_style_module(device):
    """A real exporter's graph: torch.onnx.export of a small attention block with a padding
    mask, run over several sequence lengths (needs torch; CI has none)."""
    torch = pytest.importorskip("torch", reason="torch is not installed: the export test needs it")
    pytest.importorskip("onnxscript", reason="onnxscript is not installed: torch's exporter needs it")
    import io

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(32, 2, batch_first=True)
            self.ln = torch.nn.LayerNorm(32)

        def forward(self, x, mask):
            pad = mask == 0
            y, _ = self.attn(x, x, x, key_padding_mask=pad, need_weights=False)
            return self.ln(x + torch.nn.functional.gelu(y))

    torch.manual_seed(0)
    buf = io.BytesIO()
    x, m = torch.randn(2, 7, 32), torch.ones(2, 7, dtype=torch.int64)
    torch.onnx.export(Block().eval(), (x, m), buf, input_names=["x", "mask"], output_names=["y"],
                      dynamic_shapes=({0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC},) * 2,
                      dynamo=True)
    model = onnx.load_from_string(buf.getvalue())
    rng = np.random.default_rng(0)
    seq = []
    for b, s in [(2, 7), (1, 12), (2, 7), (3, 4)]:
        mask = np.ones((b, s), np.int64)
        mask[-1, -1] = 0
        seq.append({"x": rng.standard_normal((b, s, 32)).astype(np.float32), "mask": mask})
    run_vs_ort(model, seq, device, rtol=2e-4, atol=2e-5)
