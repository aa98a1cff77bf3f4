// GPU sampling vs the CPU Sampler (sampler.h) given the same uniform number: argmax, and
// temperature / top-k / top-p / min-p draws over random logits (with NaN, -inf and +inf
// entries), several rows per launch; cuda_sample_rows with every row its own parameters and
// repetition penalty, vocabularies up to 151936, ties at the top-k / top-p thresholds (cut by
// token id like Sampler's sort, -0 tying with +0), rows without a finite logit; and the
// standalone repetition penalty.
// Exits 77 (skipped) without a GPU (see cuda_test_util.h).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "cuda_test_util.h"
#include "sampler.h"

#ifdef KVRUN_HAS_CUDA

using namespace kvrun;
using namespace kvrun::test;

namespace {

std::vector<float> random_logits(int64_t n_rows, int64_t n_vocab, uint32_t seed) {
    std::vector<float> l = random_floats(static_cast<size_t>(n_rows * n_vocab), seed, 3.0f);
    for (int64_t r = 0; r < n_rows; ++r) {
        l[size_t(r * n_vocab + 7)] = -std::numeric_limits<float>::infinity();
        l[size_t(r * n_vocab + 11)] = std::numeric_limits<float>::quiet_NaN();
    }
    return l;
}

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One row for cuda_sample_rows / Sampler::sample_with.
struct RowCase {
    SamplingParams p;
    std::vector<int32_t> recent;
    double u = 0.0;
};

// Sampler::sample_with on each row (-1 where Sampler throws: no finite logit).
std::vector<int32_t> host_tokens(const std::vector<float>& logits, int64_t n_vocab,
                                 const std::vector<RowCase>& rows) {
    std::vector<int32_t> out;
    for (size_t r = 0; r < rows.size(); ++r) {
        Sampler s(rows[r].p);
        try {
            out.push_back(s.sample_with(logits.data() + r * size_t(n_vocab), int(n_vocab),
                                        rows[r].recent, rows[r].u));
        } catch (const Error&) {
            out.push_back(-1);
        }
    }
    return out;
}

// All rows in one cuda_sample_rows launch (the logits are penalized in place on the device).
std::vector<int32_t> device_tokens(const std::vector<float>& logits, int64_t n_vocab,
                                   const std::vector<RowCase>& rows) {
    std::vector<CudaSampleRow> cfg;
    std::vector<int32_t> ids;
    for (const RowCase& r : rows)
        cfg.push_back(cuda_sample_row(r.p, r.u, r.recent.data(), r.recent.size(), n_vocab, ids));
    if (ids.empty()) ids.push_back(0);
    DevBuf<float> dl(logits);
    DevBuf<CudaSampleRow> dr(cfg);
    DevBuf<int32_t> di(ids);
    DevBuf<int32_t> out(rows.size());
    cuda_sample_rows(out.get(), dl.get(), int64_t(rows.size()), n_vocab, dr.get(), di.get(),
                     nullptr);
    return out.download();
}

SamplingParams params(float temp, int top_k, float top_p, float min_p, float penalty = 1.0f,
                      int last_n = 64, float frequency = 0.0f, float presence = 0.0f) {
    SamplingParams p;
    p.frequency_penalty = frequency;
    p.presence_penalty = presence;
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repeat_penalty = penalty;
    p.repeat_last_n = last_n;
    return p;
}

// p with logit biases on a few ids (one given twice, one banned, 300 % n_vocab also the
// penalized history's favourite).
SamplingParams biased(SamplingParams p, int64_t n_vocab) {
    const auto id = [&](int64_t i) { return TokenId(i % n_vocab); };
    p.logit_bias = {{id(300), 2.5f}, {id(5), -kInf},   {id(17), 1.25f},
                    {id(17), 0.75f}, {id(301), -3.0f}, {id(n_vocab - 1), 40.0f}};
    return p;
}

// The parameter mixes every vocabulary is tried with: greedy (plain and penalized), the
// defaults, each filter alone and off, boundary values (top-k 1 / above the vocabulary,
// top-p 0 / just below 1, min-p 1), extreme temperatures and penalties (also < 1), and
// frequency/presence penalties (greedy, with the repeat penalty, presence alone).
std::vector<SamplingParams> param_mixes(int64_t n_vocab) {
    return {
        params(0.0f, 40, 0.95f, 0.05f), params(0.0f, 0, 1.0f, 0.0f, 1.5f),
        params(0.8f, 40, 0.95f, 0.05f), params(1.0f, 0, 1.0f, 0.0f), params(1.0f, 7, 1.0f, 0.0f),
        params(1.0f, 1, 1.0f, 0.0f), params(1.0f, int(n_vocab) + 5, 1.0f, 0.0f),
        params(1.0f, int(n_vocab) - 1, 0.99f, 0.0f), params(1.0f, 0, 0.9f, 0.0f),
        params(0.7f, 0, 0.5f, 0.0f), params(1.0f, 0, 0.0f, 0.0f), params(1.0f, 0, 0.99999f, 0.0f),
        params(1.2f, 0, 1.0f, 0.1f), params(1.0f, 0, 1.0f, 1.0f), params(0.05f, 100, 0.9f, 0.01f),
        params(2.5f, 5000, 0.99f, 0.01f, 1.3f), params(0.9f, 40, 0.95f, 0.05f, 1.3f, -1),
        params(1.1f, 0, 0.8f, 0.02f, 0.7f, 8), params(0.0f, 0, 1.0f, 0.0f, 1.0f, 64, 0.9f, 0.3f),
        params(0.9f, 40, 0.95f, 0.05f, 1.2f, -1, 0.35f, -0.2f),
        params(1.0f, 0, 1.0f, 0.0f, 1.0f, 16, 0.0f, 1.5f),
        // Logit biases: a ban, boosts, an id given twice (summed), ids also penalized.
        biased(params(0.0f, 0, 1.0f, 0.0f), n_vocab),
        biased(params(0.8f, 40, 0.95f, 0.05f, 1.3f, -1, 0.2f, 0.1f), n_vocab),
        biased(params(1.0f, 0, 1.0f, 0.0f), n_vocab)};
}

}  // namespace

TEST_CASE("cuda argmax picks the largest logit, lowest id on ties") {
    const int64_t n_vocab = 32000, n_rows = 4;
    std::vector<float> l = random_logits(n_rows, n_vocab, 5);
    l[size_t(2 * n_vocab + 100)] = 50.0f;  // a tie in row 2: 100 wins over 31000
    l[size_t(2 * n_vocab + 31000)] = 50.0f;
    DevBuf<float> dl(l);
    DevBuf<int32_t> out(static_cast<size_t>(n_rows));
    cuda_argmax(out.get(), dl.get(), n_rows, n_vocab, nullptr);
    const std::vector<int32_t> got = out.download();
    for (int64_t r = 0; r < n_rows; ++r) {
        Sampler greedy(params(0.0f, 0, 1.0f, 0.0f, 1.0f, 0));
        CHECK(got[size_t(r)] == greedy.sample(l.data() + r * n_vocab, int(n_vocab), {}));
    }
    CHECK(got[2] == 100);
}

TEST_CASE("cuda sample draws the CPU sampler's token for the same uniform number") {
    struct Cfg {
        float temp;
        int top_k;
        float top_p, min_p;
    };
    const Cfg cfgs[] = {{0.0f, 40, 0.95f, 0.05f}, {1.0f, 0, 1.0f, 0.0f},
                        {0.8f, 40, 0.95f, 0.05f}, {0.7f, 0, 0.9f, 0.0f},
                        {1.2f, 0, 1.0f, 0.1f},    {1.0f, 1, 1.0f, 0.0f},
                        {0.5f, 100, 0.5f, 0.0f},  {1.5f, 5000, 0.99f, 0.01f}};
    for (int64_t n_vocab : {512, 32000, 151936}) {
        const int64_t n_rows = 3;
        const std::vector<float> l = random_logits(n_rows, n_vocab, uint32_t(n_vocab));
        DevBuf<float> dl(l);
        DevBuf<float> du(static_cast<size_t>(n_rows));
        DevBuf<int32_t> out(static_cast<size_t>(n_rows));
        for (const Cfg& c : cfgs) {
            CAPTURE(n_vocab);
            CAPTURE(c.temp);
            CAPTURE(c.top_k);
            CAPTURE(c.top_p);
            CAPTURE(c.min_p);
            SamplingParams sp = params(c.temp, c.top_k, c.top_p, c.min_p, 1.0f, 0);
            sp.seed = 1;
            Sampler cpu(sp);
            const CudaSamplerConfig gc{c.temp, c.top_k, c.top_p, c.min_p};
            for (uint64_t trial = 0; trial < 12; ++trial) {
                std::vector<float> u(static_cast<size_t>(n_rows));
                std::vector<int32_t> want(static_cast<size_t>(n_rows));
                for (int64_t r = 0; r < n_rows; ++r) {
                    const uint64_t seed = trial * 1000 + uint64_t(r);
                    cpu.reseed(seed);
                    u[size_t(r)] = float(cpu.uniform());  // the device reads float u
                    want[size_t(r)] = cpu.sample_with(l.data() + r * n_vocab, int(n_vocab), {},
                                                      double(u[size_t(r)]));
                }
                du.upload(u);
                cuda_sample(out.get(), dl.get(), n_rows, n_vocab, gc, du.get(), nullptr);
                CHECK(out.download() == want);
            }
        }
    }
}

TEST_CASE("cuda_sample_rows draws Sampler::sample_with's token, each row its own parameters") {
    for (int64_t n_vocab : {512, 32000, 128256, 151936}) {
        CAPTURE(n_vocab);
        const std::vector<SamplingParams> mixes = param_mixes(n_vocab);
        const int64_t n_rows = int64_t(mixes.size());
        std::vector<float> l = random_logits(n_rows, n_vocab, uint32_t(n_vocab) + 1);
        l[size_t(2 * n_vocab + 300)] = kInf;  // +inf counts as the largest float
        l[size_t(3 * n_vocab + 1)] = -0.0f;   // zeros of both signs
        l[size_t(3 * n_vocab + 2)] = 0.0f;
        l[size_t(4 * n_vocab + 5)] = 9.0f;  // a clear winner in row 4
        std::mt19937 pick{uint32_t(n_vocab)};
        for (uint64_t trial = 0; trial < 6; ++trial) {
            CAPTURE(trial);
            std::vector<RowCase> rows(static_cast<size_t>(n_rows));
            for (size_t r = 0; r < rows.size(); ++r) {
                rows[r].p = mixes[r];
                rows[r].p.seed = trial * 100 + r;
                Sampler draw(rows[r].p);
                rows[r].u = draw.uniform();
                // Penalized history: repeats, and the row's best tokens now and then.
                for (int k = 0; k < 90; ++k)
                    rows[r].recent.push_back(int32_t(pick() % uint32_t(n_vocab)));
                rows[r].recent.push_back(rows[r].recent[3]);
                rows[r].recent.push_back(4 == r ? 5 : int32_t(300 % n_vocab));
            }
            const std::vector<int32_t> want = host_tokens(l, n_vocab, rows);
            const std::vector<int32_t> got = device_tokens(l, n_vocab, rows);
            for (size_t r = 0; r < rows.size(); ++r) {
                CAPTURE(r);
                CHECK(got[r] == want[r]);
            }
        }
    }
}

TEST_CASE("cuda_sample_rows: the frequency penalty counts every recent occurrence") {
    const int64_t n_vocab = 512;
    std::vector<float> one(size_t(n_vocab), 0.0f);
    one[10] = 5.0f;  // seen three times: 5 - 3 * 0.4 = 3.8 falls behind token 11
    one[11] = 4.0f;
    one[12] = 3.9f;  // seen once: 3.9 - 0.4 - presence
    std::vector<float> l;
    std::vector<RowCase> rows(4);
    for (RowCase& r : rows) {
        l.insert(l.end(), one.begin(), one.end());
        r.recent = {10, 12, 10, 10};
    }
    rows[0].p = params(0.0f, 0, 1.0f, 0.0f, 1.0f, 64, 0.4f, 0.0f);   // 11
    rows[1].p = params(0.0f, 0, 1.0f, 0.0f, 1.0f, 64, 0.3f, 0.0f);   // 5 - 0.9 = 4.1: 10
    rows[2].p = params(0.0f, 0, 1.0f, 0.0f, 1.0f, 64, 0.0f, 1.05f);  // 3.95 < 4: 11
    rows[3].p = params(0.0f, 0, 1.0f, 0.0f, 1.0f, 2, 0.45f, 0.0f);   // window {10, 10}: 4.1, 10
    const std::vector<int32_t> want = host_tokens(l, n_vocab, rows);
    CHECK(want == std::vector<int32_t>{11, 10, 11, 10});
    CHECK(device_tokens(l, n_vocab, rows) == want);
}

TEST_CASE("cuda_sample_rows: a tiny or huge repeat penalty keeps the logits finite, as Sampler") {
    // 2.86 / 1.4e-39 overflows a float: Sampler clamps it to the largest finite value, and the
    // device reads +inf as that value (found by fuzz/fuzz_sampler.cpp on the host sampler).
    const int64_t n_vocab = 512;
    std::vector<float> one = random_logits(1, n_vocab, 77);
    one[7] = 2.86f;
    one[8] = 2.5f;
    one[9] = -1.5f;
    std::vector<float> l;
    std::vector<RowCase> rows;
    for (float rp : {1.4e-39f, 1e-30f, 1e30f, 3e38f}) {
        for (float temp : {0.0f, 1.9f}) {
            RowCase r;
            r.p = params(temp, 0, 1.0f, 0.0f, rp);
            r.u = 0.37;
            r.recent = {7, 8, 9};
            rows.push_back(r);
            l.insert(l.end(), one.begin(), one.end());
        }
    }
    const std::vector<int32_t> want = host_tokens(l, n_vocab, rows);
    CHECK(device_tokens(l, n_vocab, rows) == want);
    CHECK(want[0] == 7);  // both 7 and 8 clamp to FLT_MAX: the lower id wins
}

TEST_CASE("cuda_sample_rows: logit biases decide the token as in Sampler") {
    const int64_t n_vocab = 512;
    std::vector<float> one(size_t(n_vocab), 0.0f);
    one[10] = 5.0f;
    one[11] = 4.0f;
    one[12] = 3.9f;
    std::vector<float> l;
    std::vector<RowCase> rows(4);
    for (size_t r = 0; r < rows.size(); ++r) l.insert(l.end(), one.begin(), one.end());
    rows[0].p = params(0.0f, 0, 1.0f, 0.0f);
    rows[0].p.logit_bias = {{10, -kInf}};  // banned: 11
    rows[1].p = params(0.0f, 0, 1.0f, 0.0f);
    rows[1].p.logit_bias = {{12, 0.6f}, {12, 0.6f}};  // 3.9 + 1.2 = 5.1 beats 5: 12
    rows[2].p = params(0.0f, 0, 1.0f, 0.0f, 2.0f);
    rows[2].p.logit_bias = {{11, 4.0f}};  // (4 + 4) / 2 = 4 < 5 (the bias comes first): 10
    rows[2].recent = {11};
    rows[3].p = params(0.0f, 0, 1.0f, 0.0f);
    // Two huge boosts overflow to +inf together: kept at the largest float, as Sampler does.
    rows[3].p.logit_bias = {{10, -kInf}, {11, -kInf}, {12, -kInf}, {13, 3e38f}, {13, 3e38f}};
    const std::vector<int32_t> want = host_tokens(l, n_vocab, rows);
    CHECK(want == std::vector<int32_t>{11, 12, 10, 13});
    CHECK(device_tokens(l, n_vocab, rows) == want);
}

TEST_CASE("cuda_sample_rows cuts ties at the top-k and top-p thresholds by token id") {
    // Logits on a coarse grid: every threshold falls inside a run of equal logits, which
    // Sampler's sort orders by token id.
    for (int64_t n_vocab : {1000, 128256}) {
        CAPTURE(n_vocab);
        const SamplingParams mixes[] = {
            params(1.0f, 5, 1.0f, 0.0f),   params(1.0f, 40, 1.0f, 0.0f),
            params(1.0f, 333, 1.0f, 0.0f), params(1.0f, 0, 0.3f, 0.0f),
            params(1.0f, 0, 0.9f, 0.0f),   params(0.6f, 50, 0.7f, 0.0f),
            params(1.0f, 0, 0.97f, 0.3f),  params(1.3f, 700, 0.95f, 0.05f),
            params(1.0f, 0, 1.0f, 0.6f),   params(0.8f, 25, 0.5f, 0.0f, 1.2f)};
        const int64_t n_rows = int64_t(std::size(mixes));
        std::mt19937 rng(uint32_t(n_vocab) + 7);
        std::vector<float> l(static_cast<size_t>(n_rows * n_vocab));
        for (float& x : l) x = float(int(rng() % 13) - 8) * 0.5f;  // -4 .. 2 in steps of 0.5
        for (int64_t r = 0; r < n_rows; ++r) l[size_t(r * n_vocab + 17)] = -0.0f;
        for (uint64_t trial = 0; trial < 24; ++trial) {
            CAPTURE(trial);
            std::vector<RowCase> rows(static_cast<size_t>(n_rows));
            for (size_t r = 0; r < rows.size(); ++r) {
                rows[r].p = mixes[r];
                rows[r].p.seed = trial * 1000 + r;
                Sampler draw(rows[r].p);
                rows[r].u = draw.uniform();
                rows[r].recent = {1, 2, 3, 17, 2};
            }
            CHECK(device_tokens(l, n_vocab, rows) == host_tokens(l, n_vocab, rows));
        }
    }
    // -0 and +0 tie (ids 10..29, alternating signs): top-k 15 keeps ids 10..14 whatever
    // their sign, so u just below 1 picks id 14.
    const int64_t n_vocab = 64;
    std::vector<float> l(static_cast<size_t>(n_vocab), -1.0f);
    for (int i = 0; i < 10; ++i) l[size_t(i)] = 1.0f;
    for (int i = 10; i < 30; ++i) l[size_t(i)] = i % 2 ? -0.0f : 0.0f;
    std::vector<RowCase> rows(3);
    for (size_t r = 0; r < rows.size(); ++r) rows[r].p = params(30.0f, 15, 1.0f, 0.0f);
    rows[0].u = 0.999999;
    rows[1].u = 0.0;
    rows[2].u = 0.5;
    const std::vector<float> l3 = [&] {
        std::vector<float> v;
        for (int k = 0; k < 3; ++k) v.insert(v.end(), l.begin(), l.end());
        return v;
    }();
    const std::vector<int32_t> want = host_tokens(l3, n_vocab, rows);
    CHECK(want[0] == 14);
    CHECK(device_tokens(l3, n_vocab, rows) == want);
}

TEST_CASE(
    "cuda_sample_rows gives -1 for a row without a finite logit; cuda_sample_row checks ids") {
    const int64_t n_vocab = 2000;
    std::vector<float> l = random_logits(3, n_vocab, 9);
    for (int64_t i = 0; i < n_vocab; ++i) {
        l[size_t(n_vocab + i)] = i % 2 ? -kInf : kNaN;
        l[size_t(2 * n_vocab + i)] = -kInf;
    }
    std::vector<RowCase> rows(3);
    rows[0].p = params(0.8f, 40, 0.95f, 0.05f);
    rows[0].u = 0.25;
    rows[1].p = params(0.8f, 40, 0.95f, 0.05f);
    rows[2].p = params(0.0f, 0, 1.0f, 0.0f);
    const std::vector<int32_t> got = device_tokens(l, n_vocab, rows);
    CHECK(got == host_tokens(l, n_vocab, rows));
    CHECK(got[0] >= 0);
    CHECK(got[1] == -1);
    CHECK(got[2] == -1);
    // Penalized ids outside the vocabulary throw like Sampler.
    std::vector<int32_t> ids;
    const int32_t bad[] = {5, int32_t(n_vocab)};
    CHECK_THROWS_AS(
        cuda_sample_row(params(0.8f, 40, 0.95f, 0.05f, 1.1f), 0.5, bad, 2, n_vocab, ids), Error);
    // No penalty, or outside the last repeat_last_n: not checked (as in Sampler).
    CHECK_NOTHROW(cuda_sample_row(params(0.8f, 40, 0.95f, 0.05f), 0.5, bad, 2, n_vocab, ids));
    const int32_t old_bad[] = {int32_t(n_vocab), 5, 5, 6};
    const CudaSampleRow r =
        cuda_sample_row(params(0.8f, 40, 0.95f, 0.05f, 1.1f, 3), 0.5, old_bad, 4, n_vocab, ids);
    CHECK(r.penalty_count == 2);  // 5 and 6, each once
    CHECK(ids.size() == size_t(r.penalty_begin + r.penalty_count));
    // With a frequency or presence penalty the counts follow the ids.
    const int32_t seen[] = {9, 5, 9, 7, 9, 5};
    const CudaSampleRow c = cuda_sample_row(params(0.8f, 40, 0.95f, 0.05f, 1.0f, -1, 0.5f, 0.0f),
                                            0.5, seen, 6, n_vocab, ids);
    CHECK(c.penalty_count == 3);
    CHECK(std::vector<int32_t>(ids.begin() + c.penalty_begin, ids.end()) ==
          std::vector<int32_t>{5, 7, 9, 2, 1, 3});
}

TEST_CASE("cuda repeat penalty applies once per distinct recent token") {
    const int64_t n_vocab = 1000;
    std::vector<float> l = random_floats(static_cast<size_t>(n_vocab), 3, 2.0f);
    const std::vector<int32_t> recent = {5, 9, 5, 200, 999, 9, 5, -1, 1000};
    std::vector<float> want = l;
    for (int32_t id : {5, 9, 200, 999}) {
        float& x = want[size_t(id)];
        x = x > 0 ? x / 1.3f : x * 1.3f;
    }
    DevBuf<float> dl(l);
    DevBuf<int32_t> dr(recent);
    cuda_repeat_penalty(dl.get(), n_vocab, dr.get(), int64_t(recent.size()), 1.3f, nullptr);
    CHECK(dl.download() == want);
}

#endif  // KVRUN_HAS_CUDA
