// Grammar-constrained generation. A GBNF grammar (llama.cpp's format: `name ::= ...` rules
// of literals, character classes, rule references, groups, alternatives, the * + ? {m,n}
// repetitions, and tokens: `<[id]>` or `<text>` for one token, `!<[id]>` or `!<text>` for
// any one token but that) is compiled into flat rules; GrammarState is a pushdown matcher over
// Unicode code points that follows every parse at once (a set of stacks); GrammarVocab holds a
// vocabulary's token bytes as a trie, so GrammarConstraint finds all tokens the grammar
// allows next in one walk that drops whole subtrees at their first impossible byte.
#pragma once

#include <cstdint>
#include <memory>
#include <regex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sampler.h"
#include "tokenizer.h"

namespace kvrun {

class Grammar {
  public:
    // One element of a rule alternative.
    enum class Kind : uint8_t {
        End,       // end of an alternative (the rule's next alternative follows, or the rule ends)
        Char,      // one code point in any of the ranges (`ranges` [first, first + n_ranges))
        NotChar,   // one code point in none of the ranges
        Rule,      // a reference to rule `value`
        Token,     // one token: the id `value` (a control token with no text included)
        NotToken,  // one token other than `value` (never an end-of-generation token)
    };
    // Token/NotToken written by their text (`<think>`) until grammar_bind_tokens finds the
    // ids: value is kNamedToken | an index into token_names(), and matches no token.
    static constexpr uint32_t kNamedToken = 0x80000000u;
    struct Element {
        Kind kind = Kind::End;
        uint32_t value = 0;     // Rule: rule index; Char/NotChar: first index into ranges()
        uint32_t n_ranges = 0;  // Char/NotChar: how many ranges
    };
    struct Range {
        uint32_t lo = 0, hi = 0;  // inclusive code points
    };

    // Parses GBNF text. Throws Error naming the line and column of the first problem, an
    // undefined or missing root rule, or left recursion (which the matcher cannot follow).
    // Tokens named by text stay unbound (grammar_bind_tokens).
    static std::shared_ptr<const Grammar> parse(std::string_view text,
                                                std::string_view root = "root");

    // Rule r's alternatives are consecutive element runs, each closed by an End element;
    // alternatives_of(r) gives the index of each alternative's first element.
    const std::vector<uint32_t>& alternatives_of(uint32_t rule) const { return alts_[rule]; }
    const Element& element(uint32_t index) const { return elements_[index]; }
    const std::vector<Range>& ranges() const { return ranges_; }
    uint32_t root() const { return root_; }
    size_t n_rules() const { return alts_.size(); }
    uint32_t n_elements() const { return static_cast<uint32_t>(elements_.size()); }
    const std::string& rule_name(uint32_t rule) const { return names_[rule]; }
    // Does code point `cp` match element e (Char or NotChar; never a token element)?
    bool matches(const Element& e, uint32_t cp) const;
    // Could some code point in [lo, hi] match element e (Char or NotChar)?
    bool matches_any(const Element& e, uint32_t lo, uint32_t hi) const;
    // Does token `id` match element e (Token or NotToken, bound)?
    static bool matches_token(const Element& e, int32_t id);
    // The texts of tokens written as `<text>`, brackets included (see kNamedToken); empty
    // once bound.
    const std::vector<std::string>& token_names() const { return token_names_; }
    bool has_tokens() const { return has_tokens_; }  // some Token/NotToken element

  private:
    friend class GrammarParser;
    friend std::shared_ptr<const Grammar> grammar_bind_tokens(std::shared_ptr<const Grammar>,
                                                              const Tokenizer&);
    std::vector<Element> elements_;
    std::vector<Range> ranges_;
    std::vector<std::vector<uint32_t>> alts_;  // [n_rules] first element of each alternative
    std::vector<std::string> names_;           // [n_rules] (generated rules: "name/3")
    std::vector<std::string> token_names_;
    uint32_t root_ = 0;
    bool has_tokens_ = false;
};

// The grammar with its tokens found in a vocabulary: `<text>` is the one token that `<text>`
// (brackets included: `<think>`, `<|im_end|>`) encodes to (special tokens included, as llama.cpp
// reads it) or, failing that, the token spelled `text` in the vocabulary; `<[id]>` must be below
// the vocabulary's size. Returns the grammar itself when there is nothing to bind; throws Error
// naming a token not found.
std::shared_ptr<const Grammar> grammar_bind_tokens(std::shared_ptr<const Grammar> grammar,
                                                   const Tokenizer& tok);

// The matcher's position after some text: every way the grammar can still go on (stacks of
// element indices, top last, each top a Char/NotChar element; an empty stack means the text
// so far is a complete sentence), plus the bytes of a code point not yet complete.
class GrammarState {
  public:
    explicit GrammarState(std::shared_ptr<const Grammar> grammar);

    // Consumes UTF-8 bytes (a code point may be split across calls). Returns false, leaving
    // the state unchanged, when no parse can take them (or they are not valid UTF-8).
    bool advance(std::string_view bytes);
    // Would advance(bytes) succeed? (No change.)
    bool accepts(std::string_view bytes) const;
    // Consumes one token: as its bytes (UTF-8 text, "" for a control token) and, between
    // whole code points, as itself for the parses that want a token element. False, with
    // nothing changed, when neither way goes on.
    bool advance_token(int32_t id, std::string_view bytes);
    bool accepts_token(int32_t id, std::string_view bytes) const;
    // The text so far is a whole sentence of the grammar (the end of generation may come).
    bool complete() const;
    // Nothing can follow: complete, and no parse wants more text.
    bool finished() const;
    const Grammar& grammar() const { return *grammar_; }

  private:
    friend class GrammarConstraint;
    using Stack = std::vector<uint32_t>;
    struct Utf8 {
        uint32_t value = 0;    // bits of the code point read so far
        int8_t remaining = 0;  // continuation bytes still expected
        int8_t length = 0;     // bytes of the whole sequence (its lead byte says)
    };
    // Pushes the expansion of `stack` (its top may be an End or a Rule) into out: every
    // stack whose top is a character element, or the empty stack.
    void expand(Stack stack, std::vector<Stack>& out) const;
    // The stacks after code point cp (deduplicated; empty when none matches).
    std::vector<Stack> step(const std::vector<Stack>& stacks, uint32_t cp) const;
    // Feeds one byte to (stacks, utf8); false when it cannot be taken.
    bool feed(std::vector<Stack>& stacks, Utf8& utf8, uint8_t byte) const;
    // The stacks after token id (advance_token) and the partial code point they leave;
    // empty when none goes on.
    std::vector<Stack> after_token(int32_t id, std::string_view bytes, Utf8& utf8) const;

    std::shared_ptr<const Grammar> grammar_;
    std::vector<Stack> stacks_;
    Utf8 utf8_;
};

// True when `text` is a whole sentence of the grammar.
bool grammar_accepts(const Grammar& grammar, std::string_view text);

// A vocabulary's token bytes as a trie (built once per model and shared).
class GrammarVocab {
  public:
    explicit GrammarVocab(const Tokenizer& tokenizer);
    int32_t n_vocab() const { return n_vocab_; }

  private:
    friend class GrammarConstraint;
    struct Node {
        uint32_t first_child = 0, n_children = 0;  // children: nodes_[first, first + n)
        uint32_t first_token = 0, n_tokens = 0;    // tokens ending here: token_ids_[...]
        uint8_t byte = 0;
    };
    std::vector<Node> nodes_;  // nodes_[0] is the root (empty prefix)
    std::vector<TokenId> token_ids_;
    std::vector<std::string> bytes_;  // [n_vocab] each token's bytes ("" for control tokens)
    std::vector<uint8_t> eog_;        // [n_vocab] 1 for end-of-generation tokens
    int32_t n_vocab_ = 0;
};

// What starts a lazy grammar (llama.cpp's grammar_lazy + grammar_triggers): the output is
// free text until one of these shows in it, and follows the grammar from there on. A word
// or a pattern (ECMAScript regex, searched in the text so far) begins the grammar's text:
// the grammar is matched from the word's first byte, or from the pattern's first capture
// group (the whole match without one); a full pattern must match all the text so far. A
// token (e.g. a control token with no text, such as "[TOOL_CALLS]") starts the grammar
// right after it. Patterns are looked for in the last 256 bytes of text, and full patterns
// only while the text is at most 1 KiB: std::regex backtracks, recursing per
// character, so these bounds keep a pattern such as "a[\s\S]*b" from exhausting the stack
// or taking quadratic time on a long reply. Words are looked for in all of it.
struct GrammarTriggers {
    std::vector<std::string> words;
    std::vector<std::string> patterns;
    std::vector<std::string> patterns_full;
    std::vector<TokenId> tokens;
    bool empty() const {
        return words.empty() && patterns.empty() && patterns_full.empty() && tokens.empty();
    }
};

// One sequence's grammar: which tokens may come next, and advancing by the chosen one.
// End-of-generation tokens are allowed exactly when the text so far is complete; other
// tokens when their bytes continue some parse (tokens with no bytes never do) or a token
// element takes them. The grammar's tokens must be bound (grammar_bind_tokens). Copies share
// a cache of recent masks (by matcher state: inside a JSON string every character leads back
// to the same state), so they must stay on one thread.
class GrammarConstraint final : public TokenConstraint {
  public:
    GrammarConstraint(std::shared_ptr<const Grammar> grammar,
                      std::shared_ptr<const GrammarVocab> vocab);
    bool allows(TokenId token) const override;
    // mask: [n_vocab], set to 1 for allowed tokens and 0 for the rest.
    void allowed_mask(std::span<uint8_t> mask) const override;
    // Advances by a token when the grammar allows it (an end-of-generation token leaves the
    // state as it is); false, with nothing changed, when it does not.
    bool try_accept(TokenId token);
    // More tokens that end the generation like end-of-generation ones (a request's stop
    // tokens, e.g. a chat template's end of turn): allowed exactly when the text is complete.
    void set_end_tokens(std::vector<TokenId> tokens);
    // The same for a sampled token; throws Error when the grammar does not allow it.
    void accept(TokenId token);
    // Makes the grammar lazy (before the first token): every token is allowed, and the end
    // may come, until a trigger appears. Throws Error for a pattern that is not a valid
    // regex. A trigger whose text the grammar cannot start with is not one (the search goes
    // on past it).
    void set_lazy(const GrammarTriggers& triggers);
    bool triggered() const { return active_; }
    bool complete() const { return !active_ || state_.complete(); }
    bool finished() const { return active_ && state_.finished(); }
    const GrammarState& state() const { return state_; }

  private:
    // The mask walk visits trie nodes depth first. Its states (stacks + partial code point)
    // recur endlessly (inside a JSON string every character leads back to the same one), so
    // each distinct state gets an id and each (state, byte) transition is computed once.
    struct Walk;
    void walk(Walk& w, uint32_t node, int32_t state, std::span<uint8_t> mask) const;
    struct MaskCache;
    bool is_end(TokenId token) const;  // token in range

    GrammarState state_;
    std::shared_ptr<const GrammarVocab> vocab_;
    std::shared_ptr<MaskCache> cache_;
    std::vector<TokenId> end_tokens_;  // sorted
    // Lazy: not active until a trigger; the text generated so far (from where the search
    // for a word or pattern goes on).
    struct Lazy {
        GrammarTriggers triggers;
        std::vector<std::regex> patterns, patterns_full;
    };
    bool trigger_text();  // searches seen_: true when the grammar took over
    bool active_ = true;
    std::shared_ptr<const Lazy> lazy_;
    std::string seen_;
    // Trigger starts in seen_ the grammar could not take the text from: more text cannot
    // change that, so they are not tried again.
    std::set<size_t> refused_starts_;
};

}  // namespace kvrun
