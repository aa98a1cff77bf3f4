// libFuzzer target for the sampler, whose parameters JSON requests carry and whose logits may
// hold NaN or infinities: every parameter (DRY with its breakers, top-n-sigma, typical, XTC,
// dynamic temperature, mirostat, penalties, logit bias) and the logits and recent tokens come
// from the input. Invalid parameters must throw kvrun::Error at construction; then, for any
// logits, the sampler either throws kvrun::Error or
// - probabilities() are finite, non-negative and sum to 1 (one-hot when greedy);
// - sample_with(u) picks a token in range that probabilities() gives a positive probability
//   (mirostat: before its state moves), and sample() does too.
// Run with KVRUN_FUZZ_WRITE_SEEDS=<dir> to write a small seed corpus and exit.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common.h"
#include "fuzz_seeds.h"
#include "sampler.h"

namespace {

[[noreturn]] void trap(const char* what) {
    std::fprintf(stderr, "fuzz_sampler: %s\n", what);
    std::abort();
}

// Reads the input front to back; past the end, zeros.
struct Reader {
    const uint8_t* p;
    size_t n;
    uint8_t byte() {
        if (n == 0) return 0;
        --n;
        return *p++;
    }
    float unit() { return byte() / 255.0f; }  // [0, 1]
    float raw_float() {
        uint32_t bits = 0;
        for (int i = 0; i < 4; ++i) bits = bits << 8 | byte();
        float f;
        std::memcpy(&f, &bits, 4);
        return f;
    }
    // Mostly in range, sometimes anything (invalid values must be refused, not crash).
    float value(float lo, float hi) {
        const uint8_t mode = byte();
        if (mode < 16) return raw_float();
        return lo + (hi - lo) * unit();
    }
};

void write_seeds(const char* dir) {
    std::vector<std::vector<uint8_t>> seeds;
    for (int s = 0; s < 6; ++s) {
        std::vector<uint8_t> v(160);
        for (size_t i = 0; i < v.size(); ++i) v[i] = uint8_t((i * 37 + s * 101) % 251 + 16);
        seeds.push_back(v);
    }
    int n = 0;
    for (const auto& s : seeds) {
        std::ofstream out(std::string(dir) + "/seed_" + std::to_string(n++), std::ios::binary);
        out.write(reinterpret_cast<const char*>(s.data()), std::streamsize(s.size()));
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    return fuzz_write_seeds_if_asked(write_seeds);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    Reader r{data, size};
    kvrun::SamplingParams p;
    const uint8_t flags = r.byte();
    p.temperature = flags & 1 ? 0.0f : r.value(0.0f, 2.0f);
    p.top_k = r.byte() % 8 == 0 ? -1 : r.byte() % 40;
    p.top_p = r.value(0.0f, 1.0f);
    p.min_p = r.value(0.0f, 0.5f);
    p.repeat_penalty = r.value(0.5f, 2.0f);
    p.frequency_penalty = r.value(-1.0f, 1.0f);
    p.presence_penalty = r.value(-1.0f, 1.0f);
    p.repeat_last_n = int(r.byte()) - 2;
    p.seed = r.byte();
    if (flags & 2) p.dry_multiplier = r.value(0.0f, 3.0f);
    p.dry_base = r.value(1.0f, 4.0f);
    p.dry_allowed_length = int(r.byte() % 6);
    p.dry_penalty_last_n = int(r.byte()) - 2;
    if (flags & 4) p.top_n_sigma = r.value(-1.0f, 4.0f);
    if (flags & 8) p.typical_p = r.value(0.0f, 1.0f);
    if (flags & 16) {
        p.xtc_probability = r.value(0.0f, 1.0f);
        p.xtc_threshold = r.value(0.0f, 0.6f);
    }
    if (flags & 32) {
        p.dynatemp_range = r.value(0.0f, 2.0f);
        p.dynatemp_exponent = r.value(0.0f, 3.0f);
    }
    if (flags & 64) {
        p.mirostat = r.byte() % 4;  // 3 is invalid
        p.mirostat_tau = r.value(0.0f, 10.0f);
        p.mirostat_eta = r.value(0.0f, 1.0f);
    }
    if (flags & 128) {  // a --samplers order: up to 8 steps, repeats (invalid) included
        for (int n = r.byte() % 9; n > 0; --n)
            p.order.push_back(static_cast<kvrun::SamplerStep>(r.byte() % 7));
    }
    const int n_vocab = 1 + r.byte() % 48;
    // Token texts for DRY's breakers: short strings over a tiny alphabet, so breakers occur.
    std::vector<std::string> pieces(static_cast<size_t>(n_vocab));
    for (auto& piece : pieces) {
        const int len = r.byte() % 3;
        for (int i = 0; i < len; ++i) piece += "ab:\n"[r.byte() % 4];
    }
    p.dry_sequence_breakers.clear();
    for (int b = r.byte() % 3; b > 0; --b) p.dry_sequence_breakers.push_back(b == 1 ? ":" : "b\n");
    for (int b = r.byte() % 3; b > 0; --b)
        p.logit_bias.emplace_back(r.byte() % (n_vocab + 2), r.value(-5.0f, 5.0f));

    std::vector<float> logits(static_cast<size_t>(n_vocab));
    for (auto& l : logits) l = r.byte() < 8 ? r.raw_float() : r.value(-10.0f, 10.0f);
    std::vector<kvrun::TokenId> recent(r.byte() % 64);
    for (auto& t : recent) t = r.byte() % 16 == 0 ? int(r.byte()) - 8 : r.byte() % n_vocab;
    const double u = r.unit() * 0.999;

    std::unique_ptr<kvrun::Sampler> s;
    try {
        kvrun::merged_logit_bias(p, n_vocab);
        s = std::make_unique<kvrun::Sampler>(p);
    } catch (const kvrun::Error&) {
        return 0;  // refused parameters: the expected outcome for bad input
    }
    s->set_token_pieces(&pieces);
    try {
        const std::vector<float> probs = s->probabilities(logits.data(), n_vocab, recent);
        double sum = 0;
        for (float x : probs) {
            if (!(x >= 0.0f) || !std::isfinite(x)) {
                std::fprintf(stderr,
                             "temp %g top_k %d top_p %g min_p %g rep %g freq %g pres %g dry %g "
                             "sigma %g typical %g xtc %g/%g dyn %g/%g miro %d %g %g\n",
                             p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty,
                             p.frequency_penalty, p.presence_penalty, p.dry_multiplier,
                             p.top_n_sigma, p.typical_p, p.xtc_probability, p.xtc_threshold,
                             p.dynatemp_range, p.dynatemp_exponent, p.mirostat, p.mirostat_tau,
                             p.mirostat_eta);
                for (int i = 0; i < n_vocab; ++i)
                    std::fprintf(stderr, "  %d: logit %g prob %g\n", i, logits[size_t(i)],
                                 probs[size_t(i)]);
                trap("a probability is negative or not finite");
            }
            sum += x;
        }
        if (std::fabs(sum - 1.0) > 1e-3) trap("probabilities do not sum to 1");
        const kvrun::TokenId t = s->sample_with(logits.data(), n_vocab, recent, u);
        if (t < 0 || t >= n_vocab) trap("sample_with: token outside the vocabulary");
        if (!(probs[static_cast<size_t>(t)] > 0.0f)) trap("sampled a token of probability 0");
        if (s->greedy() && probs[static_cast<size_t>(t)] != 1.0f) trap("greedy is not one-hot");
        const kvrun::TokenId t2 = s->sample(logits.data(), n_vocab, recent);
        if (t2 < 0 || t2 >= n_vocab) trap("sample: token outside the vocabulary");
        if (p.mirostat != 0 && !std::isfinite(s->mirostat_mu())) trap("mirostat mu not finite");
    } catch (const kvrun::Error&) {
    }
    return 0;
}
