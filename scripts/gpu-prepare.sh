#!/usr/bin/env bash
# Run HERE (no GPU) before a device session: puts the Debian build dependencies into
# .device-deps/ and a subset of ../shared (models that fit the 64 MiB carry limit, the
# references, the text) into .carry/shared/. Both folders are git-ignored; pass them in the
# device tool's `carry` list: [".device-deps", ".carry"]. Then run scripts/gpu-session.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${KVRUN_SHARED:-../shared}
mkdir -p .git/info  # device-deps.sh records its folder in .git/info/exclude
bash "$SHARED/scripts/device-deps.sh" fetch libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 \
  libpcre2-posix3 libedit-dev libedit2 libbsd0 libmd0 >/dev/null
rm -rf .carry && mkdir -p .carry/shared/models .carry/shared/reference .carry/shared/text
cp -r "$SHARED/reference/." .carry/shared/reference/
cp "$SHARED/text/wiki.test.raw" .carry/shared/text/
# The stories260K family (every small variant, the w256 types the CUDA tests and the
# speculative pairs use) and one model per synthetic shape family: ~56 MB, so that with
# .device-deps it stays under the device tool's 64 MiB carry limit.
for m in "$SHARED"/models/stories260K.gguf "$SHARED"/models/stories260K-{F16,BF16,Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,Q4_K_M,Q6_K}.gguf \
         "$SHARED"/models/stories260K-L{2,3,4}-F32.gguf "$SHARED"/models/llama-2-tiny-random.gguf \
         "$SHARED"/models/stories260K-w256-{F32,BF16,Q2_K,Q4_K_M,Q5_K_M,Q6_K,IQ4_NL,IQ4_XS,pure-Q4_K_M}.gguf \
         "$SHARED"/models/synth-llama-hd64-gqa4-Q4_0.gguf \
         "$SHARED"/models/synth-llama-hd128-mqa-theta500k-Q8_0.gguf \
         "$SHARED"/models/synth-qwen2-hd64-gqa2-Q5_K_M.gguf; do
  cp "$m" .carry/shared/models/
done
grep -qx "/.carry/" .git/info/exclude 2>/dev/null || echo "/.carry/" >> .git/info/exclude
du -sh .device-deps .carry
