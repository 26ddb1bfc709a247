#!/usr/bin/env bash
# Make sure this machine has an OpenCL device that can build kernels.
#
# pip installs PoCL (pocl-binary-distribution), a CPU OpenCL device. That PoCL is built on
# LLVM 14, which cannot target CPUs newer than itself (e.g. AMD Zen 5: "unknown target CPU
# 'generic'"). On such machines the distribution's PoCL (Debian/Ubuntu: pocl-opencl-icd) works;
# this script installs it when, and only when, no device can build a kernel.
set -euo pipefail
py=${PYTHON:-python}
if "$py" -m dyncli devices --json 2>/dev/null | "$py" -c 'import json,sys; sys.exit(0 if any(d["builds"] for d in json.load(sys.stdin)) else 1)'; then
  exit 0
fi
echo "ensure-opencl: no OpenCL device can build kernels; installing the distribution's PoCL" >&2
if command -v apt-get >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq pocl-opencl-icd >/dev/null
else
  echo "ensure-opencl: no apt-get here; install your distribution's PoCL (or a GPU OpenCL driver)" >&2
  exit 1
fi
"$py" -m dyncli devices
