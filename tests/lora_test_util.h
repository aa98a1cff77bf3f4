// LoRA test helpers: random adapter factors for a base model's matrix and writing them as a
// llama.cpp adapter GGUF (test_lora, test_cuda_backend).
#pragma once

#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "gguf.h"
#include "gguf_writer.h"

namespace kvrun::test {

// Random LoRA factors for base matrix `name` ({n_in, n_out}): A {n_in, rank}, B {rank, n_out}.
struct Factors {
    std::string name;
    int64_t n_in = 0, n_out = 0, rank = 0;
    std::vector<float> a, b;  // [rank][n_in], [n_out][rank]
};

inline Factors random_factors(const GgufFile& base, const std::string& name, int64_t rank,
                              uint32_t seed, float std = 0.2f) {
    const GgufTensorInfo* t = base.find_tensor(name);
    REQUIRE_MESSAGE(t, name);
    Factors f{name, t->dims[0], t->dims[1], rank, {}, {}};
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, std);
    f.a.resize(size_t(rank * f.n_in));
    f.b.resize(size_t(f.n_out * rank));
    for (float& x : f.a) x = d(rng);
    for (float& x : f.b) x = d(rng);
    return f;
}

inline void write_adapter(const std::string& path, const std::string& arch, double alpha,
                          const std::vector<Factors>& fs) {
    GgufWriter w;
    w.set_string("general.architecture", arch);
    w.set_string("general.type", "adapter");
    w.set_string("adapter.type", "lora");
    w.set_f32("adapter.lora.alpha", float(alpha));
    for (const Factors& f : fs) {
        w.add_tensor(f.name + ".lora_a", GgmlType::F32, {f.n_in, f.rank}, f.a.data(),
                     f.a.size() * sizeof(float));
        w.add_tensor(f.name + ".lora_b", GgmlType::F32, {f.rank, f.n_out}, f.b.data(),
                     f.b.size() * sizeof(float));
    }
    w.write_file(path);
}

}  // namespace kvrun::test
