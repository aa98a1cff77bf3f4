#!/usr/bin/env bash
# Run ON THE GPU MACHINE (device tool), after scripts/gpu-prepare.sh here, with carry
# [".carry"] (and ".device-deps" to build there): unpacks the binaries gpu-prepare.sh built here for sm_90 (or
# builds them when they do not run), runs the cuda-labelled tests, compares GPU with CPU
# (greedy tokens on every carried model, perplexity), then benchmarks synthetic 7B/8B models,
# speculative decoding, and the other architectures while time is left. A lease is short
# (15 minutes of device time, start included): every step has a timeout, the optional ones
# run only while KVRUN_GPU_BUDGET seconds (default 420) are not spent, and everything lands
# in $OUT/results.tgz as it is made (logs + tables), so a run cut short still returns what it did.
#   usage: bash scripts/gpu-session.sh [all|test|bench|spec|extra|gemv|greedy|variants|profile|switches]
#   (default all; switches: tg128 under the opt-in launch switches (switch_ab); variants: tg128 of the GEMV builds of KVRUN_GEMV_VARIANTS, f32 and q8;
#   profile: KVRUN_TESTS, the q8 greedy sweep and ncu per kernel;
#   gemv: the GEMV variants that gpu-prepare.sh built for KVRUN_GEMV_VARIANTS; greedy: the
#   GPU-vs-CPU greedy sweep alone, for carry set 2; none of these is part of all)
set -uo pipefail
what=${1:-all}
# The device tool returns at most 8 files from $OUT: the logs and tables are written to
# $RES and packed into $OUT/results.tgz at every step (with steps.log beside it).
RESULTS=${OUT:-/tmp/kvrun-out}
OUT=/tmp/kvrun-res
mkdir -p "$RESULTS" "$OUT"
T0=$SECONDS
BUDGET=${KVRUN_GPU_BUDGET:-420}
left() { echo $(( BUDGET - (SECONDS - T0) )); }
log() {
  echo "[$(( SECONDS - T0 ))s] $*" | tee -a "$OUT/steps.log"
  tar -C "$OUT" -czf "$RESULTS/results.tgz" . && cp "$OUT/steps.log" "$RESULTS/"
}
want() { [ "$what" = all ] || [ "$what" = "$1" ]; }
# same_tokens FILE LABEL MODEL PROMPT N REF_CMD CMD: a line of FILE saying whether CMD's greedy
# text (N tokens) equals REF_CMD's (GEMV builds and modes must give the same bits).
same_tokens() {
  local ref o
  ref=$(timeout 30 $6 run -m "$3" -p "$4" -n "$5" --temp 0 2>/dev/null)
  o=$(timeout 30 $7 run -m "$3" -p "$4" -n "$5" --temp 0 2>/dev/null)
  echo "$2 same-as-base: $([ "$o" = "$ref" ] && [ -n "$o" ] && echo yes || echo NO)" >> "$1"
}
if [ -d .device-deps ]; then
  bash .device-deps/unpack.sh >/dev/null
  export CMAKE_PREFIX_PATH=/tmp/deps/usr
  export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
export KVRUN_SHARED=$PWD/.carry/shared
[ -d .carry/lib ] && export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
[ -f .carry/models.tar.xz ] && mkdir -p $KVRUN_SHARED/models && tar -xJf .carry/models.tar.xz -C $KVRUN_SHARED/models
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory,driver_version --format=csv | tee "$OUT/device.txt"
# The test binaries name /work/main (source dir) and /work/main/build-cuda/kvrun, as built here.
B=build-cuda
[ "$PWD" = /work/main ] || [ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
if [ -f .carry/bin.tar.xz ]; then
  mkdir -p $B && tar -xJf .carry/bin.tar.xz -C $B --strip-components=1
fi
if ! $B/kvrun --version > /dev/null 2>&1; then
  log "prebuilt binaries do not run here ($($B/kvrun --version 2>&1 | head -1)); building"
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DKVRUN_CUDA=ON \
    > "$OUT/build.log" 2>&1 && ninja -C $B -j16 kvrun make-synthetic-model server-load \
    test_cuda_arch test_cuda_attention test_cuda_backend test_cuda_invariance test_cuda_kv_quant test_cuda_moe test_cuda_ops \
    test_cuda_sampling >> "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
fi
log "binaries ready"
K=$B/kvrun
S=$B/make-synthetic-model
M=$KVRUN_SHARED/models
mkdir -p /tmp/models

# GPU vs CPU: greedy tokens on every carried model (f16 KV; q8 and q4 KV on some), the 4
# reference prompts as one JSONL batch per model and device, into gpu-vs-cpu.md (appended: a
# `greedy` run on another carry set adds its rows).
greedy_sweep() {
  req=/tmp/prompts.jsonl
  : > "$req"
  while IFS= read -r p; do
    p=${p//\"/\\\"}  # prompts.txt writes newlines as \n: a JSON escape already
    echo "{\"prompt\": \"$p\", \"n_predict\": 48, \"temperature\": 0}" >> "$req"
  done < $KVRUN_SHARED/reference/prompts.txt
  local tab=$OUT/gpu-vs-cpu${SWEEP_TAG:-}.md diffs=$OUT/gpu-vs-cpu${SWEEP_TAG:-}-diff.log
  if [ ! -f "$tab" ]; then
    echo "| model | KV | cpu == cuda (4 prompts x 48 greedy tokens) |" > "$tab"
    echo "|---|---|---|" >> "$tab"
  fi
  for m in $M/*.gguf; do
    kvs=f16
    case $(basename $m) in stories260K.gguf|stories260K-Q4_0.gguf|stories260K-w256-Q4_K_M.gguf|synth-*) kvs="f16 q8 q4";; esac
    for kv in $kvs; do
      # The CPU's tokens do not depend on the GPU switches: computed once per model and KV type.
      cc=/tmp/cpu-greedy/$(basename $m)-$kv
      [ -s "$cc" ] || { mkdir -p /tmp/cpu-greedy; timeout 60 $K run -m "$m" --jsonl --kv-type $kv --device cpu < "$req" \
        2>/dev/null | grep -o '"tokens":\[[^]]*\]' > "$cc"; }
      c=$(cat "$cc")
      g=$(timeout 60 $K run -m "$m" --jsonl --kv-type $kv --device cuda < "$req" 2>"$OUT/last-cuda-run.err" | grep -o '"tokens":\[[^]]*\]')
      r=NO; [ "$c" = "$g" ] && [ -n "$c" ] && r=yes
      [ $r = NO ] && { echo "== $(basename $m) $kv"; echo "cpu:  $c"; echo "cuda: $g"; cat "$OUT/last-cuda-run.err"; } >> "$diffs"
      echo "| $(basename $m) | $kv | $r |" >> "$tab"
    done
  done
  log "gpu-vs-cpu${SWEEP_TAG:-}: $(grep -c '| yes |' "$tab") same, $(grep -c '| NO |' "$tab") differ"
}

if [ "$what" = greedy ]; then  # the sweep alone, on another carry set (gpu-prepare.sh)
  greedy_sweep
  cat "$OUT/gpu-vs-cpu.md"
fi

if [ "$what" = variants ]; then
  # tg128 of each GEMV build (gpu-prepare.sh with KVRUN_GEMV_VARIANTS) beside the default
  # build, with the f32 GEMV (auto) and the 8-bit one (q8), on 7B Q4_0 and 8B Q4_K;
  # first their greedy tokens on a 2-layer 7B Q4_0 against the default build's (same bits).
  vs="base $(cd $B && ls kvrun-* 2>/dev/null | sed 's/^kvrun-//' | tr '\n' ' ')"
  bin_of() { [ $1 = base ] && echo $K || echo $B/kvrun-$1; }
  $S --preset llama2-7b --n-layer 2 --type Q4_0 -o /tmp/models/l2.gguf > /dev/null
  for g in auto q8; do
    for v in $vs; do
      KVRUN_GEMV=$g same_tokens "$OUT/variants-same.txt" "$v KVRUN_GEMV=$g" /tmp/models/l2.gguf Hello 24 $K "$(bin_of $v)"
    done
  done
  log "variants agree: $(grep -c yes "$OUT/variants-same.txt") yes, $(grep -c NO "$OUT/variants-same.txt") NO"
  $S --preset llama2-7b --type Q4_0 -o /tmp/models/llama2-7b-Q4_0.gguf > /dev/null
  $S --preset llama3-8b --type Q4_K -o /tmp/models/llama3-8b-Q4_K.gguf > /dev/null
  log "models made"
  echo "| build | KVRUN_GEMV | model | tg128 t/s | ± | % of copy bw |" > "$OUT/variants.md"
  echo "|---|---|---|---:|---:|---:|" >> "$OUT/variants.md"
  for v in $vs; do
    for g in auto q8; do
      for m in llama2-7b-Q4_0 llama3-8b-Q4_K; do
        r=$(KVRUN_GEMV=$g timeout 60 $(bin_of $v) bench -m /tmp/models/$m.gguf -p 0 -n 128 -r 3 -o md 2>/dev/null | grep '| tg128')
        echo "| $v | $g | $m | $(echo "$r" | awk -F'|' '{print $5 "|" $6 "|" $8}') |" >> "$OUT/variants.md"
      done
    done
    log "variant $v timed"
  done
  cat "$OUT/variants.md"
fi

if [ "$what" = profile ]; then
  # After a change to the GEMV default or a test: the named tests (KVRUN_TESTS), the greedy
  # sweep with the 8-bit activation GEMV (gpu-vs-cpu-q8.md), and Nsight Compute's per-kernel
  # times and DRAM bytes of a prompt and two decode steps of 2-layer 7B Q4_0 / 8B Q4_K models,
  # with the f32 and the 8-bit GEMV (clocks and caches as found: --clock-control none
  # --cache-control none).
  for t in ${KVRUN_TESTS:-}; do
    timeout 120 $B/$t > "$OUT/cuda-$t.log" 2>&1
    log "$t exit $? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/cuda-$t.log" | tr -s ' ' | tr '\n' ' ')"
  done
  SWEEP_TAG=-q8 KVRUN_GEMV=q8 greedy_sweep
  $S --preset llama2-7b --n-layer 2 --type Q4_0 -o /tmp/models/l2.gguf > /dev/null
  $S --preset llama3-8b --n-layer 2 --type Q4_K -o /tmp/models/l2k.gguf > /dev/null
  for m in l2 l2k; do
    for v in auto q8; do
      KVRUN_GEMV=$v KVRUN_CUDA_GRAPHS=0 timeout 90 ncu --clock-control none --cache-control none --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread \
        $K run -m /tmp/models/$m.gguf -p "Hello" -n 3 --temp 0 > "$OUT/ncu-$m-$v.csv" 2> "$OUT/ncu-$m-$v.err"
      log "ncu $m $v: $(wc -l < "$OUT/ncu-$m-$v.csv") lines"
    done
  done
fi

if want test; then
  # The cuda-labelled tests, run directly (ctest needs the build tree; the binaries may be
  # prebuilt): one line each in cuda-tests.md, the full output in cuda-<name>.log.
  echo "| test | exit | doctest summary |" > "$OUT/cuda-tests.md"; echo "|---|---:|---|" >> "$OUT/cuda-tests.md"
  for t in test_cuda_ops test_cuda_moe test_cuda_attention test_cuda_kv_quant test_cuda_sampling \
           test_cuda_invariance test_cuda_backend test_cuda_arch; do
    timeout 120 $B/$t > "$OUT/cuda-$t.log" 2>&1; rc=$?
    echo "| $t | $rc | $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/cuda-$t.log" | tr -s ' ' | tr '\n' ' ') |" \
      >> "$OUT/cuda-tests.md"
    log "$t exit $rc"
  done
  cat "$OUT/cuda-tests.md"
  greedy_sweep
  echo "| model | KV | cpu PPL | cuda PPL | diff % | cuda KVRUN_GEMV=q8 PPL | diff % |" > "$OUT/ppl-gpu-vs-cpu.md"
  echo "|---|---|---:|---:|---:|---:|---:|" >> "$OUT/ppl-gpu-vs-cpu.md"
  for m in $M/stories260K.gguf $M/stories260K-Q4_0.gguf $M/stories260K-w256-Q4_K_M.gguf $M/synth-llama-hd64-gqa4-Q4_0.gguf; do
    for kv in f16 q8; do
      a=$(timeout 60 $K perplexity -m $m -f $KVRUN_SHARED/text/wiki.test.raw -c 256 -b 256 --chunks 10 --kv-type $kv --device cpu 2>/dev/null | tail -1 | awk '{print $5}')
      b=$(timeout 60 $K perplexity -m $m -f $KVRUN_SHARED/text/wiki.test.raw -c 256 -b 256 --chunks 10 --kv-type $kv --device cuda 2>/dev/null | tail -1 | awk '{print $5}')
      q=$(KVRUN_GEMV=q8 timeout 60 $K perplexity -m $m -f $KVRUN_SHARED/text/wiki.test.raw -c 256 -b 256 --chunks 10 --kv-type $kv --device cuda 2>/dev/null | tail -1 | awk '{print $5}')
      echo "| $(basename $m) | $kv | $a | $b | $(python3 -c "print(f'{100*($b-$a)/$a:+.4f}')" 2>/dev/null) | $q | $(python3 -c "print(f'{100*($q-$a)/$a:+.4f}')" 2>/dev/null) |" >> "$OUT/ppl-gpu-vs-cpu.md"
    done
  done
  cat "$OUT/ppl-gpu-vs-cpu.md"
  log "test section done"
fi

# switch_ab NAME: tg128 at depth 0 (f16 KV) of /tmp/models/NAME.gguf under each combination of
# the opt-in launch switches (programmatic dependent launch KVRUN_PDL, the GEMV weight prefetch
# KVRUN_GEMV_PREFETCH, GEMV split-K KVRUN_GEMV_SPLIT, the 8-bit GEMV KVRUN_GEMV), one row each
# in switch-ab.md.
switch_ab() {
  [ -f "$OUT/switch-ab.md" ] || printf '%s\n' "| model | switches | tg128 t/s | ± | % of copy bw |" \
    "|---|---|---:|---:|---:|" > "$OUT/switch-ab.md"
  local sw r
  local all="KVRUN_PDL=on KVRUN_GEMV_PREFETCH=on KVRUN_GEMV_SPLIT=auto"
  for sw in "" "KVRUN_PDL=on" "KVRUN_GEMV_PREFETCH=on" "KVRUN_PDL=on KVRUN_GEMV_PREFETCH=on" \
            "KVRUN_GEMV_SPLIT=auto" "KVRUN_GEMV_SPLIT=8" "$all" "KVRUN_GEMV=q8" "KVRUN_GEMV=q8 $all" \
            "KVRUN_GEMV=q16" "KVRUN_GEMV=q16 $all"; do
    r=$(env $sw timeout 60 $K bench -m /tmp/models/$1.gguf -p 0 -n 128 -r 3 --kv-types f16 -o md \
      --kv-block-size 16 2>/dev/null | grep '| tg128')
    echo "| $1 | ${sw:-(defaults)} | $(echo "$r" | awk -F'|' '{print $5 "|" $6 "|" $8}') |" >> "$OUT/switch-ab.md"
  done
  log "switch A/B $1 done"
}

# bench_model NAME KVTYPES [ab]: pp512 and tg128 at depth 0 and 4096 into bench.md (again
# under the switches of KVRUN_CANDIDATE, e.g. "KVRUN_GEMV=q16 KVRUN_PDL=on", when set: the
# table a change of defaults would commit), then tg128
# at depth 0 with the opt-in 8-bit activation GEMV (KVRUN_GEMV=q8) for the A/B; with `ab`
# also pp512 with the f32 prefill attention (KVRUN_PREFILL_ATTN=f32) against the flash kernel.
bench_model() {
  echo "### $1" >> "$OUT/bench.md"
  timeout 150 $K bench -m /tmp/models/$1.gguf -p 512 -n 128 -r 3 --depth 0,4096 --kv-types $2 -o md \
    --kv-block-size 16 2>&1 | tee -a "$OUT/bench.md"
  if [ -n "${KVRUN_CANDIDATE:-}" ]; then  # the whole table again under the candidate defaults
    echo "#### $1, $KVRUN_CANDIDATE" >> "$OUT/bench.md"
    env $KVRUN_CANDIDATE timeout 150 $K bench -m /tmp/models/$1.gguf -p 512 -n 128 -r 3 --depth 0,4096 \
      --kv-types $2 -o md --kv-block-size 16 2>&1 | tee -a "$OUT/bench.md"
  fi
  echo "#### $1, KVRUN_GEMV=q8" >> "$OUT/bench.md"
  KVRUN_GEMV=q8 timeout 60 $K bench -m /tmp/models/$1.gguf -p 0 -n 128 -r 3 --kv-types f16 -o md \
    --kv-block-size 16 2>&1 | tee -a "$OUT/bench.md"
  if [ "${3:-}" = ab ]; then
    echo "#### $1, KVRUN_PREFILL_ATTN=f32" >> "$OUT/bench.md"
    KVRUN_PREFILL_ATTN=f32 timeout 90 $K bench -m /tmp/models/$1.gguf -p 512 -n 0 -r 3 --depth 0,4096 \
      --kv-types f16 -o md --kv-block-size 16 2>&1 | tee -a "$OUT/bench.md"
  fi
  echo >> "$OUT/bench.md"
  log "bench $1 done"
}

if [ "$what" = switches ]; then
  # The switch A/B alone (after a full session's bench, or for a new switch): 7B Q4_0 and
  # Q8_0, 8B Q4_K; first the GPU-vs-CPU greedy sweep with every switch that changes the
  # order of summation on (split-K; the others keep the bits, test_cuda_invariance) and with
  # q16, or, when KVRUN_CANDIDATE is set, one sweep under all of its switches instead (a
  # 15-minute lease has no time for three; the CPU's tokens are computed once).
  if [ -n "${KVRUN_CANDIDATE:-}" ]; then  # one sweep with every candidate switch on
    ( export $KVRUN_CANDIDATE; SWEEP_TAG=-candidate greedy_sweep )
  else
    SWEEP_TAG=-split KVRUN_GEMV_SPLIT=auto KVRUN_PDL=on KVRUN_GEMV_PREFETCH=on greedy_sweep
    SWEEP_TAG=-q16 KVRUN_GEMV=q16 greedy_sweep
  fi
  for m in llama2-7b:Q4_0 llama2-7b:Q8_0 llama3-8b:Q4_K; do
    $S --preset ${m%%:*} --type ${m##*:} -o /tmp/models/${m%%:*}-${m##*:}.gguf > /dev/null
    switch_ab ${m%%:*}-${m##*:}
    rm -f /tmp/models/${m%%:*}-${m##*:}.gguf
  done
  cat "$OUT/switch-ab.md"
fi

if want bench; then
  $S --preset llama2-7b --type Q4_0 -o /tmp/models/llama2-7b-Q4_0.gguf > /dev/null
  bench_model llama2-7b-Q4_0 f16,q8 ab
  $S --preset llama2-7b --type Q8_0 -o /tmp/models/llama2-7b-Q8_0.gguf > /dev/null
  bench_model llama2-7b-Q8_0 f16,q8
  rm -f /tmp/models/llama2-7b-Q8_0.gguf
  $S --preset llama3-8b --type Q4_K -o /tmp/models/llama3-8b-Q4_K.gguf > /dev/null
  bench_model llama3-8b-Q4_K f16,q8
fi

if want spec; then
  # Speculative decoding speed-up vs acceptance: synthetic targets whose layers from 4 on
  # barely change the residual stream (--residual-scale dials the draft/target agreement) and
  # drafts made of their first 4 layers; then the real stories pair.
  # spec_row LABEL LOG ARGS...: one greedy 256-token run with --spec-baseline, logged, as a row.
  spec_row() {
    local label=$1 log=$2 out tps up acc
    shift 2
    out=$(timeout 60 $K run "$@" --draft-n 8 -p "Once upon a time" -n 256 --temp 0 --ignore-eos --stats \
          --spec-baseline 2>&1 >/dev/null)
    echo "$out" > "$log"
    tps=$(echo "$out" | sed -n 's/^generation *\([0-9.]*\) tokens.*/\1/p' | head -1)
    up=$(echo "$out" | grep -io 'speed-up[^0-9]*[0-9.]*x' | head -1)
    acc=$(echo "$out" | sed -n 's/.*accepted (\([0-9.]*%\)).*/\1/p' | head -1)
    echo "| $label | $tps | $up | $acc |" >> "$OUT/spec.md"
  }
  for d in stories260K-Q8_0 stories260K-Q4_0 stories260K-L4-F32; do
    timeout 30 $K run -m $M/stories260K.gguf --draft-model $M/$d.gguf --draft-n 8 -p "Once upon a time" \
      -n 128 --temp 0 --stats --spec-baseline 2>&1 >/dev/null | sed "s/^/$d: /" >> "$OUT/spec-stories.log"
  done
  echo "| target | residual scale | draft | tokens/s | speed-up | acceptance |" > "$OUT/spec.md"
  echo "|---|---:|---|---:|---:|---:|" >> "$OUT/spec.md"
  for preset in llama-1b llama2-7b; do
    for rs in 0.0 0.05 0.2; do
      [ "$(left)" -gt 40 ] || { log "spec: out of time before $preset $rs"; break 2; }
      t=/tmp/models/$preset-spec-$rs.gguf; d=/tmp/models/$preset-spec-$rs-draft.gguf
      $S --preset $preset --type Q4_0 --residual-scale $rs --scaled-from 4 -o $t > /dev/null
      $S --draft-of $t --n-layer 4 -o $d > /dev/null
      spec_row "$preset Q4_0 | $rs | first 4 layers" "$OUT/spec-$preset-$rs.log" -m $t --draft-model $d
      [ $rs = 0.2 ] || rm -f $t $d
    done
    # Prompt lookup (no draft model) on the last target: pays where the text repeats itself.
    spec_row "$preset Q4_0 | $rs | 3-gram lookup" "$OUT/spec-$preset-lookup.log" -m $t --draft-ngram 3
    rm -f $t $d
    log "spec $preset done"
  done
  cat "$OUT/spec.md"
fi

if want extra; then
  # While time is left: q4 KV and the old tiled decode-attention kernel on llama2-7b Q4_0,
  # perplexity batching, the server under load, then the other architectures at full size.
  [ -f /tmp/models/llama2-7b-Q4_0.gguf ] || $S --preset llama2-7b --type Q4_0 -o /tmp/models/llama2-7b-Q4_0.gguf > /dev/null
  if [ "$(left)" -gt 60 ]; then
    echo "### llama2-7b-Q4_0, q4 KV; then KVRUN_DECODE_ATTN=tiled" >> "$OUT/bench-extra.md"
    timeout 60 $K bench -m /tmp/models/llama2-7b-Q4_0.gguf -p 0 -n 128 -r 3 --depth 0,4096 --kv-types q4 -o md 2>&1 | tee -a "$OUT/bench-extra.md"
    KVRUN_DECODE_ATTN=tiled timeout 60 $K bench -m /tmp/models/llama2-7b-Q4_0.gguf -p 0 -n 128 -r 3 --depth 4096 \
      --kv-types f16,q8,q4 -o md 2>&1 | tee -a "$OUT/bench-extra.md"
  fi
  if [ "$(left)" -gt 60 ]; then
    for b in 512 2048; do
      t0=$(date +%s%N)
      ppl=$(timeout 60 $K perplexity -m /tmp/models/llama2-7b-Q4_0.gguf -f $KVRUN_SHARED/text/wiki.test.raw \
            -c 512 -b $b --chunks 16 2>/dev/null | tail -1)
      t1=$(date +%s%N)
      echo "llama2-7b Q4_0, -c 512 -b $b, 16 chunks: $(( (t1 - t0) / 1000000 )) ms; $ppl" | tee -a "$OUT/ppl-batching.md"
    done
  fi
  if [ "$(left)" -gt 60 ]; then
    timeout 150 $K server -m /tmp/models/llama2-7b-Q4_0.gguf --parallel 32 -c 2048 --port 8090 2> "$OUT/server.log" &
    spid=$!
    for i in $(seq 1 60); do grep -q 'listening on' "$OUT/server.log" && break; sleep 1; done
    for c in 1 8 32; do
      timeout 60 $B/server-load --port 8090 -c $c -r 2 -n 128 --prompt-tokens 256 2>&1 | tail -1 | tee -a "$OUT/server-load.md"
    done
    kill -INT $spid; wait $spid || true
  fi
  rm -f /tmp/models/llama2-7b-Q4_0.gguf
  for spec in "qwen3-8b Q4_K_M" "gemma3-4b Q4_K_M" "qwen3-30b-a3b Q4_K_M" "gpt-oss-20b Q8_0" \
              "glm4.5-air Q4_K_M --n-layer 12" "ernie4.5-21b-a3b Q4_K_M" \
              "deepseek-v2-lite Q4_K_M --n-layer 8" "bitnet-b1.58-large TQ2_0" \
              "llama3-8b NVFP4" "llama4-scout Q4_K_M --n-layer 8" "glm4-9b Q4_K_M" \
              "seed-oss-36b Q4_K_M --n-layer 16"; do
    set -- $spec
    [ "$(left)" -gt 60 ] || { log "extra: out of time before $1"; break; }
    name=$1-$2; [ $# -gt 3 ] && name=$1-L$4-$2
    $S --preset $1 --type $2 "${@:3}" -o /tmp/models/$name.gguf > /dev/null
    bench_model $name f16
    rm -f /tmp/models/$name.gguf
  done
fi
if [ "$what" = gemv ]; then
  # Decode GEMV variants (scripts/gemv-variants.sh, built here by gpu-prepare.sh as
  # $B/kvrun-NAME) and q8: greedy tokens against the default build (the same for the variants;
  # q8 rounds x, so it may differ at near-ties), then tg128 of three 7B/8B models
  # and a speculative 9-token verification pass (7B, full agreement) per variant; ncu's
  # per-kernel times of two decode steps of a 2-layer llama2-7b Q4_0, and register/stack use.
  # q8: the default binary with the 8-bit activation GEMV (KVRUN_GEMV=q8).
  variants="base q8 $(cd $B && ls kvrun-* 2>/dev/null | sed 's/^kvrun-//' | tr '\n' ' ')"
  kv_of() { case $1 in base) echo $K;; q8) echo "env KVRUN_GEMV=q8 $K";; *) echo $B/kvrun-$1;; esac; }
  for m in stories260K-w256-Q4_K_M synth-llama-hd64-gqa4-Q4_0 stories260K-Q8_0; do
    for v in $variants; do
      same_tokens "$OUT/gemv-same.txt" "$m $v" $M/$m.gguf "Once upon a time" 48 $K "$(kv_of $v)"
    done
  done
  log "variants agree: $(grep -c yes "$OUT/gemv-same.txt") yes, $(grep -c NO "$OUT/gemv-same.txt") NO"
  $S --preset llama2-7b --type Q4_0 -o /tmp/models/llama2-7b-Q4_0.gguf > /dev/null
  $S --preset llama2-7b --type Q8_0 -o /tmp/models/llama2-7b-Q8_0.gguf > /dev/null
  $S --preset llama3-8b --type Q4_K -o /tmp/models/llama3-8b-Q4_K.gguf > /dev/null
  $S --preset llama2-7b --type Q4_0 --residual-scale 0 --scaled-from 4 -o /tmp/models/t7.gguf > /dev/null
  $S --draft-of /tmp/models/t7.gguf --n-layer 4 -o /tmp/models/d7.gguf > /dev/null
  $S --preset llama2-7b --n-layer 2 --type Q4_0 -o /tmp/models/l2.gguf > /dev/null
  log "models made"
  echo "| variant | model | tg128 t/s | % of copy bw |" > "$OUT/gemv.md"; echo "|---|---|---:|---:|" >> "$OUT/gemv.md"
  for v in $variants; do
    for m in llama2-7b-Q4_0 llama2-7b-Q8_0 llama3-8b-Q4_K; do
      r=$(timeout 60 $(kv_of $v) bench -m /tmp/models/$m.gguf -p 0 -n 128 -r 3 -o md 2>/dev/null | grep '| tg128')
      echo "| $v | $m | $(echo "$r" | awk -F'|' '{print $5}') | $(echo "$r" | awk -F'|' '{print $8}') |" >> "$OUT/gemv.md"
    done
    o=$(timeout 60 $(kv_of $v) run -m /tmp/models/t7.gguf --draft-model /tmp/models/d7.gguf --draft-n 8 \
        -p "Once upon a time" -n 256 --temp 0 --ignore-eos --stats --spec-baseline 2>&1 >/dev/null)
    echo "$o" > "$OUT/gemv-spec-$v.log"
    echo "| $v | spec 7B: $(echo "$o" | grep -E '^time in models' | tr -s ' ') | $(echo "$o" | grep -io 'speed-up[^0-9]*[0-9.]*x' | tr -s ' ') |" >> "$OUT/gemv.md"
    log "variant $v timed"
  done
  cat "$OUT/gemv.md"
  for v in base q8; do
    KVRUN_CUDA_GRAPHS=0 timeout 90 ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
      $(kv_of $v) run -m /tmp/models/l2.gguf -p "Hello" -n 3 --temp 0 > "$OUT/ncu-$v.csv" 2> "$OUT/ncu-$v.err"
    log "ncu $v: $(wc -l < "$OUT/ncu-$v.csv") lines"
  done
  for v in $variants; do
    echo "== $v" >> "$OUT/resource.txt"
    cuobjdump --dump-resource-usage $(kv_of $v) 2>&1 | grep -A1 gemv_kernel | grep -o 'REG:[0-9]* STACK:[0-9]* SHARED:[0-9]* LOCAL:[0-9]*' \
      | sort | uniq -c | sort -rn | head -8 >> "$OUT/resource.txt"
  done
  tail -40 "$OUT/resource.txt"
fi
log "done"
for f in cuda-tests.md gpu-vs-cpu.md ppl-gpu-vs-cpu.md bench.md spec.md; do
  [ -f "$OUT/$f" ] && { echo "== $f"; grep -v '| yes |' "$OUT/$f"; }
done
