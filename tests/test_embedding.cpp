// Embeddings: the vectors are the model's final normed hidden states (the output projection
// of one gives the logits), pooling and packing do not change them, normalization, and
// `kvrun embedding` end to end.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend.h"
#include "cli_test_util.h"
#include "embedding.h"
#include "gguf.h"
#include "quant.h"
#include "test_util.h"
#include "tokenizer.h"

using namespace kvrun;
using kvrun::test::run_command;
using kvrun::test::shared_model;
namespace cli = kvrun::test::cli;

namespace {

struct Fixture {
    GgufFile file;
    std::unique_ptr<Tokenizer> tok;
    std::unique_ptr<Backend> backend;
    explicit Fixture(const std::string& path) : file(GgufFile::open(path)) {
        tok = Tokenizer::from_gguf(file);
        BackendOptions o;
        o.n_kv_blocks = 64;
        o.kv_block_size = 16;
        backend = make_cpu_backend(file, o);
    }
    std::vector<TokenId> encode(const std::string& s) const { return tok->encode(s, true, false); }
};

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
    return m;
}

}  // namespace

TEST_CASE(
    "embeddings are the final normed hidden states: the output matrix maps them to the logits") {
    auto path = shared_model("stories260K.gguf");
    if (path.empty()) return;
    Fixture f(path.string());
    const std::vector<TokenId> toks = f.encode("Once upon a time, there was a little girl");
    const int64_t n_embd = f.backend->config().n_embd, n_vocab = f.backend->config().n_vocab;
    const auto per_token = compute_embeddings(*f.backend, {toks}, Pooling::None, 512, 512);
    REQUIRE(per_token.size() == toks.size());

    // The same tokens' logits from a plain forward pass.
    KvBlockTable table = kv_table_for(*f.backend);
    const SeqId seq = table.create_sequence();
    REQUIRE(table.append(seq, toks));
    kv_apply_pending(table, *f.backend);
    ForwardBatch fb;
    fb.add_sequence(table, seq, 0, int32_t(toks.size()));
    for (size_t i = 0; i < toks.size(); ++i) fb.logit_rows.push_back(int32_t(i));
    std::vector<float> logits(toks.size() * size_t(n_vocab));
    f.backend->forward(fb, logits.data());

    const GgufTensorInfo* out = f.file.find_tensor("output.weight");
    REQUIRE(out != nullptr);
    std::vector<float> w(size_t(out->n_elements));
    dequantize_row(out->type, out->data, w.data(), out->n_elements);
    double worst = 0;
    for (size_t t = 0; t < toks.size(); ++t)
        for (int64_t v = 0; v < n_vocab; ++v) {
            double dot = 0;
            for (int64_t d = 0; d < n_embd; ++d)
                dot += double(w[size_t(v * n_embd + d)]) * per_token[t][size_t(d)];
            worst = std::max(worst, std::fabs(dot - logits[t * size_t(n_vocab) + size_t(v)]));
        }
    CHECK(worst < 1e-3);
}

TEST_CASE("pooling: mean, cls and last are the per-token vectors' mean, first and last") {
    auto path = shared_model("stories260K.gguf");
    if (path.empty()) return;
    Fixture f(path.string());
    const std::vector<std::vector<TokenId>> prompts = {
        f.encode("The little dog saw a ball"), f.encode("Lily"),
        f.encode("One day, a bird flew into the garden")};
    const auto none = compute_embeddings(*f.backend, prompts, Pooling::None, 512, 512);
    const auto mean = compute_embeddings(*f.backend, prompts, Pooling::Mean, 512, 512);
    const auto cls = compute_embeddings(*f.backend, prompts, Pooling::Cls, 512, 512);
    const auto last = compute_embeddings(*f.backend, prompts, Pooling::Last, 512, 512);
    REQUIRE(mean.size() == 3);
    size_t row = 0;
    for (size_t p = 0; p < prompts.size(); ++p) {
        INFO("prompt " << p);
        std::vector<float> avg(none[0].size(), 0.0f);
        for (size_t t = 0; t < prompts[p].size(); ++t)
            for (size_t d = 0; d < avg.size(); ++d)
                avg[d] += none[row + t][d] / float(prompts[p].size());
        CHECK(max_abs_diff(mean[p], avg) < 1e-5);
        CHECK(max_abs_diff(cls[p], none[row]) == 0);
        CHECK(max_abs_diff(last[p], none[row + prompts[p].size() - 1]) == 0);
        row += prompts[p].size();
    }
    CHECK(row == none.size());
}

TEST_CASE(
    "packing: several prompts per pass, or one split over passes, give each prompt's vector") {
    auto path = shared_model("stories260K.gguf");
    if (path.empty()) return;
    Fixture f(path.string());
    const std::vector<std::vector<TokenId>> prompts = {
        f.encode("Once upon a time"), f.encode("The cat sat on the mat and looked at the sun"),
        f.encode("Tom"), f.encode("Mom said no, and Tom was sad. He went to his room")};
    const auto together = compute_embeddings(*f.backend, prompts, Pooling::Mean, 512, 512);
    for (int32_t n_batch : {1, 3, 7, 16}) {
        INFO("n_batch " << n_batch);
        const auto packed = compute_embeddings(*f.backend, prompts, Pooling::Mean, n_batch, 512);
        for (size_t p = 0; p < prompts.size(); ++p)
            CHECK(max_abs_diff(packed[p], together[p]) < 1e-5);
    }
    for (size_t p = 0; p < prompts.size(); ++p) {
        const auto alone = compute_embeddings(*f.backend, {prompts[p]}, Pooling::Last, 512, 512);
        const auto all = compute_embeddings(*f.backend, prompts, Pooling::Last, 512, 512);
        CHECK(max_abs_diff(alone[0], all[p]) < 1e-5);
    }
    // The pool gave every block back.
    KvBlockTable table = kv_table_for(*f.backend);
    CHECK(table.n_sequences() == 0);
}

TEST_CASE("embedding errors: empty prompt, longer than the context, rank pooling") {
    auto path = shared_model("stories260K.gguf");
    if (path.empty()) return;
    Fixture f(path.string());
    CHECK_THROWS_WITH_AS(compute_embeddings(*f.backend, {{}}, Pooling::Mean, 512, 512),
                         doctest::Contains("no tokens"), Error);
    CHECK_THROWS_WITH_AS(
        compute_embeddings(*f.backend, {f.encode("Once upon a time")}, Pooling::Mean, 512, 3),
        doctest::Contains("more than the context of 3"), Error);
    CHECK_THROWS_WITH_AS(compute_embeddings(*f.backend, {f.encode("x")}, Pooling::Rank, 512, 512),
                         doctest::Contains("reranker"), Error);
    CHECK(model_pooling(f.file) == Pooling::None);
    f.file.override_value("llama.pooling_type", GgufValue{GgufValueType::UINT32, uint64_t(3)});
    CHECK(model_pooling(f.file) == Pooling::Last);
    CHECK(pooling_from_name("mean") == Pooling::Mean);
    CHECK_FALSE(pooling_from_name("avg").has_value());
}

TEST_CASE("normalization and cosine similarity as llama.cpp's --embd-normalize") {
    std::vector<float> v = {3, -4, 0};
    auto n2 = v;
    normalize_embedding(n2, 2);
    CHECK(n2 == std::vector<float>{0.6f, -0.8f, 0.0f});
    auto n1 = v;
    normalize_embedding(n1, 1);
    CHECK(n1[0] == doctest::Approx(3.0 / 7));
    auto n0 = v;
    normalize_embedding(n0, 0);
    CHECK(n0[1] == doctest::Approx(-32760.0));
    auto none = v;
    normalize_embedding(none, -1);
    CHECK(none == v);
    auto n3 = v;
    normalize_embedding(n3, 3);
    CHECK(std::pow(std::fabs(n3[0]), 3) + std::pow(std::fabs(n3[1]), 3) == doctest::Approx(1.0));
    std::vector<float> zero = {0, 0, 0};
    normalize_embedding(zero, 2);
    CHECK(zero == std::vector<float>{0, 0, 0});
    CHECK(cosine_similarity(v, v) == doctest::Approx(1.0));
    CHECK(cosine_similarity(v, {-3, 4, 0}) == doctest::Approx(-1.0));
    CHECK(cosine_similarity(v, {4, 3, 0}) == doctest::Approx(0.0));
    CHECK(cosine_similarity(v, zero) == 0.0);
}

TEST_CASE("kvrun embedding: JSON vectors for each line of stdin, text with similarities, errors") {
    auto path = shared_model("stories260K.gguf");
    if (path.empty()) return;
    const std::string m = "embedding -m " + path.string();
    auto r = run_command(cli::kvrun_cmd(m + " --pooling mean --embd-output-format json"),
                         "Once upon a time\n\nThe little dog\n");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    auto j = nlohmann::json::parse(r.out);
    CHECK(j["object"] == "list");
    REQUIRE(j["data"].size() == 2);
    for (const auto& d : j["data"]) {
        REQUIRE(d["embedding"].size() == 64);
        double norm = 0;
        for (double x : d["embedding"]) norm += x * x;
        CHECK(norm == doctest::Approx(1.0).epsilon(1e-5));
    }
    // The same vector through the library.
    Fixture f(path.string());
    auto v = compute_embeddings(*f.backend, {f.encode("The little dog")}, Pooling::Mean, 512, 512);
    normalize_embedding(v[0], 2);
    for (size_t d = 0; d < 64; ++d)
        CHECK(j["data"][1]["embedding"][d].get<double>() == doctest::Approx(v[0][d]).epsilon(1e-5));

    auto text = run_command(cli::kvrun_cmd(m + " --pooling last -p 'Once upon a time\nThe cat'"));
    REQUIRE_MESSAGE(text.exit_code == 0, text.err);
    CHECK(text.out.find("embedding 0: ") == 0);
    CHECK(text.out.find("cosine similarity matrix") != std::string::npos);
    CHECK(text.out.find("  1.00 ") != std::string::npos);
    auto arr = run_command(cli::kvrun_cmd(m + " --pooling none --embd-output-format array -p Hi"));
    REQUIRE_MESSAGE(arr.exit_code == 0, arr.err);
    CHECK(nlohmann::json::parse(arr.out).size() == f.encode("Hi").size());  // one per token

    // Rank pooling needs a yes/no judge (this vocabulary has no one-token "yes"; test_server
    // checks the scores on a model that has).
    cli::check_one_line_with_hint(run_command(cli::kvrun_cmd(m + " --pooling rank -p 'q\td'")),
                                  "Qwen3-Reranker");
    cli::check_one_clear_error(run_command(cli::kvrun_cmd(m + " --pooling avg -p hi")),
                               "--pooling");
    cli::check_one_clear_error(run_command(cli::kvrun_cmd(m + " -p '\n\n'")), "no prompts");
    cli::check_one_line_with_hint(
        run_command(cli::kvrun_cmd(m + " -c 4 -p 'Once upon a time there was'")),
        "more than the context");
}
