"""Correctness against onnxruntime over shape sequences with growth, shrink, repeats and a
zero-size dim, on the generated models (MLP, encoder block, CNN, KV-cache decoder step)."""
import numpy as np
import pytest

from tests.conftest import run_vs_ort
from tests.models import encoder_block, kv_decoder_step, mlp, small_cnn


def test_mlp_dynamic_batch(device):
    rng = np.random.default_rng(1)
    seq = [{"x": rng.standard_normal((b, 32)).astype(np.float32)} for b in (1, 4, 4, 9, 2, 0, 9, 1)]
    net = run_vs_ort(mlp(), seq, device)
    # the repeated batch (4 then 4) re-inferred nothing and allocated nothing
    assert net.iter == len(seq) - 1


@pytest.mark.parametrize("variant", ["float", "ids"])
def test_encoder_block_batch_and_seq(device, variant):
    rng = np.random.default_rng(2)
    shapes = [(1, 8), (1, 8), (2, 16), (2, 5), (1, 0), (3, 12), (2, 5)]
    if variant == "float":
        model = encoder_block()
        seq = [{"x": rng.standard_normal((b, s, 64)).astype(np.float32),
                "mask": (rng.random((b, s)) > 0.2).astype(np.float32)} for b, s in shapes]
    else:
        model = encoder_block(vocab=100)
        seq = [{"input_ids": rng.integers(0, 100, (b, s)).astype(np.int64),
                "attention_mask": (rng.random((b, s)) > 0.2).astype(np.int64)} for b, s in shapes]
    run_vs_ort(model, seq, device, rtol=2e-4, atol=2e-5)


def test_encoder_block_opset13_decomposed_layernorm(device):
    rng = np.random.default_rng(3)
    seq = [{"x": rng.standard_normal((b, s, 64)).astype(np.float32),
            "mask": np.ones((b, s), np.float32)} for b, s in [(2, 4), (1, 9), (2, 4)]]
    run_vs_ort(encoder_block(opset=13), seq, device, rtol=2e-4, atol=2e-5)


def test_small_cnn_batch_and_spatial(device):
    rng = np.random.default_rng(4)
    shapes = [(1, 16, 16), (2, 16, 16), (2, 16, 16), (1, 33, 20), (3, 8, 8), (0, 8, 8), (1, 16, 16)]
    seq = [{"x": rng.standard_normal((b, 3, h, w)).astype(np.float32)} for b, h, w in shapes]
    run_vs_ort(small_cnn(), seq, device, rtol=2e-4, atol=2e-5)


def test_kv_decoder_grows_from_empty_cache(device):
    rng = np.random.default_rng(5)
    seq = []
    for past, new in [(0, 4), (4, 1), (5, 1), (6, 1), (0, 3), (3, 2)]:
        seq.append({"x": rng.standard_normal((1, new, 32)).astype(np.float32),
                    "past_k": rng.standard_normal((1, 2, past, 16)).astype(np.float32),
                    "past_v": rng.standard_normal((1, 2, past, 16)).astype(np.float32)})
    run_vs_ort(kv_decoder_step(), seq, device, rtol=2e-4, atol=2e-5)


def test_zero_size_skips_execution_and_shrink_allocates_nothing(device):
    from engine import Network, build_program
    # dynamic impls only: a background static build could land mid-test (and reorder weights)
    net = Network(build_program(mlp()), device, impls="dynamic")
    rng = np.random.default_rng(6)
    net.infer({"x": rng.standard_normal((8, 32)).astype(np.float32)})
    first = dict(net.counters)
    assert first["realloc.alloc"] > 0 and first["update_impl.build"] > 0
    net.infer({"x": rng.standard_normal((3, 32)).astype(np.float32)})  # shrink: reuse only
    assert net.counters.get("realloc.alloc", 0) == 0 and net.counters["realloc.reuse"] > 0
    assert net.counters.get("update_impl.build", 0) == 0  # shape-agnostic impls serve the new shape
    out = net.infer({"x": np.zeros((0, 32), np.float32)})
    assert out["y"].shape == (0, 10)
    assert net.counters["execute.skip.empty_output"] == net.counters["execute.skip"] > 0
    assert net.counters.get("kernels", 0) == 0
    net.infer({"x": rng.standard_normal((3, 32)).astype(np.float32)})
    assert net.counters.get("update_shape.infer", 0) > 0 and net.counters.get("realloc.alloc", 0) == 0
