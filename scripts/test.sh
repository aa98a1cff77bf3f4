#!/usr/bin/env bash
# Installs what is missing, builds kvrun (with CUDA when a toolkit is present) and runs
# the whole test suite. CUDA-labelled tests skip when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build} bash scripts/build.sh "$@"
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j"$(nproc)"
