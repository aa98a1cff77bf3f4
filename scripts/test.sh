#!/usr/bin/env bash
# Installs what is missing, builds kvrun (with CUDA when a toolkit is present) and runs
# the whole test suite. CUDA-labelled tests skip when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
# Without a GPU the CUDA tests only skip, so a fresh build dir compiles the CUDA code for one
# architecture (sm_90) instead of CMake's default two: it still proves the code builds, in
# about half the CUDA compile time (CI: 2 cores). An existing build dir keeps its setting.
extra=()
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && ! nvidia-smi -L > /dev/null 2>&1; then
  extra=(-DCMAKE_CUDA_ARCHITECTURES=90)
fi
BUILD_DIR=$BUILD_DIR bash scripts/build.sh "${extra[@]}" "$@"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)"
