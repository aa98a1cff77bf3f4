#!/usr/bin/env bash
# Run ON THE GPU MACHINE (device tool), after scripts/gpu-prepare.sh here, with carry
# [".device-deps", ".carry"]: builds with CUDA for sm_90, runs the cuda-labelled tests,
# compares GPU with CPU (greedy tokens on every carried model, perplexity), then benchmarks
# synthetic 7B/8B models. Everything lands in $OUT (logs + bench tables).
#   usage: bash scripts/gpu-session.sh [all|test|bench]   (default all)
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/kvrun-out}
mkdir -p "$OUT"
if [ -d .device-deps ]; then
  bash .device-deps/unpack.sh >/dev/null
  export CMAKE_PREFIX_PATH=/tmp/deps/usr
  export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
export KVRUN_SHARED=$PWD/.carry/shared
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv | tee "$OUT/device.txt"
B=build-gpu
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DKVRUN_CUDA=ON \
  > "$OUT/build.log" 2>&1 && ninja -C $B -j16 >> "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
K=$B/kvrun
M=$KVRUN_SHARED/models

if [ "$what" = all ] || [ "$what" = test ]; then
  ctest --test-dir $B -L cuda --output-on-failure 2>&1 | tee "$OUT/cuda-tests.log" | tail -15
  # GPU vs CPU: greedy tokens on every carried model, 4 reference prompts.
  {
    echo "| model | KV | prompt | cpu == cuda (48 greedy tokens) |"; echo "|---|---|---|---|"
    for m in $M/*.gguf; do
      for kv in f16 q8; do
        while IFS= read -r p; do
          p=${p//\\n/$'\n'}
          c=$($K run -m "$m" -p "$p" -n 48 --temp 0 --kv-type $kv --device cpu 2>&1 | md5sum | cut -c1-8)
          g=$($K run -m "$m" -p "$p" -n 48 --temp 0 --kv-type $kv --device cuda 2>&1 | md5sum | cut -c1-8)
          echo "| $(basename $m) | $kv | ${p:0:24} | $([ "$c" = "$g" ] && echo yes || echo "NO ($c vs $g)") |"
        done < $KVRUN_SHARED/reference/prompts.txt
      done
    done
  } > "$OUT/gpu-vs-cpu.md" 2>&1
  grep -c "NO" "$OUT/gpu-vs-cpu.md" || true
  {
    echo "| model | KV | cpu PPL | cuda PPL | diff % |"; echo "|---|---|---:|---:|---:|"
    for m in $M/stories260K.gguf $M/stories260K-Q4_0.gguf $M/stories260K-w256-Q4_K_M.gguf $M/synth-llama-hd64-gqa4-Q4_0.gguf; do
      for kv in f16 q8 q4; do
        a=$($K perplexity -m $m -f $KVRUN_SHARED/text/wiki.test.raw -c 256 -b 256 --chunks 10 --kv-type $kv --device cpu 2>/dev/null | tail -1 | awk '{print $5}')
        b=$($K perplexity -m $m -f $KVRUN_SHARED/text/wiki.test.raw -c 256 -b 256 --chunks 10 --kv-type $kv --device cuda 2>/dev/null | tail -1 | awk '{print $5}')
        echo "| $(basename $m) | $kv | $a | $b | $(python3 -c "print(f'{100*($b-$a)/$a:+.4f}')" 2>/dev/null) |"
      done
    done
  } > "$OUT/ppl-gpu-vs-cpu.md" 2>&1
fi

if [ "$what" = all ] || [ "$what" = bench ]; then
  mkdir -p /tmp/models
  S=$B/make-synthetic-model
  $S --preset llama2-7b --type Q4_0 -o /tmp/models/llama2-7b-Q4_0.gguf > /dev/null
  $S --preset llama2-7b --type Q8_0 -o /tmp/models/llama2-7b-Q8_0.gguf > /dev/null
  $S --preset llama3-8b --type Q4_K -o /tmp/models/llama3-8b-Q4_K.gguf > /dev/null
  for m in llama2-7b-Q4_0 llama2-7b-Q8_0 llama3-8b-Q4_K; do
    echo "### $m" >> "$OUT/bench.md"
    $K bench -m /tmp/models/$m.gguf -p 512 -n 128 -r 3 --depth 0,4096 --kv-types f16,q8,q4 -o md \
      --kv-block-size 16 2>&1 | tee -a "$OUT/bench.md"
    echo >> "$OUT/bench.md"
  done
fi
