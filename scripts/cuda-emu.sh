#!/usr/bin/env bash
# Runs CUDA tests on the host CUDA emulator (tools/cuda-emu, see its README.md): no GPU
# needed, one fiber per CUDA thread, slow. A developer tool, not part of ctest / CI.
#
#   scripts/cuda-emu.sh [ORDER] [TEST...] [-- DOCTEST-ARG...]
#     ORDER  fwd (default) | rev | rand: order in which a CTA's threads run between
#            synchronization points (rand: EMU_SEED=N picks the shuffle)
#     TEST   test_cuda_kv_quant test_cuda_attention test_cuda_sampling test_cuda_ops test_cuda_moe
#            test_cuda_invariance test_cuda_backend test_cuda_arch (default: all). Slow cases and one known
#            tolerance failure are excluded with doctest filters (FILTERS below).
#     DOCTEST-ARG  passed to each test as is, e.g. -- "-tc=cuda backend matches*"
#   Environment: EMU_ASAN=1 builds with ASan+UBSan (into build-emu/asan),
#                EMU_ARGS="..." extra doctest arguments (split like a shell line: quote
#                an argument with spaces), EMU_FILTERS=0 drops FILTERS,
#                JOBS=N build jobs (default 2).
# Builds into build-emu/ (git-ignored) from the current sources.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ALL_TESTS=(test_cuda_kv_quant test_cuda_attention test_cuda_sampling test_cuda_ops test_cuda_moe
    test_cuda_invariance test_cuda_backend test_cuda_arch)

order=fwd
if [[ $# -gt 0 && ($1 == fwd || $1 == rev || $1 == rand) ]]; then
    order=$1
    shift
fi
tests=()
doctest_args=()
while [[ $# -gt 0 ]]; do
    if [[ $1 == -- ]]; then
        shift
        doctest_args=("$@")
        break
    fi
    tests+=("$1")
    shift
done
# EMU_ARGS is split as xargs splits a line (quotes group words), so "-tc=a b*" stays whole.
if [[ -n ${EMU_ARGS:-} ]]; then
    mapfile -t emu_args < <(xargs -n1 printf '%s\n' <<< "$EMU_ARGS")
    doctest_args+=("${emu_args[@]}")
fi
[[ ${#tests[@]} -eq 0 ]] && tests=("${ALL_TESTS[@]}")
for t in "${tests[@]}"; do
    [[ " ${ALL_TESTS[*]} " == *" $t "* ]] || {
        echo "cuda-emu: unsupported test '$t' (supported: ${ALL_TESTS[*]})" >&2
        exit 2
    }
done

# Per-test doctest filters (-tce= excludes test cases by name, wildcards allowed).
declare -A FILTERS=(
    # Everything runs (cuBLAS is a host GEMM, graphs are recorded and replayed).
    [test_cuda_ops]=''
    [test_cuda_moe]=''
    # Everything runs (about 2-4 minutes, vocabularies up to 151936 included).
    [test_cuda_sampling]=''
    # One case: 3 models x 3 KV types x 2 depths (about 5-6 minutes).
    [test_cuda_invariance]=''
    # Excluded: the graph-replay case (about 4 minutes) and forward_sample on a 128256-token
    # vocabulary (about 3.5 minutes), both pass. The rest (the q8 / q4 KV case included,
    # about 1 minute) takes about 2.5 minutes. EMU_FILTERS=0 runs them all.
    [test_cuda_backend]='-tce=cuda graph replay*,cuda forward_sample picks*'
    [test_cuda_arch]=''
)

build="$ROOT/build-emu"
cmake_args=()
if [[ ${EMU_ASAN:-0} == 1 ]]; then
    build="$ROOT/build-emu/asan"
    cmake_args+=(-DEMU_SANITIZE=ON)
fi
if [[ ! -f $build/build.ninja ]]; then
    cmake -S "$ROOT/tools/cuda-emu" -B "$build" -G Ninja "${cmake_args[@]}" >/dev/null
fi
ninja -C "$build" -j "${JOBS:-2}" "${tests[@]}"

export EMU_ORDER=$order
# (allocator_may_return_null: test_cuda_ops asks for 4 PiB and expects an error.)
[[ ${EMU_ASAN:-0} == 1 ]] &&
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=1}
fail=0
for t in "${tests[@]}"; do
    args=()
    [[ ${EMU_FILTERS:-1} != 0 && -n ${FILTERS[$t]:-} ]] && args+=("${FILTERS[$t]}")
    args+=("${doctest_args[@]}")
    echo "== $t (EMU_ORDER=$order${EMU_ASAN:+, asan}) ${args[*]}"
    start=$(date +%s)
    if "$build/$t" "${args[@]}"; then
        echo "== $t: passed in $(($(date +%s) - start)) s"
    else
        echo "== $t: FAILED (exit $?) after $(($(date +%s) - start)) s"
        fail=1
    fi
done
exit $fail
