#!/usr/bin/env bash
# Run ON THE GPU MACHINE (device tool), after scripts/gpu-prepare.sh here, with carry
# [".device-deps", ".carry"]: builds with CUDA for sm_90, runs the cuda-labelled tests,
# compares GPU with CPU (greedy tokens on every carried model, perplexity), then benchmarks
# synthetic 7B/8B models. Everything lands in $OUT (logs + bench tables).
#   usage: bash scripts/gpu-session.sh [all|test|bench|spec]   (default all)
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
  # GPU vs CPU: greedy tokens on every carried model, the 4 reference prompts as one JSONL
  # batch per model, device and KV type.
  req=$OUT/prompts.jsonl
  : > "$req"
  while IFS= read -r p; do
    p=${p//\"/\\\"}  # prompts.txt writes newlines as \n: a JSON escape already
    echo "{\"prompt\": \"$p\", \"n_predict\": 48, \"temperature\": 0}" >> "$req"
  done < $KVRUN_SHARED/reference/prompts.txt
  {
    echo "| model | KV | cpu == cuda (4 prompts x 48 greedy tokens) |"; echo "|---|---|---|"
    for m in $M/*.gguf; do
      for kv in f16 q8; do
        c=$($K run -m "$m" --jsonl --kv-type $kv --device cpu < "$req" 2>/dev/null | grep -o '"tokens":\[[^]]*\]')
        g=$($K run -m "$m" --jsonl --kv-type $kv --device cuda < "$req" 2>/dev/null | grep -o '"tokens":\[[^]]*\]')
        echo "| $(basename $m) | $kv | $([ "$c" = "$g" ] && [ -n "$c" ] && echo yes || echo NO) |"
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
  # perplexity on the GPU: one 512-token chunk per forward pass (-b 512) against four
  # (-b 2048); the PPL must be the same, the time should drop (docs/perplexity.md).
  for b in 512 2048; do
    t0=$(date +%s%N)
    ppl=$($K perplexity -m /tmp/models/llama2-7b-Q4_0.gguf -f $KVRUN_SHARED/text/wiki.test.raw \
          -c 512 -b $b --chunks 16 2>/dev/null | tail -1)
    t1=$(date +%s%N)
    echo "llama2-7b Q4_0, -c 512 -b $b, 16 chunks: $(( (t1 - t0) / 1000000 )) ms; $ppl" \
      | tee -a "$OUT/ppl-batching.md"
  done
  # imatrix and embeddings on the GPU at 7B scale: 4 calibration chunks (each observed
  # product's inputs copied to the host), and 64 texts embedded.
  t0=$(date +%s%N)
  $K imatrix -m /tmp/models/llama2-7b-Q4_0.gguf -f $KVRUN_SHARED/text/wiki.test.raw -c 512 \
    --chunks 4 -o /tmp/models/im.gguf 2>&1 | tail -1 | tee -a "$OUT/imatrix-embedding.md"
  t1=$(date +%s%N)
  head -c 200000 $KVRUN_SHARED/text/wiki.test.raw | grep -v '^ *$' | head -64 > /tmp/models/texts.txt
  $K embedding -m /tmp/models/llama2-7b-Q4_0.gguf -f /tmp/models/texts.txt --pooling mean \
    --embd-output-format array 2>&1 >/dev/null | tail -1 | tee -a "$OUT/imatrix-embedding.md"
  echo "imatrix 4 chunks: $(( (t1 - t0) / 1000000 )) ms" | tee -a "$OUT/imatrix-embedding.md"
  # kvrun server under load at 7B: 1, 8 and 32 concurrent streamed clients (continuous
  # batching: output tokens/s should grow with clients while TPOT stays near batch 1's).
  $K server -m /tmp/models/llama2-7b-Q4_0.gguf --parallel 32 -c 2048 --port 8090 \
    2> "$OUT/server.log" &
  spid=$!
  for i in $(seq 1 120); do grep -q 'listening on' "$OUT/server.log" && break; sleep 1; done
  for c in 1 8 32; do
    $B/server-load --port 8090 -c $c -r 2 -n 128 --prompt-tokens 256 2>&1 | tail -1 \
      | tee -a "$OUT/server-load.md"
  done
  kill -INT $spid; wait $spid || true
  # The other architectures at full size: qwen3-8b (Q/K norms), gemma3-4b (sliding window,
  # GeGLU), qwen3-30b-a3b (mixture of experts: bandwidth counts the used experts), gpt-oss-20b
  # (MXFP4 experts with biases, attention sinks; the other weights Q8_0), and GLM 4.5 Air cut
  # to 12 of its 46 layers (sigmoid router, shared expert, partial RoPE; 16 GB instead of 60),
  # and ERNIE 4.5 21B-A3B (softmax router with a selection bias, two shared experts).
  $S --preset qwen3-8b --type Q4_K_M -o /tmp/models/qwen3-8b-Q4_K_M.gguf > /dev/null
  $S --preset gemma3-4b --type Q4_K_M -o /tmp/models/gemma3-4b-Q4_K_M.gguf > /dev/null
  $S --preset qwen3-30b-a3b --type Q4_K_M -o /tmp/models/qwen3-30b-a3b-Q4_K_M.gguf > /dev/null
  $S --preset gpt-oss-20b --type Q8_0 -o /tmp/models/gpt-oss-20b-MXFP4.gguf > /dev/null
  $S --preset glm4.5-air --n-layer 12 --type Q4_K_M -o /tmp/models/glm4.5-air-L12-Q4_K_M.gguf \
    > /dev/null
  $S --preset ernie4.5-21b-a3b --type Q4_K_M -o /tmp/models/ernie4.5-21b-a3b-Q4_K_M.gguf > /dev/null
  for m in qwen3-8b-Q4_K_M gemma3-4b-Q4_K_M qwen3-30b-a3b-Q4_K_M gpt-oss-20b-MXFP4 \
    glm4.5-air-L12-Q4_K_M ernie4.5-21b-a3b-Q4_K_M; do
    echo "### $m" >> "$OUT/bench.md"
    $K bench -m /tmp/models/$m.gguf -p 512 -n 128 -r 3 --depth 0,4096 --kv-types f16 -o md \
      --kv-block-size 16 2>&1 | tee -a "$OUT/bench.md"
    echo >> "$OUT/bench.md"
    rm -f /tmp/models/$m.gguf
  done
  # Decode attention A/B: tg128 at depth 4096 again with the old tiled kernel (the rows above
  # use the register kernel, see src/cuda/attention_decode.cu).
  for m in llama2-7b-Q4_0 llama3-8b-Q4_K; do
    echo "### $m, KVRUN_DECODE_ATTN=tiled" >> "$OUT/bench.md"
    KVRUN_DECODE_ATTN=tiled $K bench -m /tmp/models/$m.gguf -p 0 -n 128 -r 3 --depth 4096 \
      --kv-types f16,q8,q4 -o md --kv-block-size 16 2>&1 | tee -a "$OUT/bench.md"
    echo >> "$OUT/bench.md"
  done
fi

if [ "$what" = all ] || [ "$what" = spec ]; then
  # Speculative decoding speed-up vs acceptance: synthetic targets whose layers from 4 on
  # barely change the residual stream (--residual-scale dials the draft/target agreement) and
  # drafts made of their first 4 layers; then the real stories pair.
  mkdir -p /tmp/models
  S=$B/make-synthetic-model
  # spec_row LABEL LOG ARGS...: one greedy 256-token run with --spec-baseline, logged, as a row.
  spec_row() {
    local label=$1 log=$2 out tps up acc
    shift 2
    out=$($K run "$@" --draft-n 8 -p "Once upon a time" -n 256 --temp 0 --ignore-eos --stats \
          --spec-baseline 2>&1 >/dev/null)
    echo "$out" > "$log"
    tps=$(echo "$out" | sed -n 's/^generation *\([0-9.]*\) tokens.*/\1/p' | head -1)
    up=$(echo "$out" | grep -io 'speed-up[^0-9]*[0-9.]*x' | head -1)
    acc=$(echo "$out" | sed -n 's/.*accepted (\([0-9.]*%\)).*/\1/p' | head -1)
    echo "| $label | $tps | $up | $acc |" >> "$OUT/spec.md"
  }
  echo "| target | residual scale | draft | tokens/s | speed-up | acceptance |" > "$OUT/spec.md"
  echo "|---|---:|---|---:|---:|---:|" >> "$OUT/spec.md"
  for preset in llama-1b llama2-7b; do
    for rs in 0.0 0.05 0.2; do
      t=/tmp/models/$preset-spec-$rs.gguf; d=/tmp/models/$preset-spec-$rs-draft.gguf
      $S --preset $preset --type Q4_0 --residual-scale $rs --scaled-from 4 -o $t > /dev/null
      $S --draft-of $t --n-layer 4 -o $d > /dev/null
      spec_row "$preset Q4_0 | $rs | first 4 layers" "$OUT/spec-$preset-$rs.log" -m $t \
        --draft-model $d
    done
    # Prompt lookup (no draft model) on the last target: pays where the text repeats itself.
    spec_row "$preset Q4_0 | $rs | 3-gram lookup" "$OUT/spec-$preset-lookup.log" -m $t \
      --draft-ngram 3
  done
  for d in stories260K-Q8_0 stories260K-Q4_0 stories260K-L4-F32; do
    $K run -m $M/stories260K.gguf --draft-model $M/$d.gguf --draft-n 8 -p "Once upon a time" \
      -n 128 --temp 0 --stats --spec-baseline 2>&1 >/dev/null | sed "s/^/$d: /" >> "$OUT/spec-stories.log"
  done
  cat "$OUT/spec.md"
fi
