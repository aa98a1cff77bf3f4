// Control vector generation (cvector_generator.h, `kvrun cvector-generator`): the mean
// direction of one pair, applied to the last layer, turns the negative prompt's next-token
// logits into the positive prompt's exactly; pca equals an independently computed top
// eigenvector of the differences' Gram matrix (Jacobi), unit length, pointing along the
// mean; the command writes a file `--control-vector` loads; clear errors.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "cli_test_util.h"
#include "cvector_generator.h"
#include "kv_block_table.h"
#include "modes/model_options.h"
#include "test_util.h"

using namespace kvrun;

namespace {

LoadedModel load(const std::string& path, const std::string& cvec = {}, int32_t layer = -1) {
    ModelOptions o;
    o.model = path;
    o.device = "cpu";
    o.n_ctx = 256;
    if (!cvec.empty()) {
        o.control_vectors = {cvec};
        o.control_vector_layer_range = {layer, layer};
    }
    return load_model(o, 1);
}

std::vector<float> last_logits(Backend& backend, const std::vector<TokenId>& prompt) {
    KvBlockTable table = kv_table_for(backend);
    const SeqId seq = table.create_sequence();
    REQUIRE(table.append(seq, int32_t(prompt.size()), prompt.data()));
    kv_apply_pending(table, backend);
    ForwardBatch fb;
    fb.add_sequence(table, seq, 0, int32_t(prompt.size()));
    fb.logit_rows = {int32_t(prompt.size()) - 1};
    std::vector<float> logits(size_t(backend.config().n_vocab));
    backend.forward(fb, logits.data());
    table.free_sequence(seq);
    return logits;
}

// The top eigenvector of a symmetric matrix by cyclic Jacobi rotations.
std::vector<double> top_eigenvector(std::vector<std::vector<double>> a) {
    const size_t n = a.size();
    std::vector<std::vector<double>> v(n, std::vector<double>(n, 0.0));
    for (size_t i = 0; i < n; ++i) v[i][i] = 1;
    for (int sweep = 0; sweep < 60; ++sweep) {
        double off = 0;
        for (size_t p = 0; p < n; ++p)
            for (size_t q = p + 1; q < n; ++q) off += a[p][q] * a[p][q];
        if (off < 1e-24) break;
        for (size_t p = 0; p < n; ++p)
            for (size_t q = p + 1; q < n; ++q) {
                if (std::fabs(a[p][q]) < 1e-300) continue;
                const double theta = (a[q][q] - a[p][p]) / (2 * a[p][q]);
                const double t =
                    (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
                const double c = 1 / std::sqrt(t * t + 1), s = t * c;
                for (size_t k = 0; k < n; ++k) {  // columns p, q
                    const double akp = a[k][p], akq = a[k][q];
                    a[k][p] = c * akp - s * akq;
                    a[k][q] = s * akp + c * akq;
                }
                for (size_t k = 0; k < n; ++k) {  // rows p, q
                    const double apk = a[p][k], aqk = a[q][k];
                    a[p][k] = c * apk - s * aqk;
                    a[q][k] = s * apk + c * aqk;
                }
                for (size_t k = 0; k < n; ++k) {
                    const double vkp = v[k][p], vkq = v[k][q];
                    v[k][p] = c * vkp - s * vkq;
                    v[k][q] = s * vkp + c * vkq;
                }
            }
    }
    size_t best = 0;
    for (size_t i = 1; i < n; ++i)
        if (a[i][i] > a[best][best]) best = i;
    std::vector<double> out(n);
    for (size_t k = 0; k < n; ++k) out[k] = v[k][best];
    return out;
}

}  // namespace

TEST_CASE("cvector: the mean direction of one pair maps the negative prompt onto the positive") {
    const auto path = kvrun::test::shared_model("stories260K.gguf");
    if (path.empty()) return;
    LoadedModel m = load(path.string());
    const Tokenizer& tok = *m.tokenizer;
    const std::vector<TokenId> pos = tok.encode("Once upon a time, there was a happy girl", true);
    const std::vector<TokenId> neg = tok.encode("Once upon a time, there was a sad old dog", true);
    const auto diffs = cvector_differences(*m.backend, {pos}, {neg}, 512, 256);
    const auto dirs = cvector_directions(diffs, CvectorMethod::Mean, 0);
    const int32_t last = int32_t(dirs.size()) - 1;
    const auto file = std::filesystem::temp_directory_path() / "kvrun-test-cvec-mean.gguf";
    cvector_write(file.string(), dirs, "llama");

    // The last layer's output of the negative prompt's last token + the difference is the
    // positive prompt's: the same logits.
    const std::vector<float> want = last_logits(*m.backend, pos);
    LoadedModel steered = load(path.string(), file.string(), last);
    const std::vector<float> got = last_logits(*steered.backend, neg);
    const std::vector<float> plain = last_logits(*m.backend, neg);
    double max_err = 0, moved = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        max_err = std::max(max_err, double(std::fabs(got[i] - want[i])));
        moved = std::max(moved, double(std::fabs(plain[i] - want[i])));
    }
    CHECK(max_err < 1e-3);
    CHECK(moved > 0.1);  // the prompts do differ
    std::filesystem::remove(file);
}

TEST_CASE("cvector: pca is the top eigenvector of the differences, unit length, towards the mean") {
    const auto path = kvrun::test::shared_model("stories260K.gguf");
    if (path.empty()) return;
    LoadedModel m = load(path.string());
    const Tokenizer& tok = *m.tokenizer;
    auto enc = [&](const std::vector<std::string>& t) {
        std::vector<std::vector<TokenId>> out;
        for (const auto& s : t) out.push_back(tok.encode(s, true));
        return out;
    };
    const auto pos = enc({"Lily was very happy.", "The sun was warm and bright.", "Tom laughed."});
    const auto neg = enc({"Lily was very sad.", "The rain was cold and dark.", "Tom cried."});
    const auto diffs = cvector_differences(*m.backend, pos, neg, 512, 256);
    REQUIRE(diffs.size() == 3);
    const auto pca = cvector_directions(diffs, CvectorMethod::Pca, 1000);
    const auto mean = cvector_directions(diffs, CvectorMethod::Mean, 0);
    const size_t n_embd = size_t(m.backend->config().n_embd);
    for (size_t l = 1; l < pca.size(); ++l) {
        CAPTURE(l);
        std::vector<std::vector<double>> gram(n_embd, std::vector<double>(n_embd, 0.0));
        for (const auto& d : diffs)
            for (size_t i = 0; i < n_embd; ++i)
                for (size_t j = 0; j < n_embd; ++j) gram[i][j] += double(d[l][i]) * d[l][j];
        const std::vector<double> e = top_eigenvector(gram);
        double cos = 0, norm = 0, along = 0;
        for (size_t k = 0; k < n_embd; ++k) {
            cos += e[k] * pca[l][k];
            norm += double(pca[l][k]) * pca[l][k];
            along += double(pca[l][k]) * mean[l][k];
        }
        CHECK(std::fabs(cos) > 0.9999);
        CHECK(std::fabs(norm - 1) < 1e-5);
        CHECK(along > 0);
        // mean: the average difference.
        for (size_t k = 0; k < n_embd; k += 7)
            CHECK(mean[l][k] ==
                  doctest::Approx((diffs[0][l][k] + diffs[1][l][k] + diffs[2][l][k]) / 3.0)
                      .epsilon(1e-5));
    }
    CHECK_THROWS_WITH_AS(cvector_differences(*m.backend, pos, {neg[0]}, 512, 256),
                         doctest::Contains("go in pairs"), Error);
}

TEST_CASE("kvrun cvector-generator writes a control vector --control-vector loads") {
    using namespace kvrun::test::cli;
    const auto model = kvrun::test::shared_model("stories260K.gguf");
    if (model.empty()) return;
    const auto dir = std::filesystem::temp_directory_path();
    const auto p = dir / "kvrun-test-cvec-pos.txt", n = dir / "kvrun-test-cvec-neg.txt",
               short_n = dir / "kvrun-test-cvec-neg1.txt", out = dir / "kvrun-test-cvec.gguf";
    std::ofstream(p) << "Lily was happy.\nThe sun was warm.\n";
    std::ofstream(n) << "Lily was sad.\n\nThe rain was cold.\n";  // blank lines are skipped
    std::ofstream(short_n) << "Lily was sad.\n";
    auto r = run_command(kvrun_cmd("cvector-generator -m " + model.string() + " --positive-file " +
                                   p.string() + " --negative-file " + n.string() + " -o " +
                                   out.string()));
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(std::filesystem::exists(out));
    r = run_command(kvrun_cmd("run -m " + model.string() + " --control-vector " + out.string() +
                              " -p 'Once upon a time' -n 8 --temp 0"));
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(!r.out.empty());
    check_one_clear_error(
        run_command(kvrun_cmd("cvector-generator -m " + model.string() + " --positive-file " +
                              p.string() + " --negative-file " + short_n.string())),
        "line i of one pairs with line i of the other");
    for (const auto& f : {p, n, short_n, out}) std::filesystem::remove(f);
}
