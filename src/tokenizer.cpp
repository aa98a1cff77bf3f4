// Tokenizer parts common to SPM and BPE: vocabulary loading from GGUF metadata (special ids,
// add_* flags, end-of-generation set), special-token splitting, decoding, StreamDecoder.
#include "tokenizer.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>

#include "common.h"
#include "tokenizer_impl.h"
#include "unicode_text.h"

namespace kvrun {

namespace {

constexpr uint8_t kStripLeft = 1, kStripRight = 2;

// DeepSeek's special tokens use fullwidth bars and "▁".
constexpr const char* kDeepseekEos = "<\uFF5Cend\u2581of\u2581sentence\uFF5C>";
constexpr const char* kDeepseekFimBegin = "<\uFF5Cfim\u2581begin\uFF5C>";
constexpr const char* kDeepseekFimHole = "<\uFF5Cfim\u2581hole\uFF5C>";
constexpr const char* kDeepseekFimEnd = "<\uFF5Cfim\u2581end\uFF5C>";

bool is_c_space(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

// Reads an optional token-id key; keeps `id` when absent or out of range (as llama.cpp).
void read_token_id(const GgufFile& f, const char* key, size_t n_vocab, TokenId& id) {
    const GgufValue* v = f.find(key);
    if (!v) return;
    if (!v->is_int()) fail("{}: tokenizer key '{}' is not an integer", f.path(), key);
    const int64_t x = v->as_int();
    if (x >= 0 && static_cast<uint64_t>(x) < n_vocab) id = static_cast<TokenId>(x);
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
    const std::string model = file.get_string_or("tokenizer.ggml.model", "");
    if (model.empty())
        throw Error(fmt::format("{}: no tokenizer (tokenizer.ggml.model is missing)", file.path()),
                    "use a GGUF file that includes its vocabulary");
    if (model == "llama") return make_spm_tokenizer(file);
    if (model == "gpt2") return make_bpe_tokenizer(file);
    throw Error(fmt::format("{}: unsupported tokenizer model '{}' (tokenizer.ggml.model)",
                            file.path(), model),
                "kvrun supports SPM ('llama') and byte-level BPE ('gpt2') vocabularies");
}

void Tokenizer::load_vocab(const GgufFile& f, const VocabDefaults& d) {
    model_ = f.get_string_or("tokenizer.ggml.model", "");
    pre_ = f.get_string_or("tokenizer.ggml.pre", "");

    const auto& toks = f.get_array("tokenizer.ggml.tokens");
    const size_t n = toks.size();
    if (n == 0) fail("{}: tokenizer.ggml.tokens is empty", f.path());
    if (n > static_cast<size_t>(INT32_MAX)) fail("{}: too many tokens ({})", f.path(), n);
    tokens_.resize(n);
    token_types_.assign(n, kTokenNormal);
    strip_flags_.assign(n, 0);
    token_to_id_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        if (toks[i].type != GgufValueType::STRING)
            fail("{}: tokenizer.ggml.tokens[{}] is not a string", f.path(), i);
        std::string word = toks[i].as_string();
        if (word.empty()) word = fmt::format("[EMPTY_{}]", i);  // as llama.cpp names them
        token_to_id_[word] = static_cast<TokenId>(i);           // a later duplicate wins
        tokens_[i] = std::move(word);
    }
    if (f.has("tokenizer.ggml.token_type")) {
        const auto& types = f.get_array("tokenizer.ggml.token_type");
        if (types.size() != n)
            fail("{}: tokenizer.ggml.token_type has {} entries for {} tokens", f.path(),
                 types.size(), n);
        for (size_t i = 0; i < n; ++i) {
            if (!types[i].is_int())
                fail("{}: tokenizer.ggml.token_type[{}] is not an integer", f.path(), i);
            const int64_t t = types[i].as_int();
            token_types_[i] =
                (t >= kTokenNormal && t <= kTokenByte) ? static_cast<int32_t>(t) : kTokenUndefined;
        }
    }

    auto valid = [n](TokenId id) { return id >= 0 && static_cast<size_t>(id) < n ? id : -1; };
    bos_ = valid(d.bos), eos_ = valid(d.eos), unk_ = valid(d.unk), eot_ = -1;
    fim_ = FimTokens{};
    TokenId eom = -1;
    read_token_id(f, "tokenizer.ggml.bos_token_id", n, bos_);
    read_token_id(f, "tokenizer.ggml.eos_token_id", n, eos_);
    read_token_id(f, "tokenizer.ggml.eot_token_id", n, eot_);
    read_token_id(f, "tokenizer.ggml.eom_token_id", n, eom);
    read_token_id(f, "tokenizer.ggml.unknown_token_id", n, unk_);
    read_token_id(f, "tokenizer.ggml.fim_pre_token_id", n, fim_.pre);
    read_token_id(f, "tokenizer.ggml.fim_suf_token_id", n, fim_.suf);
    read_token_id(f, "tokenizer.ggml.fim_mid_token_id", n, fim_.mid);
    read_token_id(f, "tokenizer.ggml.fim_pad_token_id", n, fim_.pad);
    read_token_id(f, "tokenizer.ggml.fim_rep_token_id", n, fim_.rep);
    read_token_id(f, "tokenizer.ggml.fim_sep_token_id", n, fim_.sep);
    read_token_id(f, "tokenizer.ggml.prefix_token_id", n, fim_.pre);  // older spellings
    read_token_id(f, "tokenizer.ggml.suffix_token_id", n, fim_.suf);
    read_token_id(f, "tokenizer.ggml.middle_token_id", n, fim_.mid);

    add_bos_ = f.get_bool_or("tokenizer.ggml.add_bos_token", d.add_bos);
    add_eos_ = f.get_bool_or("tokenizer.ggml.add_eos_token", d.add_eos);
    add_space_prefix_ = f.get_bool_or("tokenizer.ggml.add_space_prefix", d.add_space_prefix);

    // Tokens recognized by their text when the file names none: the first listed text
    // present becomes the id and is treated as a control token.
    auto detect = [&](TokenId& id, std::initializer_list<const char*> texts) {
        for (const char* t : texts) {
            const TokenId found = find_token(t);
            if (found < 0 || id >= 0) continue;
            id = found;
            token_types_[found] = kTokenControl;
        }
    };
    detect(eot_, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>",
                  "_<EOT>", kDeepseekEos});
    detect(eom, {"<|eom_id|>"});
    detect(fim_.pre, {"<|fim_prefix|>", "<fim-prefix>", kDeepseekFimBegin, "<PRE>"});
    detect(fim_.suf, {"<|fim_suffix|>", "<fim-suffix>", kDeepseekFimHole, "<SUF>"});
    detect(fim_.mid, {"<|fim_middle|>", "<fim-middle>", kDeepseekFimEnd, "<MID>"});
    detect(fim_.pad, {"<|fim_.pad|>", "<fim-pad>", "<PAD>"});
    detect(fim_.rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"});
    detect(fim_.sep, {"<|file_sep|>"});

    // End of generation: end-of-turn-looking texts, FIM pad/repo/sep, EOS, EOT, EOM.
    eog_ids_.clear();
    for (const char* t : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                          "<|eom_id|>", "<EOT>", "_<EOT>", "<|return|>", "<|call|>", "<|eot|>",
                          "<|eom|>"}) {  // (the last two: Llama 4)
        const TokenId id = find_token(t);
        if (id < 0) continue;
        eog_ids_.push_back(id);
        token_types_[id] = kTokenControl;
    }
    for (TokenId id : {fim_.pad, fim_.rep, fim_.sep, eos_, eot_, eom})
        if (id >= 0) eog_ids_.push_back(id);
    // gpt-oss's harmony format (llama.cpp's rule, keyed on "<|return|>" and "<|call|>"): a reply
    // ends with <|return|> (the answer) or <|call|> (a tool call); <|end|> only closes one
    // message, say the reasoning, before the next. The message structure shows in the output
    // (<|end|>, <|start|>, <|channel|>, <|message|>, <|constrain|> are text there), so that a
    // reply can be taken apart into reasoning, answer and calls.
    if (find_token("<|return|>") >= 0 && find_token("<|call|>") >= 0) {
        if (const TokenId end = find_token("<|end|>"); end >= 0 && end != eos_) {
            eog_ids_.erase(std::remove(eog_ids_.begin(), eog_ids_.end(), end), eog_ids_.end());
            if (eot_ == end) eot_ = -1;
        }
        for (const char* t :
             {"<|end|>", "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"})
            if (const TokenId id = find_token(t); id >= 0) token_types_[id] = kTokenUserDefined;
    }
    // Magistral's reasoning tags are control tokens of Mistral's vocabulary; a reply shows
    // them (llama.cpp keeps them as its chat format's preserved tokens), so that its
    // reasoning can be told from its answer everywhere a reply is read.
    for (const char* t : {"[THINK]", "[/THINK]"})
        if (const TokenId id = find_token(t); id >= 0 && token_types_[id] == kTokenControl)
            token_types_[id] = kTokenUserDefined;
    std::sort(eog_ids_.begin(), eog_ids_.end());
    eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());

    special_cache_.clear();
    for (size_t i = 0; i < n; ++i) {
        const int32_t t = token_types_[i];
        if (t == kTokenControl || t == kTokenUserDefined || t == kTokenUnknown)
            special_cache_.push_back(static_cast<TokenId>(i));
    }
    std::stable_sort(special_cache_.begin(), special_cache_.end(),
                     [&](TokenId a, TokenId b) { return tokens_[a].size() > tokens_[b].size(); });

    // Phi-3 vocabularies strip the whitespace after their special tokens (llama.cpp keys
    // this on the model name).
    std::string name = f.get_string_or("general.name", "");
    std::transform(name.begin(), name.end(), name.begin(),
                   [](char c) { return static_cast<char>(std::tolower(static_cast<uint8_t>(c))); });
    if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
        for (TokenId id : special_cache_) strip_flags_[id] |= kStripRight;
        if (TokenId id = find_token("</s>"); id >= 0) strip_flags_[id] |= kStripRight;
        for (const char* t : {"<unk>", "<s>", "<|endoftext|>"})
            if (TokenId id = find_token(t); id >= 0) strip_flags_[id] &= ~kStripRight;
    }
}

std::vector<Tokenizer::Fragment> Tokenizer::partition_special(std::string_view text,
                                                              bool parse_special) const {
    std::vector<Fragment> frags;
    if (text.empty()) return frags;
    frags.push_back({-1, 0, text.size()});
    std::vector<Fragment> next;
    for (TokenId id : special_cache_) {
        const int32_t type = token_types_[id];
        if (!parse_special && (type == kTokenControl || type == kTokenUnknown)) continue;
        const std::string& st = tokens_[id];
        if (text.find(st) == std::string_view::npos) continue;
        next.clear();
        for (const Fragment& fr : frags) {
            if (fr.token >= 0) {
                next.push_back(fr);
                continue;
            }
            size_t off = fr.offset, len = fr.length;
            while (len > 0) {
                const size_t m = text.find(st, off);
                if (m == std::string_view::npos || m + st.size() > off + len) {
                    next.push_back({-1, off, len});
                    break;
                }
                size_t left = m - off;
                if (strip_flags_[id] & kStripLeft)
                    while (left > 0 && is_c_space(text[off + left - 1])) --left;
                if (left > 0) next.push_back({-1, off, left});
                next.push_back({id, 0, 0});
                size_t r_off = m + st.size(), r_len = off + len - r_off;
                if (strip_flags_[id] & kStripRight)
                    while (r_len > 0 && is_c_space(text[r_off])) ++r_off, --r_len;
                off = r_off, len = r_len;
            }
        }
        frags.swap(next);
    }
    return frags;
}

std::vector<std::string> token_text_pieces(const Tokenizer& tok) {
    std::vector<std::string> pieces(static_cast<size_t>(tok.n_vocab()));
    for (TokenId t = 0; t < tok.n_vocab(); ++t) {
        const int32_t type = tok.token_type(t);
        if (type != kTokenControl && type != kTokenUnknown && type != kTokenUnused)
            pieces[static_cast<size_t>(t)] = tok.token_to_piece(t);
    }
    return pieces;
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids, bool strip_leading_space,
                              bool render_special) const {
    std::string out;
    bool strip = strip_leading_space && add_space_prefix_;
    size_t i = 0;
    if (strip && !ids.empty() && ids[0] == bos_) out += token_to_piece(ids[i++], render_special);
    for (; i < ids.size(); ++i) {
        std::string piece = token_to_piece(ids[i], render_special);
        if (strip && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
        strip = false;
        out += piece;
    }
    return out;
}

bool Tokenizer::is_eog(TokenId id) const {
    return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

bool Tokenizer::is_control(TokenId id) const {
    return token_type(id) == kTokenControl;
}

int32_t Tokenizer::token_type(TokenId id) const {
    if (id < 0 || id >= n_vocab()) return kTokenUndefined;
    return token_types_[id];
}

TokenId Tokenizer::find_token(std::string_view text) const {
    auto it = token_to_id_.find(text);
    return it == token_to_id_.end() ? -1 : it->second;
}

void Tokenizer::check_id(TokenId id) const {
    if (id < 0 || id >= n_vocab())
        fail("token id {} is out of range (vocabulary of {} tokens)", id, n_vocab());
}

void StreamDecoder::show_tokens(std::vector<TokenId> ids) {
    std::sort(ids.begin(), ids.end());
    shown_ = std::move(ids);
}

std::string token_piece_shown(const Tokenizer& tok, TokenId id, const std::vector<TokenId>& shown) {
    return tok.token_to_piece(id, std::binary_search(shown.begin(), shown.end(), id));
}

std::string StreamDecoder::push(TokenId id) {
    std::string piece =
        render_special_ ? tok_.token_to_piece(id, true) : token_piece_shown(tok_, id, shown_);
    if (strip_next_) {
        if (!piece.empty() && piece[0] == ' ') piece.erase(0, 1);
        strip_next_ = false;
    }
    if (first_) {
        first_ = false;
        strip_next_ = id == tok_.bos() && tok_.add_space_prefix();
    }
    pending_ += piece;
    return utf8_take_complete(pending_, false);
}

std::string StreamDecoder::flush() {
    return utf8_take_complete(pending_, true);
}

}  // namespace kvrun
