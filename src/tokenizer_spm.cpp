// SentencePiece-style tokenizer (tokenizer.ggml.model = "llama"): spaces become "▁" (with
// one prepended), then adjacent pieces merge greedily by vocabulary score, and characters
// no piece covers fall back to <0xXX> byte tokens.
#include <array>
#include <functional>

#include "common.h"
#include "tokenizer_impl.h"
#include "unicode_text.h"

namespace kvrun {

namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581 "▁"

class SpmTokenizer final : public Tokenizer {
  public:
    explicit SpmTokenizer(const GgufFile& f);
    std::vector<TokenId> encode(std::string_view text, bool add_bos,
                                bool parse_special) const override;
    std::string token_to_piece(TokenId id, bool render_special) const override;

  private:
    void encode_escaped(std::string_view text, std::vector<TokenId>& out) const;
    void push_bytes(std::string_view bytes, std::vector<TokenId>& out) const;

    std::vector<float> scores_;          // [n_vocab] merge priority, higher first
    std::array<TokenId, 256> byte_ids_;  // token for each byte value, -1 when none
};

SpmTokenizer::SpmTokenizer(const GgufFile& f) {
    VocabDefaults d;
    d.bos = 1, d.eos = 2, d.unk = 0;
    d.add_bos = true, d.add_space_prefix = true;
    load_vocab(f, d);

    const size_t n = tokens_.size();
    scores_.assign(n, 0.0f);
    if (f.has("tokenizer.ggml.scores")) {
        const auto& scores = f.get_array("tokenizer.ggml.scores");
        if (scores.size() != n)
            fail("{}: tokenizer.ggml.scores has {} entries for {} tokens", f.path(), scores.size(),
                 n);
        for (size_t i = 0; i < n; ++i) {
            if (!scores[i].is_float() && !scores[i].is_int())
                fail("{}: tokenizer.ggml.scores[{}] is not a number", f.path(), i);
            scores_[i] = static_cast<float>(scores[i].as_float());
        }
    }

    static constexpr char kHex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
        const char name[7] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', 0};
        TokenId id = find_token(name);
        if (id < 0) id = find_token(std::string(1, static_cast<char>(b)));
        byte_ids_[b] = id >= 0 ? id : unk_;
    }
}

std::vector<TokenId> SpmTokenizer::encode(std::string_view text, bool add_bos,
                                          bool parse_special) const {
    std::vector<TokenId> out;
    if (add_bos && add_bos_ && bos_ >= 0) out.push_back(bos_);
    bool prev_special = true;  // text at the start or after a special token gets "▁"
    std::string escaped;
    for (const Fragment& fr : partition_special(text, parse_special)) {
        if (fr.token >= 0) {
            out.push_back(fr.token);
            prev_special = true;
            continue;
        }
        escaped.clear();
        if (add_space_prefix_ && prev_special) escaped += kSpaceMark;
        for (char c : text.substr(fr.offset, fr.length)) {
            if (c == ' ')
                escaped += kSpaceMark;
            else
                escaped += c;
        }
        encode_escaped(escaped, out);
        prev_special = false;
    }
    if (add_bos && add_eos_ && eos_ >= 0) out.push_back(eos_);
    return out;
}

void SpmTokenizer::encode_escaped(std::string_view text, std::vector<TokenId>& out) const {
    const auto pieces = merge_symbols<float>(
        text,
        [&](std::string_view l, std::string_view r) -> std::optional<float> {
            // Adjacent symbols are adjacent bytes of `text`: their merge is one view.
            const TokenId id = find_token(std::string_view(l.data(), l.size() + r.size()));
            return id >= 0 ? std::optional<float>(scores_[id]) : std::nullopt;
        },
        std::greater<float>());
    // Every merged symbol is a vocabulary piece; single characters may not be.
    for (const std::string_view piece : pieces) {
        const TokenId id = find_token(piece);
        if (id >= 0)
            out.push_back(id);
        else
            push_bytes(piece, out);
    }
}

void SpmTokenizer::push_bytes(std::string_view bytes, std::vector<TokenId>& out) const {
    for (char c : bytes) {
        const TokenId id = byte_ids_[static_cast<uint8_t>(c)];
        if (id < 0)
            fail("cannot encode byte 0x{:02X}: the vocabulary has no byte token and no <unk>",
                 static_cast<uint8_t>(c));
        out.push_back(id);
    }
}

std::string SpmTokenizer::token_to_piece(TokenId id, bool render_special) const {
    check_id(id);
    const int32_t type = token_types_[id];
    const std::string& text = tokens_[id];
    switch (type) {
        case kTokenControl:
        case kTokenUnknown:
            return render_special ? text : std::string();
        case kTokenUserDefined:
            return text;
        case kTokenNormal: {
            std::string piece;
            piece.reserve(text.size());
            for (size_t i = 0; i < text.size();) {
                if (text.compare(i, kSpaceMark.size(), kSpaceMark) == 0) {
                    piece += ' ';
                    i += kSpaceMark.size();
                } else {
                    piece += text[i++];
                }
            }
            return piece;
        }
        case kTokenByte: {
            // "<0xXX>": the hex digits after "<0x" (up to two) give the byte.
            unsigned value = 0;
            for (size_t i = 3; i < text.size() && i < 5; ++i) {
                const char c = text[i];
                const int digit = (c >= '0' && c <= '9')   ? c - '0'
                                  : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                  : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                                           : -1;
                if (digit < 0) break;
                value = value * 16 + static_cast<unsigned>(digit);
            }
            return std::string(1, static_cast<char>(value));
        }
        default:
            return {};  // unused / undefined tokens print nothing
    }
}

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(const GgufFile& file) {
    return std::make_unique<SpmTokenizer>(file);
}

}  // namespace kvrun
