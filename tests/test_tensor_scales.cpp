// llama.cpp's per-tensor scales (NAME.scale beside NAME.weight: a converted NVFP4 checkpoint's
// second-level scale, BitNet's weight scales): the matrix is the scale times its rows. A model
// whose weights are divided by powers of two that its .scale tensors multiply back gives the
// original's logits bit for bit on the CPU backend (dense and expert layers, per-expert scales
// included); malformed or unsupported scales are refused with the tensor's name.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "arch_test_util.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "synthetic_model.h"
#include "test_util.h"

using namespace kvrun;
using namespace kvrun::arch_test;
using kvrun::test::TempDir;

namespace {

SyntheticModelConfig small_f32(const std::string& arch) {
    SyntheticModelConfig c = small_model(arch, synthetic_preset("tiny").seed);
    if (arch == "qwen3moe") c.n_expert = 4, c.n_expert_used = 2, c.n_ff_exp = 64;
    return c;
}

// The bytes of `f` with tensor `name` (F32, shape dims, every value v) added.
std::vector<uint8_t> with_tensor(const GgufFile& f, const std::string& name,
                                 const std::vector<int64_t>& dims, float v) {
    GgufWriter w(uint32_t(f.alignment()));
    for (const auto& [k, val] : f.metadata()) w.set_value(k, val);
    for (const GgufTensorInfo& t : f.tensors())
        w.add_tensor(t.name, t.type, t.dims, t.data, t.n_bytes);
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    const std::vector<float> values(static_cast<size_t>(n), v);
    w.add_tensor(name, GgmlType::F32, dims, values.data(), values.size() * sizeof(float));
    return w.to_bytes();
}

}  // namespace

TEST_CASE("per-tensor scales multiply the matrices back: same logits, dense and experts") {
    TempDir dir;
    for (const std::string arch : {"llama", "qwen3moe"}) {
        CAPTURE(arch);
        const std::string path = dir.file(arch + ".gguf");
        synthetic_model_write(small_f32(arch), path);
        const GgufFile plain = GgufFile::open(path);
        const std::vector<uint8_t> bytes = gguf_with_scales(plain);
        const GgufFile scaled = GgufFile::from_memory(bytes.data(), bytes.size(), "scaled.gguf");
        int n_scales = 0, n_expert_scales = 0;
        for (const GgufTensorInfo& t : scaled.tensors())
            if (t.name.ends_with(".scale")) ++n_scales, n_expert_scales += t.n_elements > 1;
        CHECK(n_scales >= 14);
        CHECK(n_expert_scales == (arch == "qwen3moe" ? 6 : 0));
        const auto want = backend_logits(plain, kTokens, 6);
        const auto got = backend_logits(scaled, kTokens, 6);
        REQUIRE(got.size() == want.size());
        for (size_t t = 0; t < want.size(); ++t) CHECK(got[t] == want[t]);
        // Without one of the scales the model is another (attn_output: qwen3 normalizes Q).
        const std::vector<uint8_t> unscaled =
            gguf_rewritten(scaled, "", nullptr, "blk.0.attn_output.scale");
        const GgufFile u = GgufFile::from_memory(unscaled.data(), unscaled.size(), "u.gguf");
        CHECK(rel_diff(backend_logits(u, kTokens, 6), want) > 1e-3);
    }
}

TEST_CASE("malformed or unsupported tensor scales are refused, naming the tensor") {
    TempDir dir;
    const std::string path = dir.file("m.gguf");
    synthetic_model_write(small_f32("qwen3moe"), path);
    const GgufFile f = GgufFile::open(path);
    struct Case {
        std::string tensor;
        std::vector<int64_t> dims;
        float value;
        std::string error;
    } cases[] = {
        {"blk.0.attn_q.scale", {2}, 1.0f, "has 2 values; the scale of 'blk.0.attn_q.weight' has 1"},
        {"blk.1.ffn_up_exps.scale",
         {3},
         1.0f,
         "has 3 values; the scale of "
         "'blk.1.ffn_up_exps.weight' has 1 or 4"},
        {"blk.0.attn_k.scale", {1}, INFINITY, "'blk.0.attn_k.scale' holds inf"},
        {"token_embd.scale", {1}, 2.0f, "'token_embd.scale' is not supported"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.tensor);
        const std::string err = load_error(with_tensor(f, c.tensor, c.dims, c.value));
        CHECK(err.find(c.error) != std::string::npos);
    }
    // A scale on the output is applied; on an output tied to the embedding it is refused
    // (llama.cpp scales neither the lookup nor a tied output).
    CHECK(load_error(with_tensor(f, "output.scale", {1}, 0.5f)).empty() ==
          (f.find_tensor("output.weight") != nullptr));
}
