#!/usr/bin/env python3
"""Golden traces: the runtime's decisions and outputs over fixed shape sequences, recorded in
one tree and compared with another, so that a change of structure is shown to change no
behaviour (every decision event with its reason and fields, every counter, outputs
bit-identical on the same device).

    python scripts/golden.py record DIR [--quick] [--root TREE]
    python scripts/golden.py compare DIR_A DIR_B
    python scripts/golden.py check --ref GITREF [--quick]   # record GITREF (a worktree) and this tree, compare

Cases: the example models, small generated models (tests/models.py: encoder with fused
attention, KV-cache decode with feedback, CNN, masked attention, float16 variants), the
exporter fixtures in tests/exported (decoders with their presents fed back) and two light CNNs
of the onnx wheel over batch and resolution sequences; each with the fast path on and off, with
shape-agnostic impls and (the small ones) with static impls built in the critical path (a
background build finishes when it finishes: its decisions are not reproducible). Timings
(`ts`, fields ending in `_ms` or `_s`) are left out; everything else must match.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def _timing(key: str) -> bool:
    return key == "ts" or "_ms" in key or key.endswith("_s")


def _clean(v):
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in sorted(v.items()) if not _timing(k)}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


# ---- the cases ----------------------------------------------------------------------------
def _token_feeds(lengths, batch=1, seed=0, vocab=1000):
    rng = np.random.default_rng(seed)
    out = []
    for b, s in ((batch, s) if isinstance(s, int) else s for s in lengths):
        mask = np.ones((b, s), np.int64)
        for r in range(1, b):
            mask[r, s - min(s - 1, 2 * r):] = 0
        out.append({"input_ids": rng.integers(0, vocab, (b, s)).astype(np.int64), "attention_mask": mask})
    return out


SEQ = [8, 8, 8, 16, 16, 8, 8, 24, 24, 24, 16, 16, 16, 16, (2, 16), (2, 16), 32, 8]


def _image_feeds(name, shapes, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [{name: rng.standard_normal(s).astype(dtype)} for s in shapes]


def _decode_steps(model, seed=0):
    """(feeds, fed_back) per step: a prompt, decode steps fed back, a new batch-2 prompt."""
    import onnx
    rng = np.random.default_rng(seed)
    past = [i for i in model.graph.input if i.name.startswith("past_")]
    dims = past[0].type.tensor_type.shape.dim
    heads, d_head = dims[1].dim_value, dims[3].dim_value
    dt = onnx.helper.tensor_dtype_to_np_dtype(past[0].type.tensor_type.elem_type)
    feedback = {i.name.replace("past_", "present_"): i.name for i in past}
    steps, n = [], 0
    for b, new, cont in [(1, 4, False)] + [(1, 1, True)] * 5 + [(2, 3, False)] + [(2, 1, True)] * 3:
        n = n if cont else 0
        mask = np.ones((b, n + new), np.int64)
        mask[1:, 0] = 0
        feeds = {"input_ids": rng.integers(0, 100, (b, new)).astype(np.int64), "attention_mask": mask}
        if not cont:
            feeds.update({i.name: np.zeros((b, heads, 0, d_head), dt) for i in past})
        steps.append((feeds, {inp: out for out, inp in feedback.items()} if cont else None))
        n += new
    return feedback, steps


def cases(quick: bool):
    """name -> (model loader, steps loader, feedback, variants)"""
    import onnx
    from tests import models as M
    root = os.path.dirname(HERE)
    dyn_static = ({"impls": "dynamic"}, {"impls": "auto", "async_compile": False})
    dyn = ({"impls": "dynamic"},)
    out = {}

    def add(name, model_fn, feeds_fn, variants, feedback=None):
        out[name] = (model_fn, feeds_fn, feedback, variants)

    add("example_encoder", lambda: onnx.load(os.path.join(root, "examples", "encoder.onnx")),
        lambda m: [(f, None) for f in _token_feeds([8, 16, 24, 32, (2, 16), (2, 16), 8, 8, 8], vocab=100)], dyn)
    add("example_cnn", lambda: onnx.load(os.path.join(root, "examples", "cnn.onnx")),
        lambda m: [(f, None) for f in _image_feeds(m.graph.input[0].name, [
            (1, 3, 32, 32), (1, 3, 32, 32), (2, 3, 32, 32), (1, 3, 48, 40), (1, 3, 32, 32), (1, 3, 32, 32)])],
        dyn_static)
    add("encoder_block", lambda: M.encoder_block(vocab=1000, d_model=32, heads=2, ff=64),
        lambda m: [(f, None) for f in _token_feeds(SEQ)], dyn_static)
    add("mlp", lambda: M.mlp(), lambda m: [(f, None) for f in _image_feeds("x", [(3, 32)] * 4 + [(5, 32), (3, 32)])],
        dyn_static)
    add("small_cnn", lambda: M.small_cnn(), lambda m: [(f, None) for f in _image_feeds(
        m.graph.input[0].name, [(1, 3, 16, 16), (1, 3, 16, 16), (2, 3, 16, 16), (1, 3, 24, 20), (1, 3, 16, 16)])],
        dyn_static)
    add("bert_sdpa", lambda: M.bert_sdpa_encoder(), lambda m: [(f, None) for f in _token_feeds(SEQ, vocab=100)], dyn)
    add("bert_sdpa_f16", lambda: M.to_float16(M.bert_sdpa_encoder()),
        lambda m: [(f, None) for f in _token_feeds(SEQ[:8], vocab=100)], dyn)
    for name, fn in (("gpt2_step", M.gpt2_decoder_step), ("gpt2_step_f16", lambda: M.to_float16(M.gpt2_decoder_step()))):
        add(name, fn, lambda m: _decode_steps(m)[1], dyn, feedback=lambda m: _decode_steps(m)[0])
    add("kv_decoder_step", M.kv_decoder_step, lambda m: _kv_steps(m), dyn, feedback=lambda m: _kv_feedback(m))
    if quick:
        return out
    for path in sorted(glob.glob(os.path.join(root, "tests", "exported", "*.onnx"))):
        base = os.path.basename(path)[:-5]
        model = onnx.load(path, load_external_data=False)
        names = [i.name for i in model.graph.input]
        load = (lambda p: lambda: onnx.load(p))(path)
        dt = onnx.helper.tensor_dtype_to_np_dtype(model.graph.input[0].type.tensor_type.elem_type)
        if any(n.startswith("past_") for n in names):
            add(base, load, lambda m: _decode_steps(m)[1], dyn, feedback=lambda m: _decode_steps(m)[0])
        elif names == ["pixel_values"]:
            add(base, load, (lambda d: lambda m: [(f, None) for f in _image_feeds(
                "pixel_values", [(b, 3, 32, 32) for b in (1, 2, 2, 3, 1)], d)])(dt), dyn)
        elif names == ["x"]:
            add(base, load, (lambda d: lambda m: [(f, None) for f in _image_feeds(
                "x", [(1, 3, 24, 20), (2, 3, 24, 20), (2, 3, 24, 20), (1, 3, 17, 31), (1, 3, 24, 20)], d)])(dt), dyn)
        else:
            add(base, load, lambda m: [(f, None) for f in _token_feeds(
                [(1, 8), (1, 8), (2, 16), (3, 12), (1, 5), (2, 24), (1, 8)], vocab=100)], dyn)
    for name, shapes in (("squeezenet", [(1, 3, 64, 64), (2, 3, 64, 64), (2, 3, 64, 64), (1, 3, 96, 80), (1, 3, 64, 64)]),
                         ("densenet121", [(1, 3, 64, 64), (2, 3, 64, 64), (1, 3, 96, 96), (2, 3, 64, 64)])):
        add(f"light_{name}", (lambda n: lambda: M.make_input_dynamic(M.randomize_weights(
            onnx.load(M.light_model_paths()[n]), seed=2)))(name),
            (lambda s: lambda m: [(f, None) for f in _image_feeds(M.real_inputs(m)[0], s)])(shapes), dyn)
    return out


def _kv_feedback(model):
    outs = [o.name for o in model.graph.output]
    ins = [i.name for i in model.graph.input]
    pairs = {o: o.replace("present", "past") for o in outs if o.replace("present", "past") in ins}
    return pairs


def _kv_steps(model):
    rng = np.random.default_rng(0)
    fb = _kv_feedback(model)
    past = {i.name: i for i in model.graph.input if i.name in fb.values()}
    x = next(i for i in model.graph.input if i.name not in past)
    d = [dd.dim_value for dd in x.type.tensor_type.shape.dim]
    steps = []
    for k in range(8):
        new = 4 if k == 0 else 1
        shape = [1 if not v and j == 0 else new if not v else v for j, v in enumerate(d)]
        feeds = {x.name: rng.standard_normal(shape).astype(np.float32)}
        if k == 0:
            for n, vi in past.items():
                pd = [dd.dim_value for dd in vi.type.tensor_type.shape.dim]
                feeds[n] = np.zeros([1 if j == 0 else (0 if not v else v) for j, v in enumerate(pd)], np.float32)
        steps.append((feeds, {inp: out for out, inp in fb.items()} if k else None))
    return steps


# ---- record / compare ---------------------------------------------------------------------
def run_case(model, steps, feedback, variant, fast, device):
    from engine import Network, build_program
    from traces import MemoryTrace
    trace = MemoryTrace()
    net = Network(build_program(model), device, trace=trace, fast_path=fast, feedback=feedback, **variant)
    outputs, records = [], []
    for k, (feeds, fed_back) in enumerate(steps):
        outs = net.infer(feeds, fed_back=fed_back) if fed_back else net.infer(feeds)
        outputs.append({n: np.array(v) for n, v in outs.items()})
    for e in trace.events:
        records.append(_clean(e))
    return outputs, records


def record(out_dir: str, quick: bool, only: str | None) -> None:
    sys.path.insert(0, os.getcwd())
    from engine import select_device
    device = select_device()
    os.makedirs(out_dir, exist_ok=True)
    for name, (model_fn, steps_fn, fb_fn, variants) in cases(quick).items():
        if only and only not in name:
            continue
        model = model_fn()
        steps = steps_fn(model)
        feedback = fb_fn(model) if fb_fn else None
        for v in variants:
            for fast in (True, False):
                tag = f"{name}.{v['impls']}{'' if v.get('async_compile', True) else '-sync'}.{'fast' if fast else 'flow'}"
                try:
                    outputs, events = run_case(model, steps, feedback, v, fast, device)
                    err = None
                except Exception as e:   # recorded: a failure must fail the same way
                    outputs, events, err = [], [], f"{type(e).__name__}: {e}"
                np.savez(os.path.join(out_dir, tag + ".npz"),
                         **{f"{k}/{n}": a for k, o in enumerate(outputs) for n, a in o.items()})
                with open(os.path.join(out_dir, tag + ".json"), "w") as f:
                    json.dump({"events": events, "error": err}, f, default=str)
                print(f"recorded {tag}: {len(events)} events{' ERROR ' + err if err else ''}", flush=True)


def compare(a: str, b: str) -> int:
    bad = 0
    names = sorted(f[:-5] for f in os.listdir(a) if f.endswith(".json"))
    missing = [n for n in names if not os.path.exists(os.path.join(b, n + ".json"))]
    for n in missing:
        print(f"MISSING {n} in {b}")
    for n in names:
        if n in missing:
            continue
        ja, jb = (json.load(open(os.path.join(d, n + ".json"))) for d in (a, b))
        why = []
        if ja["error"] != jb["error"]:
            why.append(f"error {ja['error']!r} != {jb['error']!r}")
        ea, eb = ja["events"], jb["events"]
        for k, (x, y) in enumerate(zip(ea, eb)):
            if x != y:
                why.append(f"event {k}: {json.dumps(x)[:300]}\n      != {json.dumps(y)[:300]}")
                break
        if len(ea) != len(eb):
            why.append(f"{len(ea)} events != {len(eb)}")
        oa, ob = (np.load(os.path.join(d, n + ".npz")) for d in (a, b))
        if sorted(oa.files) != sorted(ob.files):
            why.append("output names differ")
        else:
            for k in oa.files:
                x, y = oa[k], ob[k]
                if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                    why.append(f"output {k} differs")
                    break
        print(("DIFF " if why else "same ") + n + "".join("\n    " + w for w in why))
        bad += bool(why) 
    print(f"{len(names) - bad - len(missing)}/{len(names)} identical")
    return 1 if bad or missing else 0


def check(ref: str, quick: bool, only: str | None) -> int:
    tmp = tempfile.mkdtemp(prefix="golden-")
    root = os.path.dirname(HERE)
    tree = os.path.join(tmp, "ref")
    subprocess.run(["git", "-C", root, "worktree", "add", "--detach", tree, ref], check=True)
    try:
        args = ["--quick"] if quick else []
        args += ["--only", only] if only else []
        for where, d in ((tree, "a"), (root, "b")):
            subprocess.run([sys.executable, os.path.abspath(__file__), "record", os.path.join(tmp, d), *args],
                           cwd=where, check=True, env={**os.environ, "PYTHONPATH": where})
        return compare(os.path.join(tmp, "a"), os.path.join(tmp, "b"))
    finally:
        subprocess.run(["git", "-C", root, "worktree", "remove", "--force", tree])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("dir")
    r.add_argument("--quick", action="store_true")
    r.add_argument("--only")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    k = sub.add_parser("check")
    k.add_argument("--ref", required=True)
    k.add_argument("--quick", action="store_true")
    k.add_argument("--only")
    a = ap.parse_args()
    if a.cmd == "record":
        record(a.dir, a.quick, a.only)
    elif a.cmd == "compare":
        sys.exit(compare(a.a, a.b))
    else:
        sys.exit(check(a.ref, a.quick, a.only))


if __name__ == "__main__":
    main()
