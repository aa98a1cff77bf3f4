// Perplexity against llama.cpp's numbers (../shared/reference/perplexity.tsv) on the
// stories260K family, and the KL-divergence save/compare round trip.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "backend.h"
#include "perplexity.h"
#include "test_util.h"
#include "text_input.h"

using namespace kvrun;

namespace {

struct RefPpl {
    double ppl = 0, err = 0;
    int chunks = 0;
};

std::map<std::string, RefPpl> load_reference(const std::filesystem::path& tsv) {
    std::map<std::string, RefPpl> out;
    std::ifstream in(tsv);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
        std::istringstream ss(line);
        std::string model, file;
        int ctx;
        RefPpl r;
        ss >> model >> file >> ctx >> r.chunks >> r.ppl >> r.err;
        out[model] = r;
    }
    return out;
}

PerplexityResult eval(const std::filesystem::path& model, const std::string& text, int chunks,
                      KvType kv = KvType::F16, const std::string& save = {},
                      const std::string& base = {}) {
    GgufFile f = GgufFile::open(model.string());
    auto tok = Tokenizer::from_gguf(f);
    BackendOptions bo;
    bo.n_kv_blocks = 256 / bo.kv_block_size;
    bo.kv_type_k = bo.kv_type_v = kv;
    auto backend = make_cpu_backend(f, bo);
    PerplexityOptions po;
    po.n_ctx = 256;
    po.n_batch = 256;
    po.n_chunks = chunks;
    po.kld_save = save;
    po.kld_base = base;
    return perplexity_run(*backend, *tok, text, po);
}

}  // namespace

TEST_CASE("perplexity matches llama.cpp within 0.5% on the stories260K family") {
    auto dir = kvrun::test::shared_dir();
    if (dir.empty()) {
        MESSAGE("SKIP: ../shared not found");
        return;
    }
    auto ref = load_reference(dir / "reference/perplexity.tsv");
    const std::string text = read_file_text((dir / "text/wiki.test.raw").string());
    int n = 0;
    for (const auto& model : kvrun::test::shared_models()) {
        const std::string name = model.filename().string();
        if (name.rfind("stories260K", 0) != 0 || name.find("w256") != std::string::npos) continue;
        REQUIRE(ref.count(name));
        const RefPpl& r = ref[name];
        PerplexityResult res = eval(model, text, r.chunks);
        const double rel = std::abs(res.ppl - r.ppl) / r.ppl;
        MESSAGE(name << ": PPL " << res.ppl << " (llama.cpp " << r.ppl << ", " << 100 * rel
                     << "%)");
        CHECK_MESSAGE(rel < 0.005, name);
        CHECK(res.ppl_stderr == doctest::Approx(r.err).epsilon(0.02));
        CHECK(res.n_chunks == r.chunks);
        ++n;
    }
    CHECK(n >= 13);
}

TEST_CASE("KL divergence: a run compared with itself is zero; f32 vs f16 KV is tiny") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string text =
        read_file_text((kvrun::test::shared_dir() / "text/wiki.test.raw").string());
    auto tmp = std::filesystem::temp_directory_path() / ("kvrun_kld_" + std::to_string(::getpid()));
    PerplexityResult base = eval(model, text, 3, KvType::F32, tmp.string());
    PerplexityResult self = eval(model, text, 3, KvType::F32, {}, tmp.string());
    CHECK(self.has_kld);
    CHECK(self.kld_mean < 1e-9);  // the same computation: identical log-probs
    CHECK(self.top1_agreement == 1.0);
    CHECK(self.base_ppl == doctest::Approx(base.ppl).epsilon(1e-3));
    PerplexityResult f16 = eval(model, text, 3, KvType::F16, {}, tmp.string());
    CHECK(f16.kld_mean < 1e-3);
    CHECK(f16.top1_agreement > 0.98);
    // A base file from another context length is rejected with a clear error.
    GgufFile f = GgufFile::open(model.string());
    auto tok = Tokenizer::from_gguf(f);
    BackendOptions bo;
    auto backend = make_cpu_backend(f, bo);
    PerplexityOptions po;
    po.n_ctx = 128;
    po.n_chunks = 2;
    po.kld_base = tmp.string();
    CHECK_THROWS_WITH_AS(perplexity_run(*backend, *tok, text, po), doctest::Contains("-c 256"),
                         Error);
    std::filesystem::remove(tmp);
}

TEST_CASE("perplexity rejects a text shorter than two chunks") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    GgufFile f = GgufFile::open(model.string());
    auto tok = Tokenizer::from_gguf(f);
    auto backend = make_cpu_backend(f, BackendOptions{});
    PerplexityOptions po;
    po.n_ctx = 256;
    CHECK_THROWS_WITH_AS(perplexity_run(*backend, *tok, "Once upon a time", po),
                         doctest::Contains("needs at least 512"), Error);
}
