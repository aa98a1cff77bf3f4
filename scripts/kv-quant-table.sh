#!/usr/bin/env bash
# Quality of the quantized KV cache: for each model, a perplexity run with the f16 cache saves
# its log-probabilities, then every variant (q8, q4 with and without Hadamard rotation, K-only
# and V-only) is compared against it. Prints a markdown table (docs/kv-cache.md).
#   scripts/kv-quant-table.sh [model.gguf ...]     (defaults: three shared models)
# Env: KVRUN (binary, default build/kvrun), TEXT (default ../shared/text/wiki.test.raw),
#      CTX (256), CHUNKS (20), BS (KV block size, 16), DEVICE (cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
KVRUN=${KVRUN:-build/kvrun}
TEXT=${TEXT:-../shared/text/wiki.test.raw}
CTX=${CTX:-256}
CHUNKS=${CHUNKS:-20}
BS=${BS:-16}
DEVICE=${DEVICE:-cpu}
if [ $# -eq 0 ]; then
  set -- ../shared/models/stories260K.gguf ../shared/models/stories260K-w256-F32.gguf \
         ../shared/models/stories260K-w256-Q4_K_M.gguf
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() {  # run OUT_PREFIX ARGS...: stdout to OUT.out, stderr to OUT.err
  local out=$1; shift
  "$KVRUN" perplexity -f "$TEXT" -c "$CTX" -b "$CTX" --chunks "$CHUNKS" --device "$DEVICE" \
    --kv-block-size "$BS" "$@" >"$out.out" 2>"$out.err" </dev/null
}

echo "| model | KV (K / V) | bytes/token | PPL | ΔPPL % | mean KLD | top-1 % |"
echo "|---|---|---:|---:|---:|---:|---:|"
for model in "$@"; do
  name=$(basename "$model" .gguf)
  run "$tmp/base" -m "$model" --kld-save "$tmp/base.kld"
  ppl=$(sed -n 's/^Final estimate: PPL = \([0-9.]*\).*/\1/p' "$tmp/base.out")
  bpt=$(sed -n 's/.*, \([0-9.]*\) bytes\/token.*/\1/p' "$tmp/base.err")
  echo "| $name | f16 / f16 | $bpt | $ppl | 0 | 0 | 100 |"
  while IFS='|' read -r label args; do
    # shellcheck disable=SC2086
    run "$tmp/v" -m "$model" --kld "$tmp/base.kld" $args
    ppl=$(sed -n 's/^Final estimate: PPL = \([0-9.]*\).*/\1/p' "$tmp/v.out")
    bpt=$(sed -n 's/.*, \([0-9.]*\) bytes\/token.*/\1/p' "$tmp/v.err")
    dppl=$(sed -n 's/^PPL base .*(\([-+0-9.]*\)%)$/\1/p' "$tmp/v.out")
    kld=$(sed -n 's/^KL divergence vs [^:]*: mean \([0-9.]*\) .*/\1/p' "$tmp/v.out")
    top1=$(sed -n 's/^top-1 agreement: \([0-9.]*\)%/\1/p' "$tmp/v.out")
    echo "| $name | $label | $bpt | $ppl | $dppl | $kld | $top1 |"
  done <<'EOF'
q8 / q8|--kv-type q8
q4 / q4|--kv-type q4
q4 / q4, rotated|--kv-type q4 --kv-rotate on
q8 / f16|--kv-type-k q8 --kv-type-v f16
f16 / q8|--kv-type-k f16 --kv-type-v q8
q4 / f16|--kv-type-k q4 --kv-type-v f16
q4 / f16, rotated|--kv-type-k q4 --kv-type-v f16 --kv-rotate on
f16 / q4|--kv-type-k f16 --kv-type-v q4
q8 / q4|--kv-type-k q8 --kv-type-v q4
EOF
done
