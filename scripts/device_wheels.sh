#!/usr/bin/env bash
# Wheels a lent GPU machine needs beside the shared device kit: its Python (3.12) has torch,
# onnx, onnxruntime, Rich and Typer but not orjson, and reaches no package registry. Without
# orjson the trace writer falls back to the json module, which costs 3x per event (session 28:
# every traced figure taken there before measured that fallback). The kit's setup.sh installs
# every wheel in its folder, so run this here after copying the kit to .device/:
#   bash scripts/device_wheels.sh [.device]
set -euo pipefail
dest=${1:-.device}
python3 -m pip download -q --only-binary :all: --no-deps --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --dest "$dest" orjson
ls "$dest"/orjson-*.whl
