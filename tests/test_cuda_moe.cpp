// CUDA mixture-of-experts ops vs their CPU twins (cpu_ops.h) on random inputs: router top-k,
// the expert-indexed GEMVs, the weighted sum, the grouped prefill path against the
// expert-indexed one, and gpt-oss's biased experts with the clamped SwiGLU (split from
// test_cuda_ops.cpp). Exits 77 (skipped) without a GPU (see cuda_test_util.h).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "common.h"
#include "cpu_ops.h"
#include "cuda_test_util.h"
#include "cuda_test_weights.h"
#include "quant.h"

#ifdef KVRUN_HAS_CUDA

using namespace kvrun;
using namespace kvrun::test;

TEST_CASE("cuda mixture-of-experts ops: top-k, expert-indexed GEMVs, weighted sum") {
    // Expert-indexed GEMVs give each job the bits of a one-row cuda_gemv on its expert's
    // slice (and the fused SwiGLU form those of cuda_swiglu on the two); top-k picks what a
    // host sort picks, with renormalized softmax weights; the sum weights the rows.
    const int64_t E = 5, K = 2, T = 7, n_in = 512, n_out = 96;
    std::vector<int32_t> ids(static_cast<size_t>(T * K));
    for (int64_t j = 0; j < T * K; ++j) ids[size_t(j)] = int32_t((j * 3 + j / K) % E);
    DevBuf<int32_t> dids(ids);
    const std::vector<float> x = random_floats(static_cast<size_t>(T * n_in), 71);
    DevBuf<float> dx(x);
    auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
    };
    // Also with 8-bit activations (cuda_set_gemv_q8; F16 / F32 keep the f32 kernel): the
    // expert-indexed launch against one-row launches of the same path.
    CudaScratch scratch;
    for (bool q8 : {false, true})
        for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F16, GgmlType::F32}) {
            CAPTURE(q8);
            CAPTURE(ggml_type_name(t));
            cuda_set_gemv_q8(q8);
            TestWeights gate = make_weights(t, E * n_out, n_in, 72),
                        up = make_weights(t, E * n_out, n_in, 73);
            auto expert = [&](const TestWeights& w, int64_t e) {
                WeightView v = w.device;
                v.n_out = n_out;
                v.data =
                    static_cast<const uint8_t*>(w.device.data) + e * n_out * w.device.row_bytes;
                return v;
            };
            const size_t expert_bytes = size_t(n_out) * gate.device.row_bytes;
            std::vector<float> want_g, want_u;
            for (int64_t j = 0; j < T * K; ++j) {
                DevBuf<float> xr(
                    std::vector<float>(x.begin() + (j / K) * n_in, x.begin() + (j / K + 1) * n_in));
                DevBuf<float> og(static_cast<size_t>(n_out)), ou(static_cast<size_t>(n_out));
                cuda_gemv(og.get(), xr.get(), expert(gate, ids[size_t(j)]), 1, scratch, nullptr);
                cuda_gemv(ou.get(), xr.get(), expert(up, ids[size_t(j)]), 1, scratch, nullptr);
                const auto g = og.download(), u = ou.download();
                want_g.insert(want_g.end(), g.begin(), g.end());
                want_u.insert(want_u.end(), u.begin(), u.end());
            }
            DevBuf<float> out(want_g.size());
            cuda_gemv_experts(out.get(), dx.get(), expert(gate, 0), expert_bytes, dids.get(), T * K,
                              int(K), nullptr, &scratch);
            CHECK(same_bits(out.download(), want_g));
            DevBuf<float> dg(want_g), du(want_u), dwant(want_g.size());
            cuda_swiglu(dwant.get(), dg.get(), du.get(), int64_t(want_g.size()), nullptr);
            cuda_gemv_experts_swiglu(out.get(), dx.get(), expert(gate, 0), expert(up, 0),
                                     expert_bytes, dids.get(), T * K, int(K), nullptr, &scratch);
            CHECK(same_bits(out.download(), dwant.download()));
            if (q8 && t == GgmlType::Q8_0) {  // and the 8-bit path did run: not the f32 bits
                std::vector<float> f32(static_cast<size_t>(n_out));
                cuda_set_gemv_q8(false);
                DevBuf<float> xr(std::vector<float>(x.begin(), x.begin() + n_in)), o(f32.size());
                cuda_gemv(o.get(), xr.get(), expert(gate, ids[0]), 1, nullptr);
                f32 = o.download();
                CHECK_FALSE(std::equal(f32.begin(), f32.end(), want_g.begin()));
            }
        }
    cuda_set_gemv_q8(false);

    const int64_t n_expert = 40, k = 6, n_tok = 9;
    const std::vector<float> logits =
        random_floats(static_cast<size_t>(n_tok * n_expert), 74, 3.0f);
    DevBuf<float> dl(logits), dw(static_cast<size_t>(n_tok * k));
    DevBuf<int32_t> dsel(std::vector<int32_t>(static_cast<size_t>(n_tok * k), -1));
    cuda_moe_topk(dl.get(), n_tok, n_expert, k, dsel.get(), dw.get(), nullptr);
    const std::vector<int32_t> sel = dsel.download();
    const std::vector<float> wts = dw.download();
    for (int64_t t = 0; t < n_tok; ++t) {
        CAPTURE(t);
        std::vector<int32_t> order(static_cast<size_t>(n_expert));
        std::iota(order.begin(), order.end(), 0);
        const float* l = logits.data() + t * n_expert;
        std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
        double z = 0;
        for (int64_t j = 0; j < k; ++j) z += std::exp(double(l[order[size_t(j)]] - l[order[0]]));
        for (int64_t j = 0; j < k; ++j) {
            CHECK(sel[size_t(t * k + j)] == order[size_t(j)]);
            CHECK(wts[size_t(t * k + j)] ==
                  doctest::Approx(std::exp(double(l[order[size_t(j)]] - l[order[0]])) / z)
                      .epsilon(1e-5));
        }
    }

    // GLM 4.5's router: the choice by sigmoid + selection bias, the weights the sigmoids (over
    // their sum, or not), times a scale; ERNIE 4.5's: by softmax probability + selection bias,
    // the weights the probabilities over their sum; OLMoE's: by softmax probability, the weights
    // the probabilities as they are.
    const std::vector<float> bias = random_floats(static_cast<size_t>(n_expert), 76, 0.3f);
    DevBuf<float> dbias(bias);
    for (int variant = 0; variant < 4; ++variant) {
        const bool sigmoid = variant < 2, norm = variant == 0 || variant == 2;
        const bool biased = variant < 3;
        const float scale = sigmoid ? 2.5f : 1.0f;
        CAPTURE(variant);
        DevBuf<float> sw(static_cast<size_t>(n_tok * k));
        DevBuf<int32_t> ssel(std::vector<int32_t>(static_cast<size_t>(n_tok * k), -1));
        cuda_moe_topk(dl.get(), n_tok, n_expert, k, ssel.get(), sw.get(), nullptr,
                      {sigmoid, biased ? dbias.get() : nullptr, norm, scale});
        const std::vector<int32_t> ids = ssel.download();
        const std::vector<float> w = sw.download();
        for (int64_t t = 0; t < n_tok; ++t) {
            CAPTURE(t);
            const float* l = logits.data() + t * n_expert;
            double zt = 0, mx = l[0];
            for (int64_t e = 0; e < n_expert; ++e) mx = std::max(mx, double(l[e]));
            for (int64_t e = 0; e < n_expert; ++e) zt += std::exp(double(l[e]) - mx);
            auto sig = [&](int32_t e) {
                return sigmoid ? 1.0 / (1.0 + std::exp(-double(l[e])))
                               : std::exp(double(l[e]) - mx) / zt;
            };
            std::vector<int32_t> order(static_cast<size_t>(n_expert));
            std::iota(order.begin(), order.end(), 0);
            std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
                const double ba = biased ? bias[size_t(a)] : 0.0, bb = biased ? bias[size_t(b)] : 0.0;
                return sig(a) + ba > sig(b) + bb;
            });
            double z = 0;
            for (int64_t j = 0; j < k; ++j) z += sig(order[size_t(j)]);
            for (int64_t j = 0; j < k; ++j) {
                CHECK(ids[size_t(t * k + j)] == order[size_t(j)]);
                CHECK(w[size_t(t * k + j)] ==
                      doctest::Approx(sig(order[size_t(j)]) / (norm ? z : 1.0) * scale)
                          .epsilon(1e-5));
            }
        }
    }

    // DeepSeek's expert groups: 40 experts in 8 groups of 5, the experts of the 3 (or 1)
    // groups whose two best choice values sum highest; the choice within them as above.
    // The host twin: cpu::limit_expert_groups on the choice values, then the same sort.
    for (int variant = 0; variant < 4; ++variant) {
        const bool sigmoid = variant % 2 == 0, biased = variant < 2;
        const int n_used = variant == 3 ? 2 : 3;
        const int64_t kk = variant == 3 ? 4 : k;  // within 2 groups of 5: at most 10
        CAPTURE(variant);
        DevBuf<float> sw(static_cast<size_t>(n_tok * kk));
        DevBuf<int32_t> ssel(std::vector<int32_t>(static_cast<size_t>(n_tok * kk), -1));
        MoeRouting r{sigmoid, biased ? dbias.get() : nullptr, true, 2.5f};
        r.n_group = 8, r.n_group_used = n_used;
        cuda_moe_topk(dl.get(), n_tok, n_expert, kk, ssel.get(), sw.get(), nullptr, r);
        const std::vector<int32_t> ids = ssel.download();
        const std::vector<float> w = sw.download();
        for (int64_t t = 0; t < n_tok; ++t) {
            CAPTURE(t);
            std::vector<float> p(logits.begin() + t * n_expert,
                                 logits.begin() + (t + 1) * n_expert);
            if (sigmoid)
                for (float& v : p) v = 1.0f / (1.0f + std::exp(-v));
            else
                cpu::softmax(p.data(), n_expert);
            std::vector<float> sel(p);
            for (int64_t e = 0; e < n_expert; ++e)
                if (biased) sel[size_t(e)] += bias[size_t(e)];
            cpu::limit_expert_groups(sel.data(), n_expert, 8, n_used);
            std::vector<int32_t> order(static_cast<size_t>(n_expert));
            std::iota(order.begin(), order.end(), 0);
            std::stable_sort(order.begin(), order.end(),
                             [&](int32_t a, int32_t b) { return sel[size_t(a)] > sel[size_t(b)]; });
            double z = 0;
            for (int64_t j = 0; j < kk; ++j) z += p[size_t(order[size_t(j)])];
            std::vector<bool> groups(8, false);
            for (int64_t j = 0; j < kk; ++j) {
                CHECK(ids[size_t(t * kk + j)] == order[size_t(j)]);
                groups[size_t(ids[size_t(t * kk + j)] / 5)] = true;
                CHECK(w[size_t(t * kk + j)] ==
                      doctest::Approx(p[size_t(order[size_t(j)])] / z * 2.5).epsilon(1e-5));
            }
            CHECK(std::count(groups.begin(), groups.end(), true) <= n_used);
        }
    }
    {  // more groups than the kernel holds, or k past the kept experts: an error, not a guess
        DevBuf<float> sw(static_cast<size_t>(n_tok * k));
        DevBuf<int32_t> ssel(static_cast<size_t>(n_tok * k));
        MoeRouting r;
        r.n_group = 40, r.n_group_used = 2;
        CHECK_THROWS_AS(
            cuda_moe_topk(dl.get(), n_tok, n_expert, k, ssel.get(), sw.get(), nullptr, r), Error);
        r.n_group = 8, r.n_group_used = 1;  // 5 experts kept, 6 asked for
        CHECK_THROWS_AS(
            cuda_moe_topk(dl.get(), n_tok, n_expert, k, ssel.get(), sw.get(), nullptr, r), Error);
    }

    const int64_t dim = 300;
    const std::vector<float> rows = random_floats(static_cast<size_t>(n_tok * k * dim), 75);
    std::vector<float> want(static_cast<size_t>(n_tok * dim), 0.0f);
    for (int64_t t = 0; t < n_tok; ++t)
        for (int64_t j = 0; j < k; ++j)
            for (int64_t d = 0; d < dim; ++d)
                want[size_t(t * dim + d)] +=
                    wts[size_t(t * k + j)] * rows[size_t((t * k + j) * dim + d)];
    DevBuf<float> drows(rows), dsum(want.size());
    cuda_moe_combine(dsum.get(), drows.get(), dw.get(), n_tok, k, dim, nullptr);
    CHECK(nmse(dsum.download(), want) < kExact);
}

TEST_CASE("cuda grouped mixture-of-experts prefill matches the expert-indexed GEMV path") {
    // cuda_moe_ffn_grouped (prefill: tokens grouped by expert, one matmul per expert) against
    // the decode path (a GEMV per token and expert, then the weighted sum) on the same ids:
    // groups of more than kCudaGemvMaxRows tokens run on the f16 GEMM, smaller ones give the
    // GEMV's bits, an expert nobody chose is skipped; out may alias x.
    const int64_t E = 6, K = 2, D = 512, F = 256;
    CudaScratch scratch;
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F16}) {
        CAPTURE(std::string(ggml_type_name(t)));
        TestWeights gate = make_weights(t, E * F, D, 81), up = make_weights(t, E * F, D, 82),
                    down = make_weights(t, E * D, F, 83);
        MoeExperts ex;
        ex.gate0 = gate.device, ex.up0 = up.device, ex.down0 = down.device;
        ex.gate0.n_out = ex.up0.n_out = F, ex.down0.n_out = D;
        ex.expert_bytes = size_t(F) * gate.device.row_bytes;
        ex.down_bytes = size_t(D) * down.device.row_bytes;
        for (int64_t T : {40, 8}) {
            CAPTURE(T);
            // T = 40: experts 0, 3, 4 get 24, 20, 20 tokens (GEMM), 1 and 2 get 8 (GEMV), 5
            // none. T = 8: every group fits the GEMV.
            std::vector<int32_t> ids(static_cast<size_t>(T * K));
            for (int64_t i = 0; i < T; ++i) {
                ids[size_t(i * K)] = int32_t(i < 24 ? 0 : 1 + i % 2);
                ids[size_t(i * K + 1)] = int32_t(3 + i % 2);
            }
            // Small activations: the random K-quant weights are large and all of one sign, and
            // the GEMM rounds the hidden rows to f16.
            const std::vector<float> x = random_floats(static_cast<size_t>(T * D), 84, 0.002f);
            std::vector<float> wts = random_floats(static_cast<size_t>(T * K), 85);
            for (float& w : wts) w = 0.5f + 0.5f * std::fabs(w);
            DevBuf<int32_t> dids(ids);
            DevBuf<float> dx(x), dw(wts), h(static_cast<size_t>(T * K * F)),
                rows(static_cast<size_t>(T * K * D)), want(x.size());
            cuda_gemv_experts_swiglu(h.get(), dx.get(), ex.gate0, ex.up0, ex.expert_bytes,
                                     dids.get(), T * K, int(K), nullptr);
            cuda_gemv_experts(rows.get(), h.get(), ex.down0, ex.down_bytes, dids.get(), T * K, 1,
                              nullptr);
            cuda_moe_combine(want.get(), rows.get(), dw.get(), T, K, D, nullptr);
            DevBuf<float> xs(static_cast<size_t>(T * K * D)), hh(static_cast<size_t>(T * K * F)),
                uu(static_cast<size_t>(T * K * F));
            DevBuf<int32_t> map(static_cast<size_t>(2 * T * K));
            const MoeGroupedBuffers buf{xs.get(), hh.get(), uu.get(), map.get()};
            DevBuf<float> out(x);  // in place: out aliases x
            cuda_moe_ffn_grouped(out.get(), out.get(), dids.get(), dw.get(), T, K, E, ex, buf,
                                 scratch, nullptr);
            const std::vector<float> got = out.download(), ref = want.download();
            if (T <= kCudaGemvMaxRows)
                CHECK(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)) == 0);
            CHECK(nmse(got, ref) < kGemmF16);
            // Llama 4: the weights scale the experts' inputs and the sum is unweighted; the
            // decode path's weighted rows (cuda_moe_weight_rows: row j is wts[j] * x[j / K])
            // against the grouped path's.
            DevBuf<float> xw(static_cast<size_t>(T * K * D));
            cuda_moe_weight_rows(xw.get(), dx.get(), dw.get(), T * K, K, D, nullptr);
            const std::vector<float> xw_host = xw.download();
            for (int64_t j : {int64_t(0), T * K - 1})
                CHECK(xw_host[size_t(j * D + 3)] == wts[size_t(j)] * x[size_t((j / K) * D + 3)]);
            cuda_gemv_experts_swiglu(h.get(), xw.get(), ex.gate0, ex.up0, ex.expert_bytes,
                                     dids.get(), T * K, 1, nullptr);
            cuda_gemv_experts(rows.get(), h.get(), ex.down0, ex.down_bytes, dids.get(), T * K, 1,
                              nullptr);
            cuda_moe_combine(want.get(), rows.get(), nullptr, T, K, D, nullptr);
            out.upload(x);
            cuda_moe_ffn_grouped(out.get(), out.get(), dids.get(), dw.get(), T, K, E, ex, buf,
                                 scratch, nullptr, true);
            const std::vector<float> got_w = out.download(), ref_w = want.download();
            if (T <= kCudaGemvMaxRows)
                CHECK(std::memcmp(got_w.data(), ref_w.data(), got_w.size() * sizeof(float)) == 0);
            CHECK(nmse(got_w, ref_w) < kGemmF16);
            CHECK(nmse(ref_w, ref) > 1e-4);  // (not the output-weighted sum)
        }
    }
}

TEST_CASE("cuda gpt-oss experts: biases by expert id, the clamped SwiGLU, grouped prefill") {
    const int64_t E = 4, K = 2, D = 256, F = 128;
    // The activation alone, on values past the clamp on both sides.
    std::vector<float> g = random_floats(1000, 91, 12.0f), u = random_floats(1000, 92, 12.0f);
    std::vector<float> want(g.size());
    cpu::swiglu_oai(want.data(), g.data(), u.data(), int64_t(g.size()), 1.702f, 7.0f);
    DevBuf<float> dg(g), du(u);
    cuda_swiglu_oai(dg.get(), dg.get(), du.get(), int64_t(g.size()), 1.702f, 7.0f, nullptr);
    CHECK(nmse(dg.download(), want) < kExact);
    CudaScratch scratch;
    for (GgmlType t : {GgmlType::MXFP4, GgmlType::Q8_0}) {
        CAPTURE(std::string(ggml_type_name(t)));
        TestWeights gate = make_weights(t, E * F, D, 93), up = make_weights(t, E * F, D, 94),
                    down = make_weights(t, E * D, F, 95);
        const std::vector<float> gb = random_floats(size_t(E * F), 96),
                                 ub = random_floats(size_t(E * F), 97),
                                 db = random_floats(size_t(E * D), 98);
        DevBuf<float> dgb(gb), dub(ub), ddb(db);
        MoeExperts ex;
        ex.gate0 = gate.device, ex.up0 = up.device, ex.down0 = down.device;
        ex.gate0.n_out = ex.up0.n_out = F, ex.down0.n_out = D;
        ex.expert_bytes = size_t(F) * gate.device.row_bytes;
        ex.down_bytes = size_t(D) * down.device.row_bytes;
        ex.gate_b = dgb.get(), ex.up_b = dub.get(), ex.down_b = ddb.get(), ex.swiglu_oai = true;
        for (int64_t T : {5, 40}) {
            CAPTURE(T);
            std::vector<int32_t> ids(static_cast<size_t>(T * K));
            for (int64_t i = 0; i < T * K; ++i) ids[size_t(i)] = int32_t((i * 3 + i / K) % E);
            for (int64_t i = 0; i < T; ++i)  // two different experts per token
                if (ids[size_t(i * K)] == ids[size_t(i * K + 1)])
                    ids[size_t(i * K + 1)] = (ids[size_t(i * K)] + 1) % E;
            const std::vector<float> x = random_floats(static_cast<size_t>(T * D), 99, 0.05f);
            // Host reference: each job's expert on its token, biases and activation, down.
            std::vector<float> ref_rows(static_cast<size_t>(T * K * D));
            auto host_expert = [&](const TestWeights& w, int64_t e, int64_t n_out) {
                WeightView v = w.host;
                v.n_out = n_out;
                v.data = static_cast<const uint8_t*>(w.host.data) + e * n_out * w.host.row_bytes;
                return v;
            };
            for (int64_t j = 0; j < T * K; ++j) {
                const int64_t e = ids[size_t(j)];
                std::vector<float> hg(static_cast<size_t>(F)), hu(static_cast<size_t>(F)),
                    hd(static_cast<size_t>(D));
                cpu::matmul(hg.data(), x.data() + (j / K) * D, host_expert(gate, e, F), 1);
                cpu::matmul(hu.data(), x.data() + (j / K) * D, host_expert(up, e, F), 1);
                cpu::add_bias(hg.data(), gb.data() + e * F, 1, F);
                cpu::add_bias(hu.data(), ub.data() + e * F, 1, F);
                cpu::swiglu_oai(hg.data(), hg.data(), hu.data(), F, 1.702f, 7.0f);
                cpu::matmul(hd.data(), hg.data(), host_expert(down, e, D), 1);
                cpu::add_bias(hd.data(), db.data() + e * D, 1, D);
                std::copy(hd.begin(), hd.end(), ref_rows.begin() + j * D);
            }
            DevBuf<int32_t> dids(ids);
            DevBuf<float> dx(x), h(static_cast<size_t>(T * K * F)), upb(h.size()),
                rows(ref_rows.size());
            cuda_moe_experts_biased(rows.get(), h.get(), upb.get(), dx.get(), dids.get(), T * K,
                                    int(K), ex, nullptr);
            CHECK(nmse(rows.download(), ref_rows) < kGemv);
            // The grouped prefill path (GEMM for the groups past kCudaGemvMaxRows) against
            // the weighted sum of those rows.
            std::vector<float> wts = random_floats(static_cast<size_t>(T * K), 100);
            for (float& w : wts) w = 0.5f + 0.5f * std::fabs(w);
            std::vector<float> want_out(static_cast<size_t>(T * D), 0.0f);
            for (int64_t j = 0; j < T * K; ++j)
                for (int64_t d = 0; d < D; ++d)
                    want_out[size_t((j / K) * D + d)] +=
                        wts[size_t(j)] * ref_rows[size_t(j * D + d)];
            DevBuf<float> dw(wts), xs(static_cast<size_t>(T * K * D)), hh(h.size()), uu(h.size());
            DevBuf<int32_t> map(static_cast<size_t>(2 * T * K));
            DevBuf<float> out(x);
            cuda_moe_ffn_grouped(out.get(), out.get(), dids.get(), dw.get(), T, K, E, ex,
                                 {xs.get(), hh.get(), uu.get(), map.get()}, scratch, nullptr);
            CHECK(nmse(out.download(), want_out) < kGemmF16);
        }
    }
}

#endif  // KVRUN_HAS_CUDA
