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
if [ -n "${KVRUN_DEVICE_DEPS:-}" ]; then  # only to build on the device machine
  bash "$SHARED/scripts/device-deps.sh" fetch libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 \
    libpcre2-posix3 libedit-dev libedit2 libbsd0 libmd0 >/dev/null
fi
rm -rf .carry && mkdir -p .carry/shared/models .carry/shared/reference .carry/shared/text .carry/lib
cp -r "$SHARED/reference/." .carry/shared/reference/
cp "$SHARED/text/wiki.test.raw" .carry/shared/text/
# Models: all 44 of ../shared/models (134 MB) do not fit one carry, but packed with xz they take
# 86 MB, most of it the random-weight synthetic models (the padded w256 ones pack 8:1). So two
# sets (KVRUN_CARRY_SET, default 1), each as .carry/models.tar.xz that gpu-session.sh unpacks:
#   1 (~51 MB packed): every shared model but the two F16 synthetic ones: what every mode needs;
#   2 (~35 MB packed): those two, for `gpu-session.sh greedy` (the GPU-vs-CPU greedy sweep);
#   0: none (`gpu-session.sh variants` makes its own models).
# The shared libraries kvrun needs beyond a CUDA image's go into .carry/lib (a few MB, instead
# of the Debian packages of .device-deps, which are only needed to build there).
case ${KVRUN_CARRY_SET:-1} in
  1) models=$(cd "$SHARED/models" && ls *.gguf | grep -v -E '^synth-.*-F16\.gguf$') ;;
  2) models=$(cd "$SHARED/models" && ls synth-*-F16.gguf) ;;
  0) models= ;;
  *) echo "KVRUN_CARRY_SET must be 0, 1 or 2" >&2; exit 2 ;;
esac
[ -z "$models" ] || tar -C "$SHARED/models" -cf - $models | xz -T0 -6 > .carry/models.tar.xz
B=build-cuda
[ -f $B/build.ninja ] || cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVRUN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null
bins="kvrun make-synthetic-model server-load test_cuda_arch test_cuda_attention test_cuda_backend test_cuda_invariance
      test_cuda_kv_quant test_cuda_moe test_cuda_ops test_cuda_sampling"
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
for l in libpcre2-8.so.0 libedit.so.2 libfmt.so.9 libbsd.so.0 libmd.so.0; do
  cp -L "$(ldd $B/kvrun | awk -v l=$l '$1 == l {print $3}')" .carry/lib/$l
done
grep -qx "/.carry/" .git/info/exclude 2>/dev/null || echo "/.carry/" >> .git/info/exclude
du -sh .carry $( [ -d .device-deps ] && echo .device-deps)
