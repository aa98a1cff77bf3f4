// SentencePiece-style tokenizer (tokenizer.ggml.model = "llama"): spaces become "▁" (with
// one prepended), then adjacent pieces merge greedily by vocabulary score, and characters
// no piece covers fall back to <0xXX> byte tokens.
#include <array>
#include <queue>

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
    // Symbols: one per UTF-8 character, linked so merged neighbours drop out of the chain.
    struct Symbol {
        int prev, next;
        size_t start, n;  // bytes of `text`; n == 0 once merged into the left neighbour
    };
    std::vector<Symbol> syms;
    for (size_t off = 0; off < text.size();) {
        const size_t len = std::min(text.size() - off, utf8_lead_len(text[off]));
        const int idx = static_cast<int>(syms.size());
        syms.push_back({idx - 1, off + len == text.size() ? -1 : idx + 1, off, len});
        off += len;
    }
    if (syms.empty()) return;

    struct Bigram {
        int left, right;
        float score;
        size_t size;  // bytes of the merged text when queued (stale if it changed)
    };
    // Highest score first; among equal scores the leftmost pair.
    auto lower = [](const Bigram& a, const Bigram& b) {
        return a.score < b.score || (a.score == b.score && a.left > b.left);
    };
    std::priority_queue<Bigram, std::vector<Bigram>, decltype(lower)> queue(lower);
    auto try_add = [&](int l, int r) {
        if (l < 0 || r < 0) return;
        const std::string_view merged = text.substr(syms[l].start, syms[l].n + syms[r].n);
        const TokenId id = find_token(merged);
        if (id < 0) return;
        queue.push({l, r, scores_[id], merged.size()});
    };
    for (int i = 1; i < static_cast<int>(syms.size()); ++i) try_add(i - 1, i);

    while (!queue.empty()) {
        const Bigram bg = queue.top();
        queue.pop();
        Symbol& left = syms[bg.left];
        Symbol& right = syms[bg.right];
        if (left.n == 0 || right.n == 0 || left.n + right.n != bg.size) continue;
        left.n += right.n;
        right.n = 0;
        left.next = right.next;
        if (right.next >= 0) syms[right.next].prev = bg.left;
        try_add(left.prev, bg.left);
        try_add(bg.left, left.next);
    }

    // Every merged symbol is a vocabulary piece; single characters may not be.
    for (int i = 0; i != -1; i = syms[i].next) {
        const std::string_view piece = text.substr(syms[i].start, syms[i].n);
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
