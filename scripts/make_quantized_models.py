"""Build the quantized fixtures of tests/test_quantized_models.py, as onnxruntime's quantization
tool writes them for a user's float model (needs onnx and onnxruntime, as the tests):

- convnet.qdq.onnx: a small CNN (Conv + Relu, a strided Conv, a depthwise Conv, global pooling,
  a Gemm head) with dynamic batch and resolution, quantized by `quantize_static` in the QDQ
  format: per-channel int8 weights, uint8 activations, a random calibration data reader;
- bert.dynamic.onnx: a tiny BERT-like encoder layer (token embedding, self-attention, a GELU
  MLP, LayerNorms) with dynamic batch and sequence length, quantized by `quantize_dynamic`
  (DynamicQuantizeLinear + MatMulInteger for every MatMul with a constant weight);
- convnet.dynamic.onnx: the same CNN quantized by `quantize_dynamic` (ConvInteger for the Convs,
  MatMulInteger for the Gemm).

    python scripts/make_quantized_models.py OUT_DIR

The float models are built with onnx.helper from seeded random weights, so a rerun writes the
same graphs (onnxruntime's version is in each file's metadata).
"""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
D, HEADS, FF, VOCAB = 32, 2, 64, 100     # the encoder's sizes (VOCAB: dyncli's default id range)


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def convnet(rng) -> onnx.ModelProto:
    """x [batch, 3, h, w] -> logits [batch, 10]."""
    w = lambda *s: (rng.standard_normal(s) * (2.0 / np.prod(s[1:])) ** 0.5).astype(np.float32)
    b = lambda n: (rng.standard_normal(n) * 0.1).astype(np.float32)
    inits = [_init("w1", w(8, 3, 3, 3)), _init("b1", b(8)), _init("w2", w(16, 8, 3, 3)), _init("b2", b(16)),
             _init("w3", w(16, 1, 3, 3)), _init("b3", b(16)), _init("w4", w(10, 16)), _init("b4", b(10))]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], group=16),
        helper.make_node("Add", ["c3", "r2"], ["s3"]),
        helper.make_node("GlobalAveragePool", ["s3"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w4", "b4"], ["logits"], transB=1),
    ]
    g = helper.make_graph(nodes, "convnet",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "h", "w"])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])


def encoder(rng) -> onnx.ModelProto:
    """input_ids [batch, seq] int64 -> y [batch, seq, D]: one post-LN BERT layer."""
    dh = D // HEADS
    w = lambda *s: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
    b = lambda n: (rng.standard_normal(n) * 0.02).astype(np.float32)
    inits = [_init("emb", rng.standard_normal((VOCAB, D)).astype(np.float32)),
             _init("wq", w(D, D)), _init("bq", b(D)), _init("wk", w(D, D)), _init("bk", b(D)),
             _init("wv", w(D, D)), _init("bv", b(D)), _init("wo", w(D, D)), _init("bo", b(D)),
             _init("w1", w(D, FF)), _init("b1", b(FF)), _init("w2", w(FF, D)), _init("b2", b(D)),
             _init("g1", np.ones(D, np.float32)), _init("be1", np.zeros(D, np.float32)),
             _init("g2", np.ones(D, np.float32)), _init("be2", np.zeros(D, np.float32)),
             _init("heads", np.array([0, 0, HEADS, dh], np.int64)),
             _init("merge", np.array([0, 0, D], np.int64)),
             _init("scale", np.array(1.0 / np.sqrt(dh), np.float32)),
             _init("rsqrt2", np.array(0.5 ** 0.5, np.float32)), _init("one", np.array(1.0, np.float32)),
             _init("half", np.array(0.5, np.float32))]
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["h0"])]

    def linear(x, wname, bname, out):
        nodes.extend([helper.make_node("MatMul", [x, wname], [out + "_mm"]),
                      helper.make_node("Add", [out + "_mm", bname], [out])])

    for p in "qkv":
        linear("h0", f"w{p}", f"b{p}", p)
        nodes.extend([helper.make_node("Reshape", [p, "heads"], [p + "_r"]),
                      helper.make_node("Transpose", [p + "_r"], [p + "_t"],
                                       perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3])])
    nodes += [
        helper.make_node("MatMul", ["q_t", "k_t"], ["sc"]),
        helper.make_node("Mul", ["sc", "scale"], ["sc_s"]),
        helper.make_node("Softmax", ["sc_s"], ["pr"], axis=-1),
        helper.make_node("MatMul", ["pr", "v_t"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merge"], ["ctx_m"]),
    ]
    linear("ctx_m", "wo", "bo", "att")
    nodes += [helper.make_node("Add", ["att", "h0"], ["res1"]),
              helper.make_node("LayerNormalization", ["res1", "g1", "be1"], ["h1"], axis=-1)]
    linear("h1", "w1", "b1", "ff1")
    nodes += [helper.make_node("Mul", ["ff1", "rsqrt2"], ["ff1_s"]),      # GELU, as exported
              helper.make_node("Erf", ["ff1_s"], ["ff1_e"]),
              helper.make_node("Add", ["ff1_e", "one"], ["ff1_p"]),
              helper.make_node("Mul", ["ff1", "ff1_p"], ["ff1_m"]),
              helper.make_node("Mul", ["ff1_m", "half"], ["ff1_g"])]
    linear("ff1_g", "w2", "b2", "ff2")
    nodes += [helper.make_node("Add", ["ff2", "h1"], ["res2"]),
              helper.make_node("LayerNormalization", ["res2", "g2", "be2"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "encoder",
                          [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", D])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])


class _Calibration:
    """onnxruntime's CalibrationDataReader protocol: random images of a few sizes."""

    def __init__(self, rng, n=8):
        self.feeds = iter([{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(n)])

    def get_next(self):
        return next(self.feeds, None)


def _stamp(path: str) -> None:
    import onnxruntime
    m = onnx.load(path)
    helper.set_model_props(m, {"onnxruntime": onnxruntime.__version__,
                               "made_by": "scripts/make_quantized_models.py"})
    onnx.save(m, path)


def main(out_dir: str) -> int:
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_dynamic, quantize_static)
    CalibrationDataReader.register(_Calibration)
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        f_conv, f_enc = os.path.join(tmp, "convnet.onnx"), os.path.join(tmp, "encoder.onnx")
        onnx.save(convnet(rng), f_conv)
        onnx.save(encoder(rng), f_enc)
        conv_out = os.path.join(out_dir, "convnet.qdq.onnx")
        quantize_static(f_conv, conv_out, _Calibration(rng), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8)
        enc_out = os.path.join(out_dir, "bert.dynamic.onnx")
        quantize_dynamic(f_enc, enc_out, weight_type=QuantType.QInt8)
        conv_dyn = os.path.join(out_dir, "convnet.dynamic.onnx")
        quantize_dynamic(f_conv, conv_dyn, weight_type=QuantType.QInt8)
    for p in (conv_out, enc_out, conv_dyn):
        _stamp(p)
        ops = sorted({n.op_type for n in onnx.load(p).graph.node})
        print(f"{p}: {os.path.getsize(p)} bytes, ops {', '.join(ops)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "tests/quantized"))
