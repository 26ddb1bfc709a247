"""Write the example models used by dyncli demos.

    python examples/make_models.py

examples/encoder.onnx: tiny BERT-like encoder layer
    inputs  input_ids int64[batch, seq], attention_mask int64[batch, seq]
    output  y float[batch, seq, 64]
examples/cnn.onnx: small CNN
    input   x float[batch, 3, height, width]  (height, width >= 8)
    output  y float[batch, 10]
examples/decoder.onnx: one attention step over a KV cache (a decode loop with --feedback)
    inputs  x float[batch, new, 32], past_k, past_v float[batch, 2, past, 16]
    outputs y float[batch, new, 32], present_k, present_v float[batch, 2, past + new, 16]

    python examples/make_models.py --bench

examples/bench/bert_minilm.onnx (90 MB) and examples/bench/gpt2_decoder.onnx (650 MB), the
benchmark models of `dyncli bench` (not in git; tests/models.py bert_encoder, gpt2_decoder).
"""
import os
import sys

import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # repo root, so tests.models imports

from tests.models import bert_encoder, encoder_block, gpt2_decoder, kv_decoder_step, small_cnn  # noqa: E402


def main():
    if "--bench" in sys.argv[1:]:
        os.makedirs(os.path.join(HERE, "bench"), exist_ok=True)
        models = {"bench/bert_minilm.onnx": bert_encoder, "bench/gpt2_decoder.onnx": gpt2_decoder}
    else:
        models = {"encoder.onnx": lambda: encoder_block(vocab=1000, d_model=64, heads=4, ff=128),
                  "cnn.onnx": small_cnn, "decoder.onnx": kv_decoder_step}
    for name, make in models.items():
        model = make()
        path = os.path.join(HERE, name)
        onnx.save(model, path)
        print(f"wrote {path} ({os.path.getsize(path) / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
