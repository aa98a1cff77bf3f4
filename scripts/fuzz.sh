#!/usr/bin/env bash
# Fuzzes with libFuzzer + ASan + UBSan for N seconds (default 600).
# Usage: scripts/fuzz.sh [gguf|tokenizer|grammar|json_schema|sampler|http|jinja] [seconds] [extra flags...]
#   gguf (default): the GGUF reader and the model config reader (fuzz/fuzz_gguf.cpp), seeded
#     from GgufWriter-made files and the smallest shared models.
#   tokenizer: SPM and byte-level BPE on the shared llama.cpp vocabularies
#     (fuzz/fuzz_tokenizer.cpp: ids in range, text round trips, streaming equals decode).
#   grammar: GBNF parsing and matching (fuzz/fuzz_grammar.cpp: clear errors, and matching
#     the whole text agrees with matching it byte by byte).
#   json_schema: JSON Schema -> GBNF (fuzz/fuzz_json_schema.cpp: clear errors, and every
#     converted grammar compiles).
#   sampler: every sampling parameter, NaN/inf logits, bad recent ids (fuzz/fuzz_sampler.cpp:
#     clear errors, distributions that sum to 1, draws in range with positive probability).
#   http: the server's HTTP/1.1 request parser (fuzz/fuzz_http.cpp: documented error statuses,
#     bodies within the limit, the same requests whether the bytes come whole or in pieces).
#   jinja: the chat-template interpreter (fuzz/fuzz_jinja.cpp: parse and render give text or
#     a clear error, never a crash or hang).
# Builds build-fuzz/fuzz_<target> (or under $KVRUN_FUZZ_BUILD; never the CMake build/ tree)
# with clang++ straight from the sources, and leaves any crashing input in fuzz/crashes/.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
target=gguf
case "${1:-}" in gguf | tokenizer | grammar | json_schema | sampler | http | jinja) target="$1"; shift ;; esac
seconds="${1:-600}"
shift || true

out="${KVRUN_FUZZ_BUILD:-build-fuzz}"
shared="${KVRUN_SHARED:-$root/../shared}"
corpus="fuzz/corpus/$target"
mkdir -p "$out" "$corpus" fuzz/crashes
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -Isrc)

if [ "$target" = gguf ]; then
    clang++ "${flags[@]}" fuzz/fuzz_gguf.cpp src/gguf.cpp src/gguf_writer.cpp src/quant.cpp src/quant_k.cpp src/quant_iq.cpp src/quant_ternary.cpp \
        src/model_config.cpp \
        -lfmt -o "$out/fuzz_gguf"
    KVRUN_FUZZ_WRITE_SEEDS="$corpus" "$out/fuzz_gguf"
    for m in stories260K-Q4_0.gguf stories260K-Q4_K_M.gguf; do
        [ -f "$shared/models/$m" ] && cp -f "$shared/models/$m" "$corpus/real_$m"
        # The header alone (metadata + tensor table) mutates faster than the whole file.
        [ -f "$shared/models/$m" ] && head -c 16384 "$shared/models/$m" > "$corpus/head_$m"
    done
    max_len=65536  # keeps mutations small; real models are still parsed up to 64 KiB
elif [ "$target" = grammar ]; then
    clang++ "${flags[@]}" fuzz/fuzz_grammar.cpp src/grammar.cpp src/grammar_match.cpp \
        src/tokenizer.cpp src/tokenizer_bpe.cpp src/tokenizer_spm.cpp src/pretokenizer.cpp \
        src/unicode_text.cpp src/gguf.cpp src/quant.cpp src/quant_k.cpp src/quant_iq.cpp src/quant_ternary.cpp -lfmt -lpcre2-8 -o "$out/fuzz_grammar"
    KVRUN_FUZZ_WRITE_SEEDS="$corpus" "$out/fuzz_grammar"
    max_len=4096
elif [ "$target" = json_schema ]; then
    clang++ "${flags[@]}" fuzz/fuzz_json_schema.cpp src/json_schema*.cpp src/grammar.cpp \
        src/grammar_match.cpp src/tokenizer.cpp src/tokenizer_bpe.cpp src/tokenizer_spm.cpp \
        src/pretokenizer.cpp src/unicode_text.cpp src/gguf.cpp src/quant.cpp src/quant_k.cpp src/quant_iq.cpp src/quant_ternary.cpp -lfmt -lpcre2-8 \
        -o "$out/fuzz_json_schema"
    KVRUN_FUZZ_WRITE_SEEDS="$corpus" "$out/fuzz_json_schema"
    max_len=4096
elif [ "$target" = sampler ]; then
    clang++ "${flags[@]}" fuzz/fuzz_sampler.cpp src/sampler.cpp src/sampler_dry.cpp -lfmt \
        -o "$out/fuzz_sampler"
    KVRUN_FUZZ_WRITE_SEEDS="$corpus" "$out/fuzz_sampler"
    max_len=1024
elif [ "$target" = http ]; then
    clang++ "${flags[@]}" fuzz/fuzz_http.cpp src/http_parser.cpp src/http_server.cpp -lfmt \
        -o "$out/fuzz_http"
    KVRUN_FUZZ_WRITE_SEEDS="$corpus" "$out/fuzz_http"
    max_len=4096
elif [ "$target" = jinja ]; then
    clang++ "${flags[@]}" fuzz/fuzz_jinja.cpp src/jinja*.cpp src/unicode_text.cpp -lfmt \
        -o "$out/fuzz_jinja"
    KVRUN_FUZZ_WRITE_SEEDS="$corpus" "$out/fuzz_jinja"
    max_len=4096
else
    if [ ! -d "$shared/vocab" ]; then
        echo "fuzz.sh: the tokenizer target needs the vocabularies in $shared/vocab" >&2
        exit 1
    fi
    clang++ "${flags[@]}" fuzz/fuzz_tokenizer.cpp src/tokenizer.cpp src/tokenizer_bpe.cpp \
        src/tokenizer_spm.cpp src/pretokenizer.cpp src/unicode_text.cpp src/gguf.cpp \
        src/quant.cpp src/quant_k.cpp src/quant_iq.cpp src/quant_ternary.cpp -lfmt -lpcre2-8 -o "$out/fuzz_tokenizer"
    # Seeds: the vocabulary suites' test strings, one file each, for every vocabulary.
    python3 - "$shared/vocab" "$corpus" <<'PY'
import pathlib, sys
vocab, corpus = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
n = 0
for inp in sorted(vocab.glob("*.inp")):
    for case in inp.read_bytes().split(b"\n__ggml_vocab_test__\n"):
        if case.strip(b"\n"):
            (corpus / f"seed_{n:05d}").write_bytes(bytes([n % 64]) + case[:4000])
            n += 1
PY
    max_len=4096
fi

export KVRUN_SHARED="$shared"
exec "$out/fuzz_$target" "$corpus" -max_total_time="$seconds" -max_len="$max_len" \
    -timeout=10 -rss_limit_mb=2048 -artifact_prefix=fuzz/crashes/ -print_final_stats=1 "$@"
