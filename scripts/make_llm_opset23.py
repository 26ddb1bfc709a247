"""Write the opset-23 LLM decode-step fixture: a small random-weight decoder in the standard
ONNX ops that 2026's exporters emit for it (RMSNormalization, RotaryEmbedding, Attention with
grouped-query heads and past / present KV), one step of generation over any number of new
tokens.

    python scripts/make_llm_opset23.py [OUT]     (default tests/llm_opset23/decoder.onnx)

2 layers, hidden 64, 4 query heads and 2 kv heads of 16, SiLU MLP 48, vocab 128, the LM head
tied to the embedding. Inputs input_ids [batch, seq] int64 and past_key_L / past_value_L
[batch, 2, past, 16]; outputs logits [batch, seq, 128] and present_key_L / present_value_L
[batch, 2, past + seq, 16]. The rotary positions are past .. past + seq - 1 (the past's length
read by a Shape); Attention is causal with the diagonal offset by the past. Needs onnx and
numpy only.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN, HEADS, KV_HEADS, HEAD, MLP, VOCAB, LAYERS = 64, 4, 2, 16, 48, 128, 2
POSITIONS = 64      # rows of the rotary caches: the longest past + new the fixture serves
OPSET = 23
DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "llm_opset23", "decoder.onnx")
I64 = TensorProto.INT64


class _Graph:
    def __init__(self, rng):
        self.rng, self.nodes, self.inits = rng, [], []

    def weight(self, name, *dims, scale=None):
        w = self.rng.standard_normal(dims) * (scale if scale is not None else dims[0] ** -0.5)
        self.inits.append(numpy_helper.from_array(w.astype(np.float32), name))
        return name

    def const(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type, inputs, out, **attrs):
        outs = out if isinstance(out, list) else [out]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=f"{op_type}_{outs[0]}", **attrs))
        return out


def _rotary_caches(g):
    inv = 1.0 / (10000 ** (np.arange(0, HEAD, 2) / HEAD))
    ang = np.outer(np.arange(POSITIONS), inv)
    g.const("cos_cache", np.cos(ang).astype(np.float32))
    g.const("sin_cache", np.sin(ang).astype(np.float32))


def _positions(g):
    """position_ids [batch, seq] = past .. past + seq - 1."""
    past = g.op("Shape", ["past_key_0"], "past_len", start=2, end=3)
    seq = g.op("Shape", ["input_ids"], "seq_len", start=1, end=2)
    end = g.op("Add", [past, seq], "pos_end")
    g.const("axis0", np.array([0], np.int64))
    scalar = lambda t: g.op("Squeeze", [t, "axis0"], f"{t}_s")  # noqa: E731
    ids = g.op("Range", [scalar(past), scalar(end), g.const("one", np.array(1, np.int64))], "pos_range")
    row = g.op("Unsqueeze", [ids, "axis0"], "pos_row")
    return g.op("Expand", [row, g.op("Shape", ["input_ids"], "ids_shape")], "position_ids")


def _layer(g, h, pos, i):
    x = g.op("RMSNormalization", [h, g.weight(f"ln1_{i}", HIDDEN, scale=0.1)], f"x_{i}", epsilon=1e-5)
    q = g.op("MatMul", [x, g.weight(f"wq_{i}", HIDDEN, HEADS * HEAD)], f"q_{i}")
    k = g.op("MatMul", [x, g.weight(f"wk_{i}", HIDDEN, KV_HEADS * HEAD)], f"k_{i}")
    v = g.op("MatMul", [x, g.weight(f"wv_{i}", HIDDEN, KV_HEADS * HEAD)], f"v_{i}")
    q = g.op("RotaryEmbedding", [q, "cos_cache", "sin_cache", pos], f"q_rot_{i}", num_heads=HEADS)
    k = g.op("RotaryEmbedding", [k, "cos_cache", "sin_cache", pos], f"k_rot_{i}", num_heads=KV_HEADS)
    a = g.op("Attention", [q, k, v, "", f"past_key_{i}", f"past_value_{i}"],
             [f"attn_{i}", f"present_key_{i}", f"present_value_{i}"],
             is_causal=1, q_num_heads=HEADS, kv_num_heads=KV_HEADS)[0]
    h = g.op("Add", [h, g.op("MatMul", [a, g.weight(f"wo_{i}", HEADS * HEAD, HIDDEN)], f"o_{i}")], f"h_attn_{i}")
    x = g.op("RMSNormalization", [h, g.weight(f"ln2_{i}", HIDDEN, scale=0.1)], f"x2_{i}", epsilon=1e-5)
    up = g.op("MatMul", [x, g.weight(f"w1_{i}", HIDDEN, MLP)], f"up_{i}")
    act = g.op("Mul", [up, g.op("Sigmoid", [up], f"gate_{i}")], f"silu_{i}")
    return g.op("Add", [h, g.op("MatMul", [act, g.weight(f"w2_{i}", MLP, HIDDEN)], f"down_{i}")], f"h_{i}")


def build(seed: int = 23) -> onnx.ModelProto:
    g = _Graph(np.random.default_rng(seed))
    _rotary_caches(g)
    emb = g.weight("embed", VOCAB, HIDDEN, scale=1.0)
    h = g.op("Gather", [emb, "input_ids"], "h_emb")
    pos = _positions(g)
    for i in range(LAYERS):
        h = _layer(g, h, pos, i)
    h = g.op("RMSNormalization", [h, g.weight("ln_f", HIDDEN, scale=0.1)], "h_final", epsilon=1e-5)
    head = g.op("Transpose", [emb], "lm_head", perm=[1, 0])
    g.op("MatMul", [h, head], "logits")
    vi = helper.make_tensor_value_info
    kv = lambda n, t: vi(n, TensorProto.FLOAT, ["batch", KV_HEADS, t, HEAD])  # noqa: E731
    ins = [vi("input_ids", I64, ["batch", "seq"])] + \
        [kv(f"past_{w}_{i}", "past") for i in range(LAYERS) for w in ("key", "value")]
    outs = [vi("logits", TensorProto.FLOAT, ["batch", "seq", VOCAB])] + \
        [kv(f"present_{w}_{i}", "total") for i in range(LAYERS) for w in ("key", "value")]
    graph = helper.make_graph(g.nodes, "llm_opset23_decoder", ins, outs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10,
                              producer_name="scripts/make_llm_opset23.py")
    onnx.checker.check_model(model, full_check=True)
    return model


def main(argv) -> int:
    out = argv[1] if len(argv) > 1 else DEFAULT_OUT
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    onnx.save(build(), out)
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
