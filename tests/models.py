"""ONNX model generators for dyncli tests.

Every generator returns an ``onnx.ModelProto`` with deterministic random
weights (``np.random.default_rng(seed)``) scaled so activations stay O(1):
the engine is compared against onnxruntime, and tiny or saturated activations
would make that comparison vacuous.

Only ops from the engine's op set are used.  Graphs are written the way the
PyTorch / HuggingFace exporters write them (shape arithmetic in-graph,
scalars as Constant nodes) so that the engine's dynamic-shape handling is
exercised, not just its kernels.
"""
from __future__ import annotations

import glob
import math
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64

__all__ = [
    "mlp",
    "encoder_block",
    "small_cnn",
    "kv_decoder_step",
    "randomize_weights",
    "light_model_paths",
    "real_inputs",
    "make_input_dynamic",
    "bert_sdpa_encoder",
    "gpt2_decoder_step",
]


# --------------------------------------------------------------------------
# graph builder
# --------------------------------------------------------------------------
class _Builder:
    """Minimal graph builder: unique names plus opset-aware helpers for the
    ops whose signature changed across opsets (Unsqueeze, ReduceMean)."""

    def __init__(self, opset: int, seed: int):
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._counts: dict[str, int] = {}

    def _unique(self, base: str) -> str:
        k = self._counts.get(base, 0)
        self._counts[base] = k + 1
        return f"{base}_{k}"

    def op(self, op_type: str, inputs, n_out: int = 1, name: str | None = None, **attrs):
        """Add a node; returns its output name (or list of names if n_out > 1)."""
        node_name = self._unique(name or op_type)
        outs = [node_name] if n_out == 1 else [f"{node_name}:{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=node_name, **attrs))
        return outs[0] if n_out == 1 else outs

    # -- constants -------------------------------------------------------
    def init(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def const(self, value, dtype=np.float32) -> str:
        """Scalar / small constant as a Constant node (how torch.onnx emits them)."""
        arr = np.asarray(value, dtype=dtype)
        return self.op("Constant", [], name="Constant", value=numpy_helper.from_array(arr))

    def weight(self, name: str, shape, fan_in: int, gain: float = 1.0) -> str:
        w = self.rng.standard_normal(shape) * (gain / math.sqrt(fan_in))
        return self.init(name, w.astype(np.float32))

    def bias(self, name: str, n: int, std: float = 0.02) -> str:
        return self.init(name, (self.rng.standard_normal(n) * std).astype(np.float32))

    # -- opset-dependent ops ----------------------------------------------
    def unsqueeze(self, x: str, axes) -> str:
        if self.opset >= 13:  # axes became an input in opset 13
            return self.op("Unsqueeze", [x, self.const(list(axes), np.int64)])
        return self.op("Unsqueeze", [x], axes=list(axes))

    def reduce_mean(self, x: str, axes, keepdims: int = 1) -> str:
        if self.opset >= 18:  # axes became an input in opset 18
            return self.op("ReduceMean", [x, self.const(list(axes), np.int64)], keepdims=keepdims)
        return self.op("ReduceMean", [x], axes=list(axes), keepdims=keepdims)

    # -- composite layers ------------------------------------------------
    def linear(self, x: str, prefix: str, d_in: int, d_out: int, gain: float = 1.0) -> str:
        """torch.nn.Linear as exported: MatMul by W^T (stored [in, out]) then Add."""
        w = self.weight(f"{prefix}.weight", (d_in, d_out), d_in, gain)
        b = self.bias(f"{prefix}.bias", d_out)
        return self.op("Add", [self.op("MatMul", [x, w]), b])

    def layer_norm(self, x: str, prefix: str, d: int, eps: float = 1e-5) -> str:
        # Non-trivial gamma/beta so a kernel ignoring them would be caught.
        gamma = self.init(f"{prefix}.weight", (1 + 0.1 * self.rng.standard_normal(d)).astype(np.float32))
        beta = self.init(f"{prefix}.bias", (0.1 * self.rng.standard_normal(d)).astype(np.float32))
        if self.opset >= 17:
            return self.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=eps)
        # Pre-17 exporters decompose LayerNorm exactly like this.
        mean = self.reduce_mean(x, [-1])
        d_ = self.op("Sub", [x, mean])
        var = self.reduce_mean(self.op("Pow", [d_, self.const(2.0)]), [-1])
        std = self.op("Sqrt", [self.op("Add", [var, self.const(eps)])])
        return self.op("Add", [self.op("Mul", [self.op("Div", [d_, std]), gamma]), beta])

    def dim(self, x: str, index: int) -> str:
        """x.size(index) as a 1-element int64 tensor: Shape -> Gather(scalar) -> Unsqueeze."""
        shape = self.op("Shape", [x])
        scalar = self.op("Gather", [shape, self.const(index, np.int64)], axis=0)
        return self.unsqueeze(scalar, [0])

    def model(self, inputs, outputs, name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        opsets = [helper.make_opsetid("", self.opset)]
        # Lowest IR version for the opset: keeps the files loadable by older runtimes.
        m = helper.make_model(
            graph,
            opset_imports=opsets,
            ir_version=helper.find_min_ir_version_for(opsets),
            producer_name="dyncli-tests",
        )
        onnx.checker.check_model(m, full_check=True)
        return m


def _vi(name: str, dtype: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


# --------------------------------------------------------------------------
# 1. MLP
# --------------------------------------------------------------------------
def mlp(seed: int = 0, d_in: int = 32, hidden: int = 64, d_out: int = 10, opset: int = 17) -> onnx.ModelProto:
    """x[batch, d_in] -> y[batch, d_out] (softmax probabilities).

    MatMul+Add+Relu, then a gated layer Tanh(Gemm) * Sigmoid(Gemm) so both
    activations feed the result, then Gemm logits and Softmax.
    """
    b = _Builder(opset, seed)
    h = b.op("Relu", [b.linear("x", "fc1", d_in, hidden, gain=math.sqrt(2))])

    def gemm(x, prefix, n_in, n_out, gain=1.0):
        # Gemm stores W as [out, in] with transB=1, like torch's Linear export at opset < 14.
        w = b.weight(f"{prefix}.weight", (n_out, n_in), n_in, gain)
        return b.op("Gemm", [x, w, b.bias(f"{prefix}.bias", n_out)], transB=1)

    gate = b.op("Mul", [b.op("Tanh", [gemm(h, "fc2a", hidden, hidden)]),
                        b.op("Sigmoid", [gemm(h, "fc2b", hidden, hidden)])])
    # Gain 4 because the gated activations are ~0.4 in std; keeps logits O(1).
    logits = gemm(gate, "fc3", hidden, d_out, gain=4.0)
    b.nodes.append(helper.make_node("Softmax", [logits], ["y"], name="Softmax_out", axis=-1))
    return b.model([_vi("x", FLOAT, ["batch", d_in])], [_vi("y", FLOAT, ["batch", d_out])], "mlp")


# --------------------------------------------------------------------------
# 2. transformer encoder block (optionally with BERT-like embeddings)
# --------------------------------------------------------------------------
def _bert_layer(b: "_Builder", x: str, bias: str, d_model: int, heads: int, ff: int,
                prefix: str = "") -> str:
    """One post-LN BERT layer (HF export style) on x [batch, seq, d_model] with the additive
    mask `bias` [batch, 1, 1, seq]; initializer names start with `prefix`."""
    d_head = d_model // heads

    def split_heads(t):
        # view(batch, seq, heads, d_head) with batch/seq read from the tensor at run time.
        target = b.op("Concat", [b.dim(t, 0), b.dim(t, 1), b.const([heads, d_head], np.int64)], axis=0)
        return b.op("Transpose", [b.op("Reshape", [t, target])], perm=[0, 2, 1, 3])  # [b, h, s, dh]

    q = split_heads(b.linear(x, prefix + "attention.self.query", d_model, d_model))
    k = split_heads(b.linear(x, prefix + "attention.self.key", d_model, d_model))
    v = split_heads(b.linear(x, prefix + "attention.self.value", d_model, d_model))
    k_t = b.op("Transpose", [k], perm=[0, 1, 3, 2])                            # key.transpose(-1, -2)
    scores = b.op("MatMul", [q, k_t])                                           # [b, h, s, s]
    # scale = sqrt(q.size(-1)): Shape-derived int -> Cast -> Sqrt, as traced SDPA exports do.
    dh = b.op("Gather", [b.op("Shape", [q]), b.const(3, np.int64)], axis=0)
    scale = b.op("Sqrt", [b.op("Cast", [dh], to=FLOAT)])
    scores = b.op("Add", [b.op("Div", [scores, scale]), bias])
    probs = b.op("Softmax", [scores], axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])    # [b, s, h, dh]
    merge = b.op("Concat", [b.dim(ctx, 0), b.dim(ctx, 1), b.const([d_model], np.int64)], axis=0)
    ctx = b.op("Reshape", [ctx, merge])                                         # [b, s, d]
    attn = b.linear(ctx, prefix + "attention.output.dense", d_model, d_model)
    h = b.layer_norm(b.op("Add", [attn, x]), prefix + "attention.output.LayerNorm", d_model)

    # ---- feed-forward with erf GELU: x * 0.5 * (1 + erf(x / sqrt(2))) ----
    f = b.linear(h, prefix + "intermediate.dense", d_model, ff)
    erf = b.op("Erf", [b.op("Div", [f, b.const(math.sqrt(2.0))])])
    g = b.op("Mul", [b.op("Mul", [f, b.op("Add", [erf, b.const(1.0)])]), b.const(0.5)])
    f2 = b.linear(g, prefix + "output.dense", ff, d_model, gain=math.sqrt(2))
    out = b.layer_norm(b.op("Add", [f2, h]), prefix + "output.LayerNorm", d_model)
    return out


def encoder_block(
    seed: int = 0,
    d_model: int = 64,
    heads: int = 4,
    ff: int = 128,
    opset: int = 17,
    vocab: int | None = None,
    max_pos: int = 256,
    mask_style: str | None = None,
) -> onnx.ModelProto:
    """One post-LN transformer encoder layer, HF-BERT export style.

    vocab=None: inputs x float[batch, seq, d_model], mask float[batch, seq] (1 = keep).
    vocab=int:  inputs input_ids int64[batch, seq], attention_mask int64[batch, seq];
                word + position + token-type embeddings and LayerNorm come first
                (seq must be <= max_pos).
    Output y float[batch, seq, d_model].

    mask_style picks how the 0/1 mask becomes an additive score bias:
      "arith": (1 - mask) * -10000        (older HF exports; Sub/Mul)
      "where": Where(Equal(mask, 0), -10000, 0)   (masked_fill exports)
    Default: "arith" for the float variant, "where" for the vocab variant, so
    the two default models together cover Sub, Mul, Equal and Where.
    """
    if d_model % heads:
        raise ValueError("d_model must be divisible by heads")
    if opset < 11:
        raise ValueError("opset >= 11 needed (float Equal, Slice/Unsqueeze semantics)")
    if mask_style is None:
        mask_style = "arith" if vocab is None else "where"
    d_head = d_model // heads
    b = _Builder(opset, seed)

    # ---- inputs / embeddings ----
    if vocab is None:
        inputs = [_vi("x", FLOAT, ["batch", "seq", d_model]), _vi("mask", FLOAT, ["batch", "seq"])]
        x, mask = "x", "mask"
    else:
        inputs = [_vi("input_ids", INT64, ["batch", "seq"]), _vi("attention_mask", INT64, ["batch", "seq"])]
        word = b.init("embeddings.word_embeddings.weight",
                      b.rng.standard_normal((vocab, d_model)).astype(np.float32))
        pos_tab = b.init("embeddings.position_embeddings.weight",
                         (0.5 * b.rng.standard_normal((max_pos, d_model))).astype(np.float32))
        type_tab = b.init("embeddings.token_type_embeddings.weight",
                          (0.5 * b.rng.standard_normal((2, d_model))).astype(np.float32))
        # HF keeps position_ids / token_type_ids as [1, max_pos] buffers and slices them to seq.
        pos_ids = b.init("embeddings.position_ids", np.arange(max_pos, dtype=np.int64)[None])
        type_ids = b.init("embeddings.token_type_ids", np.zeros((1, max_pos), np.int64))
        seq = b.dim("input_ids", 1)
        zero, one_axis = b.const([0], np.int64), b.const([1], np.int64)
        pos = b.op("Slice", [pos_ids, zero, seq, one_axis])                    # [1, seq]
        tt = b.op("Slice", [type_ids, zero, seq, one_axis])                     # [1, seq]
        tt = b.op("Expand", [tt, b.op("Shape", ["input_ids"])])                 # [batch, seq]
        emb = b.op("Add", [b.op("Gather", [word, "input_ids"], axis=0),
                           b.op("Gather", [type_tab, tt], axis=0)])
        emb = b.op("Add", [emb, b.op("Gather", [pos_tab, pos], axis=0)])       # + [1, seq, d]
        x = b.layer_norm(emb, "embeddings.LayerNorm", d_model)
        mask = b.op("Cast", ["attention_mask"], to=FLOAT)

    # ---- additive attention-mask bias [batch, 1, 1, seq] ----
    if mask_style == "arith":
        ext = b.unsqueeze(mask, [1, 2])
        bias = b.op("Mul", [b.op("Sub", [b.const(1.0), ext]), b.const(-10000.0)])
    elif mask_style == "where":
        is_pad = b.op("Equal", [mask, b.const(0.0)])
        bias = b.unsqueeze(b.op("Where", [is_pad, b.const(-10000.0), b.const(0.0)]), [1, 2])
    else:
        raise ValueError(f"unknown mask_style {mask_style!r}")

    out = _bert_layer(b, x, bias, d_model, heads, ff)
    b.nodes.append(helper.make_node("Identity", [out], ["y"], name="Identity_out"))
    return b.model(inputs, [_vi("y", FLOAT, ["batch", "seq", d_model])],
                   "encoder_block" if vocab is None else "tiny_bert")


# --------------------------------------------------------------------------
# 3. small CNN
# --------------------------------------------------------------------------
def small_cnn(seed: int = 0, opset: int = 13) -> onnx.ModelProto:
    """x float[batch, 3, height, width] -> y float[batch, 10] (softmax). Any H, W >= 8.

    stem: Conv3x3 p1 + BN + Relu -> Conv3x3 s2 SAME_UPPER + Relu -> LRN
    branch a: grouped (g=2) dilated (d=2) Conv + Relu -> MaxPool 2x2 s2
    branch b: MaxPool 2x2 s2 -> depthwise Conv3x3 + Relu -> AveragePool 3x3 s1 p1 (exclude pad)
    head: Concat(channels) -> Conv1x1 + Relu -> GlobalAveragePool -> Flatten -> Gemm -> Softmax
    """
    b = _Builder(opset, seed)
    he = math.sqrt(2)  # every conv feeds a Relu

    def conv(x, name, c_in, c_out, k, group=1, gain=he, **attrs):
        w = b.weight(f"{name}.weight", (c_out, c_in // group, k, k), c_in // group * k * k, gain)
        return b.op("Conv", [x, w, b.bias(f"{name}.bias", c_out)],
                    kernel_shape=[k, k], group=group, **attrs)

    c = 16
    t = conv("x", "stem1", 3, c, 3, pads=[1, 1, 1, 1])
    bn = [b.init(f"bn1.{n}", a.astype(np.float32)) for n, a in (
        ("scale", b.rng.uniform(0.5, 1.5, c)),
        ("bias", b.rng.normal(0, 0.1, c)),
        ("mean", b.rng.normal(0, 0.1, c)),
        ("var", b.rng.uniform(0.5, 1.5, c)),
    )]
    t = b.op("Relu", [b.op("BatchNormalization", [t, *bn], epsilon=1e-5)])
    t = b.op("Relu", [conv(t, "stem2", c, 2 * c, 3, strides=[2, 2], auto_pad="SAME_UPPER")])
    t = b.op("LRN", [t], size=5, alpha=1e-4, beta=0.75, bias=1.0)
    c *= 2  # 32 channels at ceil(H/2) x ceil(W/2)

    a = b.op("Relu", [conv(t, "branch_a", c, c, 3, group=2, dilations=[2, 2], pads=[2, 2, 2, 2])])
    a = b.op("MaxPool", [a], kernel_shape=[2, 2], strides=[2, 2])

    p = b.op("MaxPool", [t], kernel_shape=[2, 2], strides=[2, 2])
    p = b.op("Relu", [conv(p, "branch_b", c, c, 3, group=c, pads=[1, 1, 1, 1])])
    p = b.op("AveragePool", [p], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
             count_include_pad=0)

    t = b.op("Concat", [a, p], axis=1)
    t = b.op("Relu", [conv(t, "head", 2 * c, c, 1)])
    t = b.op("Flatten", [b.op("GlobalAveragePool", [t])], axis=1)
    w = b.weight("fc.weight", (10, c), c)  # pooled features are already O(1)
    logits = b.op("Gemm", [t, w, b.bias("fc.bias", 10)], transB=1)
    b.nodes.append(helper.make_node("Softmax", [logits], ["y"], name="Softmax_out", axis=-1))
    return b.model([_vi("x", FLOAT, ["batch", 3, "height", "width"])],
                   [_vi("y", FLOAT, ["batch", 10])], "small_cnn")


# --------------------------------------------------------------------------
# 4. decoder step with KV cache
# --------------------------------------------------------------------------
def kv_decoder_step(seed: int = 0, d_model: int = 32, heads: int = 2, opset: int = 17) -> onnx.ModelProto:
    """One attention step over a KV cache (no mask).

    inputs : x float[batch, new, d_model],
             past_k, past_v float[batch, heads, past, d_head]  (past may be 0)
    outputs: y float[batch, new, d_model],
             present_k, present_v float[batch, heads, total, d_head]  (total = past + new)
    """
    if d_model % heads:
        raise ValueError("d_model must be divisible by heads")
    d_head = d_model // heads
    b = _Builder(opset, seed)

    def split_heads(t):
        target = b.op("Concat", [b.dim(t, 0), b.dim(t, 1), b.const([heads, d_head], np.int64)], axis=0)
        return b.op("Transpose", [b.op("Reshape", [t, target])], perm=[0, 2, 1, 3])

    q = split_heads(b.linear("x", "q_proj", d_model, d_model))
    k = split_heads(b.linear("x", "k_proj", d_model, d_model))
    v = split_heads(b.linear("x", "v_proj", d_model, d_model))
    b.nodes.append(helper.make_node("Concat", ["past_k", k], ["present_k"], name="Concat_present_k", axis=2))
    b.nodes.append(helper.make_node("Concat", ["past_v", v], ["present_v"], name="Concat_present_v", axis=2))
    scores = b.op("MatMul", [q, b.op("Transpose", ["present_k"], perm=[0, 1, 3, 2])])
    scores = b.op("Mul", [scores, b.const(1.0 / math.sqrt(d_head))])  # scale as a Constant
    ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), "present_v"])
    ctx = b.op("Transpose", [ctx], perm=[0, 2, 1, 3])
    merge = b.op("Concat", [b.dim(ctx, 0), b.dim(ctx, 1), b.const([d_model], np.int64)], axis=0)
    out = b.linear(b.op("Reshape", [ctx, merge]), "o_proj", d_model, d_model)
    b.nodes.append(helper.make_node("Identity", [out], ["y"], name="Identity_out"))

    cache = ["batch", heads, "past", d_head]
    present = ["batch", heads, "total", d_head]
    return b.model(
        [_vi("x", FLOAT, ["batch", "new", d_model]), _vi("past_k", FLOAT, cache), _vi("past_v", FLOAT, cache)],
        [_vi("y", FLOAT, ["batch", "new", d_model]),
         _vi("present_k", FLOAT, present), _vi("present_v", FLOAT, present)],
        "kv_decoder_step",
    )


# --------------------------------------------------------------------------
# 4b. masked attention core (Softmax prologue fusion)
# --------------------------------------------------------------------------
def masked_attention(seed: int = 0, heads: int = 2, d_head: int = 8, mask_dims=("mb", 1, 1, "l"),
                     scale_op: str = "Mul", mask_first: bool = False, axis: int = -1,
                     opset: int = 17) -> onnx.ModelProto:
    """softmax(q @ k^T (*|/) scale + mask) @ v, the chain a Softmax prologue takes.

    inputs : q float[qb, heads, s, d_head], k, v float[qb, heads, l, d_head],
             mask float[mask_dims] (any shape that broadcasts against the scores [qb, heads, s, l])
    output : y float[...] (the broadcast batch of scores and mask)
    scale_op "Mul" multiplies by 1/sqrt(d_head), "Div" divides by sqrt(d_head);
    mask_first writes Add(mask, scores) instead of Add(scores, mask).
    """
    b = _Builder(opset, seed)
    scale = 1.0 / math.sqrt(d_head) if scale_op == "Mul" else math.sqrt(d_head)
    pair = ["mask", "scaled"] if mask_first else ["scaled", "mask"]
    b.nodes += [
        helper.make_node("MatMul", ["q", b.op("Transpose", ["k"], perm=[0, 1, 3, 2])], ["scores"],
                         name="MatMul_scores"),
        helper.make_node(scale_op, ["scores", b.const(scale)], ["scaled"], name=f"{scale_op}_scale"),
        helper.make_node("Add", pair, ["masked"], name="Add_mask"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="Softmax", axis=axis),
        helper.make_node("MatMul", ["probs", "v"], ["y"], name="MatMul_ctx"),
    ]
    kv = ["qb", heads, "l", d_head]
    return b.model([_vi("q", FLOAT, ["qb", heads, "s", d_head]), _vi("k", FLOAT, kv),
                    _vi("v", FLOAT, kv), _vi("mask", FLOAT, list(mask_dims))],
                   [_vi("y", FLOAT, ["yb", heads, "s", d_head])], "masked_attention")


# --------------------------------------------------------------------------
# 5. onnx "light" backend-test models
# --------------------------------------------------------------------------
def light_model_paths() -> dict[str, str]:
    """name (e.g. "densenet121") -> path of the onnx wheel's light_<name>.onnx."""
    d = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    return {
        os.path.basename(p)[len("light_"):-len(".onnx")]: p
        for p in sorted(glob.glob(os.path.join(d, "light_*.onnx")))
    }


def real_inputs(model: onnx.ModelProto) -> list[str]:
    """Graph inputs that are not initializers (IR < 4 models list weights as inputs too)."""
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


# Ops that just re-view a weight before its real consumer (densenet/inception_v2 Unsqueeze
# BN scale/shift before Mul/Add; inception_v1 Reshapes its classifier weight before Gemm).
_VIEW_OPS = {"Unsqueeze", "Reshape", "Identity", "Squeeze", "Flatten"}


def _final_consumer(name, consumers, depth=0):
    """(node, input_index, view_nodes) of the first non-view consumer of `name`, or None."""
    for node, idx in consumers.get(name, []):
        if node.op_type in _VIEW_OPS and idx == 0 and depth < 8:
            hit = _final_consumer(node.output[0], consumers, depth + 1)
            if hit is not None:
                return hit[0], hit[1], [node] + hit[2]
        elif node.op_type not in _VIEW_OPS:
            return node, idx, []
    return None


def _feeds_relu(node, consumers) -> bool:
    """True if node's output reaches a Relu through only BN / Mul / Add (single consumers)."""
    out = node.output[0]
    for _ in range(4):
        uses = consumers.get(out, [])
        if len(uses) != 1:
            return False
        nxt = uses[0][0]
        if nxt.op_type == "Relu":
            return True
        if nxt.op_type not in ("BatchNormalization", "Mul", "Add"):
            return False
        out = nxt.output[0]
    return False


def _sample_weight(rng, shape, consumer, idx, views, inits, conv_gain=1.0):
    """Random values for a weight of `shape` according to how it is consumed."""
    op = consumer.op_type
    if op == "BatchNormalization" and idx in (1, 4):          # scale, var
        return rng.uniform(0.5, 1.5, shape)
    if op == "BatchNormalization" and idx in (2, 3):          # bias, mean
        return rng.normal(0.0, 0.1, shape)
    if op == "Conv" and idx == 1:                             # [O, I/g, kh, kw]
        return rng.standard_normal(shape) * (conv_gain / math.sqrt(max(1, int(np.prod(shape[1:])))))
    if op in ("Gemm", "MatMul") and idx == 1:
        used = list(shape)
        # Use the shape the consumer sees when a constant-target Reshape sits in between.
        for v in views:
            if v.op_type == "Reshape" and len(v.input) > 1 and v.input[1] in inits:
                used = [int(s) for s in inits[v.input[1]]]
        trans_b = any(a.name == "transB" and a.i for a in consumer.attribute)
        fan_in = used[-1] if (op == "Gemm" and trans_b) else (used[-2] if len(used) > 1 else used[0])
        return rng.standard_normal(shape) / math.sqrt(max(1, fan_in))
    if op == "Mul":                                           # per-channel scale (Caffe "Scale")
        return rng.uniform(0.5, 1.5, shape)
    # Conv/Gemm biases, Add/Sum shifts: small.
    return rng.normal(0.0, 0.1 if op in ("Add", "Sum") else 0.05, shape)


def randomize_weights(model: onnx.ModelProto, seed: int = 0, relu_gain: float = 1.0) -> onnx.ModelProto:
    """Copy of a light model with its ConstantOfShape weights made random initializers.

    The light models store every large weight as ConstantOfShape(value=0.02) fed
    by an int64 shape initializer, so all channels compute the same thing and
    outputs are nearly uniform: useless for checking an engine.  Each such node
    whose output is a float tensor with a recognised consumer is replaced by an
    initializer of the same name and shape; the shape initializer (and its graph
    input) is dropped once unused.  Because these are IR-3 models, every
    initializer must also be a graph input, so the new weights are listed too.
    Everything else (real small initializers, node order, opset) is kept.

    Conv/Gemm weights are N(0,1)/sqrt(fan_in).  relu_gain multiplies Conv
    weights whose output goes (via BN/Mul/Add) straight into a Relu: sqrt(2)
    (He init) lifts the plain nets (squeezenet logits std ~0.1 -> ~2) but makes
    the residual ones explode (resnet50 ~14 -> ~900), hence default 1.
    """
    rng = np.random.default_rng(seed)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    consumers: dict[str, list] = {}
    for node in g.node:
        for i, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, i))

    keep_nodes, new_inits, shape_names = [], [], set()
    for node in g.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        hit = _final_consumer(node.output[0], consumers) if node.op_type == "ConstantOfShape" else None
        if (hit is None or node.input[0] not in inits
                or (value is not None and value.data_type != FLOAT)):  # default value is float 0
            keep_nodes.append(node)
            continue
        shape = [int(s) for s in inits[node.input[0]]]
        gain = relu_gain if hit[0].op_type == "Conv" and _feeds_relu(hit[0], consumers) else 1.0
        arr = _sample_weight(rng, shape, hit[0], hit[1], hit[2], inits, gain).astype(np.float32)
        new_inits.append(numpy_helper.from_array(arr, node.output[0]))
        shape_names.add(node.input[0])

    used = {n for node in keep_nodes for n in node.input}
    dead = shape_names - used
    del g.node[:]
    g.node.extend(keep_nodes)
    kept_inits = [t for t in g.initializer if t.name not in dead]
    del g.initializer[:]
    g.initializer.extend(kept_inits + new_inits)
    kept_inputs = [i for i in g.input if i.name not in dead]
    del g.input[:]
    g.input.extend(kept_inputs)
    if m.ir_version < 4:
        g.input.extend(_vi(t.name, FLOAT, list(t.dims)) for t in new_inits)
    onnx.checker.check_model(m, full_check=True)
    return m


def make_input_dynamic(model: onnx.ModelProto, dim_params=("batch", None, "height", "width")) -> onnx.ModelProto:
    """Copy with the real inputs' dims replaced by dim_params (None keeps a dim) and
    the outputs' leading dim set to dim_params[0].

    The light models declare data_0 as fixed 1x3x224x224, so onnxruntime refuses
    other shapes.  Only models without hard-coded Reshape targets (densenet121,
    squeezenet) actually work at other sizes.
    """
    m = onnx.ModelProto()
    m.CopyFrom(model)
    names = set(real_inputs(m))
    for vi in m.graph.input:
        if vi.name in names:
            for dim, p in zip(vi.type.tensor_type.shape.dim, dim_params):
                if p is not None:
                    dim.dim_param = p
    for vi in m.graph.output:
        dims = vi.type.tensor_type.shape.dim
        if dims and dim_params[0] is not None:
            dims[0].dim_param = dim_params[0]
    # Spatial output dims of densenet/squeezenet (1x1) stay valid; batch is now symbolic.
    return m


# --------------------------------------------------------------------------
# 7. benchmark-size models (examples/make_models.py --bench writes them)
# --------------------------------------------------------------------------
def bert_encoder(layers: int = 6, d_model: int = 384, heads: int = 12, ff: int = 1536,
                 vocab: int = 30522, max_pos: int = 512, seed: int = 0) -> onnx.ModelProto:
    """A BERT encoder of `layers` post-LN layers (defaults: the all-MiniLM-L6 architecture),
    HF export style, random weights. inputs input_ids, attention_mask int64[batch, seq];
    output last_hidden_state float[batch, seq, d_model]."""
    b = _Builder(17, seed)
    word = b.init("embeddings.word_embeddings.weight",
                  (0.5 * b.rng.standard_normal((vocab, d_model))).astype(np.float32))
    pos_tab = b.init("embeddings.position_embeddings.weight",
                     (0.5 * b.rng.standard_normal((max_pos, d_model))).astype(np.float32))
    pos_ids = b.init("embeddings.position_ids", np.arange(max_pos, dtype=np.int64)[None])
    seq = b.dim("input_ids", 1)
    pos = b.op("Slice", [pos_ids, b.const([0], np.int64), seq, b.const([1], np.int64)])
    emb = b.op("Add", [b.op("Gather", [word, "input_ids"], axis=0),
                       b.op("Gather", [pos_tab, pos], axis=0)])
    x = b.layer_norm(emb, "embeddings.LayerNorm", d_model)
    mask = b.op("Cast", ["attention_mask"], to=FLOAT)
    is_pad = b.op("Equal", [mask, b.const(0.0)])
    bias = b.unsqueeze(b.op("Where", [is_pad, b.const(-10000.0), b.const(0.0)]), [1, 2])
    for i in range(layers):
        x = _bert_layer(b, x, bias, d_model, heads, ff, prefix=f"encoder.layer.{i}.")
    b.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="Identity_out"))
    return b.model([_vi("input_ids", INT64, ["batch", "seq"]), _vi("attention_mask", INT64, ["batch", "seq"])],
                   [_vi("last_hidden_state", FLOAT, ["batch", "seq", d_model])], "bert_encoder")


def gpt2_decoder(layers: int = 12, d_model: int = 768, heads: int = 12, vocab: int = 50257,
                 max_pos: int = 1024, seed: int = 0) -> onnx.ModelProto:
    """A GPT-2 decoder step with explicit KV-cache inputs (defaults: the GPT-2 small
    architecture: pre-LN, learned positions, tanh GELU, random weights). inputs input_ids
    int64[batch, new], past_key_{i}/past_value_{i} float[batch, heads, past, d_head];
    outputs logits float[batch, new, vocab], present_key_{i}/present_value_{i}. q, k and v come
    from one projection (c_attn) cut by a Split, as GPT-2 exports them. Positions
    run from past to past + new (sliced from the table by shapes). No causal mask: exact for
    one new token per step, the decode loop it is built for (`--feedback present_key_0:past_key_0,...`)."""
    d_head = d_model // heads
    b = _Builder(17, seed)
    wte = b.init("wte", (0.1 * b.rng.standard_normal((vocab, d_model))).astype(np.float32))
    wpe = b.init("wpe", (0.1 * b.rng.standard_normal((max_pos, d_model))).astype(np.float32))
    past = b.dim("past_key_0", 2)
    end = b.op("Add", [past, b.dim("input_ids", 1)])
    pos = b.op("Slice", [wpe, past, end, b.const([0], np.int64)])               # [new, d]
    x = b.op("Add", [b.op("Gather", [wte, "input_ids"], axis=0), pos])

    def split_heads(t):
        target = b.op("Concat", [b.dim(t, 0), b.dim(t, 1), b.const([heads, d_head], np.int64)], axis=0)
        return b.op("Transpose", [b.op("Reshape", [t, target])], perm=[0, 2, 1, 3])

    inputs = [_vi("input_ids", INT64, ["batch", "new"])]
    outputs = [_vi("logits", FLOAT, ["batch", "new", vocab])]
    for i in range(layers):
        p = f"h.{i}."
        h = b.layer_norm(x, p + "ln_1", d_model)
        # GPT-2's c_attn: one projection to q, k, v, cut by Split
        qkv = b.op("Split", [b.linear(h, p + "attn.c_attn", d_model, 3 * d_model),
                             b.const([d_model] * 3, np.int64)], n_out=3, axis=2)
        q, k, v = (split_heads(t) for t in qkv)
        for kind, new in (("key", k), ("value", v)):
            b.nodes.append(helper.make_node("Concat", [f"past_{kind}_{i}", new], [f"present_{kind}_{i}"],
                                            name=f"Concat_present_{kind}_{i}", axis=2))
            inputs.append(_vi(f"past_{kind}_{i}", FLOAT, ["batch", heads, "past", d_head]))
            outputs.append(_vi(f"present_{kind}_{i}", FLOAT, ["batch", heads, "total", d_head]))
        scores = b.op("MatMul", [q, b.op("Transpose", [f"present_key_{i}"], perm=[0, 1, 3, 2])])
        scores = b.op("Mul", [scores, b.const(1.0 / math.sqrt(d_head))])
        ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), f"present_value_{i}"])
        ctx = b.op("Transpose", [ctx], perm=[0, 2, 1, 3])
        merge = b.op("Concat", [b.dim(ctx, 0), b.dim(ctx, 1), b.const([d_model], np.int64)], axis=0)
        x = b.op("Add", [x, b.linear(b.op("Reshape", [ctx, merge]), p + "attn.c_proj", d_model, d_model)])
        h = b.layer_norm(x, p + "ln_2", d_model)
        f = b.linear(h, p + "mlp.c_fc", d_model, 4 * d_model)
        # gelu_new: 0.5 f (1 + tanh(sqrt(2/pi) (f + 0.044715 f^3)))
        inner = b.op("Mul", [b.op("Add", [f, b.op("Mul", [b.op("Pow", [f, b.const(3.0)]), b.const(0.044715)])]),
                             b.const(math.sqrt(2 / math.pi))])
        g = b.op("Mul", [b.op("Mul", [f, b.const(0.5)]), b.op("Add", [b.op("Tanh", [inner]), b.const(1.0)])])
        x = b.op("Add", [x, b.linear(g, p + "mlp.c_proj", 4 * d_model, d_model, gain=math.sqrt(2))])
    x = b.layer_norm(x, "ln_f", d_model)
    lm = b.weight("lm_head.weight", (d_model, vocab), d_model)
    b.nodes.append(helper.make_node("MatMul", [x, lm], ["logits"], name="lm_head"))
    return b.model(inputs, outputs, "gpt2_decoder")

# 6. real-model patterns: a BERT-family encoder with the sdpa-style
#    mask of current transformers exports, and a GPT-2-style KV-cache decode step
# --------------------------------------------------------------------------
class _TypedBuilder(_Builder):
    """_Builder whose float weights and constants are of `dtype` (float32 by default; a
    float16 variant only changes this)."""

    def __init__(self, opset: int, seed: int, dtype=np.float32):
        super().__init__(opset, seed)
        self.dtype = np.dtype(dtype)
        self.elem = helper.np_dtype_to_tensor_dtype(self.dtype)

    def init(self, name, arr):
        arr = np.asarray(arr)
        return super().init(name, arr.astype(self.dtype) if arr.dtype.kind == "f" else arr)

    def fconst(self, value) -> str:
        return self.const(value, self.dtype)

    def layer_norm(self, x, prefix, d, eps=1e-5):
        gamma = self.init(f"{prefix}.weight", 1 + 0.1 * self.rng.standard_normal(d))
        beta = self.init(f"{prefix}.bias", 0.1 * self.rng.standard_normal(d))
        return self.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=eps)

    def scalar_dim(self, x, index):
        """x.size(index) as a 0-d int64 (what Range takes)."""
        return self.op("Gather", [self.op("Shape", [x]), self.const(index, np.int64)], axis=0)

    def heads(self, t, heads, d_head):
        target = self.op("Concat", [self.dim(t, 0), self.dim(t, 1), self.const([heads, d_head], np.int64)], axis=0)
        return self.op("Transpose", [self.op("Reshape", [t, target])], perm=[0, 2, 1, 3])

    def merge(self, t, d_model):
        t = self.op("Transpose", [t], perm=[0, 2, 1, 3])
        target = self.op("Concat", [self.dim(t, 0), self.dim(t, 1), self.const([d_model], np.int64)], axis=0)
        return self.op("Reshape", [t, target])


def bert_sdpa_encoder(seed: int = 0, layers: int = 2, d_model: int = 32, heads: int = 2,
                      ff: int = 64, vocab: int = 100, max_pos: int = 64, opset: int = 17,
                      dtype=np.float32) -> onnx.ModelProto:
    """A BERT-family encoder (`layers` post-LN layers) with the attention mask the sdpa path of
    current transformers exports: key/query positions from Range over the traced sizes, each
    key's padding flag picked from attention_mask with GatherElements, position checks with
    GreaterOrEqual/Less, combined with And into a bool [batch, 1, seq, seq] mask, turned into a
    score bias with Where(mask, 0, finfo.min), and the softmax guarded by Where(IsNaN(p), 0, p)
    (rows whose keys are all padding). opset >= 20 uses the Gelu op, else erf GELU.

    inputs : input_ids int64[batch, seq], attention_mask int64[batch, seq]
    output : last_hidden_state dtype[batch, seq, d_model]
    """
    b = _TypedBuilder(opset, seed, dtype)
    d_head = d_model // heads
    word = b.init("embeddings.word_embeddings.weight", b.rng.standard_normal((vocab, d_model)))
    pos_tab = b.init("embeddings.position_embeddings.weight", 0.5 * b.rng.standard_normal((max_pos, d_model)))
    seq = b.scalar_dim("input_ids", 1)
    zero, one = b.const(0, np.int64), b.const(1, np.int64)
    pos = b.op("Range", [zero, seq, one])                                       # [seq]
    emb = b.op("Add", [b.op("Gather", [word, "input_ids"], axis=0), b.op("Gather", [pos_tab, pos], axis=0)])
    x = b.layer_norm(emb, "embeddings.LayerNorm", d_model)

    # ---- the sdpa mask ----
    kv_idx = b.op("Range", [zero, b.scalar_dim("attention_mask", 1), one])      # [kv]
    q_idx = b.op("Range", [zero, seq, one])                                      # [seq]
    # padding_mask[batch_idx, kv_idx]: GatherElements over the expanded key indices
    idx = b.op("Expand", [b.unsqueeze(kv_idx, [0]), b.op("Shape", ["attention_mask"])])
    pad_ok = b.op("Cast", [b.op("GatherElements", ["attention_mask", idx], axis=1)], to=TensorProto.BOOL)
    kv_ok = b.op("And", [b.op("GreaterOrEqual", [kv_idx, zero]),
                         b.op("Less", [kv_idx, b.scalar_dim("attention_mask", 1)])])
    q_ok = b.op("GreaterOrEqual", [q_idx, zero])
    mask = b.op("And", [b.unsqueeze(pad_ok, [1, 2]), b.unsqueeze(kv_ok, [0, 1, 2])])   # [b, 1, 1, kv]
    mask = b.op("And", [mask, b.unsqueeze(q_ok, [0, 1, 3])])                         # [b, 1, seq, kv]
    bias = b.op("Where", [mask, b.fconst(0.0), b.fconst(float(np.finfo(b.dtype).min))])

    scale = b.fconst(1.0 / math.sqrt(d_head))
    for i in range(layers):
        p = f"encoder.layer.{i}"
        q = b.heads(b.linear(x, f"{p}.attention.self.query", d_model, d_model), heads, d_head)
        k = b.heads(b.linear(x, f"{p}.attention.self.key", d_model, d_model), heads, d_head)
        v = b.heads(b.linear(x, f"{p}.attention.self.value", d_model, d_model), heads, d_head)
        scores = b.op("Mul", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]), scale])
        probs = b.op("Softmax", [b.op("Add", [scores, bias])], axis=-1)
        probs = b.op("Where", [b.op("IsNaN", [probs]), b.fconst(0.0), probs])
        ctx = b.merge(b.op("MatMul", [probs, v]), d_model)
        attn = b.linear(ctx, f"{p}.attention.output.dense", d_model, d_model)
        h = b.layer_norm(b.op("Add", [attn, x]), f"{p}.attention.output.LayerNorm", d_model)
        f = b.linear(h, f"{p}.intermediate.dense", d_model, ff)
        if opset >= 20:
            g = b.op("Gelu", [f])
        else:
            erf = b.op("Erf", [b.op("Div", [f, b.fconst(math.sqrt(2.0))])])
            g = b.op("Mul", [b.op("Mul", [f, b.op("Add", [erf, b.fconst(1.0)])]), b.fconst(0.5)])
        f2 = b.linear(g, f"{p}.output.dense", ff, d_model, gain=math.sqrt(2))
        x = b.layer_norm(b.op("Add", [f2, h]), f"{p}.output.LayerNorm", d_model)
    b.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="Identity_out"))
    return b.model([_vi("input_ids", INT64, ["batch", "seq"]), _vi("attention_mask", INT64, ["batch", "seq"])],
                   [_vi("last_hidden_state", b.elem, ["batch", "seq", d_model])], "bert_sdpa_encoder")


def gpt2_decoder_step(seed: int = 0, layers: int = 2, d_model: int = 32, heads: int = 2,
                      vocab: int = 100, max_pos: int = 64, opset: int = 17,
                      dtype=np.float32) -> onnx.ModelProto:
    """A GPT-2-style decoder step over a KV cache: position ids by Range(past, past + new), a
    fused QKV projection (c_attn) cut by Split, present = Concat(past, new) per layer, a causal
    mask from Trilu over a ConstantOfShape of ones sliced to the new rows, combined with the
    padding of attention_mask and inverted with Not, applied as Where(masked, finfo.min,
    scores); GELU in GPT-2's tanh form (Pow/Tanh), an RMS-norm-style chain (Pow, ReduceMean,
    Sqrt, Div, Mul) before the tied LM head.

    inputs : input_ids int64[batch, new], attention_mask int64[batch, past + new],
             past_key_{i}, past_value_{i} dtype[batch, heads, past, d_head]
    outputs: logits dtype[batch, new, vocab], present_key_{i}, present_value_{i}
             dtype[batch, heads, past + new, d_head]
    """
    b = _TypedBuilder(opset, seed, dtype)
    d_head = d_model // heads
    wte = b.init("transformer.wte.weight", b.rng.standard_normal((vocab, d_model)))
    wpe = b.init("transformer.wpe.weight", 0.5 * b.rng.standard_normal((max_pos, d_model)))
    past = b.scalar_dim("past_key_0", 2)
    new = b.scalar_dim("input_ids", 1)
    total = b.op("Add", [past, new])
    pos = b.op("Range", [past, total, b.const(1, np.int64)])                     # [new]
    x = b.op("Add", [b.op("Gather", [wte, "input_ids"], axis=0), b.op("Gather", [wpe, pos], axis=0)])

    # causal [new, total]: rows past..total of tril(ones(total, total))
    tt = b.op("Concat", [b.unsqueeze(total, [0]), b.unsqueeze(total, [0])], axis=0)
    ones = b.op("ConstantOfShape", [tt], value=numpy_helper.from_array(np.ones(1, np.bool_)))
    causal = b.op("Trilu", [ones], upper=0)
    causal = b.op("Slice", [causal, b.unsqueeze(past, [0]), b.unsqueeze(total, [0]), b.const([0], np.int64)])
    pad = b.op("Cast", ["attention_mask"], to=TensorProto.BOOL)                  # [b, total]
    keep = b.op("And", [b.unsqueeze(causal, [0, 1]), b.unsqueeze(pad, [1, 2])])  # [b, 1, new, total]
    masked = b.op("Not", [keep])
    low = b.fconst(float(np.finfo(b.dtype).min))
    scale = b.fconst(1.0 / math.sqrt(d_head))

    presents = []
    for i in range(layers):
        p = f"transformer.h.{i}"
        h = b.layer_norm(x, f"{p}.ln_1", d_model)
        qkv = b.linear(h, f"{p}.attn.c_attn", d_model, 3 * d_model)
        if opset >= 13:
            q, k, v = b.op("Split", [qkv, b.const([d_model] * 3, np.int64)], n_out=3, axis=-1)
        else:
            q, k, v = b.op("Split", [qkv], n_out=3, axis=-1, split=[d_model] * 3)
        q, k, v = (b.heads(t, heads, d_head) for t in (q, k, v))
        pk, pv = f"present_key_{i}", f"present_value_{i}"
        b.nodes.append(helper.make_node("Concat", [f"past_key_{i}", k], [pk], name=f"Concat_{pk}", axis=2))
        b.nodes.append(helper.make_node("Concat", [f"past_value_{i}", v], [pv], name=f"Concat_{pv}", axis=2))
        presents += [pk, pv]
        scores = b.op("Mul", [b.op("MatMul", [q, b.op("Transpose", [pk], perm=[0, 1, 3, 2])]), scale])
        probs = b.op("Softmax", [b.op("Where", [masked, low, scores])], axis=-1)
        attn = b.linear(b.merge(b.op("MatMul", [probs, pv]), d_model), f"{p}.attn.c_proj", d_model, d_model)
        x = b.op("Add", [x, attn])
        h = b.layer_norm(x, f"{p}.ln_2", d_model)
        f = b.linear(h, f"{p}.mlp.c_fc", d_model, 4 * d_model)
        cube = b.op("Mul", [b.op("Pow", [f, b.fconst(3.0)]), b.fconst(0.044715)])
        t = b.op("Tanh", [b.op("Mul", [b.op("Add", [f, cube]), b.fconst(math.sqrt(2 / math.pi))])])
        g = b.op("Mul", [b.op("Mul", [f, b.fconst(0.5)]), b.op("Add", [t, b.fconst(1.0)])])
        x = b.op("Add", [x, b.linear(g, f"{p}.mlp.c_proj", 4 * d_model, d_model, gain=math.sqrt(2))])
    # RMS norm as exporters write it: x / sqrt(mean(x^2) + eps) * weight
    ms = b.reduce_mean(b.op("Pow", [x, b.fconst(2.0)]), [-1])
    x = b.op("Div", [x, b.op("Sqrt", [b.op("Add", [ms, b.fconst(1e-6)])])])
    x = b.op("Mul", [x, b.init("transformer.norm.weight", 1 + 0.1 * b.rng.standard_normal(d_model))])
    wte_t = b.op("Transpose", [wte], perm=[1, 0])
    b.nodes.append(helper.make_node("MatMul", [x, wte_t], ["logits"], name="MatMul_lm_head"))

    cache = ["batch", heads, "past", d_head]
    present = ["batch", heads, "total", d_head]
    ins = [_vi("input_ids", INT64, ["batch", "new"]), _vi("attention_mask", INT64, ["batch", "total"])]
    for i in range(layers):
        ins += [_vi(f"past_key_{i}", b.elem, cache), _vi(f"past_value_{i}", b.elem, cache)]
    outs = [_vi("logits", b.elem, ["batch", "new", vocab])] + [_vi(n, b.elem, present) for n in presents]
    return b.model(ins, outs, "gpt2_decoder_step")


# --------------------------------------------------------------------------
# float16 versions of the models above
# --------------------------------------------------------------------------
def to_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model in float16: float initializers, Constant/ConstantOfShape values, float
    inputs/outputs and Cast-to-float become float16 (weights rounded to half)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for t in g.initializer:
        if t.data_type == FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type == FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float16), a.t.name))
            elif n.op_type == "Cast" and a.name == "to" and a.i == FLOAT:
                a.i = TensorProto.FLOAT16
    return m
