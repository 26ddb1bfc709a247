#!/usr/bin/env bash
# Make sure this machine has an OpenCL CPU device that builds and runs the engine's kernels.
#
# pip installs PoCL (pocl-binary-distribution, 3.0 on LLVM 14). LLVM 14 predates the newest
# CPUs: on AMD Zen 5 it cannot build at all ("unknown target CPU 'generic'"), on AVX-512 CPUs
# such as AMD Zen 4 it builds but aborts or crashes while compiling the 16-lane GEMM kernels.
# So this script runs the example encoder once (a probe in its own process):
# - no device builds a kernel: install the distribution's PoCL (Debian/Ubuntu: pocl-opencl-icd);
# - the probe fails: install Intel's CPU runtime from PyPI (the `intel` extra), which the engine
#   prefers once installed (engine/device.py), and probe again.
set -euo pipefail
py=${PYTHON:-python}
here=$(cd "$(dirname "$0")/.." && pwd)

probe() {   # in a subshell whose stderr is dropped: a crash is an answer here, not news
  ( timeout 600 "$py" -m dyncli run "$here/examples/encoder.onnx" --shapes 'input_ids:1x8,attention_mask:1x8' \
    --shapes 'input_ids:2x16,attention_mask:2x16' --trace none -q || exit 1 ) >/dev/null 2>&1
}

if ! "$py" -m dyncli devices --json 2>/dev/null | "$py" -c 'import json,sys; sys.exit(0 if any(d["builds"] for d in json.load(sys.stdin)) else 1)'; then
  echo "ensure-opencl: no OpenCL device can build kernels; installing the distribution's PoCL" >&2
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq pocl-opencl-icd >/dev/null
  else
    echo "ensure-opencl: no apt-get here; install your distribution's PoCL (or a GPU OpenCL driver)" >&2
    exit 1
  fi
fi
if ! probe; then
  echo "ensure-opencl: the default CPU device cannot run the engine's kernels; installing Intel's CPU runtime (pip)" >&2
  "$py" -m pip install -q intel-opencl-rt intel-cmplr-lib-rt
  if ! probe; then
    echo "ensure-opencl: no OpenCL device runs the example encoder; see \`dyncli devices\`" >&2
    exit 1
  fi
fi
"$py" -m dyncli devices
