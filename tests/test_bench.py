"""`dyncli bench` end to end on the example encoder (figures are not asserted: they belong to
benchmarks; what is checked is that every figure is there and consistent), its kernel
micro-benchmarks, its errors, and the parallel prebuild it relies on for cold starts."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from typer.testing import CliRunner

from dyncli.cli import app
from engine import Network, build_program
from tests.models import encoder_block
from traces import MemoryTrace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENCODER = os.path.join(ROOT, "examples", "encoder.onnx")
runner = CliRunner()


def _json(out: str) -> dict:
    """The JSON document of the output (stderr lines, e.g. compiler notes, may follow it)."""
    return json.JSONDecoder().raw_decode(out[out.index("{"):])[0]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_bench_model_json():
    r = invoke("bench", ENCODER, "--shapes", "input_ids:1x{8..16..8},attention_mask:1x{8..16..8}",
               "--shapes", "input_ids:1x8,attention_mask:1x8*2", "--warmup", "0", "--repeat", "2",
               "--same-runs", "3", "--compare", "onnxruntime", "--json")
    assert r.exit_code == 0, r.output
    res = _json(r.output)
    assert res["sequence_length"] == 4 and res["timed_inferences"] == 8
    assert set(res["shapes"]) == {"1x8", "1x16"}
    assert res["shapes"]["1x8"]["inferences"] == 6
    # transitions seen in an earlier pass may be replayed: counted per shape and in total
    assert res["sequence"]["replayed"] == sum(v["replayed"] for v in res["shapes"].values()) <= 8
    assert res["dynamic_overhead"] > 0 and res["steady_host_us_per_kernel"] > 0
    # the host's part of 1x16's first inference per kernel (1x8's is the model's first)
    s16 = res["shapes"]["1x16"]
    assert res["first_seen_host_us_per_kernel"] == s16["first_seen_host_us_per_kernel"] > 0
    # both over the launch floor measured on the same queue
    floor = res["launch_floor_us"]
    assert 0 < floor < 1000
    assert res["first_seen_host_over_floor"] == pytest.approx(res["first_seen_host_us_per_kernel"] / floor)
    assert res["steady_host_over_floor"] == pytest.approx(res["steady_host_us_per_kernel"] / floor)
    assert res["peers"]["onnxruntime"]["shapes"]["1x16"]["ratio"] > 0
    assert all(v["kernels"] > 0 and v["first_seen_ms"] > 0 for v in res["shapes"].values())
    # the sequence starts at 1x8: that shape's first time is the model's first inference, and
    # the worst first-seen figure is 1x16's
    assert [k for k, v in res["shapes"].items() if v["model_first"]] == ["1x8"]
    assert res["first_seen_over_warm_max"] == res["shapes"]["1x16"]["first_seen_over_warm"]
    # the encoder's nodes answer 1x16 from functions traced at its first inference
    sf = res["shape_functions"]
    assert sf["traced"] > 0 and sf["answers"] > 0 and sf["escapes"] == {}


def test_bench_table_puts_the_host_time_per_kernel_next_to_the_launch_floor():
    r = invoke("bench", ENCODER, "--shapes", "input_ids:1x{8..16..8},attention_mask:1x{8..16..8}",
               "--warmup", "0", "--repeat", "1", "--same-runs", "2")
    assert r.exit_code == 0, r.output
    assert "launch floor: host us per launch" in r.output
    assert "host us per kernel, same shape" in r.output and "x the floor)" in r.output


def test_bench_compiled_plans_json():
    """With --compiled-plans all (the default), lengths that fit the buffers of the first (41)
    run from the plan traced at 40: the summary says how many were traced and served (--impls
    dynamic: on a CPU the MatMuls' static builds would run the flow). `partial` turns whole
    plans off; a mode that is not one is refused in words."""
    shapes = [a for n in (41, 40, 39, 38, 37, 36)
              for a in ("--shapes", f"input_ids:1x{n},attention_mask:1x{n}")]
    r = invoke("bench", ENCODER, *shapes, "--warmup", "0", "--repeat", "1", "--same-runs", "2",
               "--impls", "dynamic", "--json")
    assert r.exit_code == 0, r.output
    cp = _json(r.output)["compiled_plans"]["whole"]
    assert cp["built"] >= 1 and cp["runs"] >= 3, cp
    r = invoke("bench", ENCODER, *shapes[:6], "--warmup", "0", "--repeat", "1", "--same-runs", "2",
               "--impls", "dynamic", "--compiled-plans", "partial", "--json")
    assert _json(r.output)["compiled_plans"]["whole"] is None
    r = invoke("bench", ENCODER, *shapes[:2], "--compiled-plans", "yes")
    assert r.exit_code == 2 and "--compiled-plans must be one of off, partial, all" in r.output


def test_bench_kernels_json():
    r = invoke("bench", "--kernel", "gemm:17x33x9", "--kernel", "eltwise:1000", "--repeat", "5", "--json")
    assert r.exit_code == 0, r.output
    res = _json(r.output)
    gemm, elt = res["kernels"]
    assert gemm["unit"] == "TFLOP/s" and elt["unit"] == "GB/s"
    for k in (gemm, elt):
        for impl in ("dynamic", "static"):
            assert k[impl]["us"] > 0 and k[impl][k["unit"]] > 0 and k[impl]["kernels"] >= 1
    assert "GB/s" not in gemm["dynamic"]        # 17 rows: not a GEMV


def test_bench_kernels_gemv_bandwidth():
    """A GEMV (<= 4 rows) reports its weight bandwidth next to TFLOP/s: 4 K N bytes over the
    kernel time, in the JSON and the table."""
    r = invoke("bench", "--kernel", "gemm:3x40x24", "--repeat", "5", "--json")
    assert r.exit_code == 0, r.output
    d = _json(r.output)["kernels"][0]["dynamic"]
    assert d["GB/s"] == pytest.approx(4 * 40 * 24 / (d["us"] * 1e-6) * 1e-9)
    assert d["TFLOP/s"] == pytest.approx(2 * 3 * 40 * 24 / (d["us"] * 1e-6) * 1e-12)
    r = invoke("bench", "--kernel", "gemm:3x40x24", "--repeat", "5")
    assert r.exit_code == 0 and "GB/s" in r.output and "TFLOP/s" in r.output, r.output


@pytest.mark.parametrize("args,msg", [
    ((), "give a MODEL"),
    (("--kernel", "gemm:1x2"), "gemm takes 3 positive dims"),
    (("--kernel", "conv2d:3"), "expected one of gemm, eltwise"),
    ((ENCODER, "--kernel", "eltwise:8"), "not both"),
    ((ENCODER, "--shapes", "input_ids:1x8,attention_mask:1x8", "--repeat", "0"), "--repeat must be"),
    ((ENCODER, "--shapes", "input_ids:1x8,attention_mask:1x8", "--compare", "tvm"), "unknown peer"),
])
def test_bench_errors_are_one_line(args, msg):
    r = invoke("bench", *args)
    assert r.exit_code == 2
    assert msg in r.output and "Traceback" not in r.output


def test_prebuild_keeps_the_decisions(device):
    """The first inference's impls built in parallel ahead of the flow: the same builds are
    recorded (marked prebuilt, out of the critical path) and the outputs are the same."""
    model = encoder_block(vocab=1000, d_model=32, heads=2, ff=64)
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 1000, (1, 12)), "attention_mask": np.ones((1, 12), np.int64)}
    runs = {}
    for workers in (1, 4):
        tr = MemoryTrace()
        net = Network(build_program(model), device, trace=tr, impls="dynamic", prebuild_workers=workers)
        out = net.infer(feeds)["y"]
        builds = [(e["node"], e["impl"]) for e in tr.events if e["kind"] == "update_impl" and e["action"] == "build"]
        runs[workers] = (out, builds, [e.get("prebuilt", False) for e in tr.events
                                       if e["kind"] == "update_impl" and e["action"] == "build"],
                         net.counters.get("compile_ms_critical", 0))
    assert np.array_equal(runs[1][0], runs[4][0])
    assert runs[1][1] == runs[4][1] and len(runs[1][1]) > 2
    assert not any(runs[1][2]) and all(runs[4][2])
    assert runs[4][3] == 0


def test_new_signatures_stop_being_walked_once_walks_find_nothing(device):
    """Prebuild walks a new signature's shape inference to start its builds; once two walks in
    a row found every kernel built, later signatures are not walked (time_ms.prebuild is 0),
    and outputs stay those of the flow."""
    model = encoder_block(vocab=1000, d_model=32, heads=2, ff=64)
    rng = np.random.default_rng(0)
    net = Network(build_program(model), device, impls="dynamic", prebuild_workers=4)
    walked = []
    for s in (8, 12, 16, 20, 24):
        feeds = {"input_ids": rng.integers(0, 1000, (1, s)), "attention_mask": np.ones((1, s), np.int64)}
        net.infer(feeds)
        walked.append(net.time_ms["prebuild"] > 0)
    assert walked == [True, True, True, False, False]


DECODER = os.path.join(ROOT, "examples", "decoder.onnx")


def test_bench_decode_loop_json():
    """--feedback times the sequence as one decode: the steps after the first are served by
    partial replays, most of them compiled (the KV length a parameter: the default), the KV
    cache appends (no copies in the timed passes once it has room), and every step says where
    its time went."""
    r = invoke("bench", DECODER, "--shapes", "x:1x4x32,past_k:1x2x0x16,past_v:1x2x0x16",
               "--shapes", "x:1x1x32,past_k:1x2x0x16,past_v:1x2x0x16*12",
               "--feedback", "present_k:past_k,present_v:past_v", "--warmup", "1", "--repeat", "2",
               "--compare", "onnxruntime", "--json")
    assert r.exit_code == 0, r.output
    res = _json(r.output)
    assert res["mode"] == "decode" and res["steps"] == 13
    d = res["decode"]
    assert d["steps"] == 24 and d["kernels_mean"] > 0 and d["partial"] >= 20 and d["compiled"] >= 12
    cp = res["compiled_plans"]
    # (whole plans do not serve a decode that feeds buffers back)
    assert cp["mode"] == "all" and cp["partial"]["built"] >= 1 and cp["whole"] is None
    assert set(d["time_ms"]) >= {"flow", "enqueue", "device_wait"} and d["host_us_per_kernel"] > 0
    assert 0 < res["launch_floor_us"] < 1000     # (each step a new signature, beside the floor)
    assert res["peers"]["onnxruntime"]["mean_ms"] > 0
    rep = res["repeated"]         # the last step alone, repeated: its shape, its inputs
    assert rep["runs"] >= 2 and rep["mean_ms"] > 0 and rep["median_ms"] > 0


def test_bench_decode_needs_a_decode():
    r = invoke("bench", DECODER, "--shapes", "x:1x4x32,past_k:1x2x0x16,past_v:1x2x0x16",
               "--feedback", "present_k:past_k,present_v:past_v")
    assert r.exit_code == 2 and "at least two inferences" in r.output
