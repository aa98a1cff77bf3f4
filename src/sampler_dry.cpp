// DRY ("don't repeat yourself"): a penalty on the tokens that would extend a repetition of
// the recent text. For every earlier position whose preceding tokens equal the sequence's last
// n tokens, the token that followed there is penalized by multiplier * base^(n - allowed).
// The match lengths of all positions at once come from the Z-function of the reversed window
// (linear time); runs are cut at the last sequence breaker of the text.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "common.h"
#include "sampler.h"

namespace kvrun {

namespace {

// z[i] = the length of the longest common prefix of s and s[i..] (z[0] = s.size()).
std::vector<int32_t> z_function(std::span<const TokenId> s) {
    const int32_t n = static_cast<int32_t>(s.size());
    std::vector<int32_t> z(static_cast<size_t>(n), 0);
    if (n == 0) return z;
    z[0] = n;
    int32_t left = 0, right = 0;  // [left, right): the rightmost match found so far
    for (int32_t i = 1; i < n; ++i) {
        int32_t k = 0;
        if (i < right) k = std::min(right - i, z[static_cast<size_t>(i - left)]);
        while (i + k < n && s[static_cast<size_t>(k)] == s[static_cast<size_t>(i + k)]) ++k;
        z[static_cast<size_t>(i)] = k;
        if (i + k > right) {
            left = i;
            right = i + k;
        }
    }
    return z;
}

// Index in window of the last token in which an occurrence of a breaker ends (its text
// completes the breaker, alone or after the tokens before it), or -1 when there is none.
int32_t last_breaker_end(std::span<const TokenId> window, const std::vector<std::string>& breakers,
                         const std::vector<std::string>& pieces) {
    size_t longest = 0;
    for (const auto& b : breakers) longest = std::max(longest, b.size());
    if (longest == 0) return -1;
    for (TokenId t : window)
        if (t < 0 || static_cast<size_t>(t) >= pieces.size())
            fail("sampler: recent token id {} is outside the vocabulary (0..{})", t,
                 pieces.size() - 1);
    // Walk back from the end: token j completes a breaker when the breaker occurs in the text
    // of tokens (.., j] ending inside token j. Only the last longest - 1 bytes before token j
    // can take part, so the text examined per token stays small.
    std::string text;
    for (int32_t j = static_cast<int32_t>(window.size()) - 1; j >= 0; --j) {
        const TokenId t = window[static_cast<size_t>(j)];
        const std::string& piece = pieces[static_cast<size_t>(t)];
        if (piece.empty()) continue;
        text.clear();  // up to longest - 1 bytes of the tokens before j, then piece j
        for (int32_t i = j - 1; i >= 0 && text.size() + 1 < longest; --i) {
            const std::string& prev = pieces[static_cast<size_t>(window[static_cast<size_t>(i)])];
            text.insert(0, prev);
        }
        if (text.size() + 1 > longest) text.erase(0, text.size() - (longest - 1));
        const size_t piece_begin = text.size();
        text += piece;
        for (const auto& b : breakers) {
            if (b.empty()) continue;
            // An occurrence ending inside the piece ends at or after piece_begin.
            const size_t from = piece_begin + 1 >= b.size() ? piece_begin + 1 - b.size() : 0;
            if (text.find(b, from) != std::string::npos) return j;
        }
    }
    return -1;
}

}  // namespace

std::vector<std::pair<TokenId, float>> dry_penalties(const SamplingParams& p,
                                                     std::span<const TokenId> history,
                                                     const std::vector<std::string>* pieces) {
    if (p.dry_multiplier == 0.0f || p.dry_penalty_last_n == 0 || history.size() < 2) return {};
    std::span<const TokenId> window = history;
    if (p.dry_penalty_last_n > 0 && window.size() > static_cast<size_t>(p.dry_penalty_last_n))
        window = window.last(static_cast<size_t>(p.dry_penalty_last_n));
    const int32_t n = static_cast<int32_t>(window.size());

    // The repeated run may only cover the tokens after the last breaker.
    int32_t limit = n;
    if (std::any_of(p.dry_sequence_breakers.begin(), p.dry_sequence_breakers.end(),
                    [](const std::string& b) { return !b.empty(); })) {
        if (pieces == nullptr)
            fail("sampler: DRY's sequence breakers need the vocabulary's token texts");
        limit = n - 1 - last_breaker_end(window, p.dry_sequence_breakers, *pieces);
    }
    if (limit < p.dry_allowed_length) return {};

    // Reversed, the window's suffixes become prefixes: z[i] is how many tokens before and
    // including window[n - 1 - i] equal the last ones.
    std::vector<TokenId> reversed(window.rbegin(), window.rend());
    const std::vector<int32_t> z = z_function(reversed);
    std::vector<std::pair<TokenId, int32_t>> longest;  // (token that followed, run length)
    for (int32_t i = 1; i < n; ++i) {
        const int32_t run = std::min(z[static_cast<size_t>(i)], limit);
        if (run >= p.dry_allowed_length)
            longest.emplace_back(window[static_cast<size_t>(n - i)], run);
    }
    std::sort(longest.begin(), longest.end());
    std::vector<std::pair<TokenId, float>> out;
    for (size_t i = 0; i < longest.size(); ++i) {
        // Sorted by (token, run): the last entry of each token holds its longest run.
        if (i + 1 < longest.size() && longest[i + 1].first == longest[i].first) continue;
        const double penalty =
            static_cast<double>(p.dry_multiplier) *
            std::pow(static_cast<double>(p.dry_base), longest[i].second - p.dry_allowed_length);
        out.emplace_back(longest[i].first, static_cast<float>(std::min(penalty, double(FLT_MAX))));
    }
    return out;
}

}  // namespace kvrun
