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

# A repeated shape must skip shape inference on every node, so skips stay well above 40 even if
# fusion shrinks the graph; the bounds on buffers and builds catch a runtime that stops reusing.
expects=(--expect 'inferences==7' --expect 'check_failed==0' --expect 'update_shape.skipped>=40'
         --expect 'reallocs<=200' --expect 'impl_builds<=20' --expect 'update_impl.evict==0')

"$py" -m dyncli run examples/encoder.onnx --quiet --check --trace "$out/smoke.trace.jsonl" \
    --shapes 'input_ids:1x{8..32..8},attention_mask:1x{8..32..8}' \
    --shapes 'input_ids:2x16,attention_mask:2x16*2' \
    --shapes 'input_ids:1x8,attention_mask:1x8' \
    "${expects[@]}"

# The trace gives the same verdict, and it exports and filters.
"$py" -m dyncli trace "$out/smoke.trace.jsonl" --json "${expects[@]}" > "$out/summary.json"
"$py" -m dyncli trace "$out/smoke.trace.jsonl" --format chrome -o "$out/smoke.chrome.json"
"$py" -m dyncli trace "$out/smoke.trace.jsonl" --iter 5 --kind update_shape --json \
    --expect 'update_shape.infer==0' > "$out/repeat.json"
echo "ci-smoke: ok"
