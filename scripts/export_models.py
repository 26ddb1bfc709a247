"""Export small transformers models with torch.onnx.export, as a user would, for tests and
surveys of real exporter output. Needs torch, transformers (and onnxscript for the
dynamo exporter); the engine does not.

    python scripts/export_models.py OUT_DIR [--exporter legacy|dynamo|both] [--only NAME ...]
        [--dtype f32|f16|both] [--size tiny|bench]

Each model is a tiny random-weight configuration of a real architecture (the graph is what the
exporter writes for the full-size model, with smaller dimensions); each file records the torch
and transformers versions in its metadata. Names: {model}.{exporter}.{dtype}.onnx.
`--size bench` exports BERT at all-MiniLM-L6-v2's size and GPT-2 small instead (for
`dyncli bench` on real exporter output; the other models keep their tiny size).
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import onnx
import torch

SEQ_AXES = {0: "batch", 1: "seq"}


def _encoder_inputs(vocab=100):
    ids = torch.randint(0, vocab, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.int64)
    mask[1, 5:] = 0
    return (ids, mask), ["input_ids", "attention_mask"], {"input_ids": SEQ_AXES, "attention_mask": SEQ_AXES}


class _Encoder(torch.nn.Module):
    """model(input_ids, attention_mask).last_hidden_state"""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class _DecoderStep(torch.nn.Module):
    """One step of a causal LM over a KV cache given as flat tensors: (input_ids,
    attention_mask, past_key_0, past_value_0, ...) -> (logits, present_key_0, ...)."""

    def __init__(self, model, layers):
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, input_ids, attention_mask, *past):
        from transformers import DynamicCache
        cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(self.layers)],
                             config=self.model.config)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                         use_cache=True)
        presents = []
        for layer in out.past_key_values.layers:
            presents += [layer.keys, layer.values]
        return (out.logits, *presents)


def _decoder(model, layers, kv_heads, d_head, vocab=100):
    past_len, new = 3, 2
    ids = torch.randint(0, vocab, (2, new))
    mask = torch.ones(2, past_len + new, dtype=torch.int64)
    mask[1, 0] = 0
    past = [torch.randn(2, kv_heads, past_len, d_head) for _ in range(2 * layers)]
    names = ["input_ids", "attention_mask"]
    axes = {"input_ids": {0: "batch", 1: "new"}, "attention_mask": {0: "batch", 1: "total"}}
    outs = ["logits"]
    for i in range(layers):
        for kv in ("key", "value"):
            names.append(f"past_{kv}_{i}")
            outs.append(f"present_{kv}_{i}")
            axes[f"past_{kv}_{i}"] = {0: "batch", 2: "past"}
    return _DecoderStep(model, layers), (ids, mask, *past), names, axes, outs


def build(name: str, size: str = "tiny"):
    """(module, example args, input names, dynamic axes, output names) of a tiny `name`."""
    import transformers as tf
    torch.manual_seed(0)
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    if name == "bert" and size == "bench":   # all-MiniLM-L6-v2's shape
        m = tf.BertModel(tf.BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                       intermediate_size=1536))
        return (_Encoder(m), *_encoder_inputs(), ["last_hidden_state"])
    if name == "gpt2" and size == "bench":   # GPT-2 small
        return (*_decoder(tf.GPT2LMHeadModel(tf.GPT2Config()), 12, 12, 64), )
    if name in ("bert", "roberta"):
        cfg_cls, model_cls = ((tf.BertConfig, tf.BertModel) if name == "bert"
                              else (tf.RobertaConfig, tf.RobertaModel))
        m = model_cls(cfg_cls(vocab_size=100, max_position_embeddings=64, **small))
        return (_Encoder(m), *_encoder_inputs(), ["last_hidden_state"])
    if name == "distilbert":
        m = tf.DistilBertModel(tf.DistilBertConfig(vocab_size=100, max_position_embeddings=64, dim=32,
                                                   n_layers=2, n_heads=2, hidden_dim=64))
        return (_Encoder(m), *_encoder_inputs(), ["last_hidden_state"])
    if name == "t5":
        m = tf.T5EncoderModel(tf.T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2,
                                          num_heads=2))
        return (_Encoder(m), *_encoder_inputs(), ["last_hidden_state"])
    if name == "vit":
        m = tf.ViTModel(tf.ViTConfig(image_size=32, patch_size=8, num_channels=3, **small),
                        add_pooling_layer=False)

        class Vit(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = m

            def forward(self, pixel_values):
                return self.model(pixel_values=pixel_values).last_hidden_state
        return (Vit(), (torch.randn(2, 3, 32, 32),), ["pixel_values"], {"pixel_values": {0: "batch"}},
                ["last_hidden_state"])
    if name == "gpt2":
        m = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2,
                                             n_head=2))
        return (*_decoder(m, 2, 2, 16), )
    if name == "llama":
        m = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=100, max_position_embeddings=64,
                                               num_key_value_heads=1, **small))
        return (*_decoder(m, 2, 1, 16), )
    if name in ("convnet", "unet"):
        return (_CONV[name](), (torch.randn(2, 3, 24, 20),), ["x"],
                {"x": {0: "batch", 2: "height", 3: "width"}}, ["y"])
    raise SystemExit(f"unknown model {name!r}")


class _ConvNet(torch.nn.Module):
    """A ResNet-style classifier of torch.nn layers: Conv/BatchNorm/ReLU, a residual block,
    MaxPool, adaptive average pooling and a Linear head."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1), nn.BatchNorm2d(8), nn.ReLU(),
                                   nn.Conv2d(8, 8, 3, 1, 1, groups=2), nn.BatchNorm2d(8))
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.block(x))
        return self.head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


class _UNet(torch.nn.Module):
    """A two-level U-Net: GroupNorm/SiLU convs, a strided-conv down path, ConvTranspose and
    bilinear interpolation (Resize) up, skip concatenation."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.inc = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.GroupNorm(2, 8), nn.SiLU())
        self.down = nn.Sequential(nn.Conv2d(8, 16, 3, 2, 1), nn.GroupNorm(4, 16), nn.SiLU())
        self.up = nn.ConvTranspose2d(16, 8, 2, 2)
        self.out = nn.Conv2d(16, 3, 1)

    def forward(self, x):
        a = self.inc(x)
        b = self.up(self.down(a))
        b = torch.nn.functional.interpolate(b, size=a.shape[-2:], mode="bilinear", align_corners=False)
        return self.out(torch.cat([a, b], 1))


_CONV = {"convnet": _ConvNet, "unet": _UNet}
MODELS = ["bert", "roberta", "distilbert", "t5", "vit", "gpt2", "llama", "convnet", "unet"]


def export(name: str, exporter: str, dtype: str, out_dir: str, size: str = "tiny") -> str:
    import transformers
    module, args, names, axes, outs = build(name, size)
    module = module.eval()
    if dtype == "f16":
        module = module.half()
        args = tuple(a.half() if a.is_floating_point() else a for a in args)
    path = os.path.join(out_dir, f"{name}.{exporter}.{dtype}.onnx")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            torch.onnx.export(module, args, path, input_names=names, output_names=outs,
                              dynamic_axes=axes, opset_version=17, dynamo=False)
        else:
            # positional, one spec per argument (the decoders take their cache as *past)
            dims = tuple({i: torch.export.Dim.DYNAMIC for i in axes[n]} for n in names)
            if isinstance(module, _DecoderStep):
                dims = (*dims[:2], dims[2:])
            torch.onnx.export(module, args, path, input_names=names, output_names=outs,
                              dynamic_shapes=dims, dynamo=True, external_data=False)
    model = onnx.load(path)
    for node in model.graph.node:   # the dynamo exporter's per-node stack traces: not the graph
        del node.metadata_props[:]
    meta = {"exporter": f"torch.onnx.export {exporter}", "torch": torch.__version__,
            "transformers": transformers.__version__, "model": name}
    for k, v in meta.items():
        model.metadata_props.add(key=f"dyncli.{k}", value=v)
    onnx.save(model, path)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--exporter", choices=["legacy", "dynamo", "both"], default="both")
    ap.add_argument("--dtype", choices=["f32", "f16", "both"], default="f32")
    ap.add_argument("--only", nargs="*", default=MODELS)
    ap.add_argument("--size", choices=["tiny", "bench"], default="tiny")
    a = ap.parse_args(argv)
    os.makedirs(a.out_dir, exist_ok=True)
    exporters = ["legacy", "dynamo"] if a.exporter == "both" else [a.exporter]
    dtypes = ["f32", "f16"] if a.dtype == "both" else [a.dtype]
    failed = 0
    for name in a.only:
        for ex in exporters:
            for dt in dtypes:
                try:
                    print(export(name, ex, dt, a.out_dir, a.size), flush=True)
                except Exception as e:   # noqa: BLE001 - a survey: report and go on
                    failed += 1
                    print(f"{name} {ex} {dt}: export failed: {type(e).__name__}: {str(e)[:300]}",
                          file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
