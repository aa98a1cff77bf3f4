#!/usr/bin/env bash
# Fuzzes the GGUF reader with libFuzzer + ASan + UBSan for N seconds (default 600).
# Usage: scripts/fuzz.sh [seconds] [extra libFuzzer flags...]
# Builds build-fuzz/fuzz_gguf (or $KVRUN_FUZZ_BUILD/fuzz_gguf; never the CMake build/ tree)
# with clang++ straight from the sources, seeds fuzz/corpus from GgufWriter-made files and
# the smallest shared models, and leaves any crashing input in fuzz/crashes/.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
seconds="${1:-600}"
shift || true

out="${KVRUN_FUZZ_BUILD:-build-fuzz}"
mkdir -p "$out" fuzz/corpus fuzz/crashes
clang++ -std=c++20 -O1 -g -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -Isrc fuzz/fuzz_gguf.cpp src/gguf.cpp src/gguf_writer.cpp src/quant*.cpp \
    -lfmt -o "$out/fuzz_gguf"

KVRUN_FUZZ_WRITE_SEEDS=fuzz/corpus "$out/fuzz_gguf"
shared="${KVRUN_SHARED:-$root/../shared}"
for m in stories260K-Q4_0.gguf stories260K-Q4_K_M.gguf; do
    [ -f "$shared/models/$m" ] && cp -f "$shared/models/$m" "fuzz/corpus/real_$m"
    # The header alone (metadata + tensor table) mutates faster than the whole file.
    [ -f "$shared/models/$m" ] && head -c 16384 "$shared/models/$m" > "fuzz/corpus/head_$m"
done

# -max_len keeps mutations small; real models are still parsed up to their first 64 KiB.
exec "$out/fuzz_gguf" fuzz/corpus -max_total_time="$seconds" -max_len=65536 \
    -rss_limit_mb=2048 -artifact_prefix=fuzz/crashes/ -print_final_stats=1 "$@"
