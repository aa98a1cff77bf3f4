#!/usr/bin/env bash
# Configures and builds kvrun into build/ (CUDA when a toolkit is found; pass
# -DKVRUN_CUDA=OFF for a CPU-only build). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
ninja -C "$BUILD_DIR" -j"$(nproc)"
