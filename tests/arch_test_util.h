// The pieces of test_arch's independent reference forward passes that several test files
// share: F32 tensor views, float loops for products, RMSNorm and RoPE, and the CPU backend's
// logits for a token sequence fed as a prefill then one token per step.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "model_config.h"
#include "synthetic_model.h"

namespace kvrun::arch_test {

// The token ids the architecture tests feed their small models (vocabularies of 300 and more).
inline const std::vector<int32_t> kTokens = {1, 17, 250, 4, 99, 31, 7, 123, 88, 5, 260, 42, 3, 77};

// The small F32 models the architecture tests build on: `tiny` cut to 2 layers of width 64
// (4 heads over 2 KV heads, FFN 96, 300 tokens), weights large enough (std 0.15) that every part
// visibly moves the logits; `seed` picks the weights.
inline SyntheticModelConfig small_model(const std::string& arch, uint64_t seed) {
    SyntheticModelConfig c = synthetic_preset("tiny");
    c.arch = arch;
    c.n_layer = 2, c.n_embd = 64, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 96, c.n_vocab = 300;
    c.weight_std = 0.15f;
    c.seed = seed;
    return c;
}

// A float view of one F32 tensor: rows of dims[0] elements.
struct Mat {
    const float* data = nullptr;
    int64_t n_in = 0, n_out = 0;
    const float* row(int64_t r) const { return data + r * n_in; }
};

inline Mat tensor(const GgufFile& f, const std::string& name) {
    const GgufTensorInfo* t = f.find_tensor(name);
    REQUIRE_MESSAGE(t, "missing " << name);
    REQUIRE(t->type == GgmlType::F32);
    Mat m;
    m.data = reinterpret_cast<const float*>(t->data);
    m.n_in = t->dims[0];
    m.n_out = 1;  // rows: the product of the other dims (experts stacked)
    for (size_t i = 1; i < t->dims.size(); ++i) m.n_out *= t->dims[i];
    return m;
}

inline std::vector<float> matvec(const Mat& w, const std::vector<float>& x) {
    REQUIRE(int64_t(x.size()) == w.n_in);
    std::vector<float> y(size_t(w.n_out));
    for (int64_t r = 0; r < w.n_out; ++r) {
        double s = 0;
        for (int64_t i = 0; i < w.n_in; ++i) s += double(w.row(r)[i]) * x[size_t(i)];
        y[size_t(r)] = float(s);
    }
    return y;
}

// A SwiGLU FFN: down (silu(gate h) * (up h)).
inline std::vector<float> swiglu_ffn(const Mat& gate, const Mat& up, const Mat& down,
                                     const std::vector<float>& h) {
    std::vector<float> g = matvec(gate, h), u = matvec(up, h);
    for (size_t i = 0; i < g.size(); ++i)
        g[i] = float(double(g[i]) / (1 + std::exp(-double(g[i]))) * u[i]);
    return matvec(down, g);
}

// x / rms(x) * w over `x`'s elements [off, off + n).
inline void rms_normalize(std::vector<float>& x, int64_t off, int64_t n, const float* w,
                          double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[size_t(off + i)]) * x[size_t(off + i)];
    const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
    for (int64_t i = 0; i < n; ++i) x[size_t(off + i)] = float(x[size_t(off + i)] * inv * w[i]);
}

// Rotates the first n_rot dims of each head of `x` (n_heads x head_dim) for position pos: pair
// j turns by pos * base^(-2j/n_rot) / factors[j] (factors empty: 1) and is scaled by mscale;
// the pair is (j, j + n_rot/2) for NeoX, (2j, 2j+1) otherwise; dims from n_rot on stay.
inline void rotate(std::vector<float>& x, int64_t n_heads, int64_t head_dim, int64_t n_rot,
                   int64_t pos, double base, bool neox, const std::vector<float>& factors,
                   double mscale, double freq_scale = 1) {
    for (int64_t h = 0; h < n_heads; ++h)
        for (int64_t j = 0; j < n_rot / 2; ++j) {
            double theta =
                freq_scale * double(pos) * std::pow(base, -2.0 * double(j) / double(n_rot));
            if (!factors.empty()) theta /= factors[size_t(j)];
            const int64_t a = h * head_dim + (neox ? j : 2 * j);
            const int64_t b = h * head_dim + (neox ? j + n_rot / 2 : 2 * j + 1);
            const double x0 = x[size_t(a)], x1 = x[size_t(b)];
            x[size_t(a)] = float(mscale * (x0 * std::cos(theta) - x1 * std::sin(theta)));
            x[size_t(b)] = float(mscale * (x0 * std::sin(theta) + x1 * std::cos(theta)));
        }
}

// Causal attention of token t's queries q (n_head x head_dim) over the keys and values of
// tokens u0..t (n_kv_head x head_dim each; query head h reads KV head h / (n_head / n_kv_head)),
// scores scaled by 1/sqrt(head_dim); sinks (one logit per head, or null) join each softmax's
// denominator and take their share of the mass to no value (gpt-oss).
inline std::vector<float> attend(const std::vector<float>& q,
                                 const std::vector<std::vector<float>>& keys,
                                 const std::vector<std::vector<float>>& values, int64_t t,
                                 int64_t u0, int64_t n_head, int64_t n_kv_head, int64_t hd,
                                 const float* sinks = nullptr) {
    const int64_t group = n_head / n_kv_head;
    std::vector<float> att(size_t(n_head * hd), 0.0f);
    for (int64_t h = 0; h < n_head; ++h) {
        const int64_t kvh = h / group;
        std::vector<double> p(size_t(t + 1), 0.0);
        const double sink = sinks ? double(sinks[h]) : -INFINITY;
        double mx = sink;
        for (int64_t u = u0; u <= t; ++u) {
            double s = 0;
            for (int64_t i = 0; i < hd; ++i)
                s += double(q[size_t(h * hd + i)]) * keys[size_t(u)][size_t(kvh * hd + i)];
            p[size_t(u)] = s / std::sqrt(double(hd));
            mx = std::max(mx, p[size_t(u)]);
        }
        double z = std::exp(sink - mx);
        for (int64_t u = u0; u <= t; ++u) z += (p[size_t(u)] = std::exp(p[size_t(u)] - mx));
        for (int64_t u = u0; u <= t; ++u)
            for (int64_t i = 0; i < hd; ++i)
                att[size_t(h * hd + i)] +=
                    float(p[size_t(u)] / z * values[size_t(u)][size_t(kvh * hd + i)]);
    }
    return att;
}

// The logits of each row of x (the last layer's outputs): RMSNorm with out_norm, then out.
inline std::vector<std::vector<float>> output_logits(const std::vector<std::vector<float>>& x,
                                                     const float* out_norm, const Mat& out,
                                                     double eps) {
    std::vector<std::vector<float>> logits;
    for (std::vector<float> h : x) {
        rms_normalize(h, 0, int64_t(h.size()), out_norm, eps);
        logits.push_back(matvec(out, h));
    }
    return logits;
}

// The CPU backend's logits for every token of `tokens` (positions from pos0), fed as a
// prefill of `first` tokens and then one token per step, in KV blocks of 4 tokens; n_ctx is
// the run's context (BackendOptions::n_ctx).
inline std::vector<std::vector<float>> backend_logits(const GgufFile& f,
                                                      const std::vector<int32_t>& tokens,
                                                      size_t first, int32_t pos0 = 0,
                                                      int64_t n_ctx = 0,
                                                      const ControlVectorOptions& cvec = {}) {
    BackendOptions o;
    o.control_vectors = cvec;
    o.n_ctx = n_ctx;
    o.kv_block_size = 4;
    o.n_kv_blocks = 16;
    o.n_threads = 2;
    o.kv_type_k = o.kv_type_v = KvType::F32;  // f16 K/V would round at 1e-3
    auto be = make_cpu_backend(f, o);
    const size_t n_vocab = size_t(be->config().n_vocab);
    std::vector<int32_t> table(16);
    for (int i = 0; i < 16; ++i) table[size_t(i)] = 15 - i;  // not in order, on purpose
    std::vector<std::vector<float>> out;
    for (size_t start = 0; start < tokens.size();) {
        const size_t n = start == 0 ? first : 1;
        ForwardBatch b;
        for (size_t i = start; i < start + n; ++i) {
            b.tokens.push_back(tokens[i]);
            b.positions.push_back(pos0 + int32_t(i));
            b.seq_index.push_back(0);
            b.slots.push_back(int32_t(i));
            b.logit_rows.push_back(int32_t(i - start));
        }
        b.block_tables = {table};
        std::vector<float> logits(n * n_vocab);
        be->forward(b, logits.data());
        for (size_t r = 0; r < n; ++r)
            out.emplace_back(logits.begin() + long(r * n_vocab),
                             logits.begin() + long((r + 1) * n_vocab));
        start += n;
    }
    return out;
}

// max |a - b| / max |b| over all rows.
inline double rel_diff(const std::vector<std::vector<float>>& a,
                       const std::vector<std::vector<float>>& b) {
    REQUIRE(a.size() == b.size());
    double d = 0, m = 0;
    for (size_t t = 0; t < a.size(); ++t) {
        REQUIRE(a[t].size() == b[t].size());
        for (size_t i = 0; i < a[t].size(); ++i) {
            d = std::max(d, double(std::fabs(a[t][i] - b[t][i])));
            m = std::max(m, double(std::fabs(b[t][i])));
        }
    }
    return d / m;
}

// The bytes of `f` rewritten with metadata key `key` dropped (or, with `value`, set to it) and
// tensor `tensor` dropped (or, with `dims`, replaced by F32 ones of that shape); "" keeps all.
inline std::vector<uint8_t> gguf_rewritten(const GgufFile& f, const std::string& key,
                                           const GgufValue* value, const std::string& tensor,
                                           const std::vector<int64_t>& dims = {}) {
    GgufWriter w(uint32_t(f.alignment()));
    for (const auto& [k, v] : f.metadata())
        if (k != key) w.set_value(k, v);
    if (value) w.set_value(key, *value);
    std::vector<float> ones;
    for (const GgufTensorInfo& t : f.tensors()) {
        if (t.name != tensor) {
            w.add_tensor(t.name, t.type, t.dims, t.data, t.n_bytes);
        } else if (!dims.empty()) {
            int64_t n = 1;
            for (int64_t d : dims) n *= d;
            ones.assign(size_t(n), 1.0f);
            w.add_tensor(t.name, GgmlType::F32, dims, ones.data(), ones.size() * sizeof(float));
        }
    }
    return w.to_bytes();
}

// `f` with llama.cpp's per-tensor scales on its F32 matrices (2-D and 3-D, the embedding and
// routers excepted): NAME.scale after NAME.weight holds s, a power of two per tensor (for an
// expert stack, per expert: they differ), and the weights are divided by it, so the model is
// the same: the scaled products give the same bits wherever the weights stay normal floats.
inline std::vector<uint8_t> gguf_with_scales(const GgufFile& f) {
    GgufWriter w(uint32_t(f.alignment()));
    for (const auto& [k, v] : f.metadata()) w.set_value(k, v);
    int i = 0;
    for (const GgufTensorInfo& t : f.tensors()) {
        const bool matrix = t.type == GgmlType::F32 && t.dims.size() >= 2 &&
                            t.name.ends_with(".weight") && t.name != "token_embd.weight" &&
                            t.name.find("ffn_gate_inp") == std::string::npos;
        if (!matrix) {
            w.add_tensor(t.name, t.type, t.dims, t.data, t.n_bytes);
            continue;
        }
        const int64_t n_stack = t.dims.size() >= 3 ? t.dims[2] : 1, per = t.n_elements / n_stack;
        const float* src = reinterpret_cast<const float*>(t.data);
        std::vector<float> data(static_cast<size_t>(t.n_elements)),
            scales(static_cast<size_t>(n_stack));
        for (int64_t e = 0; e < n_stack; ++e) {
            scales[size_t(e)] = std::ldexp(1.0f, int((i + e) % 5) - 2);
            for (int64_t j = e * per; j < (e + 1) * per; ++j)
                data[size_t(j)] = src[j] / scales[size_t(e)];
        }
        ++i;
        w.add_tensor(t.name, GgmlType::F32, t.dims, data.data(), data.size() * sizeof(float));
        w.add_tensor(t.name.substr(0, t.name.size() - 7) + ".scale", GgmlType::F32, {n_stack},
                     scales.data(), scales.size() * sizeof(float));
    }
    return w.to_bytes();
}

// The error that reading the config (config_only) or making a CPU backend from a GGUF's bytes
// raises, or "" when none does.
inline std::string load_error(const std::vector<uint8_t>& bytes, bool config_only = false) {
    try {
        const GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size(), "bad.gguf");
        if (config_only) {
            model_config_from_gguf(f);
        } else {
            BackendOptions o;
            o.n_kv_blocks = 8;
            make_cpu_backend(f, o);
        }
    } catch (const Error& e) {
        return std::string(e.what());
    }
    return std::string();
}

}  // namespace kvrun::arch_test
