#!/usr/bin/env bash
# CPU experiment behind the choice of the GPU's integer GEMV (KVRUN_GEMV=q8|q16,
# docs/performance.md): how often does rounding the activations x of the decode matmuls to
# 8 or 16 bits per 32 elements (d = max|x| / 127 or 32767, round to nearest) change the
# greedy tokens of the shared models, and by how much (scripts/near-ties.py)? Builds a
# CPU-only kvrun in a scratch worktree with the rounding added to cpu::matmul (rows <= 16,
# the weight types the integer GEMV decodes), so the repository's code stays as it is.
# Validated against the GPU: the 8-bit rows reproduce the GPU q8 sweep of 2026-11-27.
#   usage: bash scripts/x-rounding-sweep.sh [SHARED_DIR]   (results in /tmp/x-rounding/)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
shared=$(realpath "${1:-$root/../shared}")
work=/tmp/x-rounding
rm -rf "$work" && mkdir -p "$work"
git -C "$root" worktree remove --force "$work/src" 2>/dev/null || true
git -C "$root" worktree add -q --detach "$work/src" HEAD
trap 'git -C "$root" worktree remove --force "$work/src"' EXIT
python3 - "$work/src/src/cpu_matmul.cpp" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
anchor = "    if (llamacpp_rounding()) return llamacpp::matmul(out, x, w, n_rows);\n"
add = """    static const int xbits = std::getenv("KVRUN_EXP_XBITS") ? std::atoi(std::getenv("KVRUN_EXP_XBITS")) : 0;
    std::vector<float> xr;
    const bool int_type = w.type == GgmlType::Q4_0 || w.type == GgmlType::Q4_1 ||
        w.type == GgmlType::Q5_0 || w.type == GgmlType::Q5_1 || w.type == GgmlType::Q8_0 ||
        w.type == GgmlType::IQ4_NL || w.type == GgmlType::IQ4_XS || w.type == GgmlType::Q4_K ||
        w.type == GgmlType::Q5_K || w.type == GgmlType::Q6_K;
    if (xbits && n_rows <= 16 && w.n_in % 32 == 0 && int_type) {
        xr.assign(x, x + n_rows * w.n_in);
        const float qm = xbits == 8 ? 127.0f : 32767.0f;
        for (size_t b = 0; b < xr.size(); b += 32) {
            float amax = 0;
            for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(xr[i]));
            const float d = amax / qm, id = d > 0 ? 1.0f / d : 0.0f;
            for (size_t i = b; i < b + 32; ++i) xr[i] = std::nearbyint(xr[i] * id) * d;
        }
        x = xr.data();
    }
"""
assert anchor in s
s = s.replace(anchor, anchor + add, 1)
s = "#include <cmath>\n#include <cstdlib>\n#include <vector>\n" + s
open(p, "w").write(s)
PY
cmake -S "$work/src" -B "$work/build" -G Ninja -DKVRUN_CUDA=OFF -DCMAKE_BUILD_TYPE=Release > "$work/cmake.log"
ninja -C "$work/build" kvrun > "$work/build.log"
K=$work/build/kvrun
req=$work/prompts.jsonl
while IFS= read -r p; do
  p=${p//\"/\\\"}
  echo "{\"prompt\": \"$p\", \"n_predict\": 48, \"temperature\": 0}" >> "$req"
done < "$shared/reference/prompts.txt"
tab=$work/sweep.md
echo "| model | KV | x 16-bit == f32 | x 8-bit == f32 |" > "$tab"
echo "|---|---|---|---|" >> "$tab"
for m in "$shared"/models/*.gguf; do
  kvs=f16  # the KV types of gpu-session.sh's greedy sweep
  case $(basename "$m") in stories260K.gguf|stories260K-Q4_0.gguf|stories260K-w256-Q4_K_M.gguf|synth-*) kvs="f16 q8 q4";; esac
  for kv in $kvs; do
    toks() { KVRUN_EXP_XBITS=$1 timeout 120 $K run -m "$m" --jsonl --kv-type $kv --device cpu < "$req" 2>/dev/null | grep -o '"tokens":\[[^]]*\]' || true; }
    a=$(toks 0); row="| $(basename "$m") | $kv |"
    for bits in 16 8; do
      b=$(toks $bits); r=NO
      [ "$a" = "$b" ] && [ -n "$a" ] && r=yes
      [ $r = NO ] && { echo "== $(basename "$m") $kv"; echo "cpu:  $a"; echo "cuda: $b"; } >> "$work/x$bits-diff.log"
      row="$row $r |"
    done
    echo "$row" >> "$tab"
  done
done
cat "$tab"
for bits in 16 8; do
  [ -f "$work/x$bits-diff.log" ] || continue
  echo "## $bits-bit x: the CPU's log-probability gaps where the tokens differ"
  python3 "$root/scripts/near-ties.py" "$work/x$bits-diff.log" --kvrun $K --shared "$shared"
done
