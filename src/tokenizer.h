// Tokenizers driven by GGUF metadata: SPM (tokenizer.ggml.model = "llama") and byte-level
// BPE ("gpt2") with the pre-tokenizer chosen by tokenizer.ggml.pre; special tokens;
// detokenization, including a streaming decoder that never splits a UTF-8 character.
// Behaviour follows llama.cpp's tokenizer exactly (same ids for the same text).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gguf.h"

namespace kvrun {

using TokenId = int32_t;

// GGUF token types (tokenizer.ggml.token_type).
enum TokenType : int32_t {
    kTokenUndefined = 0,
    kTokenNormal = 1,
    kTokenUnknown = 2,
    kTokenControl = 3,
    kTokenUserDefined = 4,
    kTokenUnused = 5,
    kTokenByte = 6,
};

class Tokenizer {
  public:
    // Reads tokenizer.ggml.* from the file. Throws Error for an unsupported model type or
    // inconsistent metadata (e.g. scores/token_type arrays of the wrong length).
    static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& file);
    virtual ~Tokenizer() = default;

    // add_bos: plays llama.cpp's add_special: prepend BOS when the vocabulary wants it
    // (tokenizer.ggml.add_bos_token, default true for SPM) and append EOS when it wants that
    // (add_eos_token, rare). parse_special: recognize control token texts (e.g. "<s>",
    // "<|im_end|>") in `text`. User-defined tokens are always recognized, as in llama.cpp.
    virtual std::vector<TokenId> encode(std::string_view text, bool add_bos,
                                        bool parse_special = false) const = 0;
    // The bytes a token stands for (byte-fallback and byte-level tokens become raw bytes;
    // control tokens become "" unless `render_special`). Throws Error for an id out of range.
    virtual std::string token_to_piece(TokenId id, bool render_special = false) const = 0;
    // Concatenated pieces. For SPM the leading space added by encode is removed when
    // `strip_leading_space`: the first piece after an optional leading BOS loses one leading
    // space, so decode(encode(s, any_bos)) == s for SPM as for BPE (special tokens aside).
    // render_special: control tokens show their text (llama.cpp's --special) instead of "".
    std::string decode(const std::vector<TokenId>& ids, bool strip_leading_space = true,
                       bool render_special = false) const;

    int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
    const std::string& token_text(TokenId id) const {  // throws Error when out of range
        check_id(id);
        return tokens_[id];
    }
    TokenId bos() const { return bos_; }  // -1 when the vocabulary has none
    TokenId eos() const { return eos_; }
    TokenId eot() const { return eot_; }  // end of turn (<|eot_id|>, <|im_end|>...), or -1
    TokenId unk() const { return unk_; }
    // Fill-in-the-middle tokens (tokenizer.ggml.fim_*_token_id, or recognized by their text
    // as llama.cpp does: <|fim_prefix|>, <PRE>, ...); -1 where the vocabulary has none.
    struct FimTokens {
        TokenId pre = -1, suf = -1, mid = -1, pad = -1, rep = -1, sep = -1;
    };
    const FimTokens& fim() const { return fim_; }
    bool add_bos() const { return add_bos_; }  // tokenizer.ggml.add_bos_token
    bool add_eos() const { return add_eos_; }
    bool add_space_prefix() const { return add_space_prefix_; }  // SPM: encode prepends "▁"
    bool is_eog(TokenId id) const;  // end of generation (EOS, EOT, ...)
    bool is_control(TokenId id) const;
    // Effective token type (a TokenType): the GGUF type, with end-of-turn/FIM-looking tokens
    // promoted to control as llama.cpp does. kTokenUndefined for an id out of range.
    int32_t token_type(TokenId id) const;
    const std::vector<TokenId>& eog_ids() const { return eog_ids_; }  // sorted
    // The id whose text is exactly `text` (e.g. "<|im_end|>"), or -1.
    TokenId find_token(std::string_view text) const;
    const std::string& model_name() const { return model_; }  // "llama", "gpt2", ...
    const std::string& pre_name() const { return pre_; }

  protected:
    // Defaults a concrete tokenizer passes to load_vocab before the file's keys apply.
    struct VocabDefaults {
        TokenId bos = -1, eos = -1, unk = -1;
        bool add_bos = false, add_eos = false, add_space_prefix = false;
    };
    // A piece of the input after special-token splitting: a token, or text [offset, +length).
    struct Fragment {
        TokenId token = -1;  // >= 0: a special token; -1: text
        size_t offset = 0, length = 0;
    };
    struct StringHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };

    // Loads tokens, types, special ids, add_* flags, EOG set and the special-token cache.
    void load_vocab(const GgufFile& file, const VocabDefaults& defaults);
    // Splits `text` at special-token occurrences (user-defined always; control and unknown
    // ones only when parse_special), longest token first, as llama.cpp does.
    std::vector<Fragment> partition_special(std::string_view text, bool parse_special) const;
    void check_id(TokenId id) const;  // throws Error when out of range

    std::vector<std::string> tokens_;
    std::vector<int32_t> token_types_;  // effective type per id (see token_type())
    std::vector<uint8_t> strip_flags_;  // per id: 1 = strip spaces left, 2 = right of match
    std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> token_to_id_;
    std::vector<TokenId> special_cache_;  // control/user-defined/unknown ids, longest first
    std::vector<TokenId> eog_ids_;
    TokenId bos_ = -1, eos_ = -1, eot_ = -1, unk_ = -1;
    FimTokens fim_;
    bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;
    std::string model_, pre_;
};

// Each token's text as generated output shows it ("" for control, unknown and unused tokens):
// [n_vocab]. What DRY's breakers and the grammar's token trie look at.
std::vector<std::string> token_text_pieces(const Tokenizer& tok);

// A token's text as output shows it, control tokens in `shown` (sorted) with their text
// (llama.cpp's preserved_tokens), other control tokens as "".
std::string token_piece_shown(const Tokenizer& tok, TokenId id, const std::vector<TokenId>& shown);

// Turns a stream of token ids into text chunks that are always whole UTF-8 characters.
// When the first token pushed is BOS (a whole sequence from its start) and the vocabulary
// adds a space prefix (SPM), the piece right after BOS loses its leading space, as decode()
// does; a stream that starts elsewhere (e.g. generated tokens after a prompt) keeps it.
class StreamDecoder {
  public:
    // render_special: control tokens show their text (Tokenizer::decode).
    explicit StreamDecoder(const Tokenizer& tok, bool render_special = false)
        : tok_(tok), render_special_(render_special) {}
    // These control tokens show their text even without render_special (llama.cpp's
    // preserved_tokens: a tool syntax's markers, so the reply can be read back).
    void show_tokens(std::vector<TokenId> ids);
    // Returns the text that became complete with this token (possibly empty). Malformed
    // byte sequences come out as U+FFFD.
    std::string push(TokenId id);
    // Returns what is left (incomplete bytes are replaced by U+FFFD).
    std::string flush();

  private:
    const Tokenizer& tok_;
    bool render_special_ = false;
    std::vector<TokenId> shown_;  // sorted
    std::string pending_;
    bool first_ = true;
    bool strip_next_ = false;  // BOS came first: strip the next piece's leading space
};

}  // namespace kvrun
