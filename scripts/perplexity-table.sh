#!/usr/bin/env bash
# Runs `kvrun perplexity -c 256 -b 256` (20 chunks; 10 for the synthetic models, as in the
# reference) on every shared model and prints a markdown table against llama.cpp's values
# from ../shared/reference/perplexity.tsv. Usage: scripts/perplexity-table.sh [kvrun-binary] [extra flags]
set -euo pipefail
cd "$(dirname "$0")/.."
KVRUN=${1:-build/kvrun}
shift || true
SHARED=${KVRUN_SHARED:-../shared}
echo "| model | chunks | llama.cpp PPL | kvrun PPL | kvrun ± | diff % |"
echo "|---|---:|---:|---:|---:|---:|"
tail -n +2 "$SHARED/reference/perplexity.tsv" | while IFS=$'\t' read -r model file ctx chunks ppl err; do
  out=$("$KVRUN" perplexity -m "$SHARED/models/$model" -f "$SHARED/text/$file" -c "$ctx" -b "$ctx" \
        --chunks "$chunks" --device cpu "$@" 2>/dev/null | tail -n 1)
  ours=$(echo "$out" | sed -E 's/.*PPL = ([0-9.]+) \+\/- ([0-9.]+).*/\1/')
  oerr=$(echo "$out" | sed -E 's/.*PPL = ([0-9.]+) \+\/- ([0-9.]+).*/\2/')
  diff=$(python3 -c "print(f'{100*($ours-$ppl)/$ppl:+.3f}')")
  echo "| $model | $chunks | $ppl | $ours | $oerr | $diff |"
done
