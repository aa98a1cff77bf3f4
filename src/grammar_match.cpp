// Matching text against a compiled grammar: GrammarState follows every parse at once as a
// set of element stacks and reads UTF-8 a byte at a time (a code point split across tokens
// is checked against the ranges it could still become); GrammarVocab and
// GrammarConstraint turn that into the set of tokens allowed next.
#include <algorithm>
#include <map>

#include "common.h"
#include "grammar.h"

namespace kvrun {

using Kind = Grammar::Kind;

namespace {

// Parses followed at once. Real grammars keep a handful; a deliberately ambiguous one could
// multiply them without end, so past this the matcher stops with an error instead of hanging.
constexpr size_t kMaxStacks = 20000;

void add_stack(std::vector<std::vector<uint32_t>>& out, std::vector<uint32_t>&& s) {
    if (out.size() >= kMaxStacks)
        fail(
            "grammar: the grammar is too ambiguous here (more than {} ways to parse the text "
            "at once); rewrite it so that fewer alternatives match the same text",
            kMaxStacks);
    out.push_back(std::move(s));
}

}  // namespace

GrammarState::GrammarState(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
    if (!grammar_) fail("grammar: no grammar given");
    for (uint32_t alt : grammar_->alternatives_of(grammar_->root())) expand({alt}, stacks_);
    std::sort(stacks_.begin(), stacks_.end());
    stacks_.erase(std::unique(stacks_.begin(), stacks_.end()), stacks_.end());
}

void GrammarState::expand(Stack stack, std::vector<Stack>& out) const {
    for (;;) {
        if (stack.empty()) {
            add_stack(out, std::move(stack));
            return;
        }
        const uint32_t pos = stack.back();
        const Grammar::Element& e = grammar_->element(pos);
        if (e.kind == Kind::End) {  // this rule is done: continue below it
            stack.pop_back();
            continue;
        }
        if (e.kind != Kind::Rule) {
            add_stack(out, std::move(stack));
            return;
        }
        // A rule reference: its continuation (unless the alternative ends there, which keeps
        // right-recursive repetitions from growing the stack), then each alternative on top.
        stack.pop_back();
        if (grammar_->element(pos + 1).kind != Kind::End) stack.push_back(pos + 1);
        const auto& alts = grammar_->alternatives_of(e.value);
        for (size_t i = 0; i + 1 < alts.size(); ++i) {
            Stack s = stack;
            s.push_back(alts[i]);
            expand(std::move(s), out);
        }
        stack.push_back(alts.back());
    }
}

std::vector<GrammarState::Stack> GrammarState::step(const std::vector<Stack>& stacks,
                                                    uint32_t cp) const {
    std::vector<Stack> out;
    for (const Stack& s : stacks) {
        if (s.empty()) continue;
        const uint32_t pos = s.back();
        if (!grammar_->matches(grammar_->element(pos), cp)) continue;
        Stack next(s.begin(), s.end() - 1);
        if (grammar_->element(pos + 1).kind != Kind::End) next.push_back(pos + 1);
        expand(std::move(next), out);
    }
    if (out.size() > 1) {
        std::sort(out.begin(), out.end());
        out.erase(std::unique(out.begin(), out.end()), out.end());
    }
    return out;
}

bool GrammarState::feed(std::vector<Stack>& stacks, Utf8& utf8, uint8_t byte) const {
    if (utf8.remaining == 0) {
        if (byte < 0x80) {
            utf8 = {byte, 0, 1};
        } else if ((byte & 0xE0) == 0xC0) {
            utf8 = {byte & 0x1Fu, 1, 2};
        } else if ((byte & 0xF0) == 0xE0) {
            utf8 = {byte & 0x0Fu, 2, 3};
        } else if ((byte & 0xF8) == 0xF0) {
            utf8 = {byte & 0x07u, 3, 4};
        } else {
            return false;  // a continuation byte or an invalid lead
        }
    } else {
        if ((byte & 0xC0) != 0x80) return false;
        utf8.value = (utf8.value << 6) | (byte & 0x3Fu);
        utf8.remaining--;
    }
    // The code points this sequence can still become, without overlong encodings (a "{"
    // spelled in four bytes), values past U+10FFFF or surrogates: well-formed UTF-8 only.
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    const int shift = 6 * utf8.remaining;
    const uint32_t lo = std::max(utf8.value << shift, kMin[utf8.length]);
    const uint32_t hi = std::min((utf8.value << shift) | ((1u << shift) - 1), 0x10FFFFu);
    if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) return false;
    if (utf8.remaining > 0) {  // some stack must accept a code point this prefix can become
        return std::any_of(stacks.begin(), stacks.end(), [&](const Stack& s) {
            return !s.empty() && grammar_->matches_any(grammar_->element(s.back()), lo, hi);
        });
    }
    auto next = step(stacks, utf8.value);
    if (next.empty()) return false;
    stacks = std::move(next);
    utf8 = {};
    return true;
}

bool GrammarState::advance(std::string_view bytes) {
    std::vector<Stack> stacks = stacks_;
    Utf8 utf8 = utf8_;
    for (char c : bytes)
        if (!feed(stacks, utf8, static_cast<uint8_t>(c))) return false;
    stacks_ = std::move(stacks);
    utf8_ = utf8;
    return true;
}

bool GrammarState::accepts(std::string_view bytes) const {
    GrammarState copy = *this;
    return copy.advance(bytes);
}

std::vector<GrammarState::Stack> GrammarState::after_token(int32_t id, std::string_view bytes,
                                                           Utf8& utf8) const {
    std::vector<Stack> out;
    utf8 = utf8_;
    if (!bytes.empty()) {  // as text
        std::vector<Stack> stacks = stacks_;
        bool ok = true;
        for (char c : bytes)
            if (!(ok = feed(stacks, utf8, static_cast<uint8_t>(c)))) break;
        // Text that leaves a code point open can only go on as text.
        if (ok && utf8.remaining > 0) return stacks;
        if (ok) out = std::move(stacks);
        utf8 = {};
    }
    if (utf8_.remaining == 0 && grammar_->has_tokens()) {  // as itself
        for (const Stack& s : stacks_) {
            if (s.empty() || !Grammar::matches_token(grammar_->element(s.back()), id)) continue;
            Stack next(s.begin(), s.end() - 1);
            if (grammar_->element(s.back() + 1).kind != Kind::End) next.push_back(s.back() + 1);
            expand(std::move(next), out);
        }
        std::sort(out.begin(), out.end());
        out.erase(std::unique(out.begin(), out.end()), out.end());
    }
    return out;
}

bool GrammarState::advance_token(int32_t id, std::string_view bytes) {
    Utf8 utf8;
    std::vector<Stack> next = after_token(id, bytes, utf8);
    if (next.empty()) return false;
    stacks_ = std::move(next);
    utf8_ = utf8;
    return true;
}

bool GrammarState::accepts_token(int32_t id, std::string_view bytes) const {
    Utf8 utf8;
    return !after_token(id, bytes, utf8).empty();
}

bool GrammarState::complete() const {
    return utf8_.remaining == 0 &&
           std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}

bool GrammarState::finished() const {
    return complete() && stacks_.size() == 1;
}

bool grammar_accepts(const Grammar& grammar, std::string_view text) {
    // A non-owning pointer: the state lives only inside this call.
    GrammarState state(std::shared_ptr<const Grammar>(&grammar, [](const Grammar*) {}));
    return state.advance(text) && state.complete();
}

// ---- the vocabulary trie ----

GrammarVocab::GrammarVocab(const Tokenizer& tok) : n_vocab_(tok.n_vocab()) {
    bytes_ = token_text_pieces(tok);
    eog_.assign(static_cast<size_t>(n_vocab_), 0);
    std::vector<TokenId> ids;
    for (TokenId t = 0; t < n_vocab_; ++t) {
        eog_[t] = tok.is_eog(t) ? 1 : 0;
        if (eog_[t]) bytes_[t].clear();  // an end, never text
        if (!bytes_[t].empty()) ids.push_back(t);
    }
    std::sort(ids.begin(), ids.end(), [&](TokenId a, TokenId b) {
        return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b;
    });
    token_ids_ = ids;
    // Children of a node are contiguous: each node's block is allocated before its children
    // are filled in. Tokens [lo, hi) of the sorted list share the node's prefix of `depth`.
    nodes_.resize(1);
    struct Todo {
        uint32_t node, lo, hi, depth;
    };
    std::vector<Todo> todo{{0, 0, static_cast<uint32_t>(ids.size()), 0}};
    while (!todo.empty()) {
        const Todo t = todo.back();
        todo.pop_back();
        uint32_t i = t.lo;
        while (i < t.hi && bytes_[ids[i]].size() == t.depth) ++i;
        nodes_[t.node].first_token = t.lo;
        nodes_[t.node].n_tokens = i - t.lo;
        std::vector<Todo> kids;
        while (i < t.hi) {
            const char b = bytes_[ids[i]][t.depth];
            uint32_t j = i;
            while (j < t.hi && bytes_[ids[j]][t.depth] == b) ++j;
            kids.push_back({0, i, j, t.depth + 1});
            i = j;
        }
        const auto first = static_cast<uint32_t>(nodes_.size());
        nodes_[t.node].first_child = first;
        nodes_[t.node].n_children = static_cast<uint32_t>(kids.size());
        nodes_.resize(nodes_.size() + kids.size());
        for (size_t k = 0; k < kids.size(); ++k) {
            kids[k].node = first + static_cast<uint32_t>(k);
            nodes_[kids[k].node].byte = static_cast<uint8_t>(bytes_[ids[kids[k].lo]][t.depth]);
            todo.push_back(kids[k]);
        }
    }
}

// ---- the constraint ----

// The last few masks, by matcher state (stacks, then the partial code point's key).
struct GrammarConstraint::MaskCache {
    using Key = std::pair<std::vector<GrammarState::Stack>, uint64_t>;
    static constexpr size_t kEntries = 16;
    std::map<Key, std::vector<uint8_t>> masks;
    std::vector<Key> order;  // oldest first
};

GrammarConstraint::GrammarConstraint(std::shared_ptr<const Grammar> grammar,
                                     std::shared_ptr<const GrammarVocab> vocab)
    : state_(std::move(grammar)), vocab_(std::move(vocab)), cache_(std::make_shared<MaskCache>()) {
    if (!vocab_) fail("grammar: no vocabulary given");
    const Grammar& g = state_.grammar();
    if (!g.token_names().empty())
        fail("grammar: token `{}` is not bound to the vocabulary", g.token_names()[0]);
    if (g.has_tokens())
        for (uint32_t i = 0; i < g.n_elements(); ++i) {
            const Grammar::Element& e = g.element(i);
            if ((e.kind == Kind::Token || e.kind == Kind::NotToken) &&
                e.value >= static_cast<uint32_t>(vocab_->n_vocab_))
                fail("grammar: token id {} is beyond the vocabulary of {} tokens", e.value,
                     vocab_->n_vocab_);
        }
}

void GrammarConstraint::set_end_tokens(std::vector<TokenId> tokens) {
    std::sort(tokens.begin(), tokens.end());
    end_tokens_ = std::move(tokens);
    cache_ = std::make_shared<MaskCache>();  // masks made without them no longer hold
}

bool GrammarConstraint::is_end(TokenId token) const {
    return vocab_->eog_[token] || std::binary_search(end_tokens_.begin(), end_tokens_.end(), token);
}

bool GrammarConstraint::allows(TokenId token) const {
    if (token < 0 || token >= vocab_->n_vocab_) return false;
    if (!active_) return true;
    if (is_end(token)) return state_.complete();
    return state_.accepts_token(token, vocab_->bytes_[token]);
}

struct GrammarConstraint::Walk {
    struct State {
        std::vector<GrammarState::Stack> stacks;
        GrammarState::Utf8 utf8;
    };
    std::vector<State> states;
    std::map<std::pair<std::vector<GrammarState::Stack>, uint32_t>, int32_t> ids;
    std::vector<int32_t> next;  // [states][256]: -2 not computed yet, -1 refused, else a state

    int32_t intern(State st) {
        const uint32_t utf8_key = (st.utf8.value << 4) |
                                  (static_cast<uint32_t>(st.utf8.remaining) << 2) |
                                  static_cast<uint32_t>(st.utf8.length & 3);
        auto [it, added] =
            ids.try_emplace({st.stacks, utf8_key}, static_cast<int32_t>(states.size()));
        if (added) {
            states.push_back(std::move(st));
            next.resize(next.size() + 256, -2);
        }
        return it->second;
    }
};

void GrammarConstraint::walk(Walk& w, uint32_t node, int32_t state, std::span<uint8_t> mask) const {
    const GrammarVocab::Node& n = vocab_->nodes_[node];
    for (uint32_t c = n.first_child; c < n.first_child + n.n_children; ++c) {
        const GrammarVocab::Node& child = vocab_->nodes_[c];
        const size_t slot = static_cast<size_t>(state) * 256 + child.byte;
        if (w.next[slot] == -2) {
            Walk::State st = w.states[static_cast<size_t>(state)];
            w.next[slot] =
                state_.feed(st.stacks, st.utf8, child.byte) ? w.intern(std::move(st)) : -1;
        }
        const int32_t to = w.next[slot];
        if (to < 0) continue;  // no token below this byte can be allowed
        for (uint32_t i = 0; i < child.n_tokens; ++i)
            mask[static_cast<size_t>(vocab_->token_ids_[child.first_token + i])] = 1;
        if (child.n_children > 0) walk(w, c, to, mask);
    }
}

void GrammarConstraint::allowed_mask(std::span<uint8_t> mask) const {
    if (mask.size() != static_cast<size_t>(vocab_->n_vocab_))
        fail("grammar: mask has {} entries for a vocabulary of {}", mask.size(), vocab_->n_vocab_);
    if (!active_) {
        std::fill(mask.begin(), mask.end(), 1);
        return;
    }
    const GrammarState::Utf8& u = state_.utf8_;
    MaskCache::Key key{state_.stacks_, (uint64_t(u.value) << 16) |
                                           (uint64_t(uint8_t(u.remaining)) << 8) |
                                           uint64_t(uint8_t(u.length))};
    if (auto it = cache_->masks.find(key); it != cache_->masks.end()) {
        std::copy(it->second.begin(), it->second.end(), mask.begin());
        return;
    }
    std::fill(mask.begin(), mask.end(), 0);
    Walk w;
    walk(w, 0, w.intern({state_.stacks_, state_.utf8_}), mask);
    if (state_.grammar().has_tokens() && state_.utf8_.remaining == 0)  // token elements
        for (const GrammarState::Stack& s : state_.stacks_) {
            if (s.empty()) continue;
            const Grammar::Element& e = state_.grammar().element(s.back());
            if (e.kind == Kind::Token && !is_end(static_cast<TokenId>(e.value))) {
                mask[e.value] = 1;
            } else if (e.kind == Kind::NotToken) {
                for (TokenId t = 0; t < vocab_->n_vocab_; ++t)
                    if (Grammar::matches_token(e, t) && !is_end(t))
                        mask[static_cast<size_t>(t)] = 1;
            }
        }
    if (state_.complete()) {
        for (size_t t = 0; t < mask.size(); ++t)
            if (vocab_->eog_[t]) mask[t] = 1;
        for (TokenId t : end_tokens_)
            if (t >= 0 && static_cast<size_t>(t) < mask.size()) mask[static_cast<size_t>(t)] = 1;
    } else {
        for (TokenId t : end_tokens_)
            if (t >= 0 && static_cast<size_t>(t) < mask.size()) mask[static_cast<size_t>(t)] = 0;
    }
    if (cache_->order.size() == MaskCache::kEntries) {
        cache_->masks.erase(cache_->order.front());
        cache_->order.erase(cache_->order.begin());
    }
    cache_->masks.emplace(key, std::vector<uint8_t>(mask.begin(), mask.end()));
    cache_->order.push_back(std::move(key));
}

void GrammarConstraint::set_lazy(const GrammarTriggers& triggers) {
    auto lazy = std::make_shared<Lazy>();
    lazy->triggers = triggers;
    auto compile = [](const std::vector<std::string>& in, std::vector<std::regex>& out) {
        for (const std::string& p : in) {
            try {
                out.emplace_back(p, std::regex::ECMAScript);
            } catch (const std::regex_error& e) {
                fail("grammar trigger pattern '{}' is not a valid regex: {}", p, e.what());
            }
        }
    };
    compile(triggers.patterns, lazy->patterns);
    compile(triggers.patterns_full, lazy->patterns_full);
    lazy_ = std::move(lazy);
    active_ = false;
    seen_.clear();
    refused_starts_.clear();
}

bool GrammarConstraint::trigger_text() {
    // Bounds of the regex searches (GrammarTriggers).
    constexpr size_t kPatternWindow = 256, kFullLimit = 1024;
    const size_t from = seen_.size() > kPatternWindow ? seen_.size() - kPatternWindow : 0;
    const std::string_view recent = std::string_view(seen_).substr(from);
    // Where the grammar would take the text from, earliest first.
    std::vector<size_t> starts;
    for (const std::string& w : lazy_->triggers.words)
        for (size_t p = seen_.find(w); p != std::string::npos && !w.empty();
             p = seen_.find(w, p + 1))
            starts.push_back(p);
    auto start_of = [](const std::cmatch& m) {
        return size_t(m.size() > 1 && m[1].matched ? m.position(1) : m.position(0));
    };
    for (const std::regex& re : lazy_->patterns)
        for (auto it = std::cregex_iterator(recent.data(), recent.data() + recent.size(), re);
             it != std::cregex_iterator(); ++it)
            starts.push_back(from + start_of(*it));
    if (seen_.size() <= kFullLimit)
        for (const std::regex& re : lazy_->patterns_full)
            if (std::cmatch m;
                std::regex_match(recent.data() - from, recent.data() + recent.size(), m, re))
                starts.push_back(start_of(m));
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    for (size_t p : starts) {
        if (refused_starts_.count(p)) continue;
        GrammarState s = state_;
        if (!s.advance(std::string_view(seen_).substr(p))) {
            refused_starts_.insert(p);
            continue;
        }
        state_ = std::move(s);
        active_ = true;
        seen_.clear();
        refused_starts_.clear();
        return true;
    }
    return false;
}

bool GrammarConstraint::try_accept(TokenId token) {
    if (token < 0 || token >= vocab_->n_vocab_) return false;
    if (!active_) {
        const std::vector<TokenId>& t = lazy_->triggers.tokens;
        if (std::find(t.begin(), t.end(), token) != t.end()) {
            active_ = true;
            seen_.clear();
            return true;
        }
        if (is_end(token)) return true;
        seen_ += vocab_->bytes_[token];
        trigger_text();
        return true;
    }
    if (is_end(token)) return state_.complete();                // the end: the state stays
    return state_.advance_token(token, vocab_->bytes_[token]);  // a refusal changes nothing
}

void GrammarConstraint::accept(TokenId token) {
    if (try_accept(token)) return;
    if (token >= 0 && token < vocab_->n_vocab_ && is_end(token))
        fail("grammar: generation ended before the grammar was complete");
    fail("grammar: token {} does not continue the grammar", token);
}

}  // namespace kvrun
