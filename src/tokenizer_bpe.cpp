// Byte-level BPE tokenizer (tokenizer.ggml.model = "gpt2"): pre-tokenize with the regexes
// of tokenizer.ggml.pre, map each byte to its GPT-2 stand-in character, then apply the
// ranked merges (tokenizer.ggml.merges, lowest rank first) inside each pre-token.
#include <array>
#include <functional>

#include "common.h"
#include "pretokenizer.h"
#include "tokenizer_impl.h"
#include "unicode_text.h"

namespace kvrun {

namespace {

// GPT-2's reversible byte <-> character map: printable Latin-1 bytes stand for themselves,
// the other 68 bytes (controls, space, DEL, NBSP, soft hyphen...) take U+0100 onwards.
struct ByteMap {
    std::array<std::string, 256> to_char;  // byte -> UTF-8 of its stand-in character
    std::array<int16_t, 324> to_byte;      // stand-in code point -> byte, -1 when none

    ByteMap() {
        to_byte.fill(-1);
        uint32_t next = 256;
        for (uint32_t b = 0; b < 256; ++b) {
            const bool printable =
                (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            const uint32_t cp = printable ? b : next++;
            utf8_append(to_char[b], cp);
            to_byte[cp] = static_cast<int16_t>(b);
        }
    }
};

const ByteMap& byte_map() {
    static const ByteMap map;
    return map;
}

class BpeTokenizer final : public Tokenizer {
  public:
    explicit BpeTokenizer(const GgufFile& f);
    std::vector<TokenId> encode(std::string_view text, bool add_bos,
                                bool parse_special) const override;
    std::string token_to_piece(TokenId id, bool render_special) const override;

  private:
    void encode_word(const std::string& word, std::vector<TokenId>& out) const;
    int merge_rank(std::string_view left, std::string_view right, std::string& key) const;

    // "left right" (a merges entry as written) -> rank; the first occurrence wins.
    std::unordered_map<std::string, int, StringHash, std::equal_to<>> ranks_;
    std::unique_ptr<RegexSplitter> splitter_;
    bool ignore_merges_ = false;
};

BpeTokenizer::BpeTokenizer(const GgufFile& f) {
    const PreTokenizerSpec spec = pretokenizer_spec(f.get_string_or("tokenizer.ggml.pre", ""));
    VocabDefaults d;
    d.bos = spec.no_bos ? -1 : 11, d.eos = 11, d.unk = -1;
    d.add_bos = spec.add_bos;
    load_vocab(f, d);
    ignore_merges_ = spec.ignore_merges;

    if (!f.has("tokenizer.ggml.merges"))
        throw Error(fmt::format("{}: BPE vocabulary without tokenizer.ggml.merges", f.path()),
                    "the GGUF file is incomplete; convert the model again");
    const auto& merges = f.get_array("tokenizer.ggml.merges");
    ranks_.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
        if (merges[i].type != GgufValueType::STRING)
            fail("{}: tokenizer.ggml.merges[{}] is not a string", f.path(), i);
        const std::string& m = merges[i].as_string();
        if (m.size() < 2 || m.find(' ', 1) == std::string::npos) continue;  // matches nothing
        ranks_.emplace(m, static_cast<int>(i));
    }
    splitter_ = std::make_unique<RegexSplitter>(spec.regexes);
}

std::vector<TokenId> BpeTokenizer::encode(std::string_view text, bool add_bos,
                                          bool parse_special) const {
    std::vector<TokenId> out;
    if (add_bos && add_bos_ && bos_ >= 0) out.push_back(bos_);
    const ByteMap& bm = byte_map();
    std::string mapped;
    for (const Fragment& fr : partition_special(text, parse_special)) {
        if (fr.token >= 0) {
            out.push_back(fr.token);
            continue;
        }
        for (const std::string& word : splitter_->split(text.substr(fr.offset, fr.length))) {
            mapped.clear();
            for (char c : word) mapped += bm.to_char[static_cast<uint8_t>(c)];
            encode_word(mapped, out);
        }
    }
    if (add_bos && add_eos_ && eos_ >= 0) out.push_back(eos_);
    return out;
}

int BpeTokenizer::merge_rank(std::string_view left, std::string_view right,
                             std::string& key) const {
    key.assign(left);
    key += ' ';
    key += right;
    auto it = ranks_.find(std::string_view(key));
    return it == ranks_.end() ? -1 : it->second;
}

void BpeTokenizer::encode_word(const std::string& word, std::vector<TokenId>& out) const {
    if (word.empty()) return;
    if (ignore_merges_) {
        if (TokenId id = find_token(word); id >= 0) {
            out.push_back(id);
            return;
        }
    }
    std::string key;
    const auto pieces = merge_symbols<int>(
        word,
        [&](std::string_view l, std::string_view r) -> std::optional<int> {
            const int rank = merge_rank(l, r, key);
            return rank >= 0 ? std::optional<int>(rank) : std::nullopt;
        },
        std::less<int>());
    for (const std::string_view piece : pieces) {
        if (TokenId id = find_token(piece); id >= 0) {
            out.push_back(id);
            continue;
        }
        // Not a vocabulary entry: llama.cpp falls back to single-byte entries, if any.
        for (char c : piece)
            if (TokenId id = find_token(std::string_view(&c, 1)); id >= 0) out.push_back(id);
    }
}

std::string BpeTokenizer::token_to_piece(TokenId id, bool render_special) const {
    check_id(id);
    const std::string& text = tokens_[id];
    switch (token_types_[id]) {
        case kTokenControl:
        case kTokenUnknown:
            return render_special ? text : std::string();
        case kTokenUserDefined:
            return text;
        case kTokenNormal: {
            const ByteMap& bm = byte_map();
            std::string piece;
            piece.reserve(text.size());
            for (uint32_t cp : utf8_decode_lenient(text)) {
                if (cp < bm.to_byte.size() && bm.to_byte[cp] >= 0)
                    piece += static_cast<char>(bm.to_byte[cp]);
                else
                    utf8_append(piece, cp);  // not a byte stand-in: keep the character
            }
            return piece;
        }
        default:
            return {};  // byte / unused / undefined tokens print nothing (as llama.cpp)
    }
}

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(const GgufFile& file) {
    return std::make_unique<BpeTokenizer>(file);
}

}  // namespace kvrun
