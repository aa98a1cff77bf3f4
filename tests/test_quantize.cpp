// `kvrun quantize`: llama-quantize's file types, mix rules and bytes, checked against the
// llama-quantize outputs in ../shared/models; quality of kvrun's own K-quants against
// llama.cpp's (KL divergence to the F32 model); bad input.
#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "quant.h"
#include "quantize_model.h"
#include "test_util.h"

using namespace kvrun;
using kvrun::test::run_command;
using kvrun::test::shared_model;
namespace cli = kvrun::test::cli;
namespace fs = std::filesystem;

namespace {

QuantizeOptions options_for(const std::string& type, bool pure = false) {
    QuantizeOptions o;
    o.type = find_quant_file_type(type);
    REQUIRE(o.type != nullptr);
    o.pure = pure;
    return o;
}

fs::path temp_gguf(const std::string& tag) {
    return cli::temp_path("quantize_" + tag) + ".gguf";
}

std::string file_bytes(const fs::path& p) {
    return cli::read_all(p);
}

// The llama-quantize outputs in ../shared/models: (source, reference, type, --pure).
struct Case {
    std::string source, reference, type;
    bool pure = false;
};

std::vector<Case> shared_cases() {
    std::vector<Case> cases;
    for (const char* t : {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K_M", "Q6_K", "F16", "BF16"})
        cases.push_back({"stories260K.gguf", std::string("stories260K-") + t + ".gguf", t});
    for (const char* t : {"F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M",
                          "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS"})
        cases.push_back(
            {"stories260K-w256-F32.gguf", std::string("stories260K-w256-") + t + ".gguf", t});
    for (const char* t : {"Q2_K", "Q3_K_M", "Q4_0", "Q4_1", "Q4_K_M", "Q5_0", "Q5_1", "Q5_K_M"})
        cases.push_back({"stories260K-w256-F32.gguf",
                         std::string("stories260K-w256-pure-") + t + ".gguf", t, true});
    return cases;
}

bool legacy_or_float(GgmlType t) {
    return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16 || t == GgmlType::Q4_0 ||
           t == GgmlType::Q4_1 || t == GgmlType::Q5_0 || t == GgmlType::Q5_1 || t == GgmlType::Q8_0;
}

}  // namespace

TEST_CASE("quantize: file type names and numbers are llama-quantize's") {
    CHECK(find_quant_file_type("Q4_K_M")->id == 15);
    CHECK(find_quant_file_type("q4_k_m")->id == 15);
    CHECK(find_quant_file_type("Q4_K")->name == "Q4_K_M");  // llama-quantize's alias
    CHECK(find_quant_file_type("Q3_K")->name == "Q3_K_M");
    CHECK(find_quant_file_type("15")->name == "Q4_K_M");
    CHECK(find_quant_file_type("7")->name == "Q8_0");
    CHECK(find_quant_file_type("32")->base == GgmlType::BF16);
    CHECK(find_quant_file_type("Q4_X") == nullptr);
    CHECK(find_quant_file_type("") == nullptr);
    CHECK(find_quant_file_type("99") == nullptr);
    CHECK_FALSE(find_quant_file_type("IQ2_XXS")->unsupported.empty());
    CHECK(find_quant_file_type("IQ4_XS")->unsupported.empty());
    // The _M mixes' layer rule: first and last eighth, every third between.
    std::vector<int> more;
    for (int i = 0; i < 32; ++i)
        if (quant_use_more_bits(i, 32)) more.push_back(i);
    CHECK(more == std::vector<int>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31});
}

TEST_CASE("quantize: every tensor gets llama-quantize's type, in its order") {
    for (const Case& c : shared_cases()) {
        INFO(c.reference << (c.pure ? " (--pure)" : ""));
        auto src_path = shared_model(c.source), ref_path = shared_model(c.reference);
        if (src_path.empty() || ref_path.empty()) return;
        GgufFile src = GgufFile::open(src_path.string()), ref = GgufFile::open(ref_path.string());
        auto plan = plan_quantization(src, options_for(c.type, c.pure));
        REQUIRE(plan.size() == ref.tensors().size());
        for (size_t i = 0; i < plan.size(); ++i) {
            const GgufTensorInfo& want = ref.tensors()[i];
            INFO(want.name);
            CHECK(plan[i].tensor->name == want.name);
            CHECK(ggml_type_name(plan[i].to) == std::string(ggml_type_name(want.type)));
        }
    }
}

TEST_CASE("quantize: legacy types, F16 and BF16 give llama-quantize's files byte for byte") {
    int identical_files = 0;
    for (const Case& c : shared_cases()) {
        INFO(c.reference << (c.pure ? " (--pure)" : ""));
        auto src_path = shared_model(c.source), ref_path = shared_model(c.reference);
        if (src_path.empty() || ref_path.empty()) return;
        GgufFile src = GgufFile::open(src_path.string()), ref = GgufFile::open(ref_path.string());
        const fs::path out = temp_gguf("bytes");
        const QuantizeResult r = quantize_model(src, out.string(), options_for(c.type, c.pure));
        CHECK_FALSE(fs::exists(out.string() + ".part"));
        GgufFile got = GgufFile::open(out.string());
        CHECK(got.get_int("general.file_type") == ref.get_int("general.file_type"));
        CHECK(r.bytes_out == [&] {
            uint64_t n = 0;
            for (const auto& t : ref.tensors()) n += t.n_bytes;
            return n;
        }());
        bool all_legacy = true;
        for (const GgufTensorInfo& want : ref.tensors()) {
            INFO(want.name);
            const GgufTensorInfo* t = got.find_tensor(want.name);
            REQUIRE(t != nullptr);
            REQUIRE(t->type == want.type);
            REQUIRE(t->n_bytes == want.n_bytes);
            if (!legacy_or_float(want.type)) {
                all_legacy = false;
                continue;
            }
            CHECK(std::equal(t->data, t->data + t->n_bytes, want.data));
        }
        if (all_legacy) {  // then the whole file: metadata, order, offsets and padding
            CHECK(file_bytes(out) == file_bytes(ref_path));
            identical_files += file_bytes(out) == file_bytes(ref_path);
        }
        fs::remove(out);
    }
    MESSAGE(identical_files << " files identical to llama-quantize's");
    CHECK(identical_files >= 16);
}

TEST_CASE("quantize: kvrun's K-quants and IQ4 are as close to F32 as llama-quantize's") {
    // Mean KL divergence of each quantized model's next-token distributions from the F32
    // model's, over 40 chunks of WikiText-2: kvrun's own K-quant / IQ4 fits against the
    // llama-quantize files (measured: Q2_K 1.47 vs 2.06, Q3_K_M 0.45 vs 0.53, Q4_K_M 0.136
    // vs 0.136, Q6_K 0.0112 vs 0.0123, IQ4_XS 0.180 vs 0.180).
    auto f32 = shared_model("stories260K-w256-F32.gguf");
    auto text = kvrun::test::shared_path("text/wiki.test.raw");
    if (f32.empty() || text.empty()) return;
    const std::string common = " -f " + text.string() + " -c 256 --chunks 40 -t 2";
    const fs::path base = temp_gguf("kld_base");
    auto r = run_command(cli::kvrun_cmd("perplexity -m " + f32.string() + common +
                                        " --kl-divergence-base " + base.string()));
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    auto mean_kld = [&](const std::string& model) {
        return cli::mean_kld(model, common, base.string());
    };
    for (const std::string type : {"Q2_K", "Q3_K_M", "Q4_K_M", "Q6_K", "IQ4_XS"}) {
        INFO(type);
        auto ref = shared_model("stories260K-w256-" + type + ".gguf");
        if (ref.empty()) continue;
        const fs::path out = temp_gguf(type);
        auto q = run_command(
            cli::kvrun_cmd("quantize -q " + f32.string() + " " + out.string() + " " + type));
        REQUIRE_MESSAGE(q.exit_code == 0, q.err);
        const double ours = mean_kld(out.string()), theirs = mean_kld(ref.string());
        MESSAGE(type << ": mean KLD kvrun " << ours << ", llama-quantize " << theirs);
        CHECK(ours <= theirs * 1.03);
        fs::remove(out);
    }
    fs::remove(base);
}

TEST_CASE("quantize: fallbacks, overrides, requantizing and COPY") {
    auto small = shared_model("stories260K.gguf");
    auto q8 = shared_model("stories260K-Q8_0.gguf");
    if (small.empty() || q8.empty()) return;
    GgufFile src = GgufFile::open(small.string());
    auto type_of = [](const std::vector<TensorQuantChoice>& plan, const std::string& name) {
        for (const auto& c : plan)
            if (c.tensor->name == name) return c.to;
        FAIL("no tensor " << name);
        return GgmlType::F32;
    };
    SUBCASE("rows of 172 take F16, rows of 64 a 32-block type instead of a K-quant") {
        auto plan = plan_quantization(src, options_for("Q6_K"));
        CHECK(type_of(plan, "blk.0.ffn_down.weight") == GgmlType::F16);
        CHECK(type_of(plan, "blk.0.attn_q.weight") == GgmlType::Q8_0);
        int fallbacks = 0;
        for (const auto& c : plan) fallbacks += c.fallback;
        CHECK(fallbacks == 36);  // output.weight's Q8_0 is the mix's own rule for such rows
        CHECK(type_of(plan, "blk.0.attn_norm.weight") == GgmlType::F32);  // norms kept
    }
    SUBCASE("--output-tensor-type, --token-embedding-type, --tensor-type, --leave-output") {
        QuantizeOptions o = options_for("Q4_0");
        o.output_type = GgmlType::F16;
        o.token_embd_type = GgmlType::Q8_0;
        o.tensor_types = {{"attn_v", GgmlType::Q8_0}, {"blk\\.1\\.attn_v", GgmlType::Q5_1}};
        auto plan = plan_quantization(src, o);
        CHECK(type_of(plan, "output.weight") == GgmlType::F16);
        CHECK(type_of(plan, "token_embd.weight") == GgmlType::Q8_0);
        CHECK(type_of(plan, "blk.0.attn_v.weight") == GgmlType::Q8_0);
        CHECK(type_of(plan, "blk.1.attn_v.weight") == GgmlType::Q5_1);  // the last match wins
        CHECK(type_of(plan, "blk.1.attn_k.weight") == GgmlType::Q4_0);
        o.leave_output = true;
        o.output_type.reset();
        CHECK(type_of(plan_quantization(src, o), "output.weight") == GgmlType::F32);
        o.leave_output = false;
        o.output_type = GgmlType::Q4_K;  // 64 is no multiple of 256
        CHECK_THROWS_WITH_AS(plan_quantization(src, o), doctest::Contains("output.weight"), Error);
        o.output_type.reset();
        o.tensor_types = {{"(", GgmlType::Q8_0}};
        CHECK_THROWS_WITH_AS(plan_quantization(src, o), doctest::Contains("bad regular expression"),
                             Error);
    }
    SUBCASE("a quantized input needs --allow-requantize") {
        GgufFile in = GgufFile::open(q8.string());
        QuantizeOptions o = options_for("Q4_0");
        CHECK_THROWS_WITH_AS(plan_quantization(in, o), doctest::Contains("--allow-requantize"),
                             Error);
        o.allow_requantize = true;
        auto plan = plan_quantization(in, o);
        CHECK(type_of(plan, "blk.0.attn_q.weight") == GgmlType::Q4_0);
        CHECK(type_of(plan, "blk.0.ffn_down.weight") == GgmlType::F16);  // kept: already F16
        // Q8_0 -> Q8_0 is a copy, not a requantization.
        CHECK_NOTHROW(plan_quantization(in, options_for("Q8_0")));
    }
    SUBCASE("COPY keeps every tensor and the file type; metadata overrides apply") {
        QuantizeOptions o;  // type nullptr: COPY
        o.metadata = {{"general.name", gguf_make_string("renamed")}};
        GgufFile in = GgufFile::open(q8.string());
        const fs::path out = temp_gguf("copy");
        const QuantizeResult r = quantize_model(in, out.string(), o);
        CHECK(r.n_converted == 0);
        GgufFile got = GgufFile::open(out.string());
        CHECK(got.get_string("general.name") == "renamed");
        CHECK(got.get_int("general.file_type") == in.get_int("general.file_type"));
        for (const GgufTensorInfo& t : in.tensors()) {
            const GgufTensorInfo* g = got.find_tensor(t.name);
            REQUIRE(g != nullptr);
            CHECK(std::equal(t.data, t.data + t.n_bytes, g->data));
        }
        fs::remove(out);
    }
    SUBCASE("types kvrun cannot write are refused with the reason") {
        CHECK_THROWS_WITH_AS(plan_quantization(src, options_for("IQ2_XXS")),
                             doctest::Contains("no quantizer"), Error);
        CHECK_THROWS_WITH_AS(plan_quantization(src, options_for("Q2_K_S")),
                             doctest::Contains("needs an importance matrix"), Error);
        CHECK_THROWS_WITH_AS(plan_quantization(src, options_for("IQ3_S")),
                             doctest::Contains("no quantizer"), Error);
    }
    SUBCASE("an interrupted or failed run leaves no file behind") {
        const fs::path out = temp_gguf("cancel");
        std::atomic<bool> cancel{true};
        CHECK_THROWS_WITH_AS(quantize_model(src, out.string(), options_for("Q8_0"), {}, &cancel),
                             "interrupted", Error);
        CHECK_FALSE(fs::exists(out));
        CHECK_FALSE(fs::exists(out.string() + ".part"));
        CHECK_THROWS_WITH_AS(quantize_model(src, small.string(), options_for("Q8_0")),
                             doctest::Contains("overwrite the input"), Error);
    }
}

TEST_CASE("quantize: the command line") {
    auto small = shared_model("stories260K.gguf");
    auto ref = shared_model("stories260K-Q4_K_M.gguf");
    if (small.empty() || ref.empty()) return;
    const fs::path out = temp_gguf("cli");
    SUBCASE("INPUT OUTPUT TYPE NTHREADS writes llama-quantize's file and it runs") {
        auto r = run_command(
            cli::kvrun_cmd("quantize " + small.string() + " " + out.string() + " Q4_K_M 2"));
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        CHECK(r.out.empty());  // the report goes to stderr
        CHECK(r.err.find("blk.2.attn_v.weight") != std::string::npos);
        CHECK(r.err.find("fallback") != std::string::npos);
        CHECK(r.err.find("37 converted, 11 kept") != std::string::npos);
        CHECK(file_bytes(out) == file_bytes(ref));
        CHECK(run_command(cli::kvrun_cmd("info -m " + out.string()))
                  .out.find("file type       Q4_K_M") != std::string::npos);
        auto a = run_command(
            cli::kvrun_cmd("run -m " + out.string() + " -p 'Once upon a time' -n 24 --temp 0"));
        auto b = run_command(
            cli::kvrun_cmd("run -m " + ref.string() + " -p 'Once upon a time' -n 24 --temp 0"));
        CHECK(a.exit_code == 0);
        CHECK(a.out == b.out);
        CHECK(a.out.size() > 40);
    }
    SUBCASE("repeatable flags take one value each, before the positionals") {
        auto r = run_command(cli::kvrun_cmd(
            "quantize -q --tensor-type attn_v=Q8_0 --tensor-type ffn_up=Q5_0 --override-kv "
            "general.name=str:renamed " +
            small.string() + " " + out.string() + " Q4_0"));
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        GgufFile got = GgufFile::open(out.string());
        CHECK(got.get_string("general.name") == "renamed");
        CHECK(got.find_tensor("blk.3.attn_v.weight")->type == GgmlType::Q8_0);
        CHECK(got.find_tensor("blk.3.ffn_up.weight")->type == GgmlType::Q5_0);
        CHECK(got.find_tensor("blk.3.attn_q.weight")->type == GgmlType::Q4_0);
    }
    SUBCASE("without OUTPUT the file is ggml-model-TYPE.gguf beside the input") {
        const fs::path dir =
            fs::temp_directory_path() / ("kvrun_qdir_" + std::to_string(::getpid()));
        fs::create_directories(dir);
        fs::copy_file(small, dir / "model.gguf", fs::copy_options::overwrite_existing);
        auto r =
            run_command(cli::kvrun_cmd("quantize -q " + (dir / "model.gguf").string() + " q8_0"));
        CHECK_MESSAGE(r.exit_code == 0, r.err);
        CHECK(fs::exists(dir / "ggml-model-Q8_0.gguf"));
        fs::remove_all(dir);
    }
    SUBCASE("bad input: one clear line each") {
        const std::string in = small.string(), o = out.string();
        cli::check_one_line_with_hint(
            run_command(cli::kvrun_cmd("quantize " + in + " " + o + " Q4_X")),
            "unknown quantization type 'Q4_X'");
        cli::check_one_clear_error(
            run_command(cli::kvrun_cmd("quantize " + in + " " + o + " IQ2_XXS")), "no quantizer");
        cli::check_one_clear_error(
            run_command(cli::kvrun_cmd("quantize " + in + " " + in + " Q8_0")),
            "overwrite the input");
        cli::check_one_clear_error(
            run_command(cli::kvrun_cmd("quantize /nonexistent.gguf " + o + " Q8_0")),
            "nonexistent.gguf");
        cli::check_one_clear_error(run_command(cli::kvrun_cmd("quantize --output-tensor-type Q9 " +
                                                              in + " " + o + " Q8_0")),
                                   "unknown tensor type 'Q9'");
        cli::check_one_clear_error(
            run_command(cli::kvrun_cmd("quantize --tensor-type attn_v " + in + " " + o + " Q8_0")),
            "REGEX=TYPE");
        cli::check_one_clear_error(
            run_command(cli::kvrun_cmd("quantize --imatrix x.dat " + in + " " + o + " Q8_0")),
            "x.dat");
        const std::string readme = std::string(KVRUN_SOURCE_DIR) + "/README.md";
        cli::check_one_clear_error(
            run_command(cli::kvrun_cmd("quantize " + readme + " " + o + " Q8_0")), "README.md");
        // A truncated model: the reader's error, and no output file.
        const std::string bytes = file_bytes(small);
        const std::string cut = cli::temp_file(bytes.substr(0, bytes.size() / 2), "cut");
        cli::check_one_clear_error(
            run_command(cli::kvrun_cmd("quantize " + cut + " " + o + " Q8_0")), cut);
        CHECK_FALSE(fs::exists(out));
        fs::remove(cut);
    }
    fs::remove(out);
}
