#!/usr/bin/env bash
# Run HERE (no GPU) before a device session: puts the Debian build dependencies into
# .device-deps/, a subset of ../shared (models that fit the 64 MiB carry limit, the
# references, the text) into .carry/shared/, and kvrun, the tools and the cuda-labelled tests
# built here for sm_90 (build-cuda/, stripped, one tar.xz of ~5.5 MB) into .carry/bin.tar.xz, so
# that the short lease does not spend minutes compiling. Both folders are git-ignored; pass
# them in the device tool's `carry` list: [".device-deps", ".carry"]. Then run
# scripts/gpu-session.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${KVRUN_SHARED:-../shared}
mkdir -p .git/info  # device-deps.sh records its folder in .git/info/exclude
bash "$SHARED/scripts/device-deps.sh" fetch libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 \
  libpcre2-posix3 libedit-dev libedit2 libbsd0 libmd0 >/dev/null
rm -rf .carry && mkdir -p .carry/shared/models .carry/shared/reference .carry/shared/text
cp -r "$SHARED/reference/." .carry/shared/reference/
cp "$SHARED/text/wiki.test.raw" .carry/shared/text/
# Models: all 44 of ../shared/models do not fit one carry (134 MB), so they come in three sets
# (KVRUN_CARRY_SET, default a), each under the device tool's 64 MiB limit with the binaries
# (~5.5 MB) and .device-deps:
#   a (~47 MB): the stories260K family (every small variant, the w256 types the CUDA tests and
#     the speculative pairs use) and one model per synthetic shape family: what every mode needs;
#   b (~47 MB): the other w256 and w256-pure types, w256-F32, the other synthetic quantizations;
#   c (~39 MB): the two F16 synthetic models.
# Sets b and c are for `gpu-session.sh greedy` (the GPU-vs-CPU greedy sweep on what is carried),
# so that the three sets together cover every shared model.
case ${KVRUN_CARRY_SET:-a} in
  a) set -- "$SHARED"/models/stories260K.gguf \
       "$SHARED"/models/stories260K-{F16,BF16,Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,Q4_K_M,Q6_K}.gguf \
       "$SHARED"/models/stories260K-L{2,3,4}-F32.gguf "$SHARED"/models/llama-2-tiny-random.gguf \
       "$SHARED"/models/stories260K-w256-{BF16,Q2_K,Q4_K_M,Q5_K_M,Q6_K,IQ4_NL,IQ4_XS,pure-Q4_K_M}.gguf \
       "$SHARED"/models/synth-llama-hd64-gqa4-Q4_0.gguf \
       "$SHARED"/models/synth-llama-hd128-mqa-theta500k-Q8_0.gguf \
       "$SHARED"/models/synth-qwen2-hd64-gqa2-Q5_K_M.gguf ;;
  b) set -- "$SHARED"/models/stories260K-w256-{F16,F32,Q3_K_M,Q4_0,Q4_1,Q5_0,Q5_1,Q8_0}.gguf \
       "$SHARED"/models/stories260K-w256-pure-{Q2_K,Q3_K_M,Q4_0,Q4_1,Q5_0,Q5_1,Q5_K_M}.gguf \
       "$SHARED"/models/synth-llama-hd128-mqa-theta500k-Q4_K_M.gguf \
       "$SHARED"/models/synth-llama-hd64-gqa4-Q4_K_M.gguf ;;
  c) set -- "$SHARED"/models/synth-llama-hd64-gqa4-F16.gguf \
       "$SHARED"/models/synth-qwen2-hd64-gqa2-F16.gguf ;;
  *) echo "KVRUN_CARRY_SET must be a, b or c" >&2; exit 2 ;;
esac
for m in "$@"; do
  cp "$m" .carry/shared/models/
done
B=build-cuda
[ -f $B/build.ninja ] || cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVRUN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null
bins="kvrun make-synthetic-model server-load test_cuda_attention test_cuda_backend test_cuda_invariance
      test_cuda_kv_quant test_cuda_ops test_cuda_sampling"
ninja -C $B $bins > /dev/null
rm -rf /tmp/kvrun-bin && mkdir -p /tmp/kvrun-bin/bin
for f in $bins; do strip -o /tmp/kvrun-bin/bin/$f $B/$f; done
# KVRUN_GEMV_VARIANTS="w4u1:4:1 w16u2:16:2 ...": kvrun-NAME builds for `gpu-session.sh gemv`
# (~3 MB each once packed: carry only the three models that mode uses then).
if [ -n "${KVRUN_GEMV_VARIANTS:-}" ]; then
  bash scripts/gemv-variants.sh $B /tmp/kvrun-bin/variants $KVRUN_GEMV_VARIANTS
  for f in /tmp/kvrun-bin/variants/*; do strip -o /tmp/kvrun-bin/bin/$(basename $f) $f; done
  rm -rf /tmp/kvrun-bin/variants
fi
tar -C /tmp/kvrun-bin -cf - bin | xz -9e > .carry/bin.tar.xz
grep -qx "/.carry/" .git/info/exclude 2>/dev/null || echo "/.carry/" >> .git/info/exclude
du -sh .device-deps .carry
