// Importance matrices: what `kvrun imatrix` collects (checked against the layer-0 input
// computed by hand), both file layouts, weighted quantization (lower weighted error; a
// lower KL divergence for the quantized model), and bad input.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "gguf.h"
#include "imatrix.h"
#include "quant.h"
#include "quantize_model.h"
#include "test_util.h"
#include "tokenizer.h"

using namespace kvrun;
using kvrun::test::run_command;
using kvrun::test::shared_model;
namespace cli = kvrun::test::cli;
namespace fs = std::filesystem;

namespace {

// A temporary path ending in `tag` (the extension decides the imatrix layout).
std::string temp_path(const std::string& tag) {
    return cli::temp_path("imatrix") + "_" + tag;
}

// sum_i w_i (dequant(quant(x))_i - x_i)^2 for one row.
double weighted_error(GgmlType t, const std::vector<float>& x, const float* w, bool use_w) {
    std::vector<uint8_t> q(ggml_row_bytes(t, int64_t(x.size())));
    quantize_row_weighted(t, x.data(), use_w ? w : nullptr, q.data(), int64_t(x.size()));
    std::vector<float> y(x.size());
    dequantize_row(t, q.data(), y.data(), int64_t(x.size()));
    double e = 0;
    for (size_t i = 0; i < x.size(); ++i) e += double(w[i]) * (y[i] - x[i]) * (y[i] - x[i]);
    return e;
}

}  // namespace

TEST_CASE("weighted quantization: lower weighted error, and nullptr is quantize_row") {
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> x(4096), w(4096);
    for (size_t i = 0; i < x.size(); ++i) {
        x[i] = g(rng) * (i % 97 == 0 ? 6.0f : 1.0f);  // a few outliers
        // Importance spread over three orders of magnitude, as activations' squares are.
        w[i] = std::exp(2.5f * g(rng));
    }
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                       GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                       GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS}) {
        INFO(ggml_type_name(t));
        const double plain = weighted_error(t, x, w.data(), false);
        const double fitted = weighted_error(t, x, w.data(), true);
        MESSAGE(std::string(ggml_type_name(t)) << ": weighted error " << plain << " -> " << fitted);
        CHECK(fitted < plain * 0.97);
        // No weights: exactly quantize_row's bytes.
        std::vector<uint8_t> a(ggml_row_bytes(t, 4096)), b(a.size());
        quantize_row(t, x.data(), a.data(), 4096);
        quantize_row_weighted(t, x.data(), nullptr, b.data(), 4096);
        CHECK(a == b);
    }
}

TEST_CASE("kvrun imatrix collects each matrix's mean squared inputs, in both file layouts") {
    auto model = shared_model("stories260K.gguf");
    auto text = kvrun::test::shared_path("text/wiki.test.raw");
    if (model.empty() || text.empty()) return;
    const std::string gguf = temp_path("a.gguf"), dat = temp_path("a.dat");
    const std::string args = " -m " + model.string() + " -f " + text.string() + " -c 64 --chunks 3";
    auto r = run_command(cli::kvrun_cmd("imatrix" + args + " -o " + gguf));
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.err.find("35 matrices, 3 chunks") != std::string::npos);
    r = run_command(cli::kvrun_cmd("imatrix" + args + " -o " + dat));
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const Imatrix a = load_imatrix(gguf), b = load_imatrix(dat);
    CHECK(a.chunks == 3);
    CHECK(a.chunk_size == 64);
    CHECK(b.chunks == 3);
    REQUIRE(a.entries.size() == 35);  // 7 matrices x 5 layers: no output, no token_embd
    CHECK_FALSE(a.entries.count("output.weight"));
    for (const auto& [name, e] : a.entries) {
        INFO(name);
        CHECK(e.counts == std::vector<double>{3.0 * 64});  // every token of every chunk
        const auto ma = a.mean_squares(name), mb = b.mean_squares(name);
        REQUIRE(ma.size() == mb.size());
        for (size_t j = 0; j < ma.size(); ++j) CHECK(mb[j] == doctest::Approx(ma[j]).epsilon(1e-5));
    }
    // info describes it; the model-running commands refuse it with a hint.
    auto info = run_command(cli::kvrun_cmd("info -m " + gguf));
    CHECK(info.out.find("35 matrices, 3 chunks of 64 tokens") != std::string::npos);
    cli::check_one_line_with_hint(run_command(cli::kvrun_cmd("run -m " + gguf + " -p hi")),
                                  "is an importance matrix, not a model");
    // Q, K and V read the same normed input; so do gate and up.
    CHECK(a.mean_squares("blk.2.attn_q.weight") == a.mean_squares("blk.2.attn_v.weight"));
    CHECK(a.mean_squares("blk.2.ffn_gate.weight") == a.mean_squares("blk.2.ffn_up.weight"));

    // Layer 0's attention input by hand: each chunk's tokens (BOS first) embedded, RMS-normed
    // and scaled by attn_norm; the mean of its squares per column.
    GgufFile f = GgufFile::open(model.string());
    auto tok = Tokenizer::from_gguf(f);
    const std::vector<TokenId> all = tok->encode(cli::read_all(text), true, false);
    const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
    const GgufTensorInfo* norm = f.find_tensor("blk.0.attn_norm.weight");
    const int64_t d = emb->dims[0];
    const double eps = f.get_float("llama.attention.layer_norm_rms_epsilon");
    std::vector<float> row(static_cast<size_t>(d)), g(static_cast<size_t>(d));
    dequantize_row(norm->type, norm->data, g.data(), d);
    std::vector<double> want(size_t(d), 0.0);
    for (int c = 0; c < 3; ++c)
        for (int i = 0; i < 64; ++i) {
            const TokenId t = i == 0 ? tok->bos() : all[size_t(c * 64 + i)];
            dequantize_row(emb->type, emb->data + size_t(t) * ggml_row_bytes(emb->type, d),
                           row.data(), d);
            double ss = 0;
            for (float v : row) ss += double(v) * v;
            const double inv = 1.0 / std::sqrt(ss / double(d) + eps);
            for (int64_t j = 0; j < d; ++j) {
                const double y = row[size_t(j)] * inv * g[size_t(j)];
                want[size_t(j)] += y * y / (3 * 64);
            }
        }
    const auto got = a.mean_squares("blk.0.attn_q.weight");
    REQUIRE(got.size() == size_t(d));
    for (int64_t j = 0; j < d; ++j)
        CHECK(got[size_t(j)] == doctest::Approx(want[size_t(j)]).epsilon(1e-3));
    fs::remove(gguf);
    fs::remove(dat);
}

TEST_CASE("quantize --imatrix: closer to the F32 model than without (held-out text)") {
    auto f32 = shared_model("stories260K-w256-F32.gguf");
    auto text = kvrun::test::shared_path("text/wiki.test.raw");
    if (f32.empty() || text.empty()) return;
    const std::string im = temp_path("cal.gguf"), base = temp_path("base.kld");
    // Calibrated on chunks 100-159, measured on chunks 0-39.
    auto r = run_command(cli::kvrun_cmd("imatrix -m " + f32.string() + " -f " + text.string() +
                                        " -c 256 --chunk 100 --chunks 60 -o " + im));
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const std::string common = " -f " + text.string() + " -c 256 --chunks 40";
    r = run_command(
        cli::kvrun_cmd("perplexity -m " + f32.string() + common + " --kl-divergence-base " + base));
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    auto mean_kld = [&](const std::string& model) { return cli::mean_kld(model, common, base); };
    // Measured: Q4_1 0.208 -> 0.142, IQ4_XS 0.180 -> 0.171, Q4_K_M 0.136 -> 0.131.
    for (const std::string type : {"Q4_1", "IQ4_XS", "Q4_K_M"}) {
        INFO(type);
        const std::string plain = temp_path(type + ".gguf"),
                          weighted = temp_path(type + "-im.gguf");
        auto q =
            run_command(cli::kvrun_cmd("quantize -q " + f32.string() + " " + plain + " " + type));
        REQUIRE_MESSAGE(q.exit_code == 0, q.err);
        q = run_command(cli::kvrun_cmd("quantize --imatrix " + im + " " + f32.string() + " " +
                                       weighted + " " + type));
        REQUIRE_MESSAGE(q.exit_code == 0, q.err);
        CHECK(q.err.find("(35 with the importance matrix)") != std::string::npos);
        CHECK(GgufFile::open(weighted).get_string("quantize.imatrix.file") == im);
        CHECK(run_command(cli::kvrun_cmd("info -m " + weighted))
                  .out.find("quantized with the importance matrix " + im) != std::string::npos);
        const double without = mean_kld(plain), with = mean_kld(weighted);
        MESSAGE(type << ": mean KLD " << without << " -> " << with << " with the imatrix");
        CHECK(with < without * 0.98);
        fs::remove(plain);
        fs::remove(weighted);
    }
    fs::remove(im);
    fs::remove(base);
}

TEST_CASE("imatrix and quantize --imatrix: bad input") {
    auto small = shared_model("stories260K.gguf");
    auto wide = shared_model("stories260K-w256-F32.gguf");
    auto text = kvrun::test::shared_path("text/wiki.test.raw");
    if (small.empty() || wide.empty() || text.empty()) return;
    const std::string im = temp_path("small.gguf"), out = temp_path("out.gguf");
    auto r = run_command(cli::kvrun_cmd("imatrix -m " + small.string() + " -f " + text.string() +
                                        " -c 64 --chunks 2 -o " + im));
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    // --include-weights / --exclude-weights pick the entries by name.
    auto inc =
        run_command(cli::kvrun_cmd("quantize -q --imatrix " + im + " --include-weights ffn_down " +
                                   small.string() + " " + out + " Q4_0"));
    CHECK_MESSAGE(inc.err.find("(5 with the importance matrix)") != std::string::npos, inc.err);
    auto exc =
        run_command(cli::kvrun_cmd("quantize -q --imatrix " + im + " --exclude-weights attn " +
                                   small.string() + " " + out + " Q4_0"));
    CHECK_MESSAGE(exc.err.find("(15 with the importance matrix)") != std::string::npos, exc.err);
    // An imatrix of another model: the sizes differ.
    cli::check_one_clear_error(run_command(cli::kvrun_cmd("quantize --imatrix " + im + " " +
                                                          wide.string() + " " + out + " Q4_K_M")),
                               "columns");
    // Q2_K_S needs one; with it, it works.
    cli::check_one_line_with_hint(
        run_command(cli::kvrun_cmd("quantize " + small.string() + " " + out + " Q2_K_S")),
        "needs an importance matrix");
    auto ok = run_command(cli::kvrun_cmd("quantize -q --imatrix " + im + " " + small.string() +
                                         " " + out + " Q2_K_S"));
    CHECK_MESSAGE(ok.exit_code == 0, ok.err);
    // A truncated .dat, a file that is neither layout.
    const std::string dat = temp_path("small.dat");
    REQUIRE(run_command(cli::kvrun_cmd("imatrix -m " + small.string() + " -f " + text.string() +
                                       " -c 64 --chunks 1 -o " + dat))
                .exit_code == 0);
    const std::string bytes = cli::read_all(dat);
    const std::string cut = cli::temp_file(bytes.substr(0, bytes.size() / 2), "cut");
    cli::check_one_clear_error(run_command(cli::kvrun_cmd("quantize --imatrix " + cut + " " +
                                                          small.string() + " " + out + " Q4_0")),
                               "truncated imatrix");
    const std::string junk = cli::temp_file("not an imatrix at all", "junk");
    cli::check_one_clear_error(run_command(cli::kvrun_cmd("quantize --imatrix " + junk + " " +
                                                          small.string() + " " + out + " Q4_0")),
                               junk);
    // A text shorter than a chunk.
    const std::string short_text = cli::temp_file("Once upon a time.", "short");
    cli::check_one_line_with_hint(
        run_command(cli::kvrun_cmd("imatrix -m " + small.string() + " -f " + short_text)),
        "no chunk");
    for (const std::string& p : {im, out, dat, cut, junk, short_text}) fs::remove(p);
}

TEST_CASE("imatrix files: every prefix and random corruptions load or fail cleanly") {
    auto small = shared_model("stories260K.gguf");
    auto text = kvrun::test::shared_path("text/wiki.test.raw");
    if (small.empty() || text.empty()) return;
    for (const std::string ext : {".dat", ".gguf"}) {
        INFO(ext);
        const std::string path = temp_path("fuzz" + ext);
        REQUIRE(run_command(cli::kvrun_cmd("imatrix -m " + small.string() + " -f " + text.string() +
                                           " -c 32 --chunks 1 -o " + path))
                    .exit_code == 0);
        const std::string bytes = cli::read_all(path);
        const std::string probe = temp_path("probe" + ext);
        auto try_load = [&](const std::string& b) {
            { std::ofstream(probe, std::ios::binary) << b; }
            try {
                const Imatrix im = load_imatrix(probe);
                for (const auto& [name, e] : im.entries) (void)im.mean_squares(name);
            } catch (const Error&) {
            }
        };
        for (size_t n = 0; n < bytes.size(); n += 1 + n / 64) try_load(bytes.substr(0, n));
        std::mt19937 rng(3);
        for (int i = 0; i < 300; ++i) {
            std::string b = bytes;
            for (int k = 0; k < 4; ++k) b[rng() % b.size()] = char(rng());
            try_load(b);
        }
        CHECK(load_imatrix(path).entries.size() == 35);
        fs::remove(path);
        fs::remove(probe);
    }
}

TEST_CASE("imatrix --in-file adds files up: two halves make the whole") {
    auto small = shared_model("stories260K.gguf");
    auto wide = shared_model("stories260K-w256-F32.gguf");
    auto text = kvrun::test::shared_path("text/wiki.test.raw");
    if (small.empty() || wide.empty() || text.empty()) return;
    const std::string m = "imatrix -m " + small.string() + " -c 64 ";
    const std::string a = temp_path("a.gguf"), b = temp_path("b.dat"), ab = temp_path("ab.gguf"),
                      sum = temp_path("sum.gguf"), more = temp_path("more.gguf");
    const std::string f = " -f " + text.string();
    for (const auto& [args, out] : std::vector<std::pair<std::string, std::string>>{
             {f + " --chunks 2", a},
             {f + " --chunk 2 --chunks 2", b},
             {f + " --chunks 4", ab},
             {"--in-file " + a + " --in-file " + b, sum},
             {f + " --chunk 2 --chunks 2 --in-file " + a, more}}) {
        auto r = run_command(cli::kvrun_cmd(m + args + " -o " + out));
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    }
    const Imatrix whole = load_imatrix(ab);
    for (const std::string& p : {sum, more}) {
        INFO(p);
        const Imatrix got = load_imatrix(p);
        CHECK(got.chunks == 4);
        REQUIRE(got.entries.size() == whole.entries.size());
        for (const auto& [name, e] : whole.entries) {
            INFO(name);
            const auto want = whole.mean_squares(name), have = got.mean_squares(name);
            REQUIRE(have.size() == want.size());
            for (size_t j = 0; j < want.size(); ++j)
                CHECK(have[j] == doctest::Approx(want[j]).epsilon(1e-5));
        }
    }
    // Another model's imatrix does not fit.
    cli::check_one_clear_error(run_command(cli::kvrun_cmd("imatrix -m " + wide.string() +
                                                          " --in-file " + a + " -o " + sum)),
                               "this model's tensor");
    cli::check_one_line_with_hint(run_command(cli::kvrun_cmd("imatrix -m " + small.string())),
                                  "--in-file");
    for (const std::string& p : {a, b, ab, sum, more}) fs::remove(p);
}

TEST_CASE("imatrix saves every --output-frequency chunks, and Ctrl-C keeps the chunks done") {
    auto model = shared_model("stories260K-w256-F32.gguf");
    auto text = kvrun::test::shared_path("text/wiki.test.raw");
    if (model.empty() || text.empty()) return;
    const std::string out = temp_path("int.gguf");
    // All ~1300 chunks would take a while: wait until the first save (after 5), then SIGINT.
    const std::string script =
        cli::kvrun_cmd("imatrix -m " + model.string() + " -f " + text.string() +
                       " -c 256 --output-frequency 5 -o " + out) +
        " & pid=$!; for i in $(seq 300); do [ -s " + out +
        " ] && break; sleep 0.1; done; kill -INT $pid; wait $pid; "
        "echo rc=$?";
    auto r = run_command("sh -c " + kvrun::test::shell_quote(script));
    CHECK_MESSAGE(r.out.find("rc=130") != std::string::npos, r.out << r.err);
    CHECK(r.err.find("saved 5 chunks") != std::string::npos);
    CHECK(r.err.find("interrupted after") != std::string::npos);
    const Imatrix im = load_imatrix(out);
    CHECK(im.chunks >= 5);
    CHECK(im.chunks < 1000);
    for (const auto& [name, e] : im.entries) CHECK(e.counts.front() == double(im.chunks * 256));
    fs::remove(out);
}
