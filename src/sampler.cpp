// Sampler: the filter chain (logit bias -> penalties -> DRY -> top-n-sigma -> top-k ->
// typical -> top-p -> min-p -> XTC -> temperature), the filtered distribution, and seeded
// draws that are identical on every platform.
#include "sampler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "common.h"

namespace kvrun {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Higher logit first, lower token id first among equal logits (deterministic ties).
bool better(const std::pair<float, TokenId>& a, const std::pair<float, TokenId>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// Index of the entry of probs [n] that u in [0, 1) selects by inverse CDF, walking in index
// order; zero entries are never selected. Caller guarantees a positive total.
size_t draw_index(const float* probs, size_t n, double u) {
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += probs[i];
    const double target = u * total;
    double cum = 0.0;
    size_t last = 0;
    for (size_t i = 0; i < n; ++i) {
        if (probs[i] <= 0.0f) continue;
        cum += probs[i];
        last = i;
        if (target < cum) return i;
    }
    return last;  // rounding left target at the very top
}

void check_vocab(const float* p, int n_vocab, const char* what) {
    if (p == nullptr) fail("sampler: null {} buffer", what);
    if (n_vocab <= 0) fail("sampler: vocabulary size {} must be positive", n_vocab);
}

}  // namespace

void sampling_validate(const SamplingParams& p) {
    // Written so that NaN fails every check.
    if (!(p.temperature >= 0.0f) || std::isinf(p.temperature))
        fail("temperature must be a finite number >= 0 (got {}; 0 is greedy)", p.temperature);
    if (p.top_k < 0) fail("top-k must be >= 0 (got {}; 0 disables it)", p.top_k);
    if (!(p.top_p >= 0.0f && p.top_p <= 1.0f))
        fail("top-p must be between 0 and 1 (got {}; 1 disables it)", p.top_p);
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
        fail("min-p must be between 0 and 1 (got {}; 0 disables it)", p.min_p);
    if (!(p.repeat_penalty > 0.0f) || std::isinf(p.repeat_penalty))
        fail("repeat penalty must be a finite number > 0 (got {}; 1 disables it)",
             p.repeat_penalty);
    if (!std::isfinite(p.frequency_penalty))
        fail("frequency penalty must be a finite number (got {}; 0 disables it)",
             p.frequency_penalty);
    if (!std::isfinite(p.presence_penalty))
        fail("presence penalty must be a finite number (got {}; 0 disables it)",
             p.presence_penalty);
    for (const auto& [id, bias] : p.logit_bias)
        if (std::isnan(bias) || bias == std::numeric_limits<float>::infinity())
            fail("logit bias of token {} must be a finite number or -inf (got {})", id, bias);
    if (p.repeat_last_n < -1)
        fail("repeat-last-n must be >= -1 (got {}; -1 means every token, 0 disables it)",
             p.repeat_last_n);
    if (!(p.dry_multiplier >= 0.0f) || std::isinf(p.dry_multiplier))
        fail("DRY multiplier must be a finite number >= 0 (got {}; 0 disables it)",
             p.dry_multiplier);
    if (!(p.dry_base >= 1.0f) || std::isinf(p.dry_base))
        fail("DRY base must be a finite number >= 1 (got {})", p.dry_base);
    if (p.dry_allowed_length < 1)
        fail("DRY allowed length must be >= 1 (got {})", p.dry_allowed_length);
    if (p.dry_penalty_last_n < -1)
        fail("DRY penalty-last-n must be >= -1 (got {}; -1 means every token, 0 disables it)",
             p.dry_penalty_last_n);
    if (p.dry_sequence_breakers.size() > 64)
        fail("at most 64 DRY sequence breakers (got {})", p.dry_sequence_breakers.size());
    for (const auto& b : p.dry_sequence_breakers)
        if (b.size() > 40)
            fail("a DRY sequence breaker is at most 40 bytes (got {} bytes)", b.size());
    if (!std::isfinite(p.top_n_sigma))
        fail("top-n-sigma must be a finite number (got {}; <= 0 disables it)", p.top_n_sigma);
    if (!(p.typical_p >= 0.0f && p.typical_p <= 1.0f))
        fail("typical-p must be between 0 and 1 (got {}; 1 disables it)", p.typical_p);
    if (!(p.xtc_probability >= 0.0f && p.xtc_probability <= 1.0f))
        fail("XTC probability must be between 0 and 1 (got {}; 0 disables it)", p.xtc_probability);
    if (!(p.xtc_threshold >= 0.0f && p.xtc_threshold <= 1.0f))
        fail("XTC threshold must be between 0 and 1 (got {}; above 0.5 it never applies)",
             p.xtc_threshold);
    if (!(p.dynatemp_range >= 0.0f) || std::isinf(p.dynatemp_range))
        fail("dynamic temperature range must be a finite number >= 0 (got {}; 0 disables it)",
             p.dynatemp_range);
    if (!(p.dynatemp_exponent >= 0.0f) || std::isinf(p.dynatemp_exponent))
        fail("dynamic temperature exponent must be a finite number >= 0 (got {})",
             p.dynatemp_exponent);
    if (p.mirostat < 0 || p.mirostat > 2)
        fail("mirostat must be 0 (off), 1 or 2 (got {})", p.mirostat);
    if (!(p.mirostat_tau >= 0.0f) || std::isinf(p.mirostat_tau))
        fail("mirostat tau must be a finite number >= 0 (got {})", p.mirostat_tau);
    if (!(p.mirostat_eta >= 0.0f) || std::isinf(p.mirostat_eta))
        fail("mirostat eta must be a finite number >= 0 (got {})", p.mirostat_eta);
    for (size_t i = 0; i < p.order.size(); ++i) {
        if (static_cast<uint8_t>(p.order[i]) > static_cast<uint8_t>(SamplerStep::Temperature))
            fail("unknown sampler step {}", static_cast<int>(p.order[i]));
        for (size_t j = 0; j < i; ++j)
            if (p.order[j] == p.order[i])
                fail("sampler '{}' is listed twice", sampler_order_name({p.order[i]}));
    }
}

namespace {

constexpr std::pair<std::string_view, SamplerStep> kStepNames[] = {
    {"top_n_sigma", SamplerStep::TopNSigma},
    {"top-n-sigma", SamplerStep::TopNSigma},
    {"top_k", SamplerStep::TopK},
    {"top-k", SamplerStep::TopK},
    {"typ_p", SamplerStep::Typical},
    {"typical_p", SamplerStep::Typical},
    {"typical", SamplerStep::Typical},
    {"typ-p", SamplerStep::Typical},
    {"top_p", SamplerStep::TopP},
    {"top-p", SamplerStep::TopP},
    {"nucleus", SamplerStep::TopP},
    {"min_p", SamplerStep::MinP},
    {"min-p", SamplerStep::MinP},
    {"xtc", SamplerStep::Xtc},
    {"temperature", SamplerStep::Temperature},
    {"temp", SamplerStep::Temperature},
};

// Appends a step, refusing a repeat.
void add_step(std::vector<SamplerStep>& out, SamplerStep s, std::string_view name) {
    if (std::find(out.begin(), out.end(), s) != out.end())
        fail("sampler '{}' is listed twice", name);
    out.push_back(s);
}

}  // namespace

std::vector<SamplerStep> sampler_order_parse(std::string_view names) {
    std::vector<SamplerStep> out;
    size_t start = 0;
    while (start <= names.size()) {
        size_t end = names.find(';', start);
        if (end == std::string_view::npos) end = names.size();
        std::string_view name = names.substr(start, end - start);
        while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
        while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
        start = end + 1;
        if (name.empty()) continue;
        if (name == "penalties" || name == "dry") {
            if (!out.empty())
                fail(
                    "sampler '{}' must come before the filters (kvrun always applies the "
                    "penalties and DRY first)",
                    name);
            continue;
        }
        const auto* it = std::find_if(std::begin(kStepNames), std::end(kStepNames),
                                      [&](const auto& e) { return e.first == name; });
        if (it == std::end(kStepNames))
            fail(
                "unknown sampler '{}' (known: penalties, dry, top_n_sigma, top_k, typ_p, top_p, "
                "min_p, xtc, temperature)",
                name);
        add_step(out, it->second, name);
    }
    if (out.empty()) fail("--samplers lists no sampler");
    return out;
}

std::vector<SamplerStep> sampler_seq_parse(std::string_view letters) {
    std::string names;
    for (char ch : letters) {
        const char* name = nullptr;
        switch (ch) {
            case 'e':
                name = "penalties";
                break;
            case 'd':
                name = "dry";
                break;
            case 's':
                name = "top_n_sigma";
                break;
            case 'k':
                name = "top_k";
                break;
            case 'y':
                name = "typ_p";
                break;
            case 'p':
                name = "top_p";
                break;
            case 'm':
                name = "min_p";
                break;
            case 'x':
                name = "xtc";
                break;
            case 't':
                name = "temperature";
                break;
            default:
                fail("unknown sampler letter '{}' (known: e d s k y p m x t)", ch);
        }
        names += std::string(name) + ";";
    }
    return sampler_order_parse(names);
}

std::string sampler_order_name(const std::vector<SamplerStep>& order) {
    static const std::vector<SamplerStep> kDefault = {
        SamplerStep::TopNSigma, SamplerStep::TopK, SamplerStep::Typical,    SamplerStep::TopP,
        SamplerStep::MinP,      SamplerStep::Xtc,  SamplerStep::Temperature};
    std::string out;
    for (SamplerStep s : order.empty() ? kDefault : order) {
        // The first name of a step in kStepNames is its canonical (llama.cpp) one.
        const auto* it = std::find_if(std::begin(kStepNames), std::end(kStepNames),
                                      [&](const auto& e) { return e.second == s; });
        out += (out.empty() ? "" : ";") + std::string(it == std::end(kStepNames) ? "?" : it->first);
    }
    return out;
}

bool sampling_needs_host(const SamplingParams& p) {
    return (p.dry_multiplier != 0.0f && p.dry_penalty_last_n != 0) || p.top_n_sigma > 0.0f ||
           p.typical_p < 1.0f || p.xtc_probability > 0.0f || p.dynatemp_range > 0.0f ||
           p.mirostat != 0 || !p.order.empty();
}

int32_t sampling_history_length(const SamplingParams& p) {
    const bool dry = p.dry_multiplier != 0.0f && p.dry_penalty_last_n != 0;
    if (p.repeat_last_n < 0 || (dry && p.dry_penalty_last_n < 0)) return -1;
    return std::max(p.repeat_last_n, dry ? p.dry_penalty_last_n : 0);
}

std::vector<std::pair<TokenId, float>> merged_logit_bias(const SamplingParams& p, int64_t n_vocab) {
    std::vector<std::pair<TokenId, float>> out = p.logit_bias;
    for (const auto& [id, bias] : out)
        if (id < 0 || id >= n_vocab)
            fail("logit bias: token id {} is outside the vocabulary (0..{})", id, n_vocab - 1);
    std::stable_sort(out.begin(), out.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    size_t n = 0;
    for (size_t i = 0; i < out.size(); ++i) {
        if (n > 0 && out[n - 1].first == out[i].first)
            out[n - 1].second += out[i].second;  // -inf + finite stays -inf
        else
            out[n++] = out[i];
    }
    out.resize(n);
    return out;
}

std::vector<std::pair<TokenId, int32_t>> penalized_token_counts(const SamplingParams& p,
                                                                std::span<const TokenId> recent,
                                                                int64_t n_vocab) {
    const bool counted = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
    if ((p.repeat_penalty == 1.0f && !counted) || p.repeat_last_n == 0) return {};
    size_t n = recent.size();
    if (p.repeat_last_n > 0) n = std::min(n, static_cast<size_t>(p.repeat_last_n));
    std::vector<TokenId> ids(recent.end() - static_cast<std::ptrdiff_t>(n), recent.end());
    std::sort(ids.begin(), ids.end());
    std::vector<std::pair<TokenId, int32_t>> out;
    for (TokenId id : ids) {
        if (id < 0 || id >= n_vocab)
            fail("sampler: recent token id {} is outside the vocabulary (0..{})", id, n_vocab - 1);
        if (!out.empty() && out.back().first == id)
            ++out.back().second;
        else
            out.emplace_back(id, 1);
    }
    return out;
}

TokenLogprobs token_logprobs(const float* logits, int n_vocab, TokenId chosen, int32_t n_top) {
    check_vocab(logits, n_vocab, "logits");
    if (chosen < 0 || chosen >= n_vocab)
        fail("logprobs: token {} is outside the vocabulary (0..{})", chosen, n_vocab - 1);
    auto value = [&](int i) { return std::isnan(logits[i]) ? kNegInf : logits[i]; };
    float max = kNegInf;
    for (int i = 0; i < n_vocab; ++i) max = std::max(max, value(i));
    if (max == kNegInf) fail("logprobs: every logit is -inf or NaN");
    if (std::isinf(max)) max = FLT_MAX;  // +inf logits: treated as the largest finite value
    double z = 0.0;
    for (int i = 0; i < n_vocab; ++i)
        z += std::exp(static_cast<double>(std::min(value(i), FLT_MAX)) - max);
    const double log_z = std::log(z);  // relative to max, so huge logits keep their precision
    auto logprob = [&](int i) {
        const float v = value(i);
        return v == kNegInf
                   ? kNegInf
                   : static_cast<float>((static_cast<double>(std::min(v, FLT_MAX)) - max) - log_z);
    };
    TokenLogprobs out;
    out.chosen = {chosen, logprob(chosen)};
    const int n = std::clamp(n_top, 0, n_vocab);
    if (n > 0) {
        std::vector<std::pair<float, TokenId>> all(static_cast<size_t>(n_vocab));
        for (int i = 0; i < n_vocab; ++i) all[static_cast<size_t>(i)] = {value(i), i};
        std::partial_sort(all.begin(), all.begin() + n, all.end(), better);
        for (int i = 0; i < n; ++i) out.top.push_back({all[i].second, logprob(all[i].second)});
    }
    return out;
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params), rng_(params.seed), mu_(2.0f * params.mirostat_tau) {
    sampling_validate(params);
}

double Sampler::uniform() {
    return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

void Sampler::penalized_logits(const float* logits, int n_vocab, std::span<const TokenId> recent) {
    check_vocab(logits, n_vocab, "logits");
    work_.assign(logits, logits + n_vocab);
    for (float& l : work_) {
        if (std::isnan(l))
            l = kNegInf;
        else if (l == std::numeric_limits<float>::infinity())
            l = FLT_MAX;
    }
    if (!params_.logit_bias.empty()) {
        if (bias_.empty()) bias_ = merged_logit_bias(params_, n_vocab);
        for (const auto& [id, bias] : bias_) {
            if (id >= n_vocab) fail("logit bias: token id {} is outside the vocabulary", id);
            float& l = work_[static_cast<size_t>(id)];
            if (l != kNegInf) l = biased_logit(l, bias);
        }
    }
    if (std::all_of(work_.begin(), work_.end(), [](float l) { return l == kNegInf; }))
        fail(
            "sampler: every logit is -inf or NaN (or banned by a logit bias); nothing can be "
            "sampled");

    const bool counted = params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f;
    for (const auto& [id, count] : penalized_token_counts(params_, recent, n_vocab)) {
        float& l = work_[static_cast<size_t>(id)];
        if (l == kNegInf) continue;
        // As llama.cpp does: shrink toward zero when positive, push further down when
        // negative; then subtract the count and presence terms.
        l = l > 0.0f ? l / params_.repeat_penalty : l * params_.repeat_penalty;
        l = std::clamp(l, -FLT_MAX, FLT_MAX);  // a tiny or huge penalty stays finite
        if (counted)  // kept finite: a penalized token stays a candidate, however unlikely
            l = std::clamp(
                l - (float(count) * params_.frequency_penalty + params_.presence_penalty), -FLT_MAX,
                FLT_MAX);
    }
    for (const auto& [id, penalty] : dry_penalties(params_, recent, pieces_)) {
        if (id < 0 || id >= n_vocab)
            fail("sampler: recent token id {} is outside the vocabulary", id);
        float& l = work_[static_cast<size_t>(id)];
        if (l != kNegInf) l = std::max(l - penalty, -FLT_MAX);  // finite, as above
    }
}

TokenId Sampler::argmax_of_work() const {
    size_t best = 0;
    for (size_t i = 1; i < work_.size(); ++i) {
        if (work_[i] > work_[best]) best = i;
    }
    return static_cast<TokenId>(best);
}

void Sampler::mask_work() {
    mask_.assign(work_.size(), 0);
    constraint_->allowed_mask(mask_);
    bool any = false;
    for (size_t i = 0; i < work_.size(); ++i) {
        if (!mask_[i]) work_[i] = kNegInf;
        any |= work_[i] != kNegInf;
    }
    if (!any)
        fail(
            "sampler: the grammar allows no token of the vocabulary here (it wants a character "
            "no token can spell, or only tokens whose logits are NaN)");
}

TokenId Sampler::constrained_argmax() {
    TokenId best = argmax_of_work();
    if (constraint_ == nullptr || (work_[best] != kNegInf && constraint_->allows(best)))
        return best;
    mask_work();
    return argmax_of_work();
}

void Sampler::filter(const float* logits, int n_vocab, std::span<const TokenId> recent_tokens) {
    penalized_logits(logits, n_vocab, recent_tokens);
    if (params_.mirostat != 0) {
        mirostat_filter();
        return;
    }
    // top-n-sigma looks at every candidate's logit, so a constraint masks the vocabulary first
    // (as does a custom order, whose filters all see only allowed tokens).
    const bool sigma = params_.top_n_sigma > 0.0f;
    if (constraint_ != nullptr && (sigma || !params_.order.empty())) mask_work();
    collect_candidates();
    if (!params_.order.empty()) {
        ordered_filter();
        return;
    }
    if (sigma) top_n_sigma(cand_);

    // top-k: the k best (ties broken by lower id), then sorted best first.
    size_t k = params_.top_k > 0 ? static_cast<size_t>(params_.top_k) : cand_.size();
    if (constraint_ != nullptr && !sigma) {
        // The k best allowed tokens: usually found among the few best candidates, checked one
        // by one; otherwise (or without top-k) the constraint masks the whole vocabulary.
        bool found = false;
        const size_t window = std::min(cand_.size(), std::max<size_t>(4 * k, 256));
        if (k < cand_.size()) {
            std::nth_element(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(window),
                             cand_.end(), better);
            std::sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(window), better);
            size_t kept = 0;
            for (size_t i = 0; i < window && kept < k; ++i)
                if (constraint_->allows(cand_[i].second)) cand_[kept++] = cand_[i];
            if (kept == k) {
                cand_.resize(k);
                found = true;
            }
        }
        if (!found) {
            mask_work();
            std::erase_if(cand_, [&](const auto& c) { return !mask_[c.second]; });
        }
        k = std::min(k, cand_.size());
    }
    if (k < cand_.size()) {
        std::nth_element(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(k), cand_.end(),
                         better);
        cand_.resize(k);
    }
    std::sort(cand_.begin(), cand_.end(), better);
    if (params_.typical_p < 1.0f) typical(cand_);

    // top-p on the untempered softmax of the survivors, then min-p.
    if (params_.top_p < 1.0f) top_p(cand_);
    if (params_.min_p > 0.0f) min_p(cand_);

    // XTC: its coin drops the first `cut` candidates (best first). Always dropped when the
    // coin always comes up; otherwise the distribution is the mixture of both outcomes.
    size_t cut = xtc_cut(cand_);
    xtc_ids_.clear();
    if (cut > 0 && params_.xtc_probability >= 1.0f) {
        cand_.erase(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(cut));
        cut = 0;
    }
    for (size_t i = 0; i < cut; ++i) xtc_ids_.push_back(cand_[i].second);
    std::sort(xtc_ids_.begin(), xtc_ids_.end());

    // Temperature, softmax, then token-id order so draws match sample_from().
    std::sort(cand_.begin(), cand_.end(),
              [](const auto& a, const auto& b) { return a.second < b.second; });
    cand_prob_.resize(cand_.size());
    tempered_softmax(nullptr, cand_prob_);
    if (!xtc_ids_.empty()) {
        xtc_excluded_.assign(cand_.size(), 0);
        for (size_t i = 0; i < cand_.size(); ++i)
            xtc_excluded_[i] =
                std::binary_search(xtc_ids_.begin(), xtc_ids_.end(), cand_[i].second);
        xtc_prob_.resize(cand_.size());
        tempered_softmax(&xtc_excluded_, xtc_prob_);
        const double q = params_.xtc_probability;
        for (size_t i = 0; i < cand_.size(); ++i)
            cand_prob_[i] = static_cast<float>((1.0 - q) * cand_prob_[i] + q * xtc_prob_[i]);
    }
}

void Sampler::ordered_filter() {
    acc_.assign(work_.size(), 0.0);
    acc_ids_.clear();
    run_steps(cand_, 0, 1.0);
    std::sort(acc_ids_.begin(), acc_ids_.end());
    acc_ids_.erase(std::unique(acc_ids_.begin(), acc_ids_.end()), acc_ids_.end());
    cand_.clear();
    cand_prob_.clear();
    for (TokenId id : acc_ids_) {
        cand_.push_back({work_[size_t(id)], id});
        cand_prob_.push_back(static_cast<float>(acc_[size_t(id)]));
    }
    xtc_ids_.clear();
}

void Sampler::run_steps(std::vector<std::pair<float, TokenId>> c, size_t step, double weight) {
    auto sort_best_first = [&] { std::sort(c.begin(), c.end(), better); };
    for (; step < params_.order.size() && c.size() > 1; ++step) {
        switch (params_.order[step]) {
            case SamplerStep::TopNSigma:
                if (params_.top_n_sigma > 0.0f) top_n_sigma(c);
                break;
            case SamplerStep::TopK:
                if (params_.top_k > 0 && size_t(params_.top_k) < c.size()) {
                    std::nth_element(c.begin(), c.begin() + params_.top_k, c.end(), better);
                    c.resize(size_t(params_.top_k));
                }
                break;
            case SamplerStep::Typical:
                if (params_.typical_p < 1.0f) {
                    sort_best_first();
                    typical(c);
                }
                break;
            case SamplerStep::TopP:
                if (params_.top_p < 1.0f) {
                    sort_best_first();
                    top_p(c);
                }
                break;
            case SamplerStep::MinP:
                if (params_.min_p > 0.0f) {
                    sort_best_first();
                    min_p(c);
                }
                break;
            case SamplerStep::Xtc: {
                sort_best_first();
                const size_t cut = xtc_cut(c);
                if (cut == 0) break;
                const double q = params_.xtc_probability;
                std::vector<std::pair<float, TokenId>> dropped(c.begin() + std::ptrdiff_t(cut),
                                                               c.end());
                if (q >= 1.0) {
                    c = std::move(dropped);
                } else {  // both outcomes of the coin, each through the remaining steps
                    run_steps(std::move(dropped), step + 1, weight * q);
                    weight *= 1.0 - q;
                }
                break;
            }
            case SamplerStep::Temperature: {
                double t = params_.temperature;
                const double max = std::min_element(c.begin(), c.end(), better)->first;
                if (params_.dynatemp_range > 0.0f) {  // as tempered_softmax
                    double z = 0.0, entropy = 0.0;
                    for (const auto& x : c) z += std::exp(static_cast<double>(x.first) - max);
                    for (const auto& x : c) {
                        const double p = std::exp(static_cast<double>(x.first) - max) / z;
                        if (p > 0.0) entropy -= p * std::log(p);
                    }
                    t = dynamic_temperature(entropy, c.size());
                }
                if (!(t > 0.0)) {  // the best candidate (lowest id on ties)
                    c = {*std::min_element(c.begin(), c.end(), better)};
                    break;
                }
                // Relative to the best (softmax and every filter ignore a shift), so a tiny
                // temperature cannot overflow: the best becomes 0, the rest stay finite.
                for (auto& x : c)
                    x.first = static_cast<float>(
                        std::max((static_cast<double>(x.first) - max) / t, -double(FLT_MAX)));
                break;
            }
        }
    }
    // The softmax of what is left, weighted into the mixture.
    const double max = std::min_element(c.begin(), c.end(), better)->first;  // the best
    double z = 0.0;
    for (const auto& x : c) z += std::exp(static_cast<double>(x.first) - max);
    for (const auto& x : c) {
        acc_[size_t(x.second)] += weight * std::exp(static_cast<double>(x.first) - max) / z;
        acc_ids_.push_back(x.second);
    }
}

void Sampler::collect_candidates() {
    cand_.clear();
    for (size_t i = 0; i < work_.size(); ++i)
        if (work_[i] != kNegInf) cand_.emplace_back(work_[i], static_cast<TokenId>(i));
}

void Sampler::mirostat_filter() {
    if (constraint_ != nullptr) mask_work();
    collect_candidates();
    std::sort(cand_.begin(), cand_.end(), better);
    // The distribution at the temperature, best first.
    const double inv_t = 1.0 / static_cast<double>(params_.temperature);
    const double max = cand_.front().first;
    std::vector<double>& p = miro_p_;
    p.resize(cand_.size());
    double z = 0.0;
    for (size_t i = 0; i < cand_.size(); ++i)
        z += p[i] = std::exp((static_cast<double>(cand_[i].first) - max) * inv_t);
    for (double& x : p) x /= z;
    size_t keep = cand_.size();
    if (params_.mirostat == 2) {
        // The tokens whose surprise stays within mu (at least the best).
        keep = 0;
        while (keep < p.size() && -std::log2(p[keep]) <= mu_) ++keep;
        keep = std::max<size_t>(keep, 1);
    } else {
        // Mirostat 1: estimate the Zipf exponent s from the best 100 tokens, then the top-k
        // whose expected surprise is mu for a vocabulary of that shape.
        double num = 0.0, den = 0.0;
        for (size_t i = 0; i + 1 < std::min<size_t>(p.size(), 100); ++i) {
            if (!(p[i + 1] > 0.0)) break;
            const double t = std::log(double(i + 2) / double(i + 1));
            num += t * std::log(p[i] / p[i + 1]);
            den += t * t;
        }
        if (den > 0.0) {
            const double s = num / den, eps = s - 1.0;
            const double n = static_cast<double>(work_.size());
            const double k =
                std::pow(eps * std::pow(2.0, double(mu_)) / (1.0 - std::pow(n, -eps)), 1.0 / s);
            if (std::isfinite(k)) keep = static_cast<size_t>(std::clamp(k, 1.0, double(keep)));
        }
    }
    cand_.resize(keep);
    std::sort(cand_.begin(), cand_.end(),
              [](const auto& a, const auto& b) { return a.second < b.second; });
    cand_prob_.resize(cand_.size());
    z = 0.0;
    for (size_t i = 0; i < cand_.size(); ++i)
        z += std::exp((static_cast<double>(cand_[i].first) - max) * inv_t);
    for (size_t i = 0; i < cand_.size(); ++i)
        cand_prob_[i] =
            static_cast<float>(std::exp((static_cast<double>(cand_[i].first) - max) * inv_t) / z);
}

void Sampler::top_n_sigma(std::vector<std::pair<float, TokenId>>& cand) const {
    if (cand.size() < 2) return;
    double max = -DBL_MAX, sum = 0.0;
    for (const auto& c : cand) {
        max = std::max(max, static_cast<double>(c.first));
        sum += c.first;
    }
    const double mean = sum / static_cast<double>(cand.size());
    double var = 0.0;
    for (const auto& c : cand) var += (c.first - mean) * (c.first - mean);
    const double sigma = std::sqrt(var / static_cast<double>(cand.size()));
    const double floor = max - static_cast<double>(params_.top_n_sigma) * sigma;
    std::erase_if(cand, [&](const auto& c) { return static_cast<double>(c.first) < floor; });
}

void Sampler::top_p(std::vector<std::pair<float, TokenId>>& cand) const {
    const double max = cand.front().first;  // best first
    double z = 0.0;
    for (const auto& c : cand) z += std::exp(static_cast<double>(c.first) - max);
    double cum = 0.0;
    size_t keep = cand.size();
    for (size_t i = 0; i < cand.size(); ++i) {
        cum += std::exp(static_cast<double>(cand[i].first) - max) / z;
        if (cum >= params_.top_p) {
            keep = i + 1;
            break;
        }
    }
    cand.resize(keep);
}

void Sampler::min_p(std::vector<std::pair<float, TokenId>>& cand) const {
    const double threshold = static_cast<double>(cand.front().first) + std::log(params_.min_p);
    size_t keep = 1;
    while (keep < cand.size() && static_cast<double>(cand[keep].first) >= threshold) ++keep;
    cand.resize(keep);
}

double Sampler::dynamic_temperature(double entropy, size_t n) const {
    const double t = params_.temperature;
    const double norm = std::clamp(entropy / std::log(static_cast<double>(n)), 0.0, 1.0);
    const double lo = std::max(0.0, t - params_.dynatemp_range);
    const double hi = t + params_.dynatemp_range;
    return lo + (hi - lo) * std::pow(norm, static_cast<double>(params_.dynatemp_exponent));
}

void Sampler::typical(std::vector<std::pair<float, TokenId>>& cand_) const {
    if (cand_.size() < 2) return;
    const double max = cand_.front().first;  // best first
    double z = 0.0;
    for (const auto& c : cand_) z += std::exp(static_cast<double>(c.first) - max);
    const double log_z = std::log(z);
    double entropy = 0.0;
    std::vector<std::pair<double, size_t>> order(cand_.size());  // (|surprise - entropy|, index)
    for (size_t i = 0; i < cand_.size(); ++i) {
        const double logp = static_cast<double>(cand_[i].first) - max - log_z;
        entropy -= std::exp(logp) * logp;
        order[i] = {-logp, i};
    }
    for (auto& o : order) o.first = std::abs(o.first - entropy);
    std::stable_sort(order.begin(), order.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    // The most typical tokens until their mass reaches typical_p (at least one).
    double cum = 0.0;
    size_t keep = order.size();
    for (size_t i = 0; i < order.size(); ++i) {
        cum += std::exp(static_cast<double>(cand_[order[i].second].first) - max - log_z);
        if (cum >= params_.typical_p) {
            keep = i + 1;
            break;
        }
    }
    std::vector<std::pair<float, TokenId>> kept;
    for (size_t i = 0; i < keep; ++i) kept.push_back(cand_[order[i].second]);
    std::sort(kept.begin(), kept.end(), better);
    cand_ = std::move(kept);
}

size_t Sampler::xtc_cut(const std::vector<std::pair<float, TokenId>>& cand_) const {
    if (params_.xtc_probability <= 0.0f || cand_.size() < 2) return 0;
    const double max = cand_.front().first;  // best first
    double z = 0.0;
    for (const auto& c : cand_) z += std::exp(static_cast<double>(c.first) - max);
    size_t above = 0;  // a prefix, as the candidates are sorted best first
    while (above < cand_.size() &&
           std::exp(static_cast<double>(cand_[above].first) - max) / z >= params_.xtc_threshold)
        ++above;
    return above >= 2 ? above - 1 : 0;
}

void Sampler::tempered_softmax(const std::vector<uint8_t>* excluded,
                               std::vector<float>& out) const {
    auto in = [&](size_t i) { return excluded == nullptr || !(*excluded)[i]; };
    float max_logit = kNegInf;
    size_t n = 0;
    for (size_t i = 0; i < cand_.size(); ++i)
        if (in(i)) {
            max_logit = std::max(max_logit, cand_[i].first);
            ++n;
        }
    double t = params_.temperature;
    if (params_.dynatemp_range > 0.0f && n > 1) {
        // The normalized entropy of the untempered distribution sets the temperature.
        double z = 0.0;
        for (size_t i = 0; i < cand_.size(); ++i)
            if (in(i)) z += std::exp(static_cast<double>(cand_[i].first) - max_logit);
        double entropy = 0.0;
        for (size_t i = 0; i < cand_.size(); ++i) {
            if (!in(i)) continue;
            const double p = std::exp(static_cast<double>(cand_[i].first) - max_logit) / z;
            if (p > 0.0) entropy -= p * std::log(p);
        }
        t = dynamic_temperature(entropy, n);
    }
    std::fill(out.begin(), out.end(), 0.0f);
    if (!(t > 0.0)) {  // a dynamic temperature of 0: the best candidate (lowest id on ties)
        for (size_t i = 0; i < cand_.size(); ++i)
            if (in(i) && cand_[i].first == max_logit) {
                out[i] = 1.0f;
                return;
            }
    }
    const double inv_t = 1.0 / t;
    double z = 0.0;
    for (size_t i = 0; i < cand_.size(); ++i) {
        if (!in(i)) continue;
        const double e = std::exp((static_cast<double>(cand_[i].first) - max_logit) * inv_t);
        out[i] = static_cast<float>(e);
        z += e;
    }
    for (size_t i = 0; i < cand_.size(); ++i)
        if (in(i)) out[i] = static_cast<float>(out[i] / z);
}

TokenId Sampler::sample(const float* logits, int n_vocab, std::span<const TokenId> recent_tokens) {
    return sample_with(logits, n_vocab, recent_tokens, greedy() ? 0.0 : uniform());
}

TokenId Sampler::sample_with(const float* logits, int n_vocab,
                             std::span<const TokenId> recent_tokens, double u) {
    if (greedy()) {
        penalized_logits(logits, n_vocab, recent_tokens);
        return constrained_argmax();
    }
    filter(logits, n_vocab, recent_tokens);
    const size_t i = draw_index(cand_prob_.data(), cand_prob_.size(), u);
    if (params_.mirostat != 0) {  // the surprise of the draw moves the bound toward tau
        const double surprise = -std::log2(static_cast<double>(cand_prob_[i]));
        const double mu = mu_ - params_.mirostat_eta * (surprise - params_.mirostat_tau);
        mu_ = static_cast<float>(std::clamp(mu, -double(FLT_MAX), double(FLT_MAX)));
    }
    return cand_[i].second;
}

void Sampler::compute_probabilities(const float* logits, int n_vocab,
                                    std::span<const TokenId> recent_tokens, float* probs) {
    check_vocab(probs, n_vocab, "probabilities");
    if (greedy()) {
        penalized_logits(logits, n_vocab, recent_tokens);
        std::fill(probs, probs + n_vocab, 0.0f);
        probs[constrained_argmax()] = 1.0f;
        return;
    }
    filter(logits, n_vocab, recent_tokens);
    std::fill(probs, probs + n_vocab, 0.0f);
    for (size_t i = 0; i < cand_.size(); ++i) probs[cand_[i].second] = cand_prob_[i];
}

std::vector<float> Sampler::probabilities(const float* logits, int n_vocab,
                                          std::span<const TokenId> recent_tokens) {
    check_vocab(logits, n_vocab, "logits");
    std::vector<float> out(static_cast<size_t>(n_vocab));
    compute_probabilities(logits, n_vocab, recent_tokens, out.data());
    return out;
}

TokenId Sampler::sample_from(const float* probs, int n_vocab) {
    check_vocab(probs, n_vocab, "probabilities");
    double total = 0.0;
    for (int i = 0; i < n_vocab; ++i) {
        if (!(probs[i] >= 0.0f) || std::isinf(probs[i])) {
            fail("sampler: probability {} of token {} is not a finite non-negative number",
                 probs[i], i);
        }
        total += probs[i];
    }
    if (!(total > 0.0)) fail("sampler: the distribution to sample from is all zeros");
    return static_cast<TokenId>(draw_index(probs, static_cast<size_t>(n_vocab), uniform()));
}

}  // namespace kvrun
