// Internal to the tokenizer files: factories for the concrete tokenizers behind
// Tokenizer::from_gguf (SPM in tokenizer_spm.cpp, byte-level BPE in tokenizer_bpe.cpp).
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <queue>
#include <string_view>
#include <vector>

#include "tokenizer.h"
#include "unicode_text.h"

namespace kvrun {

std::unique_ptr<Tokenizer> make_spm_tokenizer(const GgufFile& file);
std::unique_ptr<Tokenizer> make_bpe_tokenizer(const GgufFile& file);

// The pairwise merge both tokenizers share: `text` starts as one symbol per UTF-8
// character; while some adjacent pair can merge, the pair of best priority (the leftmost
// among equals) becomes one symbol. `priority(left, right)` returns the pair's priority, or
// nullopt when it cannot merge; `better(a, b)` says whether priority a beats b (SPM: higher
// score, BPE: lower rank). Returns the final symbols, in order.
template <class P, class PriorityFn, class BetterFn>
std::vector<std::string_view> merge_symbols(std::string_view text, PriorityFn priority,
                                            BetterFn better) {
    struct Symbol {
        int prev, next;
        size_t start, n;  // bytes of `text`; n == 0 once merged into the left neighbour
    };
    std::vector<Symbol> syms;
    for (size_t off = 0; off < text.size();) {
        const size_t len = std::min(text.size() - off, utf8_lead_len(uint8_t(text[off])));
        const int idx = static_cast<int>(syms.size());
        syms.push_back({idx - 1, off + len == text.size() ? -1 : idx + 1, off, len});
        off += len;
    }
    struct Pair {
        int left, right;
        P prio;
        size_t left_n, right_n;  // symbol sizes when queued (stale once either changed)
    };
    auto worse = [&](const Pair& a, const Pair& b) {  // max-heap order: best on top
        if (better(b.prio, a.prio)) return true;
        if (better(a.prio, b.prio)) return false;
        return a.left > b.left;
    };
    std::priority_queue<Pair, std::vector<Pair>, decltype(worse)> queue(worse);
    auto piece = [&](int i) { return text.substr(syms[i].start, syms[i].n); };
    auto try_add = [&](int l, int r) {
        if (l < 0 || r < 0) return;
        if (std::optional<P> p = priority(piece(l), piece(r)))
            queue.push({l, r, *p, syms[l].n, syms[r].n});
    };
    for (int i = 1; i < static_cast<int>(syms.size()); ++i) try_add(i - 1, i);
    while (!queue.empty()) {
        const Pair pr = queue.top();
        queue.pop();
        Symbol& left = syms[pr.left];
        Symbol& right = syms[pr.right];
        if (left.n == 0 || right.n == 0 || left.n != pr.left_n || right.n != pr.right_n) continue;
        left.n += right.n;
        right.n = 0;
        left.next = right.next;
        if (right.next >= 0) syms[right.next].prev = pr.left;
        try_add(left.prev, pr.left);
        try_add(pr.left, left.next);
    }
    std::vector<std::string_view> out;
    for (int i = syms.empty() ? -1 : 0; i != -1; i = syms[i].next) out.push_back(piece(i));
    return out;
}

}  // namespace kvrun
