// CUDA ops vs their CPU twins (cpu_ops.h / quant.h) on random inputs: dense ops, embedding
// and weight dequantization, fused GEMV and f16 tensor-core GEMM for every weight type, KV
// writes, row gather, CUDA-graph capture (and the scratch buffer refusing to move during a
// capture), device queries and error messages. Each comparison uses the
// normalized MSE sum((gpu - cpu)^2) / sum(cpu^2) with a per-op bound.
// Exits 77 (skipped) without a GPU (see cuda_test_util.h).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "attn_window.h"
#include "common.h"
#include "cpu_ops.h"
#include "cuda_test_util.h"
#include "cuda_test_weights.h"
#include "quant.h"

#ifdef KVRUN_HAS_CUDA

using namespace kvrun;
using namespace kvrun::test;

TEST_CASE(
    "cuda rmsnorm, softmax, swiglu, add, add_bias, geglu, softcap, scale, add_scaled_rows, "
    "add_sigmoid_gated match the CPU") {
    // 4096 and 8192: the register kernel (4 and 8 elements per thread); 8200: the loops.
    for (int64_t dim : {64, 172, 4096, 8192, 8200}) {
        CAPTURE(dim);
        const int64_t rows = 5, n = rows * dim;
        const std::vector<float> x = random_floats(static_cast<size_t>(n), 1, 2.0f);
        const std::vector<float> w = random_floats(static_cast<size_t>(dim), 2);
        const std::vector<float> y = random_floats(static_cast<size_t>(n), 3);
        DevBuf<float> dx(x), dw(w), dy(y), dout(static_cast<size_t>(n));

        std::vector<float> ref(static_cast<size_t>(n));
        cpu::rmsnorm(ref.data(), x.data(), w.data(), rows, dim, 1e-5f);
        cuda_rmsnorm(dout.get(), dx.get(), dw.get(), rows, dim, 1e-5f, nullptr);
        CHECK(nmse(dout.download(), ref) < kExact);
        DevBuf<float> in_place(x);  // out == x (qwen3's q / k norms)
        cuda_rmsnorm(in_place.get(), in_place.get(), dw.get(), rows, dim, 1e-5f, nullptr);
        CHECK(same_bits(in_place.download(), dout.download()));

        ref = x;
        for (int64_t r = 0; r < rows; ++r) cpu::softmax(ref.data() + r * dim, dim);
        DevBuf<float> sm(x);
        cuda_softmax(sm.get(), rows, dim, nullptr);
        CHECK(nmse(sm.download(), ref) < kExact);

        cpu::swiglu(ref.data(), x.data(), y.data(), n);
        cuda_swiglu(dout.get(), dx.get(), dy.get(), n, nullptr);
        CHECK(nmse(dout.download(), ref) < kExact);

        ref = x;
        cpu::add(ref.data(), y.data(), n);
        DevBuf<float> acc(x);
        cuda_add(acc.get(), dy.get(), n, nullptr);
        CHECK(nmse(acc.download(), ref) < kExact);

        ref = x;
        cpu::add_bias(ref.data(), w.data(), rows, dim);
        acc.upload(x);
        cuda_add_bias(acc.get(), dw.get(), rows, dim, nullptr);
        CHECK(nmse(acc.download(), ref) < kExact);

        // Gemma's ops: GeGLU, soft cap, scale.
        cpu::geglu(ref.data(), x.data(), y.data(), n);
        cuda_geglu(dout.get(), dx.get(), dy.get(), n, nullptr);
        CHECK(nmse(dout.download(), ref) < kExact);
        ref = x;
        cpu::softcap(ref.data(), n, 1.5f);
        acc.upload(x);
        cuda_softcap(acc.get(), n, 1.5f, nullptr);
        CHECK(nmse(acc.download(), ref) < kExact);
        ref = x;
        cpu::scale(ref.data(), n, 48.0f);
        acc.upload(x);
        cuda_scale(acc.get(), n, 48.0f, nullptr);
        CHECK(nmse(acc.download(), ref) < kExact);
        // Llama 4's attention temperature, row by row from device positions (a floor of 7
        // tokens: rows at positions 0 and 5 keep 1, the others grow with the position).
        const std::vector<int32_t> pos = {0, 5, 6, 100, 8190};
        DevBuf<int32_t> dpos(pos);
        ref = x;
        for (int64_t r = 0; r < rows; ++r)
            cpu::scale(ref.data() + r * dim, dim, attn_temperature(pos[size_t(r)], 0.1f, 7));
        acc.upload(x);
        cuda_attn_temperature(acc.get(), dpos.get(), rows, dim, 0.1f, 7, nullptr);
        CHECK(nmse(acc.download(), ref) < kExact);
        CHECK(std::vector<float>(ref.begin(), ref.begin() + 2 * dim) ==
              std::vector<float>(x.begin(), x.begin() + 2 * dim));
        CHECK(attn_temperature(6, 0.1f, 7) == doctest::Approx(1 + 0.1 * std::log(2.0)));
        // LoRA's per-row scaled add: the same bits as the host (a row scale of 0 adds nothing).
        const std::vector<float> user = {0.5f, -2.0f, 0.0f, 1.0f, 3.25f};
        DevBuf<float> du(user);
        ref = x;
        cpu::add_scaled_rows(ref.data(), y.data(), user.data(), rows, dim, 0.375);
        acc.upload(x);
        cuda_add_scaled_rows(acc.get(), dy.get(), du.get(), rows, dim, 0.375, nullptr);
        CHECK(acc.download() == ref);
        CHECK(std::vector<float>(ref.begin() + 2 * dim, ref.begin() + 3 * dim) ==
              std::vector<float>(x.begin() + 2 * dim, x.begin() + 3 * dim));
        // Qwen2-MoE's shared expert, added with a sigmoid gate per row (large logits included:
        // the gate saturates at 0 and 1 without a NaN).
        const std::vector<float> g = {0.5f, -2.0f, 0.0f, 90.0f, -90.0f};
        DevBuf<float> dg(g);
        ref = x;
        cpu::add_sigmoid_gated(ref.data(), y.data(), g.data(), rows, dim);
        acc.upload(x);
        cuda_add_sigmoid_gated(acc.get(), dy.get(), dg.get(), rows, dim, nullptr);
        CHECK(nmse(acc.download(), ref) < kExact);
        CHECK(std::vector<float>(ref.begin() + 4 * dim, ref.end()) ==
              std::vector<float>(x.begin() + 4 * dim, x.end()));
    }
}

TEST_CASE("cuda add_rmsnorm gives the bits of cuda_add then cuda_rmsnorm") {
    for (int64_t dim : {1, 64, 255, 4096, 4097, 8192, 8200})
        for (int64_t rows : {1, 3, 17}) {
            CAPTURE(dim);
            CAPTURE(rows);
            const size_t n = size_t(rows * dim);
            const uint32_t seed = uint32_t(dim * 31 + rows);
            const std::vector<float> x = random_floats(n, seed, 3.0f);
            const std::vector<float> y = random_floats(n, seed + 1);
            const std::vector<float> w = random_floats(size_t(dim), seed + 2);
            DevBuf<float> dy(y), dw(w);
            DevBuf<float> rx(x), rout(n);  // reference: two launches
            cuda_add(rx.get(), dy.get(), int64_t(n), nullptr);
            cuda_rmsnorm(rout.get(), rx.get(), dw.get(), rows, dim, 1e-5f, nullptr);
            const std::vector<float> want_x = rx.download(), want_out = rout.download();

            DevBuf<float> fx(x), fout(n);
            cuda_add_rmsnorm(fx.get(), dy.get(), fout.get(), dw.get(), rows, dim, 1e-5f, nullptr);
            CHECK(same_bits(fx.download(), want_x));
            CHECK(same_bits(fout.download(), want_out));
            // out may be y (the backend normalizes into the buffer the residual came from).
            DevBuf<float> fx2(x), fy(y);
            cuda_add_rmsnorm(fx2.get(), fy.get(), fy.get(), dw.get(), rows, dim, 1e-5f, nullptr);
            CHECK(same_bits(fx2.download(), want_x));
            CHECK(same_bits(fy.download(), want_out));

            // And it is the CPU's add + rmsnorm (the reference is not trivially equal).
            std::vector<float> hx = x, hout(n);
            cpu::add(hx.data(), y.data(), int64_t(n));
            cpu::rmsnorm(hout.data(), hx.data(), w.data(), rows, dim, 1e-5f);
            CHECK(nmse(want_out, hout) < kExact);
        }
    DevBuf<float> x(64), w(64);
    CHECK_THROWS_AS(cuda_add_rmsnorm(x.get(), w.get(), x.get(), w.get(), 1, 64, 1e-5f, nullptr),
                    Error);
}

TEST_CASE("cuda layernorm, add_layernorm and gelu match the CPU") {
    for (int64_t dim : {64, 172, 4096, 8200}) {
        CAPTURE(dim);
        const int64_t rows = 5;
        const size_t n = size_t(rows * dim);
        // Inputs off centre, so that the mean matters.
        std::vector<float> x = random_floats(n, 31, 2.0f), y = random_floats(n, 32);
        for (float& v : x) v += 3.0f;
        const std::vector<float> w = random_floats(size_t(dim), 33),
                                 b = random_floats(size_t(dim), 34);
        DevBuf<float> dw(w), db(b), dy(y);
        for (bool bias : {false, true}) {
            CAPTURE(bias);
            std::vector<float> ref(n);
            cpu::layernorm(ref.data(), x.data(), w.data(), bias ? b.data() : nullptr, rows, dim,
                           1e-5f);
            DevBuf<float> dx(x), dout(n);
            cuda_layernorm(dout.get(), dx.get(), dw.get(), bias ? db.get() : nullptr, rows, dim,
                           1e-5f, nullptr);
            CHECK(nmse(dout.download(), ref) < kExact);
            CHECK(same_bits(dx.download(), x));  // (x is only read)
            // In place, and fused with the residual add (out may be y).
            cuda_layernorm(dx.get(), dx.get(), dw.get(), bias ? db.get() : nullptr, rows, dim,
                           1e-5f, nullptr);
            CHECK(same_bits(dx.download(), dout.download()));
            std::vector<float> hx = x;
            cpu::add(hx.data(), y.data(), int64_t(n));
            cpu::layernorm(ref.data(), hx.data(), w.data(), bias ? b.data() : nullptr, rows, dim,
                           1e-5f);
            DevBuf<float> fx(x), fy(y);
            cuda_add_layernorm(fx.get(), fy.get(), fy.get(), dw.get(), bias ? db.get() : nullptr,
                               rows, dim, 1e-5f, nullptr);
            CHECK(nmse(fx.download(), hx) < kExact);
            CHECK(nmse(fy.download(), ref) < kExact);
        }
        std::vector<float> g(n);
        cpu::gelu(g.data(), x.data(), int64_t(n));
        DevBuf<float> dx(x);
        cuda_gelu(dx.get(), dx.get(), int64_t(n), nullptr);  // (in place)
        CHECK(nmse(dx.download(), g) < kExact);
    }
    DevBuf<float> x(64), w(64);
    CHECK_THROWS_AS(
        cuda_add_layernorm(x.get(), w.get(), x.get(), w.get(), nullptr, 1, 64, 1e-5f, nullptr),
        Error);
}

TEST_CASE("cuda rope matches the CPU (llama and neox pairs, partial rotation, long positions)") {
    const int64_t n_tokens = 9, n_heads = 4;
    std::vector<int32_t> pos = {0, 1, 2, 17, 255, 1000, 4095, 8191, 32767};
    DevBuf<int32_t> dpos(pos);
    for (int64_t head_dim : {64, 128})
        for (int64_t n_rot : {head_dim, head_dim / 2})
            for (float base : {10000.0f, 500000.0f})
                for (float fscale : {1.0f, 0.25f})
                    for (bool neox : {false, true}) {
                        CAPTURE(head_dim);
                        CAPTURE(n_rot);
                        CAPTURE(base);
                        CAPTURE(fscale);
                        CAPTURE(neox);
                        std::vector<float> x =
                            random_floats(static_cast<size_t>(n_tokens * n_heads * head_dim), 11);
                        DevBuf<float> dx(x);
                        const RopeParams p = RopeParams::plain(n_rot, base, fscale, neox);
                        cpu::rope(x.data(), pos.data(), n_tokens, n_heads, head_dim, p);
                        cuda_rope(dx.get(), dpos.get(), n_tokens, n_heads, head_dim, p, nullptr);
                        CHECK(nmse(dx.download(), x) < kExact);
                    }
}

TEST_CASE("cuda rope matches the CPU with frequency factors and YaRN") {
    const int64_t n_tokens = 7, n_heads = 3, head_dim = 128;
    std::vector<int32_t> pos = {0, 3, 100, 4095, 8191, 65535, 131071};
    DevBuf<int32_t> dpos(pos);
    for (int64_t n_rot : {head_dim, head_dim / 2})
        for (bool factors : {false, true})
            for (bool yarn : {false, true})
                for (bool neox : {false, true}) {
                    CAPTURE(n_rot);
                    CAPTURE(factors);
                    CAPTURE(yarn);
                    CAPTURE(neox);
                    std::vector<float> ff(size_t(n_rot / 2));
                    for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + float(i % 9);
                    DevBuf<float> dff(ff);
                    RopeParams p = RopeParams::plain(n_rot, 500000.0f, yarn ? 0.25f : 1.0f, neox);
                    if (yarn) {
                        p.ext_factor = 1.0f;
                        p.corr_low = 5.0f;
                        p.corr_high = float(n_rot / 2 - 10);
                        p.mscale = 1.1386f;
                    }
                    std::vector<float> x =
                        random_floats(static_cast<size_t>(n_tokens * n_heads * head_dim), 5);
                    DevBuf<float> dx(x);
                    RopeParams host = p, dev = p;
                    if (factors) {
                        host.freq_factors = ff.data();
                        dev.freq_factors = dff.get();
                    }
                    cpu::rope(x.data(), pos.data(), n_tokens, n_heads, head_dim, host);
                    cuda_rope(dx.get(), dpos.get(), n_tokens, n_heads, head_dim, dev, nullptr);
                    CHECK(nmse(dx.download(), x) < kExact);
                }
}

TEST_CASE("cuda embed and f16 dequantization match dequantize_row for every weight type") {
    for (GgmlType t : cuda_weight_types()) {
        CAPTURE(ggml_type_name(t));
        const int64_t be = ggml_type_traits(t).block_elems;
        std::vector<int64_t> widths = be == 256  ? std::vector<int64_t>{256, 768}
                                      : be == 32 ? std::vector<int64_t>{96, 512}
                                      : be == 1  ? std::vector<int64_t>{64, 172, 520}
                                                 : std::vector<int64_t>{be, 5 * be};
        for (int64_t n_in : widths) {
            CAPTURE(n_in);
            const int64_t n_out = 37;
            TestWeights w = make_weights(t, n_out, n_in, 100 + uint32_t(n_in));
            const std::vector<int32_t> tokens = {0, 5, 36, 5, 3, 20};
            const int64_t nt = int64_t(tokens.size());
            std::vector<float> ref(static_cast<size_t>(nt * n_in));
            cpu::embed(ref.data(), w.host, tokens.data(), nt);
            DevBuf<int32_t> dtok(tokens);
            DevBuf<float> dout(ref.size());
            cuda_embed(dout.get(), w.device, dtok.get(), nt, nullptr);
            CHECK(nmse(dout.download(), ref) < 1e-12);

            // Rows 3..36 to f16 (the GEMM path's weight tiles).
            const int64_t row0 = 3, rows = n_out - row0;
            std::vector<float> deq(static_cast<size_t>(rows * n_in));
            for (int64_t r = 0; r < rows; ++r)
                dequantize_row(t, w.bytes.data() + size_t(row0 + r) * w.host.row_bytes,
                               deq.data() + r * n_in, n_in);
            DevBuf<uint16_t> d16(deq.size());
            cuda_dequantize_f16(d16.get(), w.device, row0, rows, nullptr);
            const std::vector<uint16_t> h16 = d16.download();
            std::vector<float> got(h16.size());
            for (size_t i = 0; i < h16.size(); ++i) got[i] = fp16_to_fp32(h16[i]);
            CHECK(nmse(got, deq) < 1e-6);
        }
    }
}

TEST_CASE("cuda embed gives a zero row for an out-of-range token id") {
    TestWeights w = make_weights(GgmlType::Q8_0, 8, 64, 5);
    DevBuf<int32_t> tok(std::vector<int32_t>{-1, 8, 1000000});
    DevBuf<float> out(3 * 64);
    cuda_embed(out.get(), w.device, tok.get(), 3, nullptr);
    const std::vector<float> got = out.download();
    CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("cuda gemv (fused dequantize x vector) matches cpu::matmul for every weight type") {
    for (GgmlType t : cuda_weight_types()) {
        CAPTURE(ggml_type_name(t));
        const int64_t be = ggml_type_traits(t).block_elems;
        std::vector<int64_t> widths = be == 256  ? std::vector<int64_t>{256, 2048}
                                      : be == 32 ? std::vector<int64_t>{96, 2048}
                                      : be == 1  ? std::vector<int64_t>{172, 2048}
                                                 : std::vector<int64_t>{3 * be, 2048};
        for (int64_t n_in : widths)
            for (int64_t n_out : {37, 128}) {
                TestWeights w = make_weights(t, n_out, n_in, 7 + uint32_t(n_in + n_out));
                for (int64_t n_rows : {1, 2, 3, 8, 11}) {
                    CAPTURE(n_in);
                    CAPTURE(n_out);
                    CAPTURE(n_rows);
                    const std::vector<float> x =
                        random_floats(static_cast<size_t>(n_rows * n_in), 9);
                    std::vector<float> ref(static_cast<size_t>(n_rows * n_out));
                    cpu::matmul(ref.data(), x.data(), w.host, n_rows);
                    DevBuf<float> dx(x), dout(ref.size());
                    cuda_gemv(dout.get(), dx.get(), w.device, n_rows, nullptr);
                    CHECK(nmse(dout.download(), ref) < kGemv);
                }
            }
    }
}

namespace {

// Given `all`, cuda_matmul's product of x's n_rows rows with w: each row (every `step`-th)
// alone gives its bits (a row's bits do not depend on the pass's row count).
void check_rows_alone(const TestWeights& w, const std::vector<float>& x,
                      const std::vector<float>& all, int64_t n_rows, int64_t step,
                      CudaScratch& scratch) {
    const int64_t n_in = w.host.n_in, n_out = w.host.n_out;
    for (int64_t r = 0; r < n_rows; r += step) {
        CAPTURE(r);
        const std::vector<float> xr(x.begin() + r * n_in, x.begin() + (r + 1) * n_in);
        DevBuf<float> dxr(xr), dout(static_cast<size_t>(n_out));
        cuda_matmul(dout.get(), dxr.get(), w.device, 1, scratch, nullptr);
        const std::vector<float> one = dout.download();
        CHECK(std::equal(one.begin(), one.end(), all.begin() + r * n_out));
    }
}

// What every GEMV path must keep: check_rows_alone, and the fused gate/up launch with w as
// both matrices gives silu(all) * all.
void check_gemv_rows(const TestWeights& w, const std::vector<float>& x,
                     const std::vector<float>& all, int64_t n_rows, int64_t step,
                     CudaScratch& scratch) {
    check_rows_alone(w, x, all, n_rows, step, scratch);
    DevBuf<float> dx(x), dg(all.size()), du(all.size());
    cuda_matmul_swiglu(dg.get(), du.get(), dx.get(), w.device, w.device, n_rows, scratch, nullptr);
    std::vector<float> want(all.size());
    for (size_t i = 0; i < all.size(); ++i) want[i] = all[i] / (1.0f + std::exp(-all[i])) * all[i];
    CHECK(nmse(dg.download(), want) < kGemv);
}

}  // namespace

TEST_CASE("cuda gemv gives each row the same bits whatever the number of rows") {
    // What keeps a speculative verification pass (up to kCudaGemvMaxRows rows) identical to
    // single-token decode steps: cuda_matmul must take the GEMV for every such row count.
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F16}) {
        CAPTURE(ggml_type_name(t));
        const int64_t n_in = 512, n_out = 72;
        TestWeights w = make_weights(t, n_out, n_in, 41);
        CudaScratch scratch;
        const int64_t n_rows = kCudaGemvMaxRows;
        const std::vector<float> x = random_floats(static_cast<size_t>(n_rows * n_in), 42);
        DevBuf<float> dx(x), dall(static_cast<size_t>(n_rows * n_out));
        cuda_matmul(dall.get(), dx.get(), w.device, n_rows, scratch, nullptr);
        check_rows_alone(w, x, dall.download(), n_rows, 1, scratch);
    }
}

TEST_CASE("cuda gemv split-K (KVRUN_GEMV_SPLIT): near the CPU, row bits, swiglu, 8-bit x") {
    // Every launch here has few blocks, so each split applies: 2, 4 or 8 warps per row pair
    // (and 0, auto: the fewest parts that reach 1024 blocks, here 8).
    struct Reset {
        ~Reset() {
            cuda_set_gemv_split(1);
            cuda_set_gemv_q8(false);
        }
    } reset;
    for (int split : {2, 4, 8, 0})
        for (bool q8 : {false, true})
            for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q8_0,
                               GgmlType::Q4_K, GgmlType::Q6_K}) {
                if (q8 && (t == GgmlType::F32 || t == GgmlType::F16)) continue;
                CAPTURE(split);
                CAPTURE(q8);
                CAPTURE(ggml_type_name(t));
                cuda_set_gemv_split(split);
                cuda_set_gemv_q8(q8);
                // 75 rows: a part-filled last block and a last row pair of one row; 8192
                // inputs: two x chunks for one row (odd chunk boundaries for the parts).
                for (int64_t n_in : {256, 8192}) {
                    CAPTURE(n_in);
                    const int64_t n_out = 75;
                    TestWeights w = make_weights(t, n_out, n_in, 5 + uint32_t(n_in));
                    CudaScratch scratch;
                    const int64_t n_rows = 11;
                    const std::vector<float> x = random_floats(size_t(n_rows * n_in), 6);
                    std::vector<float> ref(size_t(n_rows * n_out));
                    cpu::matmul(ref.data(), x.data(), w.host, n_rows);
                    DevBuf<float> dx(x), dall(ref.size());
                    cuda_matmul(dall.get(), dx.get(), w.device, n_rows, scratch, nullptr);
                    const std::vector<float> all = dall.download();
                    CHECK(nmse(all, ref) < (q8 ? 1e-4 : kGemv));
                    if (n_in == 8192) {  // the parts' sums really were added in another order
                        cuda_set_gemv_split(1);
                        DevBuf<float> d1(ref.size());
                        cuda_matmul(d1.get(), dx.get(), w.device, n_rows, scratch, nullptr);
                        CHECK(d1.download() != all);
                        cuda_set_gemv_split(split);
                    }
                    check_gemv_rows(w, x, all, n_rows, 5, scratch);
                }
            }
    cuda_set_gemv_split(1);
    CHECK(cuda_gemv_split() == 1);
    CHECK_THROWS_WITH_AS(cuda_set_gemv_split(3), doctest::Contains("0 (auto), 1, 2, 4 or 8"),
                         Error);
}

TEST_CASE("cuda gemv with 8- and 16-bit activations: integer reference, near f32, row bits") {
    // KVRUN_GEMV=q8 (cuda_set_gemv_q8): x rounded to signed bytes per 32 elements
    // (d = max|x| / 127, round to nearest even), integer dot products per item; KVRUN_GEMV=q16
    // (cuda_set_gemv_q16): int16s (d = max|x| / 32767), dp2a products.
    struct Off {
        ~Off() { cuda_set_gemv_q8(false); }
    } off;
    for (const int bits : {8, 16}) {
        CAPTURE(bits);
        const float qmax = bits == 8 ? 127.0f : 32767.0f;
        if (bits == 8)
            cuda_set_gemv_q8(true);
        else
            cuda_set_gemv_q16(true);
        CHECK(cuda_gemv_q8());
        CHECK(cuda_gemv_q16() == (bits == 16));
        for (GgmlType t :
             {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
              GgmlType::IQ4_NL, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS}) {
            CAPTURE(ggml_type_name(t));
            for (int64_t n_in : {256, 2048}) {
                const int64_t n_out = 75;
                TestWeights w = make_weights(t, n_out, n_in, 61 + uint32_t(n_in));
                std::vector<float> wf(size_t(n_out * n_in));
                for (int64_t o = 0; o < n_out; ++o)
                    dequantize_row(t, w.bytes.data() + o * w.host.row_bytes, wf.data() + o * n_in,
                                   n_in);
                CudaScratch scratch;
                for (int64_t n_rows : {1, 3, 9, 16}) {
                    CAPTURE(n_in);
                    CAPTURE(n_rows);
                    const std::vector<float> x = random_floats(size_t(n_rows * n_in), 62 + n_rows);
                    // x as the kernel rounds it, then the exact product in double.
                    std::vector<float> xr(x.size());
                    for (size_t b = 0; b < x.size(); b += 32) {
                        float amax = 0.0f;
                        for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
                        const float d = amax / qmax, id = d > 0.0f ? 1.0f / d : 0.0f;
                        for (size_t i = b; i < b + 32; ++i) xr[i] = std::nearbyint(x[i] * id) * d;
                    }
                    std::vector<float> ref(size_t(n_rows * n_out)), f32(ref.size());
                    for (int64_t r = 0; r < n_rows; ++r)
                        for (int64_t o = 0; o < n_out; ++o) {
                            double acc = 0.0;
                            for (int64_t i = 0; i < n_in; ++i)
                                acc += double(wf[size_t(o * n_in + i)]) * xr[size_t(r * n_in + i)];
                            ref[size_t(r * n_out + o)] = float(acc);
                        }
                    cpu::matmul(f32.data(), x.data(), w.host, n_rows);
                    DevBuf<float> dx(x), dout(ref.size());
                    cuda_matmul(dout.get(), dx.get(), w.device, n_rows, scratch, nullptr);
                    const std::vector<float> got = dout.download();
                    CHECK(nmse(got, ref) < kGemv);
                    // x's rounding: ~1e-5 on random data with bytes, ~256^2 times less with int16s
                    CHECK(nmse(got, f32) < (bits == 8 ? 1e-4 : 1e-8));
                    CHECK(nmse(got, f32) > (bits == 8 ? 1e-9 : 1e-14));  // the integer path ran
                    check_gemv_rows(w, x, got, n_rows, 4, scratch);
                }
            }
        }
    }
    cuda_set_gemv_q8(false);
    CHECK_FALSE(cuda_gemv_q8());
    CHECK_FALSE(cuda_gemv_q16());
}

TEST_CASE("cuda rmsnorm_xq / add_rmsnorm_xq: the norms' bits, x quantized as the GEMV does") {
    // The decode step's norms quantize their output for the integer GEMV in the same launch
    // (CudaBackend::norm_xb); the matmul given those rows must see what it would have made.
    struct Off {
        ~Off() { cuda_set_gemv_q8(false); }
    } off;
    for (const int elt : {1, 2})
        for (int64_t dim : {64, 4096, 8192, 8224})  // 8224: past the register kernel
            for (int64_t rows : {1, 3}) {
                CAPTURE(elt);
                CAPTURE(dim);
                CAPTURE(rows);
                if (elt == 1)
                    cuda_set_gemv_q8(true);
                else
                    cuda_set_gemv_q16(true);
                const size_t n = size_t(rows * dim), nb = n / 32;
                const uint32_t seed = uint32_t(dim + rows + elt);
                const std::vector<float> x = random_floats(n, seed, 3.0f);
                const std::vector<float> y = random_floats(n, seed + 1);
                const std::vector<float> w = random_floats(size_t(dim), seed + 2);
                DevBuf<float> dy(y), dw(w);
                for (const bool add : {false, true}) {
                    CAPTURE(add);
                    DevBuf<float> px(x), pout(n);  // the plain op and cuda_quantize_x
                    DevBuf<int8_t> pq(n * size_t(elt));
                    DevBuf<float> pd(nb);
                    if (add)
                        cuda_add_rmsnorm(px.get(), dy.get(), pout.get(), dw.get(), rows, dim, 1e-5f,
                                         nullptr);
                    else
                        cuda_rmsnorm(pout.get(), px.get(), dw.get(), rows, dim, 1e-5f, nullptr);
                    cuda_quantize_x(pout.get(), rows, dim,
                                    CudaXq{pout.get(), pq.get(), pd.get(), elt}, nullptr);
                    DevBuf<float> fx(x), fout(n);
                    DevBuf<int8_t> fq(n * size_t(elt));
                    DevBuf<float> fd(nb);
                    const CudaXq xq{fout.get(), fq.get(), fd.get(), elt};
                    if (add)
                        cuda_add_rmsnorm_xq(fx.get(), dy.get(), fout.get(), dw.get(), rows, dim,
                                            1e-5f, xq, nullptr);
                    else
                        cuda_rmsnorm_xq(fout.get(), fx.get(), dw.get(), rows, dim, 1e-5f, xq,
                                        nullptr);
                    CHECK(same_bits(fx.download(), px.download()));
                    CHECK(same_bits(fout.download(), pout.download()));
                    CHECK(fq.download() == pq.download());
                    CHECK(same_bits(fd.download(), pd.download()));
                    // A gate/up GEMV given the rows: the bits of the one that quantizes them.
                    if (dim != 64 || rows != 3) continue;
                    TestWeights wg = make_weights(GgmlType::Q4_0, 40, dim, 78);
                    CudaScratch scratch;
                    DevBuf<float> g1(size_t(rows * 40)), u1(g1.size()), g2(g1.size()),
                        u2(g1.size());
                    cuda_matmul_swiglu(g1.get(), u1.get(), fout.get(), wg.device, wg.device, rows,
                                       scratch, nullptr, &xq);
                    cuda_matmul_swiglu(g2.get(), u2.get(), fout.get(), wg.device, wg.device, rows,
                                       scratch, nullptr);
                    CHECK(same_bits(g1.download(), g2.download()));
                }
            }
    CudaXq bad{nullptr, nullptr, nullptr, 1};
    DevBuf<float> a(64), b(64);
    CHECK_THROWS_AS(cuda_rmsnorm_xq(a.get(), a.get(), b.get(), 1, 64, 1e-5f, bad, nullptr), Error);
}

TEST_CASE("cuda matmul_qkv, matmul_swiglu and matmul_geglu give the bits of separate launches") {
    // The backend's fused decode launches: q/k/v in one GEMV, gate/up with SiLU(gate) * up
    // written by the GEMV. Mixed types (Q4_K_M keeps some attn_v / ffn tensors in Q6_K) take
    // separate launches, more than kCudaGemvMaxRows rows the GEMM path.
    CudaScratch scratch;
    const int64_t n_in = 512;
    struct Types {
        GgmlType a, b, c;
    };
    for (Types ty : {Types{GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0},
                     Types{GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K},
                     Types{GgmlType::Q8_0, GgmlType::F16, GgmlType::Q8_0},
                     Types{GgmlType::F32, GgmlType::F32, GgmlType::F32}}) {
        CAPTURE(ggml_type_name(ty.a));
        CAPTURE(ggml_type_name(ty.b));
        CAPTURE(ggml_type_name(ty.c));
        TestWeights wq = make_weights(ty.a, 256, n_in, 51), wk = make_weights(ty.b, 72, n_in, 52),
                    wv = make_weights(ty.c, 72, n_in, 53);
        TestWeights gate = make_weights(ty.a, 200, n_in, 54),
                    up = make_weights(ty.b, 200, n_in, 55);
        for (int64_t n_rows : {1, 3, 16, 20}) {
            CAPTURE(n_rows);
            const std::vector<float> x = random_floats(static_cast<size_t>(n_rows * n_in), 56);
            DevBuf<float> dx(x);
            auto run = [&](const TestWeights& w) {
                DevBuf<float> out(static_cast<size_t>(n_rows * w.host.n_out));
                cuda_matmul(out.get(), dx.get(), w.device, n_rows, scratch, nullptr);
                return out.download();
            };
            DevBuf<float> q(static_cast<size_t>(n_rows * 256)), k(static_cast<size_t>(n_rows * 72)),
                v(static_cast<size_t>(n_rows * 72));
            cuda_matmul_qkv(q.get(), k.get(), v.get(), dx.get(), wq.device, wk.device, wv.device,
                            n_rows, scratch, nullptr);
            auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
                return a.size() == b.size() &&
                       std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
            };
            CHECK(same_bits(q.download(), run(wq)));
            CHECK(same_bits(k.download(), run(wk)));
            CHECK(same_bits(v.download(), run(wv)));

            std::vector<float> want = run(gate);
            const std::vector<float> u = run(up);
            DevBuf<float> dg(want), du(u), dwant(want.size());
            cuda_swiglu(dwant.get(), dg.get(), du.get(), int64_t(want.size()), nullptr);
            want = dwant.download();
            DevBuf<float> out(want.size()), up_buf(want.size());
            cuda_matmul_swiglu(out.get(), up_buf.get(), dx.get(), gate.device, up.device, n_rows,
                               scratch, nullptr);
            CHECK(same_bits(out.download(), want));

            // Gemma's GeGLU form: the bits of the two products and cuda_geglu.
            std::vector<float> want_g = run(gate);
            DevBuf<float> dgg(want_g), dgwant(want_g.size());
            cuda_geglu(dgwant.get(), dgg.get(), du.get(), int64_t(want_g.size()), nullptr);
            cuda_matmul_geglu(out.get(), up_buf.get(), dx.get(), gate.device, up.device, n_rows,
                              scratch, nullptr);
            CHECK(same_bits(out.download(), dgwant.download()));
        }
    }
}

TEST_CASE("cuda gemm (f16 tensor cores) and cuda_matmul match cpu::matmul for every type") {
    CudaScratch scratch;
    for (GgmlType t : cuda_weight_types()) {
        CAPTURE(ggml_type_name(t));
        const int64_t n_in = 512, n_out = 200;
        TestWeights w = make_weights(t, n_out, n_in, 31);
        for (int64_t n_rows : {9, 64}) {
            CAPTURE(n_rows);
            const std::vector<float> x = random_floats(static_cast<size_t>(n_rows * n_in), 10);
            std::vector<float> ref(static_cast<size_t>(n_rows * n_out));
            cpu::matmul(ref.data(), x.data(), w.host, n_rows);
            DevBuf<float> dx(x), dout(ref.size());
            const double bound = t == GgmlType::F32 ? kGemv : kGemmF16;
            cuda_gemm(dout.get(), dx.get(), w.device, n_rows, scratch, nullptr);
            CHECK(nmse(dout.download(), ref) < bound);
            dout.zero();
            cuda_matmul(dout.get(), dx.get(), w.device, n_rows, scratch, nullptr);
            CHECK(nmse(dout.download(), ref) < (n_rows <= kCudaGemvMaxRows ? kGemv : bound));
        }
    }
}

TEST_CASE("cuda tensor-core tile helper (flash attention) multiplies in the documented layout") {
    // Small integers: every product and sum is exact in f16 x f16 -> f32, in any order, so the
    // instruction (GPU) and the shuffle twin (emulator) must both give the host product.
    std::vector<uint16_t> a(16 * 16), b(16 * 8);
    std::vector<float> fa(a.size()), fb(b.size()), ref(16 * 8, 0.0f);
    for (size_t i = 0; i < a.size(); ++i) fa[i] = float(int((i * 7 + 3) % 17) - 8);
    for (size_t i = 0; i < b.size(); ++i) fb[i] = float(int((i * 5 + 1) % 13) - 6);
    for (size_t i = 0; i < a.size(); ++i) a[i] = fp32_to_fp16(fa[i]);
    for (size_t i = 0; i < b.size(); ++i) b[i] = fp32_to_fp16(fb[i]);
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 8; ++c)
            for (int k = 0; k < 16; ++k)
                ref[size_t(r * 8 + c)] += fa[size_t(r * 16 + k)] * fb[size_t(k * 8 + c)];
    DevBuf<uint16_t> da(a), db(b);
    DevBuf<float> dd(ref.size());
    cuda_mma_16816_tile(dd.get(), da.get(), db.get(), nullptr);
    CHECK(dd.download() == ref);
}

TEST_CASE("cuda gemm splits a wide weight into several dequantized tiles") {
    // 16384 inputs -> 1024 rows per 32 MiB tile, so 1100 rows take two tiles.
    CudaScratch scratch;
    const int64_t n_in = 16384, n_out = 1100, n_rows = 9;
    TestWeights w = make_weights(GgmlType::Q8_0, n_out, n_in, 12);
    const std::vector<float> x = random_floats(static_cast<size_t>(n_rows * n_in), 13);
    std::vector<float> ref(static_cast<size_t>(n_rows * n_out));
    cpu::matmul(ref.data(), x.data(), w.host, n_rows);
    DevBuf<float> dx(x), dout(ref.size());
    cuda_gemm(dout.get(), dx.get(), w.device, n_rows, scratch, nullptr);
    CHECK(nmse(dout.download(), ref) < kGemmF16);
}

TEST_CASE("cuda kv_write stores the same bytes as the CPU (f32 and f16 pools)") {
    const int64_t n_blocks = 6, n_kv_head = 2, block_size = 16, head_dim = 64;
    const std::vector<int32_t> table = {4, 1, 5, 0, 2, 3};  // 2 sequences x 3 blocks
    const std::vector<int32_t> seq = {0, 0, 1, 1, 0};
    const std::vector<int32_t> slot = {0, 17, 47, 5, 33};
    const int64_t nt = int64_t(seq.size());
    const std::vector<float> k = random_floats(static_cast<size_t>(nt * n_kv_head * head_dim), 21);
    const std::vector<float> v = random_floats(static_cast<size_t>(nt * n_kv_head * head_dim), 22);
    DevBuf<int32_t> dtable(table), dseq(seq), dslot(slot);
    DevBuf<float> dk(k), dv(v);
    for (KvType type : {KvType::F32, KvType::F16}) {
        const size_t elem = type == KvType::F32 ? 4 : 2;
        const size_t bytes = size_t(n_blocks * n_kv_head * block_size * head_dim) * elem;
        std::vector<uint8_t> k_pool(bytes, 0), v_pool(bytes, 0);
        KvLayerView host{type,     type,      k_pool.data(), v_pool.data(),
                         n_blocks, n_kv_head, block_size,    head_dim};
        KvBatchView hb{seq.data(), slot.data(), table.data(), 3, nt};
        cpu::kv_write(host, hb, k.data(), v.data());

        DevBuf<uint8_t> dkp(bytes), dvp(bytes);
        dkp.zero();
        dvp.zero();
        KvLayerView dev = host;
        dev.k = dkp.get();
        dev.v = dvp.get();
        KvBatchView db{dseq.get(), dslot.get(), dtable.get(), 3, nt};
        cuda_kv_write(dev, db, dk.get(), dv.get(), nullptr);
        CHECK(dkp.download() == k_pool);
        CHECK(dvp.download() == v_pool);
    }
}

TEST_CASE("cuda ops replay correctly from a captured CUDA graph") {
    CudaScratch scratch;
    const int64_t n_in = 1024, n_out = 256;
    TestWeights w = make_weights(GgmlType::Q4_K, n_out, n_in, 41);
    const std::vector<float> x = random_floats(static_cast<size_t>(16 * n_in), 42);
    const std::vector<float> g = random_floats(static_cast<size_t>(n_in), 43);
    DevBuf<float> dx(x), dg(g), dn(x.size()), d1(static_cast<size_t>(n_out)),
        d16(static_cast<size_t>(16 * n_out));
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    auto run = [&] {
        cuda_rmsnorm(dn.get(), dx.get(), dg.get(), 16, n_in, 1e-5f, s);
        cuda_matmul(d1.get(), dn.get(), w.device, 1, scratch, s);
        cuda_matmul(d16.get(), dn.get(), w.device, 16, scratch, s);
    };
    run();  // eager: also sizes the scratch buffer
    CUDA_CHECK(cudaStreamSynchronize(s));
    const std::vector<float> eager1 = d1.download(), eager16 = d16.download();
    d1.zero();
    d16.zero();
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    run();
    CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphLaunch(exec, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    CHECK(d1.download() == eager1);
    CHECK(nmse(d16.download(), eager16) < 1e-12);
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    CUDA_CHECK(cudaStreamDestroy(s));
}

TEST_CASE("cuda gather_rows copies the logit rows in the given order") {
    const int64_t dim = 96, n = 40;
    const std::vector<float> x = random_floats(static_cast<size_t>(n * dim), 51);
    const std::vector<int32_t> rows = {39, 0, 7, 7, 12};
    DevBuf<float> dx(x), out(rows.size() * size_t(dim));
    DevBuf<int32_t> dr(rows);
    cuda_gather_rows(out.get(), dx.get(), dr.get(), int64_t(rows.size()), dim, nullptr);
    std::vector<float> want;
    for (int32_t r : rows) want.insert(want.end(), x.begin() + r * dim, x.begin() + (r + 1) * dim);
    CHECK(out.download() == want);
}

TEST_CASE("cuda copy_rows and mla_kv_rows (DeepSeek's latent attention) match the host") {
    // Strided rows: columns 3..10 of 6 rows 20 wide into rows 12 wide at column 2.
    const std::vector<float> x = random_floats(120, 52);
    std::vector<float> want(72, -1.0f);
    DevBuf<float> dx(x), out(want);
    for (int64_t r = 0; r < 6; ++r)
        for (int64_t c = 0; c < 8; ++c) want[size_t(r * 12 + 2 + c)] = x[size_t(r * 20 + 3 + c)];
    cuda_copy_rows(out.get() + 2, 12, dx.get() + 3, 20, 6, 8, nullptr);
    CHECK(out.download() == want);
    CHECK_THROWS_AS(cuda_copy_rows(out.get(), 4, dx.get(), 20, 6, 8, nullptr), Error);

    // The cached rows [k_pe | rmsnorm(c) * w] from [c | k_pe], as CpuBackend::mla_attention
    // builds them: rank 512 + 64 RoPE'd dims (every DeepSeek), and a small shape.
    for (auto [rank, rot] :
         {std::pair{int64_t(512), int64_t(64)}, std::pair{int64_t(32), int64_t(8)}}) {
        CAPTURE(rank);
        const int64_t T = 5, D = rank + rot;
        const std::vector<float> kv_a = random_floats(size_t(T * D), 53, 3.0f);
        const std::vector<float> w = random_floats(size_t(rank), 54);
        std::vector<float> ref(size_t(T * D));
        for (int64_t t = 0; t < T; ++t) {
            std::copy(kv_a.begin() + t * D + rank, kv_a.begin() + (t + 1) * D, ref.begin() + t * D);
            cpu::rmsnorm(ref.data() + t * D + rot, kv_a.data() + t * D, w.data(), 1, rank, 1e-6f);
        }
        DevBuf<float> dkv(kv_a), dw(w), dk(size_t(T * D));
        cuda_mla_kv_rows(dk.get(), dkv.get(), dw.get(), T, rank, rot, 1e-6f, nullptr);
        const std::vector<float> k = dk.download();
        CHECK(nmse(k, ref) < kExact);
        for (int64_t t = 0; t < T; ++t)  // k_pe is copied as it is
            CHECK(std::equal(k.begin() + t * D, k.begin() + t * D + rot, ref.begin() + t * D));
    }
}

TEST_CASE("cuda scratch grows outside a graph capture and refuses to move during one") {
    CudaScratch scratch;
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    void* p1 = scratch.get(1000, s);
    CHECK(p1 != nullptr);
    CHECK(scratch.size() >= 1000);
    CHECK(scratch.get(10, s) == p1);  // big enough: the same buffer
    const size_t size1 = scratch.size();
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CHECK(scratch.get(size1, s) == p1);
    CHECK_THROWS_WITH_AS(scratch.get(size1 + 1, s), doctest::Contains("during graph capture"),
                         Error);
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    if (graph) CUDA_CHECK(cudaGraphDestroy(graph));
    CHECK(scratch.size() == size1);  // nothing was freed under the capture
    scratch.get(size1 + 1, s);       // outside: grows
    CHECK(scratch.size() > size1);
    CUDA_CHECK(cudaStreamDestroy(s));
}

TEST_CASE("cuda device queries and errors name what went wrong") {
    const CudaDeviceInfo info = cuda_device_info(0);
    CHECK(!info.name.empty());
    CHECK(info.total_bytes > 0);
    CHECK(info.sm_count > 0);
    CHECK(cuda_device_summary(info).find(info.name) != std::string::npos);
    CHECK_THROWS_AS(cuda_device_info(cuda_device_count()), Error);

    try {
        (void)cuda_alloc(static_cast<size_t>(1) << 52, "the test buffer");
        FAIL("a 4 PiB allocation succeeded");
    } catch (const Error& e) {
        const std::string msg = e.what();
        CHECK(msg.find("out of GPU memory allocating the test buffer") != std::string::npos);
        CHECK(msg.find("requested 4294967296.0 MiB") != std::string::npos);
        CHECK(msg.find("free of") != std::string::npos);
    }

    TestWeights w = make_weights(GgmlType::Q8_0, 4, 64, 1);
    WeightView bad = w.device;
    bad.type = GgmlType::Q8_K;
    DevBuf<float> x(64), out(4);
    CHECK_THROWS_WITH_AS(cuda_gemv(out.get(), x.get(), bad, 1, nullptr),
                         doctest::Contains("unsupported weight type"), Error);
    bad = w.device;
    bad.n_in = 48;  // not a whole number of blocks
    CHECK_THROWS_AS(cuda_gemv(out.get(), x.get(), bad, 1, nullptr), Error);
}

#endif  // KVRUN_HAS_CUDA
