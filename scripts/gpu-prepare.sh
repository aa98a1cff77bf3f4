#!/usr/bin/env bash
# Run HERE (no GPU) before a device session: puts the Debian build dependencies into
# .device-deps/ and a subset of ../shared (models that fit the 64 MiB carry limit, the
# references, the text) into .carry/shared/. Both folders are git-ignored; pass them in the
# device tool's `carry` list: [".device-deps", ".carry"]. Then run scripts/gpu-session.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${KVRUN_SHARED:-../shared}
bash "$SHARED/scripts/device-deps.sh" fetch libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 \
  libpcre2-posix3 libedit-dev libedit2 libbsd0 libmd0 >/dev/null
rm -rf .carry && mkdir -p .carry/shared/models .carry/shared/reference .carry/shared/text
cp -r "$SHARED/reference/." .carry/shared/reference/
cp "$SHARED/text/wiki.test.raw" .carry/shared/text/
# Every stories260K variant (small) plus one model per synthetic shape family.
for m in "$SHARED"/models/stories260K*.gguf "$SHARED"/models/llama-2-tiny-random.gguf \
         "$SHARED"/models/synth-llama-hd64-gqa4-Q4_0.gguf \
         "$SHARED"/models/synth-llama-hd128-mqa-theta500k-Q4_K_M.gguf \
         "$SHARED"/models/synth-qwen2-hd64-gqa2-Q5_K_M.gguf; do
  cp "$m" .carry/shared/models/
done
grep -qx "/.carry/" .git/info/exclude 2>/dev/null || echo "/.carry/" >> .git/info/exclude
du -sh .device-deps .carry
