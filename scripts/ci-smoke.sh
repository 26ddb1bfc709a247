#!/usr/bin/env bash
# CI smoke: the example encoder over growing, repeated and shrinking sequence lengths, every output
# checked against onnxruntime, with bounds on what the runtime did; then the same questions asked
# of the trace it wrote. Any failed check or expectation exits non-zero (see README, exit statuses).
# Uses the caller's python: PYTHON=/path/to/python bash scripts/ci-smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# A repeated shape must skip shape inference on every node (29 of them since Reshape targets
# copying the input's own dims fold at load), so skips over the run stay well above 40; the
# bounds on buffers and builds catch a runtime that stops reusing.
# The last shape comes three times: its second run changes nothing, so the third is a plan replay
# (the fast path), which the trace expands into the decisions it stands for.
expects=(--expect 'inferences==9' --expect 'check_failed==0' --expect 'update_shape.skipped>=40'
         --expect 'reallocs<=200' --expect 'impl_builds<=20' --expect 'update_impl.evict==0'
         --expect 'plan.replay==1')

"$py" -m dyncli run examples/encoder.onnx --quiet --check --trace "$out/smoke.trace.jsonl" \
    --shapes 'input_ids:1x{8..32..8},attention_mask:1x{8..32..8}' \
    --shapes 'input_ids:2x16,attention_mask:2x16*2' \
    --shapes 'input_ids:1x8,attention_mask:1x8*3' \
    "${expects[@]}"

# The trace gives the same verdict, and it exports and filters.
"$py" -m dyncli trace "$out/smoke.trace.jsonl" --json "${expects[@]}" > "$out/summary.json"
"$py" -m dyncli trace "$out/smoke.trace.jsonl" --format chrome -o "$out/smoke.chrome.json"
"$py" -m dyncli trace "$out/smoke.trace.jsonl" --iter 5 --kind update_shape --json \
    --expect 'update_shape.infer==0' > "$out/repeat.json"
"$py" -m dyncli trace "$out/smoke.trace.jsonl" --iter 8 --json \
    --expect 'plan.replay==1' --expect 'update_shape.infer==0' --expect 'update_shape.skip>=25' \
    > "$out/replay.json"

# dyncli bench runs end to end (figures are for benchmarks, not for CI: only its JSON is checked)
"$py" -m dyncli bench examples/encoder.onnx --shapes 'input_ids:1x{8..16..8},attention_mask:1x{8..16..8}' \
    --warmup 0 --repeat 1 --same-runs 3 --compare onnxruntime --json > "$out/bench.json"
"$py" -c "import json, sys; r = json.load(open(sys.argv[1])); assert r['dynamic_overhead'] > 0 and r['peers']['onnxruntime']['mean_ms'] > 0" "$out/bench.json"
echo "ci-smoke: ok"
