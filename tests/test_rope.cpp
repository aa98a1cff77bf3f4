// RoPE beyond the plain rotation: Llama 3.1's per-pair frequency factors (rope_freqs.weight),
// linear and YaRN scaling, and llama.cpp's --rope-* / --yarn-* overrides. The op's angles are
// checked pair by pair against the formulas; whole models are checked by equivalences that
// must hold exactly (constant factors c = linear scaling by c = an override of the scale, an
// overridden base = a model written with that base, YaRN by override = YaRN from metadata) and
// by load errors for hostile rope_freqs tensors.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"
#include "cpu_ops.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "model_config.h"
#include "rope.h"
#include "synthetic_model.h"
#include "test_util.h"

using namespace kvrun;
using kvrun::test::TempDir;

namespace {

// The angle pair i of `x` was turned by, from one rotated pair (a, b) = (1, 0) at
// position pos: atan2 of the result, unwrapped against the expected angle.
double turned_angle(const RopeParams& p, int32_t pos, int64_t i, double expect, double* norm) {
    const int64_t n_rot = p.n_rot;
    std::vector<float> x(size_t(n_rot), 0.0f);
    const int64_t a = p.neox ? i : 2 * i, b = p.neox ? i + n_rot / 2 : 2 * i + 1;
    x[size_t(a)] = 1.0f;
    cpu::rope(x.data(), &pos, 1, 1, n_rot, p);
    *norm = std::hypot(double(x[size_t(a)]), double(x[size_t(b)]));
    const double got = std::atan2(double(x[size_t(b)]), double(x[size_t(a)]));
    return got + 2.0 * M_PI * std::round((expect - got) / (2.0 * M_PI));
}

double plain_angle(double base, int64_t n_rot, int32_t pos, int64_t i) {
    return double(pos) * std::pow(base, -2.0 * double(i) / double(n_rot));
}

SyntheticModelConfig tiny_model(uint64_t seed = 3) {
    SyntheticModelConfig c = synthetic_preset("tiny");
    c.n_layer = 2;
    c.n_ctx = 8192;
    c.seed = seed;
    c.weight_std = 0.08f;  // large enough that RoPE changes move the logits visibly
    return c;
}

// Last-token logits of a 48-token prompt (positions offset by `pos0`), CPU backend.
std::vector<float> last_logits(const std::string& path, const RopeOverrides& rope = {},
                               int32_t pos0 = 0) {
    GgufFile f = GgufFile::open(path);
    BackendOptions o;
    o.n_kv_blocks = 8;
    o.n_threads = 2;
    o.rope = rope;
    auto be = make_cpu_backend(f, o);
    ForwardBatch b;
    const int n = 48;
    for (int i = 0; i < n; ++i) {
        b.tokens.push_back(3 + (i * 37) % 500);
        b.positions.push_back(pos0 + i);
        b.seq_index.push_back(0);
        b.slots.push_back(i);
    }
    b.logit_rows.push_back(n - 1);
    b.block_tables = {{0, 1, 2, 3, 4, 5, 6, 7}};
    std::vector<float> logits(size_t(be->config().n_vocab));
    be->forward(b, logits.data());
    return logits;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
    return m;
}

// A copy of the GGUF at src with rope_freqs.weight replaced by `data` of `type` and `dims`.
void rewrite_rope_freqs(const std::string& src, const std::string& dst, GgmlType type,
                        std::vector<int64_t> dims, const std::vector<uint8_t>& data) {
    GgufFile f = GgufFile::open(src);
    GgufWriter w(uint32_t(f.alignment()));
    for (const auto& [key, value] : f.metadata()) w.set_value(key, value);
    for (const GgufTensorInfo& t : f.tensors())
        if (t.name != "rope_freqs.weight") w.add_tensor(t.name, t.type, t.dims, t.data, t.n_bytes);
    w.add_tensor("rope_freqs.weight", type, dims, data.data(), data.size());
    w.write_file(dst);
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    return {p, p + v.size() * sizeof(float)};
}

std::string load_error(const std::string& path) {
    try {
        GgufFile f = GgufFile::open(path);
        model_config_from_gguf(f);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("rope frequency factors divide each pair's angle") {
    const int64_t n_rot = 16;
    std::vector<float> ff(n_rot / 2);
    for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + 1.5f * float(i);
    for (bool neox : {false, true}) {
        CAPTURE(neox);
        RopeParams p = RopeParams::plain(n_rot, 10000.0f, 1.0f, neox);
        p.freq_factors = ff.data();
        for (int32_t pos : {1, 7, 1000, 100000})
            for (int64_t i = 0; i < n_rot / 2; ++i) {
                CAPTURE(pos);
                CAPTURE(i);
                const double want = plain_angle(1e4, n_rot, pos, i) / ff[size_t(i)];
                double norm = 0;
                CHECK(turned_angle(p, pos, i, want, &norm) ==
                      doctest::Approx(want).epsilon(1e-6).scale(1.0));
                CHECK(norm == doctest::Approx(1.0).epsilon(1e-6));
            }
    }
}

TEST_CASE("YaRN keeps fast pairs, interpolates slow ones, ramps between and scales magnitudes") {
    // n_rot 64, base 10000, original context 2048, factor 4: llama.cpp's correction range
    // from beta_fast 32 and beta_slow 1.
    const int64_t n_rot = 64;
    ModelConfig c;
    c.n_rot = n_rot;
    c.head_dim = n_rot;
    c.rope_freq_base = 10000.0f;
    c.rope_freq_scale = 0.25f;
    c.rope_scaling = "yarn";
    c.yarn_n_ctx_orig = 2048;
    const RopeParams p = c.rope(nullptr);
    auto corr = [&](double turns) {
        return double(n_rot) * std::log(2048.0 / (turns * 2.0 * M_PI)) / (2.0 * std::log(1e4));
    };
    CHECK(p.corr_low == float(std::floor(corr(32))));  // floor(8.06)
    CHECK(p.corr_high == float(std::ceil(corr(1))));   // ceil(20.1)
    CHECK(p.corr_low == 8.0f);
    CHECK(p.corr_high == 21.0f);
    CHECK(p.ext_factor == 1.0f);
    const double mscale = 1.0 + 0.1 * std::log(4.0);
    CHECK(p.mscale == doctest::Approx(mscale).epsilon(1e-6));

    for (int64_t i = 0; i < n_rot / 2; ++i) {
        CAPTURE(i);
        const int32_t pos = 777;
        const double extrap = plain_angle(1e4, n_rot, pos, i), interp = extrap * 0.25;
        double want = 0;
        if (i <= 8)
            want = extrap;  // turns often over the original context: unchanged
        else if (i >= 21)
            want = interp;  // turns rarely: plain interpolation
        else {
            const double ramp = 1.0 - (double(i) - 8.0) / (21.0 - 8.0);
            want = interp * (1.0 - ramp) + extrap * ramp;
        }
        double norm = 0;
        CHECK(turned_angle(p, pos, i, want, &norm) == doctest::Approx(want).epsilon(1e-6));
        CHECK(norm == doctest::Approx(mscale).epsilon(1e-6));
    }

    // Attention factor from the metadata multiplies mscale; ext factor 0 is plain
    // interpolation with the attention factor alone.
    c.yarn_attn_factor = 2.0f;
    CHECK(c.rope(nullptr).mscale == doctest::Approx(2.0 * mscale).epsilon(1e-6));
    c.yarn_ext_factor = 0.0f;
    const RopeParams q = c.rope(nullptr);
    CHECK(q.ext_factor == 0.0f);
    CHECK(q.mscale == 2.0f);
    double norm = 0;
    CHECK(turned_angle(q, 777, 3, plain_angle(1e4, n_rot, 777, 3) * 0.25, &norm) ==
          doctest::Approx(plain_angle(1e4, n_rot, 777, 3) * 0.25).epsilon(1e-6));
}

TEST_CASE("llama.cpp's float RoPE agrees with the double one with factors and YaRN") {
    const int64_t n_rot = 128, head_dim = 128, n_heads = 2;
    std::vector<float> ff = llama3_rope_factors(n_rot, 500000.0, 8.0, 1.0, 4.0, 8192);
    const std::vector<int32_t> pos = {0, 5, 1000, 8191, 30000};
    for (int variant = 0; variant < 3; ++variant) {
        CAPTURE(variant);
        RopeParams p = RopeParams::plain(n_rot, 500000.0f, variant == 0 ? 1.0f : 0.125f, false);
        if (variant != 1) p.freq_factors = ff.data();
        if (variant != 0) {
            p.ext_factor = 1.0f;
            p.corr_low = 20.0f;
            p.corr_high = 40.0f;
            p.mscale = 1.2079f;
        }
        std::vector<float> x(pos.size() * n_heads * head_dim);
        for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i)) + 0.1f;
        std::vector<float> y = x;
        cpu::rope(x.data(), pos.data(), int64_t(pos.size()), n_heads, head_dim, p);
        cpu::set_llamacpp_rounding(true);
        cpu::rope(y.data(), pos.data(), int64_t(pos.size()), n_heads, head_dim, p);
        cpu::set_llamacpp_rounding(false);
        // Float angles drift by about pos * 1e-7 radians.
        CHECK(max_abs_diff(x, y) < 1e-2);
        double diff = 0;
        for (size_t i = 0; i < x.size() / pos.size() * 2; ++i)
            diff = std::max(diff, std::fabs(double(x[i]) - double(y[i])));
        CHECK(diff < 1e-5);  // positions 0 and 5
    }
}

TEST_CASE("Llama 3.1 factors: fast pairs kept, slow pairs divided by the factor, smooth between") {
    // Llama 3.1 8B: head 128, base 500000, factor 8, low 1, high 4, original context 8192.
    const std::vector<float> ff = llama3_rope_factors(128, 500000.0, 8.0, 1.0, 4.0, 8192);
    REQUIRE(ff.size() == 64);
    for (size_t i = 0; i < ff.size(); ++i) {
        CAPTURE(i);
        const double wavelen = 2.0 * M_PI / std::pow(500000.0, -2.0 * double(i) / 128.0);
        if (wavelen < 8192.0 / 4.0) CHECK(ff[i] == 1.0f);
        if (wavelen > 8192.0) CHECK(ff[i] == 8.0f);
        if (i > 0) CHECK(ff[i] >= ff[i - 1]);
        // The new frequency blends old and old / 8 by how many turns the pair makes over the
        // original context (HF transformers' rule).
        if (wavelen >= 8192.0 / 4.0 && wavelen <= 8192.0) {
            const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
            CHECK(1.0 / ff[i] == doctest::Approx((1 - smooth) / 8.0 + smooth).epsilon(1e-6));
        }
    }
    CHECK(ff[0] == 1.0f);
    CHECK(ff[63] == 8.0f);
}

TEST_CASE("models: constant factors = linear scaling = a scale override, and the base override") {
    TempDir dir;
    SyntheticModelConfig c = tiny_model();
    const std::string plain = dir.file("plain.gguf"), linear = dir.file("linear.gguf"),
                      factors = dir.file("factors.gguf"), ones = dir.file("ones.gguf"),
                      base = dir.file("base.gguf");
    synthetic_model_write(c, plain);
    c.rope_scaling = "linear", c.rope_factor = 4;
    synthetic_model_write(c, linear);
    c.rope_scaling = "none", c.rope_freqs.assign(32, 4.0f);
    synthetic_model_write(c, factors);
    c.rope_freqs.assign(32, 1.0f);
    synthetic_model_write(c, ones);
    c.rope_freqs.clear(), c.rope_base = 50000;
    synthetic_model_write(c, base);

    {
        GgufFile f = GgufFile::open(factors);
        const ModelConfig mc = model_config_from_gguf(f);
        CHECK(mc.rope_freq_factors == std::vector<float>(32, 4.0f));
        GgufFile fl = GgufFile::open(linear);
        CHECK(model_config_from_gguf(fl).rope_scaling == "linear");
        CHECK(model_config_from_gguf(fl).rope_freq_scale == 0.25f);
    }

    const std::vector<float> ref = last_logits(plain);
    const std::vector<float> lin = last_logits(linear, {}, 1000);
    CHECK(max_abs_diff(ref, last_logits(plain, {}, 1000)) > 1e-3);  // RoPE matters here
    CHECK(max_abs_diff(lin, last_logits(plain, {}, 1000)) > 1e-3);  // and so does the scale
    CHECK(max_abs_diff(last_logits(factors, {}, 1000), lin) < 1e-5);
    RopeOverrides scale;
    scale.freq_scale = 0.25f;
    CHECK(max_abs_diff(last_logits(plain, scale, 1000), lin) < 1e-5);
    RopeOverrides none;
    none.scaling = "none";
    CHECK(max_abs_diff(last_logits(linear, none, 1000), last_logits(plain, {}, 1000)) < 1e-5);
    CHECK(max_abs_diff(last_logits(ones, {}, 1000), last_logits(plain, {}, 1000)) == 0.0);

    RopeOverrides b;
    b.freq_base = 50000;
    const std::vector<float> base_logits = last_logits(base, {}, 1000);
    CHECK(max_abs_diff(base_logits, last_logits(plain, {}, 1000)) > 1e-3);
    CHECK(max_abs_diff(last_logits(plain, b, 1000), base_logits) < 1e-5);
}

TEST_CASE("models: YaRN from metadata equals YaRN by override, and differs from linear") {
    TempDir dir;
    SyntheticModelConfig c = tiny_model(5);
    const std::string plain = dir.file("plain.gguf"), yarn = dir.file("yarn.gguf"),
                      linear = dir.file("linear.gguf");
    synthetic_model_write(c, plain);
    c.rope_scaling = "yarn", c.rope_factor = 4, c.rope_orig_ctx = 2048;
    synthetic_model_write(c, yarn);
    c.rope_scaling = "linear";
    synthetic_model_write(c, linear);
    {
        GgufFile f = GgufFile::open(yarn);
        const ModelConfig mc = model_config_from_gguf(f);
        CHECK(mc.rope_scaling == "yarn");
        CHECK(mc.yarn_n_ctx_orig == 2048);
        CHECK(mc.rope_freq_scale == 0.25f);
    }
    const std::vector<float> y = last_logits(yarn, {}, 3000);
    CHECK(max_abs_diff(y, last_logits(linear, {}, 3000)) > 1e-3);
    RopeOverrides o;
    o.scaling = "yarn", o.freq_scale = 0.25f, o.yarn_orig_ctx = 2048;
    CHECK(max_abs_diff(last_logits(plain, o, 3000), y) < 1e-5);
    // --yarn-ext-factor 0 with attention factor 1 / mscale is linear interpolation.
    RopeOverrides lin;
    lin.yarn_ext_factor = 0.0f;
    lin.yarn_attn_factor = 1.0f;
    CHECK(max_abs_diff(last_logits(yarn, lin, 3000), last_logits(linear, {}, 3000)) < 1e-5);
    // Beta overrides move the correction range: different logits.
    RopeOverrides beta;
    beta.yarn_beta_fast = 8, beta.yarn_beta_slow = 0.5f;
    CHECK(max_abs_diff(last_logits(yarn, beta, 3000), y) > 1e-4);
}

TEST_CASE("hostile RoPE metadata and rope_freqs tensors give one clear error") {
    TempDir dir;
    SyntheticModelConfig c = tiny_model();
    c.rope_scaling = "llama3", c.rope_factor = 8, c.rope_orig_ctx = 256;
    const std::string good = dir.file("good.gguf");
    synthetic_model_write(c, good);
    CHECK(load_error(good).empty());
    {
        GgufFile f = GgufFile::open(good);
        CHECK(model_config_from_gguf(f).rope_freq_factors ==
              llama3_rope_factors(64, 10000.0, 8.0, 1.0, 4.0, 256));
    }

    const std::string bad = dir.file("bad.gguf");
    rewrite_rope_freqs(good, bad, GgmlType::F32, {16}, f32_bytes(std::vector<float>(16, 1.0f)));
    CHECK(load_error(bad).find("rope_freqs.weight has shape [16], expected [32]") !=
          std::string::npos);
    rewrite_rope_freqs(good, bad, GgmlType::F32, {32, 1}, f32_bytes(std::vector<float>(32, 1)));
    CHECK(load_error(bad).find("rope_freqs.weight has shape [32, 1]") != std::string::npos);
    rewrite_rope_freqs(good, bad, GgmlType::Q8_0, {32}, std::vector<uint8_t>(34, 0));
    CHECK(load_error(bad).find("rope_freqs.weight is Q8_0, expected F32, F16 or BF16") !=
          std::string::npos);
    std::vector<float> v(32, 2.0f);
    v[7] = 0.0f;
    rewrite_rope_freqs(good, bad, GgmlType::F32, {32}, f32_bytes(v));
    CHECK(load_error(bad).find("rope_freqs.weight[7] = 0 must be positive") != std::string::npos);
    v[7] = std::nanf("");
    rewrite_rope_freqs(good, bad, GgmlType::F32, {32}, f32_bytes(v));
    CHECK(load_error(bad).find("rope_freqs.weight[7] = nan must be positive") != std::string::npos);

    // Scaling metadata.
    auto with_meta = [&](const std::string& key, GgufValue value) {
        GgufFile f = GgufFile::open(good);
        GgufWriter w(uint32_t(f.alignment()));
        for (const auto& [k, val] : f.metadata()) w.set_value(k, val);
        w.set_value(key, value);
        for (const GgufTensorInfo& t : f.tensors())
            w.add_tensor(t.name, t.type, t.dims, t.data, t.n_bytes);
        w.write_file(bad);
        return load_error(bad);
    };
    CHECK(with_meta("llama.rope.scaling.type", gguf_make_string("longrope"))
              .find("rope scaling type 'longrope' is not supported (supported: none, linear, "
                    "yarn)") != std::string::npos);
    CHECK(with_meta("llama.rope.scaling.factor", gguf_make_float(GgufValueType::FLOAT32, -2))
              .find("llama.rope.scaling.factor = -2 must be positive") != std::string::npos);
    CHECK(with_meta("llama.rope.scaling.attn_factor",
                    gguf_make_float(GgufValueType::FLOAT32, std::nan("")))
              .find("rope.scaling.attn_factor = nan must be positive") != std::string::npos);
    // llama.cpp reads a factor of 0 as unset; the old rope.scale_linear key is linear scaling.
    CHECK(
        with_meta("llama.rope.scaling.factor", gguf_make_float(GgufValueType::FLOAT32, 0)).empty());
    CHECK(with_meta("llama.rope.scale_linear", gguf_make_float(GgufValueType::FLOAT32, 2)).empty());
    {
        GgufFile f = GgufFile::open(bad);
        const ModelConfig mc = model_config_from_gguf(f);
        CHECK(mc.rope_scaling == "linear");
        CHECK(mc.rope_freq_scale == 0.5f);
    }
}

TEST_CASE("rope overrides are validated") {
    ModelConfig c;
    RopeOverrides o;
    o.scaling = "dynamic";
    CHECK_THROWS_WITH_AS(apply_rope_overrides(c, o),
                         "--rope-scaling 'dynamic': expected none, linear or yarn", Error);
    o = {};
    o.freq_base = std::numeric_limits<float>::infinity();
    CHECK_THROWS_WITH_AS(apply_rope_overrides(c, o), "--rope-freq-base = inf must be positive",
                         Error);
    // A scale on an unscaled model is linear scaling (llama.cpp's default type).
    o = {};
    o.freq_scale = 0.5f;
    apply_rope_overrides(c, o);
    CHECK(c.rope_scaling == "linear");
    CHECK(c.rope_freq_scale == 0.5f);
}
