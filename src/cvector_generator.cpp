// Control vector generation (see cvector_generator.h).
#include "cvector_generator.h"

#include <cmath>

#include "common.h"
#include "embedding.h"
#include "gguf_writer.h"

namespace kvrun {
namespace {

// Each layer's output at the last row the backend computed (the prompt's last token: one
// prompt per pass, its last batch ends with it).
std::vector<std::vector<float>> last_token_layers(Backend& backend,
                                                  const std::vector<TokenId>& prompt,
                                                  int32_t n_batch, int32_t max_tokens) {
    const ModelConfig& c = backend.config();
    std::vector<std::vector<float>> out(size_t(c.n_layer), std::vector<float>(size_t(c.n_embd)));
    if (!backend.set_layer_observer([&](int32_t layer, const float* x, int64_t rows) {
            const float* last = x + (rows - 1) * c.n_embd;
            std::copy(last, last + c.n_embd, out[size_t(layer)].begin());
        }))
        throw Error("this backend cannot show layer outputs", "give --device cpu");
    try {
        compute_embeddings(backend, {prompt}, Pooling::Last, n_batch, max_tokens);
    } catch (...) {
        backend.set_layer_observer({});
        throw;
    }
    backend.set_layer_observer({});
    return out;
}

double dot(const std::vector<float>& a, const std::vector<double>& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
    return s;
}

}  // namespace

std::vector<std::vector<std::vector<float>>> cvector_differences(
    Backend& backend, const std::vector<std::vector<TokenId>>& positives,
    const std::vector<std::vector<TokenId>>& negatives, int32_t n_batch, int32_t max_tokens) {
    if (positives.size() != negatives.size())
        fail("{} positive prompts but {} negative ones: they go in pairs", positives.size(),
             negatives.size());
    if (positives.empty()) fail("no prompt pairs");
    std::vector<std::vector<std::vector<float>>> diffs;
    for (size_t i = 0; i < positives.size(); ++i) {
        std::vector<std::vector<float>> p =
            last_token_layers(backend, positives[i], n_batch, max_tokens);
        const std::vector<std::vector<float>> n =
            last_token_layers(backend, negatives[i], n_batch, max_tokens);
        for (size_t l = 0; l < p.size(); ++l)
            for (size_t k = 0; k < p[l].size(); ++k) p[l][k] -= n[l][k];
        diffs.push_back(std::move(p));
    }
    return diffs;
}

std::vector<float> principal_direction(const std::vector<std::vector<float>>& rows,
                                       int32_t iterations) {
    const size_t n = rows.empty() ? 0 : rows[0].size();
    // Start from the mean (the answer for one pair, and a good guess otherwise).
    std::vector<double> mean(n, 0.0), v(n, 0.0);
    for (const auto& r : rows)
        for (size_t k = 0; k < n; ++k) mean[k] += r[k];
    v = mean;
    auto normalize = [&](std::vector<double>& x) {
        double s = 0;
        for (double e : x) s += e * e;
        s = std::sqrt(s);
        if (s == 0) return false;
        for (double& e : x) e /= s;
        return true;
    };
    if (!normalize(v)) {  // differences that cancel out: start from the first non-zero row
        for (const auto& r : rows) {
            v.assign(r.begin(), r.end());
            if (normalize(v)) break;
        }
        if (!normalize(v)) return std::vector<float>(n, 0.0f);
    }
    for (int32_t it = 0; it < iterations; ++it) {  // v <- D^T D v, normalized
        std::vector<double> next(n, 0.0);
        for (const auto& r : rows) {
            const double p = dot(r, v);
            for (size_t k = 0; k < n; ++k) next[k] += p * r[k];
        }
        if (!normalize(next)) break;
        double change = 0;
        for (size_t k = 0; k < n; ++k) change = std::max(change, std::fabs(next[k] - v[k]));
        v = std::move(next);
        if (change < 1e-9) break;
    }
    double along = 0;  // the sign: towards the positive prompts on average
    for (size_t k = 0; k < n; ++k) along += v[k] * mean[k];
    std::vector<float> out(n);
    for (size_t k = 0; k < n; ++k) out[k] = static_cast<float>(along < 0 ? -v[k] : v[k]);
    return out;
}

std::vector<std::vector<float>> cvector_directions(
    const std::vector<std::vector<std::vector<float>>>& differences, CvectorMethod method,
    int32_t pca_iterations) {
    if (differences.empty()) fail("no prompt pairs");
    const size_t n_layer = differences[0].size();
    std::vector<std::vector<float>> out(n_layer);
    for (size_t l = 0; l < n_layer; ++l) {
        std::vector<std::vector<float>> rows;
        for (const auto& d : differences) rows.push_back(d[l]);
        if (method == CvectorMethod::Pca) {
            out[l] = principal_direction(rows, pca_iterations);
            continue;
        }
        out[l].assign(rows[0].size(), 0.0f);
        for (const auto& r : rows)
            for (size_t k = 0; k < r.size(); ++k) out[l][k] += r[k] / float(rows.size());
    }
    return out;
}

void cvector_write(const std::string& path, const std::vector<std::vector<float>>& directions,
                   const std::string& model_hint) {
    GgufWriter w;
    w.set_string("general.architecture", "controlvector");
    w.set_string("controlvector.model_hint", model_hint);
    w.set_i32("controlvector.layer_count", static_cast<int32_t>(directions.size()) - 1);
    for (size_t l = 1; l < directions.size(); ++l) {
        const std::vector<float>& d = directions[l];
        w.add_tensor(fmt::format("direction.{}", l), GgmlType::F32, {int64_t(d.size())}, d.data(),
                     d.size() * sizeof(float));
    }
    w.write_file(path);
}

}  // namespace kvrun
