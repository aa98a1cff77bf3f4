// libFuzzer target for the tokenizers: encodes arbitrary bytes with the shared llama.cpp
// vocabularies (SPM and byte-level BPE with each pre-tokenizer) and traps when
// - encoding valid UTF-8 throws, or any encoding yields an id outside the vocabulary;
// - valid UTF-8 encoded as text tokens only does not decode back to itself, unless the
//   vocabulary lacks a one-byte token for a byte of the text (Falcon's has none for most
//   control characters: llama.cpp drops them, and so do we) or, for SPM, the text holds
//   U+2581, SPM's own mark for a space;
// - streaming the ids through StreamDecoder differs from decode() (or, where the ids spell
//   malformed UTF-8, gives malformed text).
// Slow inputs (a pathological merge order) show up as libFuzzer timeouts.
//
// The first input byte picks the vocabulary (low nibble) and the flags (bit 4: parse
// special tokens, bit 5: add BOS); the rest is the text. The vocabularies are read from
// $KVRUN_SHARED/vocab (default ../shared/vocab, relative to the working directory).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common.h"
#include "gguf.h"
#include "tokenizer.h"
#include "unicode_text.h"

namespace {

struct Vocab {
    std::unique_ptr<kvrun::Tokenizer> tok;
    bool has_byte[256] = {};  // some token's piece is exactly this one byte
};
std::vector<Vocab> g_vocabs;

void load_vocabs() {
    const char* shared = std::getenv("KVRUN_SHARED");
    const std::string dir = std::string(shared ? shared : "../shared") + "/vocab/";
    for (const char* name : {"llama-spm", "phi-3", "gpt-2", "falcon", "deepseek-llm",
                             "deepseek-coder", "starcoder", "refact", "mpt", "gpt-neox"}) {
        const std::string path = dir + "ggml-vocab-" + name + ".gguf";
        try {
            Vocab v{kvrun::Tokenizer::from_gguf(kvrun::GgufFile::open(path))};
            for (kvrun::TokenId id = 0; id < v.tok->n_vocab(); ++id) {
                const std::string piece = v.tok->token_to_piece(id);
                if (piece.size() == 1) v.has_byte[uint8_t(piece[0])] = true;
            }
            g_vocabs.push_back(std::move(v));
        } catch (const kvrun::Error& e) {
            std::fprintf(stderr, "fuzz_tokenizer: %s\n", e.what());
            std::exit(1);
        }
    }
}

std::string stream(const kvrun::Tokenizer& tok, const std::vector<kvrun::TokenId>& ids) {
    kvrun::StreamDecoder dec(tok);
    std::string out;
    for (kvrun::TokenId id : ids) out += dec.push(id);
    return out + dec.flush();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
    load_vocabs();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const Vocab& vocab = g_vocabs[(data[0] & 15) % g_vocabs.size()];
    const kvrun::Tokenizer& tok = *vocab.tok;
    const bool parse_special = data[0] & 16, add_bos = data[0] & 32;
    const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
    const bool valid = kvrun::utf8_is_valid(text);
    std::vector<kvrun::TokenId> ids;
    try {
        ids = tok.encode(text, add_bos, parse_special);
    } catch (const kvrun::Error&) {
        if (valid) __builtin_trap();  // only malformed text may be refused
        return 0;
    }
    // Text tokens only (normal and byte ones), BOS/EOS added by add_bos aside: a special
    // token found in the text is rendered back, but SPM then prefixes the text after it with
    // a space, as llama.cpp does, and an unknown token stands for text it cannot spell.
    bool text_only = true;
    for (size_t i = 0; i < ids.size(); ++i) {
        const kvrun::TokenId id = ids[i];
        if (id < 0 || id >= tok.n_vocab()) __builtin_trap();
        const bool added = add_bos && ((i == 0 && id == tok.bos() && tok.add_bos()) ||
                                       (i + 1 == ids.size() && id == tok.eos() && tok.add_eos()));
        const int32_t type = tok.token_type(id);
        text_only =
            text_only && (added || type == kvrun::kTokenNormal || type == kvrun::kTokenByte);
    }
    if (!valid) return 0;
    bool all_bytes = true;
    for (char c : text) all_bytes = all_bytes && vocab.has_byte[uint8_t(c)];
    // SPM writes a space as U+2581, so a U+2581 in the text comes back as a space.
    const bool spm_space_mark =
        tok.model_name() == "llama" && text.find("\xE2\x96\x81") != std::string_view::npos;
    if (text_only && all_bytes && !spm_space_mark && tok.decode(ids) != text) __builtin_trap();
    // The stream gives decode()'s text, or, where the ids spell malformed UTF-8 (a byte the
    // vocabulary cannot write was dropped), valid text with U+FFFD in its place.
    const bool from_bos = !ids.empty() && ids[0] == tok.bos();
    const std::string streamed = stream(tok, ids), decoded = tok.decode(ids, from_bos);
    if (kvrun::utf8_is_valid(decoded) ? streamed != decoded : !kvrun::utf8_is_valid(streamed))
        __builtin_trap();
    return 0;
}
