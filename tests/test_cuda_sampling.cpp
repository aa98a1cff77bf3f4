// GPU sampling vs the CPU Sampler (sampler.h) given the same uniform number: argmax, and
// temperature / top-k / top-p / min-p draws over random logits (with NaN and -inf entries),
// several rows per launch; and the repetition penalty.
// Exits 77 (skipped) without a GPU (see cuda_test_util.h).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
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
        Sampler greedy(SamplingParams{0.0f, 0, 1.0f, 0.0f, 1.0f, 0, 1});
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
            SamplingParams sp{c.temp, c.top_k, c.top_p, c.min_p, 1.0f, 0, 1};
            Sampler cpu(sp);
            const CudaSamplerConfig gc{c.temp, c.top_k, c.top_p, c.min_p};
            for (uint64_t trial = 0; trial < 12; ++trial) {
                std::vector<float> u(static_cast<size_t>(n_rows));
                std::vector<int32_t> want(static_cast<size_t>(n_rows));
                for (int64_t r = 0; r < n_rows; ++r) {
                    const uint64_t seed = trial * 1000 + uint64_t(r);
                    cpu.reseed(seed);
                    const double ud = cpu.uniform();
                    u[size_t(r)] = float(ud);
                    cpu.reseed(seed);
                    want[size_t(r)] = cpu.sample(l.data() + r * n_vocab, int(n_vocab), {});
                }
                du.upload(u);
                cuda_sample(out.get(), dl.get(), n_rows, n_vocab, gc, du.get(), nullptr);
                CHECK(out.download() == want);
            }
        }
    }
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
