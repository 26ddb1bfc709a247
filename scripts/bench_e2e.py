#!/usr/bin/env python3
"""End-to-end figures of the engine on the benchmark models, with their peers, in one process.

    python examples/make_models.py --bench          # once: examples/bench/*.onnx
    python scripts/bench_e2e.py [--bert] [--gpt2] [--torch] [--json FILE]

--bert: the MiniLM-architecture BERT (6 layers, 384, 12 heads, FFN 1536) over 200 sequence
  lengths drawn from {8, 16, 24, 32, 48, 64, 96, 128} (batch 1, seed 0) through `dyncli bench`:
  default options (kernel time from a profiling pass, onnxruntime CPU on the same inputs), the
  fast path off, and the plugin's ShapePredictor (`--predictor openvino`); time by part; and
  `dyncli run`'s default trace vs no trace over the same sequence.
--gpt2: the GPT-2-small-architecture decode step, 256 tokens, KV cache fed back on the device
  (--feedback present_*:past_*): mean latency per token of a warm second pass, kernels per step,
  time by part and partial replays (`dyncli bench --feedback` with scripts/decode_shapes.py
  gives the same figure from the command line).
--torch: the same architectures in torch eager on CUDA (transformers, random weights, TF32
  off), inputs from the host and outputs back to it as ours are; skipped with a message when
  torch or CUDA is missing.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dyncli.bench import BenchOptions, bench_model  # noqa: E402
from dyncli.defaults import CLI_DEFAULT_POLICY  # noqa: E402
from engine import Network, build_program, select_device  # noqa: E402
from engine.device import describe  # noqa: E402

BERT = os.path.join(ROOT, "examples", "bench", "bert_minilm.onnx")
GPT2 = os.path.join(ROOT, "examples", "bench", "gpt2_decoder.onnx")
LENGTHS = [8, 16, 24, 32, 48, 64, 96, 128]
# traced and untraced passes over the sequence, alternating: a process's speed drifts over its first
# seconds (session 28: nine rounds, x0.96-1.07 around a median of x1.02)
TRACE_ROUNDS = 9


def bert_sequence(n=200, seed=0):
    rng = np.random.default_rng(seed)
    return [int(s) for s in rng.choice(LENGTHS, n)]


def bench_bert(device, out):
    import onnx
    seq = bert_sequence()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([{"input_ids": [1, s], "attention_mask": [1, s]} for s in seq], f)
    for key, fast, pred in (("bert_default", True, CLI_DEFAULT_POLICY), ("bert_no_fast_path", False, CLI_DEFAULT_POLICY),
                            ("bert_openvino", True, "openvino")):
        r = bench_model(BenchOptions(model=BERT, shapes_file=f.name, warmup=1, repeat=1, same_runs=10,
                                     device=device, fast_path=fast, profile=key == "bert_default",
                                     compare=["onnxruntime"] if key == "bert_default" else [],
                                     input_range=["input_ids:0..30000"], predictor=pred))
        out[key] = r
        sq = r["sequence"]
        print(f"BERT {key}: mean {sq['mean_ms']:.3f} ms median {sq['median_ms']:.3f} p90 {sq['p90_ms']:.3f}; "
              f"dynamic overhead {r['dynamic_overhead']:.2f}; host us/kernel same shape "
              f"{r['steady_host_us_per_kernel']:.1f}, first-seen {r['first_seen_host_us_per_kernel']:.1f}; kernels {sq['kernels_mean']:.0f}; replayed "
              f"{sq['replayed']}/{r['timed_inferences']}; kernel time {sq.get('device_ms_mean', float('nan')):.3f} ms; "
              f"first-seen/warm max after the model's first inference {r['first_seen_over_warm_max']:.1f} "
              f"(the model's first: {next(k for k, v in r['shapes'].items() if v['model_first'])}; "
              f"seq 96: {r['shapes']['1x96']['first_seen_ms']:.1f} / {r['shapes']['1x96']['same_shape_ms']:.2f} ms); "
              f"load {r['load_ms']:.0f} ms compile {r['compile_ms']:.0f} ms; partial {sq.get('partial')}; "
              f"time by part (mean) {({k: round(v, 3) for k, v in sq.get('time_ms', {}).items()})}; "
              f"first-seen 96 by part {r['shapes']['1x96'].get('first_seen_time_ms')}", flush=True)
        if "peers" in r:
            print(f"  onnxruntime CPU mean {r['peers']['onnxruntime']['mean_ms']:.3f} ms", flush=True)
    # the trace's cost: the same sequence with the trace `dyncli run` writes, and without
    from traces import TraceWriter
    from traces.writer import ENCODER
    prog = build_program(onnx.load(BERT), BERT)
    rng = np.random.default_rng(0)
    feeds = [{"input_ids": rng.integers(0, 30000, (1, s)), "attention_mask": np.ones((1, s), np.int64)}
             for s in seq]
    tpath = os.path.join(tempfile.gettempdir(), "bert.trace.jsonl")
    trace = TraceWriter(tpath, {"model": BERT})
    nets = {traced: Network(prog, select_device(device), trace=trace if traced else None,
                            predictor=CLI_DEFAULT_POLICY) for traced in (True, False)}
    for net in nets.values():                       # warm
        for f in feeds:
            net.infer(f)
    # alternating rounds (a pass run first or second alone would carry the order's effects)
    rounds = {True: [], False: []}
    for _ in range(TRACE_ROUNDS):
        for traced, net in nets.items():
            ms = []
            for f in feeds:
                t0 = time.perf_counter()
                net.infer(f)
                ms.append((time.perf_counter() - t0) * 1e3)
            rounds[traced].append(statistics.mean(ms))
    trace.close()
    out["trace_bytes"] = os.path.getsize(tpath)
    lat = {k: statistics.median(v) for k, v in rounds.items()}
    out["run_traced_ms"], out["run_untraced_ms"] = lat[True], lat[False]
    ratios = sorted(t / u for t, u in zip(rounds[True], rounds[False]))
    print(f"traced vs untraced mean latency, median of {TRACE_ROUNDS} alternating rounds: {lat[True]:.3f} vs "
          f"{lat[False]:.3f} ms (x{lat[True] / lat[False]:.2f}, rounds x{ratios[0]:.2f}-x{ratios[-1]:.2f}); "
          f"trace {out['trace_bytes'] / 1e6:.1f} MB for {(TRACE_ROUNDS + 1) * len(seq)} inferences, written with "
          f"{ENCODER}{'' if ENCODER == 'orjson' else ' (orjson, a dependency, is missing: 3x the cost)'}",
          flush=True)


def gpt2_feeds(prog, past=0):
    import onnx  # noqa: F401
    f = {"input_ids": np.array([[1]], np.int64)}
    if "attention_mask" in prog.inputs:     # exported decoders take it ([1, past + 1])
        f["attention_mask"] = np.ones((1, past + 1), np.int64)
    for name, l in prog.inputs.items():
        if name.startswith("past_"):
            f[name] = np.zeros((1, l.shape[1], past, l.shape[3]), np.float32)
    return f


def bench_gpt2(device, out, tokens=256):
    import onnx
    prog = build_program(onnx.load(GPT2), GPT2)
    fb = {n.replace("past_", "present_"): n for n in prog.inputs if n.startswith("past_")}
    net = Network(prog, device, feedback=fb, predictor=CLI_DEFAULT_POLICY)
    res = {}
    for p in ("cold", "warm"):
        lat, kernels, parts, counters = [], [], [], []
        fed = {}
        for t in range(tokens):
            feeds = gpt2_feeds(prog) if t == 0 else {"input_ids": np.array([[t % 50000]], np.int64)}
            if t and "attention_mask" in prog.inputs:
                feeds["attention_mask"] = np.ones((1, t + 1), np.int64)
            t0 = time.perf_counter()
            net.infer(feeds, fed_back={} if t == 0 else {v: k for k, v in fb.items()}, outputs=["logits"])
            lat.append((time.perf_counter() - t0) * 1e3)
            kernels.append(net.counters["kernels"])
            parts.append(getattr(net, "time_ms", {}))
            counters.append(dict(net.counters))
        res[p] = {"mean_ms": statistics.mean(lat[1:]), "median_ms": statistics.median(lat[1:]),
                  "kernels": statistics.mean(kernels[1:]),
                  "time_ms": {k: round(statistics.mean(x.get(k, 0) for x in parts[1:]), 3)
                              for k in parts[-1]},
                  "partial_replays": sum(x.get("plan.partial", 0) for x in counters)}
    out["gpt2"] = res
    print(f"GPT-2 decode {tokens} tokens: warm mean {res['warm']['mean_ms']:.3f} ms/token "
          f"(median {res['warm']['median_ms']:.3f}), {res['warm']['kernels']:.0f} kernels/step; "
          f"cold pass {res['cold']['mean_ms']:.3f}; warm time by part {res['warm']['time_ms']}, partial replays {res['warm']['partial_replays']}", flush=True)


def torch_peers(out, tokens=256):
    try:
        import torch
        from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        print(f"torch peers skipped: {e}")
        return
    if not torch.cuda.is_available():
        print("torch peers skipped: no CUDA")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    with torch.no_grad():
        bert = BertModel(BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                    intermediate_size=1536)).to(dev).eval()
        seq = bert_sequence()
        rng = np.random.default_rng(0)
        feeds = [(rng.integers(0, 30000, (1, s)), np.ones((1, s), np.int64)) for s in seq]

        def run_bert(ids, mask):
            o = bert(input_ids=torch.from_numpy(ids).to(dev), attention_mask=torch.from_numpy(mask).to(dev))
            return o.last_hidden_state.cpu()
        for f in feeds:
            run_bert(*f)
        lat = []
        for f in feeds:
            t0 = time.perf_counter()
            run_bert(*f)
            lat.append((time.perf_counter() - t0) * 1e3)
        out["torch_bert_mean_ms"] = statistics.mean(lat)
        print(f"torch eager CUDA BERT sequence: mean {statistics.mean(lat):.3f} ms", flush=True)

        gpt = GPT2LMHeadModel(GPT2Config()).to(dev).eval()
        for p in range(2):
            past, lat = None, []
            for t in range(tokens):
                ids = torch.tensor([[t % 50000]]).to(dev)
                t0 = time.perf_counter()
                o = gpt(input_ids=ids, past_key_values=past, use_cache=True)
                past = o.past_key_values
                o.logits.cpu()
                lat.append((time.perf_counter() - t0) * 1e3)
        out["torch_gpt2_ms_per_token"] = statistics.mean(lat[1:])
        print(f"torch eager CUDA GPT-2 decode: {statistics.mean(lat[1:]):.3f} ms/token", flush=True)


def host_profile(device):
    import cProfile
    import pstats
    import onnx
    net = Network(build_program(onnx.load(BERT), BERT), device)
    rng = np.random.default_rng(0)
    feeds = [{"input_ids": rng.integers(0, 30000, (1, s)), "attention_mask": np.ones((1, s), np.int64)}
             for s in bert_sequence(40)]
    for f in feeds:
        net.infer(f)
    pr = cProfile.Profile()
    pr.enable()
    for f in feeds:
        net.infer(f)
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    # a shape never seen before (kernels all built): where its first-seen time goes
    f = {"input_ids": rng.integers(0, 30000, (1, 80)), "attention_mask": np.ones((1, 80), np.int64)}
    pr = cProfile.Profile()
    pr.enable()
    t0 = time.perf_counter()
    net.infer(f)
    pr.disable()
    print(f"first-seen seq 80: {(time.perf_counter() - t0) * 1e3:.1f} ms")
    pstats.Stats(pr).sort_stats("tottime").print_stats(15)


def decode_profile(device, steps=64):
    """Where a decode step's time goes: host vs blocked per step, kernel time (profiling
    network), and a cProfile of the host work."""
    import cProfile
    import pstats
    import onnx
    prog = build_program(onnx.load(GPT2), GPT2)
    fb = {n.replace("past_", "present_"): n for n in prog.inputs if n.startswith("past_")}
    back = {v: k for k, v in fb.items()}
    for profile in (False, True):
        net = Network(prog, device, feedback=fb, profile=profile)
        net.infer(gpt2_feeds(prog), outputs=["logits"])
        for t in range(steps):
            net.infer({"input_ids": np.array([[t]], np.int64)}, fed_back=back, outputs=["logits"])
        lat, blocked, dev = [], [], []
        pr = cProfile.Profile()
        for t in range(steps):
            if not profile and t == steps // 2:
                pr.enable()
            t0 = time.perf_counter()
            net.infer({"input_ids": np.array([[t]], np.int64)}, fed_back=back, outputs=["logits"])
            lat.append((time.perf_counter() - t0) * 1e3)
            blocked.append(net.blocked_s * 1e3)
            if profile:
                dev.append(net.device_ms())
        pr.disable()
        if profile:
            print(f"decode, profiling queue: kernel time {statistics.median(dev):.3f} ms/step", flush=True)
        else:
            print(f"decode: {statistics.median(lat):.3f} ms/step, blocked {statistics.median(blocked):.3f} ms, "
                  f"kernels {net.counters['kernels']}", flush=True)
            pstats.Stats(pr).sort_stats("tottime").print_stats(22)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bert", action="store_true")
    ap.add_argument("--gpt2", action="store_true")
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--host-profile", action="store_true",
                    help="cProfile of the flow's host work over 40 BERT inferences of changing shapes")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--device")
    ap.add_argument("--json")
    ap.add_argument("--bert-model", help="another BERT-style ONNX file (input_ids, attention_mask), "
                    "e.g. a transformers export from scripts/export_models.py --size bench")
    ap.add_argument("--gpt2-model", help="another GPT-2 decode-step ONNX file (past_*/present_* KV "
                    "inputs/outputs, optional attention_mask)")
    a = ap.parse_args()
    global BERT, GPT2
    BERT, GPT2 = a.bert_model or BERT, a.gpt2_model or GPT2
    dev = select_device(a.device)
    out = {"device": describe(dev)}
    print(f"device: {out['device']}", flush=True)
    if a.bert:
        bench_bert(a.device, out)
    if a.gpt2:
        bench_gpt2(dev, out, a.tokens)
    if a.torch:
        torch_peers(out, a.tokens)
    if a.host_profile:
        if a.gpt2:
            decode_profile(dev)
        else:
            host_profile(dev)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
