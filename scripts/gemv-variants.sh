#!/usr/bin/env bash
# Builds kvrun variants that differ only in the decode GEMV's compile-time shape
# (src/cuda/gemv.cu: KVRUN_GEMV_WARPS, KVRUN_GEMV_UNROLL, and KVRUN_GEMV_UNROLL_FROM: the
# smallest row-count instance that unrolls), for timing against each other on a
# lent GPU without a full rebuild per variant: gemv.cu is recompiled with the extra
# definitions, swapped into a copy of libkvrun_cuda.a, and kvrun relinked.
#   usage: scripts/gemv-variants.sh BUILD_DIR OUT_DIR NAME:WARPS:UNROLL[:FROM]...
#   e.g. w4u1:4:1 w16u2:16:2 w8u4f1:8:4:1
# (scripts/gpu-prepare.sh runs it for KVRUN_GEMV_VARIANTS; gpu-session.sh gemv times them.)
set -euo pipefail
B=$(cd "$1" && pwd); OUTD=$2; shift 2
mkdir -p "$OUTD"
ninja -C "$B" kvrun > /dev/null
cc=$(ninja -C "$B" -t commands kvrun | grep -- '-c [^ ]*src/cuda/gemv.cu ')
link=$(ninja -C "$B" -t commands kvrun | grep -- ' -o kvrun ')
for spec in "$@"; do
  IFS=: read -r name warps unroll from <<< "$spec"
  defs="-DKVRUN_GEMV_WARPS=$warps -DKVRUN_GEMV_UNROLL=$unroll -DKVRUN_GEMV_UNROLL_FROM=${from:-16}"
  tmp=$(mktemp -d)
  c=${cc/ -c / $defs -c }
  (cd "$B" && eval "${c% -o *} -o $tmp/gemv.cu.o")
  cp "$B/libkvrun_cuda.a" "$tmp/libkvrun_cuda.a"
  (cd "$tmp" && ar d libkvrun_cuda.a gemv.cu.o && ar q libkvrun_cuda.a gemv.cu.o)
  (cd "$B" && eval "${link//libkvrun_cuda.a/$tmp/libkvrun_cuda.a}" ) > /dev/null
  mv "$B/kvrun" "$OUTD/kvrun-$name"
  rm -rf "$tmp"
  ninja -C "$B" kvrun > /dev/null  # restores the default binary
  echo "built $OUTD/kvrun-$name ($defs)"
done
