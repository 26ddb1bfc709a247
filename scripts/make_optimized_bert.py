"""Write the BERT fixture that onnxruntime's transformer optimizer fuses: a small random-weight
encoder in the graph pattern of a TorchScript export of HF BERT (what the optimizer's fusions
match), run through `onnxruntime.transformers.optimizer.optimize_model(model_type='bert')`.

    python scripts/make_optimized_bert.py [OUT]     (default tests/ort_optimized/bert.ortopt.f32.onnx)

The result holds com.microsoft EmbedLayerNormalization (with the 1-D mask index it computes),
Attention, SkipLayerNormalization and BiasGelu; the script refuses to write a model missing any
of them (a newer optimizer matching other patterns). 2 layers, hidden 64, 4 heads, FFN 96,
inputs input_ids / token_type_ids / attention_mask [batch, seq] int64. The file records the
onnxruntime version that optimized it in its metadata. Needs onnx, numpy and onnxruntime only
(opt_level=0: the optimizer's Python fusions, no torch).
"""
from __future__ import annotations

import collections
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN, HEADS, FFN, LAYERS = 64, 4, 96, 2
VOCAB, POSITIONS, TYPES = 100, 64, 2
OPSET = 17
EXPECTED = ("EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu")
DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "ort_optimized", "bert.ortopt.f32.onnx")


class _Graph:
    """Nodes and initializers under unique names."""

    def __init__(self, rng):
        self.rng, self.nodes, self.inits, self.k = rng, [], [], 0

    def const(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, name, shape, scale):
        return self.const(name, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def op(self, op_type, inputs, **attrs):
        self.k += 1
        out = f"{op_type.lower()}_{self.k}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"{op_type}_{self.k}", **attrs))
        return out

    def layer_norm(self, x, prefix):
        g = self.const(f"{prefix}.gamma", (1 + 0.1 * self.rng.standard_normal(HIDDEN)).astype(np.float32))
        b = self.weight(f"{prefix}.beta", (HIDDEN,), 0.1)
        return self.op("LayerNormalization", [x, g, b], axis=-1, epsilon=1e-12)

    def linear(self, x, prefix, n_in, n_out):
        w = self.weight(f"{prefix}.weight", (n_in, n_out), 1 / np.sqrt(n_in))
        return self.op("Add", [self.op("MatMul", [x, w]), self.weight(f"{prefix}.bias", (n_out,), 0.1)])


def _embeddings(g):
    """word + token type + position (positions sliced from a [1, max] buffer by the sequence
    length): the pattern the optimizer's EmbedLayerNormalization fusion matches."""
    word = g.op("Gather", [g.weight("word_embeddings", (VOCAB, HIDDEN), 1.0), "input_ids"])
    types = g.op("Gather", [g.weight("token_type_embeddings", (TYPES, HIDDEN), 1.0), "token_type_ids"])
    seq = g.op("Gather", [g.op("Shape", ["input_ids"]), g.const("one", np.array(1, np.int64))], axis=0)
    end = g.op("Unsqueeze", [seq, g.const("axes0", np.array([0], np.int64))])
    buf = g.const("position_ids", np.arange(POSITIONS, dtype=np.int64)[None])
    pos_ids = g.op("Slice", [buf, g.const("start0", np.array([0], np.int64)), end,
                             g.const("axis1", np.array([1], np.int64)), g.const("step1", np.array([1], np.int64))])
    pos = g.op("Gather", [g.weight("position_embeddings", (POSITIONS, HIDDEN), 1.0), pos_ids])
    return g.layer_norm(g.op("Add", [g.op("Add", [word, types]), pos]), "embeddings.LayerNorm")


def _mask_bias(g):
    """(1 - mask[:, None, None, :]) * -10000, as BERT's extended attention mask."""
    m = g.op("Unsqueeze", ["attention_mask", g.const("axes1", np.array([1], np.int64))])
    m = g.op("Cast", [g.op("Unsqueeze", [m, g.const("axes2", np.array([2], np.int64))])], to=TensorProto.FLOAT)
    m = g.op("Sub", [g.const("one_f", np.array(1.0, np.float32)), m])
    return g.op("Mul", [m, g.const("mask_min", np.array(-10000.0, np.float32))])


def _layer(g, x, mask, i):
    d = HIDDEN // HEADS
    heads = g.const(f"l{i}.heads_shape", np.array([0, 0, HEADS, d], np.int64))
    qkv = []
    for name, perm in (("query", [0, 2, 1, 3]), ("key", [0, 2, 3, 1]), ("value", [0, 2, 1, 3])):
        t = g.op("Reshape", [g.linear(x, f"l{i}.{name}", HIDDEN, HIDDEN), heads])
        qkv.append(g.op("Transpose", [t], perm=perm))
    q, k, v = qkv
    scores = g.op("Div", [g.op("MatMul", [q, k]), g.const(f"l{i}.sqrt_d", np.array(np.sqrt(d), np.float32))])
    probs = g.op("Softmax", [g.op("Add", [scores, mask])], axis=-1)
    ctx = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, g.const(f"l{i}.merge_shape", np.array([0, 0, HIDDEN], np.int64))])
    x = g.layer_norm(g.op("Add", [g.linear(ctx, f"l{i}.attn_out", HIDDEN, HIDDEN), x]), f"l{i}.attn_ln")
    h = g.linear(x, f"l{i}.ffn_in", HIDDEN, FFN)
    erf = g.op("Erf", [g.op("Div", [h, g.const(f"l{i}.sqrt2", np.array(np.sqrt(2.0), np.float32))])])
    gelu = g.op("Mul", [g.op("Mul", [h, g.op("Add", [erf, g.const(f"l{i}.one", np.array(1.0, np.float32))])]),
                        g.const(f"l{i}.half", np.array(0.5, np.float32))])
    return g.layer_norm(g.op("Add", [g.linear(gelu, f"l{i}.ffn_out", FFN, HIDDEN), x]), f"l{i}.ffn_ln")


def unfused_bert(seed: int = 0) -> onnx.ModelProto:
    g = _Graph(np.random.default_rng(seed))
    x, mask = _embeddings(g), _mask_bias(g)
    for i in range(LAYERS):
        x = _layer(g, x, mask, i)
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
           for n in ("input_ids", "token_type_ids", "attention_mask")]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", HIDDEN])
    graph = helper.make_graph(g.nodes, "bert", ids, [out], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="dyncli-tests")
    onnx.checker.check_model(model)
    return model


def optimized_bert(seed: int = 0) -> onnx.ModelProto:
    import onnxruntime
    from onnxruntime.transformers.optimizer import optimize_model
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bert.onnx")
        onnx.save(unfused_bert(seed), path)
        opt = optimize_model(path, model_type="bert", num_heads=HEADS, hidden_size=HIDDEN, opt_level=0)
    model = opt.model
    ops = collections.Counter(n.op_type for n in model.graph.node if n.domain == "com.microsoft")
    missing = [op for op in EXPECTED if not ops[op]]
    if missing:
        raise SystemExit(f"the optimizer emitted {dict(ops)}, not {', '.join(missing)}")
    del model.metadata_props[:]
    for k, v in (("model", "bert"), ("optimizer", f"onnxruntime {onnxruntime.__version__}"),
                 ("fused", ", ".join(f"{op} {n}" for op, n in sorted(ops.items())))):
        model.metadata_props.add(key=f"dyncli.{k}", value=v)
    return model


def main(argv=None) -> None:
    from onnxruntime.transformers.onnx_model import OnnxModel
    argv = sys.argv[1:] if argv is None else argv
    out = argv[0] if argv else DEFAULT_OUT
    model = optimized_bert()
    # as the optimizer's save_model_to_file writes it (it adds the com.microsoft opset import)
    OnnxModel.save(model, out)
    meta = {p.key: p.value for p in model.metadata_props}
    print(f"{out}: {os.path.getsize(out)} bytes; {meta['dyncli.fused']}")


if __name__ == "__main__":
    main()
