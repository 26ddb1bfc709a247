"""Real exporter output against onnxruntime over shape sequences.

tests/exported/ holds what `torch.onnx.export` wrote for small random-weight configurations of
real architectures (BERT, RoBERTa, DistilBERT, T5 encoder, ViT, GPT-2 and LLaMA decode steps
with a KV cache, a ResNet-style CNN and a U-Net), with the TorchScript ("legacy", opset 17) and
the torch.export ("dynamo", opset 18+) exporters, in float32 and float16. Each file names the
torch and transformers versions that wrote it in its metadata; `python scripts/export_models.py
tests/exported` rewrites them (needs torch, transformers, onnxscript; CI needs none of them).
The legacy exporter's float16 BERT/RoBERTa/DistilBERT/GPT-2 are not here: they mix float and
half in LayerNormalization, which onnxruntime refuses.

Encoders run growth, repeats, shrink and batch changes; decoders a prompt, then decode steps
with the presents fed back on the device (`--feedback`), onnxruntime fed its own presents.
"""
import glob
import os

import numpy as np
import onnx
import pytest

from engine import Network, build_program
from tests.conftest import assert_close_for, ort_session

HERE = os.path.join(os.path.dirname(__file__), "exported")
FILES = sorted(glob.glob(os.path.join(HERE, "*.onnx")))
ENCODER_SHAPES = [(1, 8), (1, 8), (2, 16), (3, 12), (1, 5), (2, 24), (1, 8)]
IMAGE_SHAPES = [(1, 24, 20), (2, 24, 20), (2, 24, 20), (1, 17, 31), (3, 8, 8), (1, 24, 20)]


def _meta(model):
    return {p.key: p.value for p in model.metadata_props}


def _elem(vi):
    return onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)


def _encoder_feeds(model, rng):
    names = [i.name for i in model.graph.input]
    if names == ["pixel_values"]:
        dt = _elem(model.graph.input[0])
        return [{"pixel_values": rng.standard_normal((b, 3, 32, 32)).astype(dt)} for b in (1, 2, 2, 3, 1)]
    if names == ["x"]:
        dt = _elem(model.graph.input[0])
        return [{"x": rng.standard_normal((b, 3, h, w)).astype(dt)} for b, h, w in IMAGE_SHAPES]
    assert names == ["input_ids", "attention_mask"], names
    seq = []
    for b, s in ENCODER_SHAPES:
        mask = np.ones((b, s), np.int64)
        for r in range(1, b):            # rows padded at the end, each keeps at least one key
            mask[r, s - min(s - 1, 2 * r):] = 0
        seq.append({"input_ids": rng.integers(0, 100, (b, s)).astype(np.int64), "attention_mask": mask})
    return seq


def _decode(model, device, sess, rng):
    """A prompt of 4 tokens, 4 decode steps, a new batch-2 prompt with a left-padded row and 3
    steps, the presents fed back on the device."""
    past_inputs = [i for i in model.graph.input if i.name.startswith("past_")]
    dims = past_inputs[0].type.tensor_type.shape.dim
    kv_heads, d_head, dt = dims[1].dim_value, dims[3].dim_value, _elem(past_inputs[0])
    feedback = {i.name.replace("past_", "present_"): i.name for i in past_inputs}
    net = Network(build_program(model), device, impls="dynamic", feedback=feedback)
    names = [o.name for o in sess.get_outputs()]
    plan = [(1, 4, False)] + [(1, 1, True)] * 4 + [(2, 3, False)] + [(2, 1, True)] * 3
    past, ref = 0, None
    for k, (b, new, cont) in enumerate(plan):
        past = past if cont else 0
        mask = np.ones((b, past + new), np.int64)
        mask[1:, 0] = 0                                         # a left-padded prompt row
        feeds = {"input_ids": rng.integers(0, 100, (b, new)).astype(np.int64), "attention_mask": mask}
        if cont:
            fed = {inp: out for out, inp in feedback.items()}
            outs = net.infer(feeds, fed_back=fed)
            feeds.update({inp: ref[out] for out, inp in feedback.items()})
        else:
            feeds.update({i.name: np.zeros((b, kv_heads, 0, d_head), dt) for i in past_inputs})
            outs = net.infer(feeds)
        ref = dict(zip(names, sess.run(None, feeds)))
        for n in names:
            assert_close_for(outs[n], ref[n], f"step {k} (batch {b}, past {past}) output {n}")
        past += new
    appended = any(i.kv_past is not None for i in net.insts)
    # LLaMA's grouped KV heads (repeat_kv: Unsqueeze, Expand, Reshape) read the cache through a
    # view that can't carry a padded layout: its presents are whole concats (a copy per step)
    assert appended == (_meta(model)["dyncli.model"] != "llama"), "in-place KV append"


def test_the_exports_are_here_and_say_who_wrote_them():
    assert len(FILES) >= 30, FILES
    for path in FILES:
        meta = _meta(onnx.load(path))
        name, exporter, dtype = os.path.basename(path).split(".")[:3]
        assert meta["dyncli.model"] == name and meta["dyncli.exporter"].endswith(exporter), path
        assert meta["dyncli.torch"] and meta["dyncli.transformers"], path


@pytest.mark.parametrize("path", FILES, ids=[os.path.basename(p)[:-5] for p in FILES])
def test_exported_model_matches_onnxruntime(device, path):
    model = onnx.load(path)
    sess = ort_session(model)
    rng = np.random.default_rng(0)
    if any(i.name.startswith("past_") for i in model.graph.input):
        return _decode(model, device, sess, rng)
    net = Network(build_program(model), device, impls="dynamic")
    names = [o.name for o in sess.get_outputs()]
    for k, feeds in enumerate(_encoder_feeds(model, rng)):
        outs = net.infer(feeds)
        for n, want in zip(names, sess.run(None, feeds)):
            assert_close_for(outs[n], want, f"inference {k} {[v.shape for v in feeds.values()]} output {n}")
            assert np.ptp(want) > 0


@pytest.mark.parametrize("path", [p for p in FILES if ".f32." in p and "conv" not in p and "unet" not in p],
                         ids=lambda p: os.path.basename(p)[:-5])
def test_every_exported_attention_runs_as_one_kernel(path):
    """Both exporters' attention (TorchScript: Add(scores, mask) with the mask computed later;
    torch.export: q and k^T each scaled, the NaN guard after the softmax) fuses into one
    attention node per layer in float32."""
    prog = build_program(onnx.load(path))
    softmax = [n for n in prog.nodes if n.op == "Softmax"]
    assert softmax and all(n.fused_into is not None and n.fused_into.op == "attention" for n in softmax)
