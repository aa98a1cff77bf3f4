// LoRA adapters (lora.h): an adapter applied at run time gives the logits of the base model
// with the update merged into its weights (W + scale * B A, scale = user scale x alpha / rank),
// for plain and fused (phi3) matrices and the output; bad adapters get one clear error; the
// CLI flags --lora and --lora-scaled reach the backend.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"
#include "engine.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "lora.h"
#include "lora_test_util.h"
#include "synthetic_model.h"
#include "test_util.h"
#include "tokenizer.h"

using namespace kvrun;
using kvrun::test::Factors;
using kvrun::test::random_factors;
using kvrun::test::TempDir;
using kvrun::test::write_adapter;

namespace {

// The base model (F32) with W + scale * B A written into each adapted matrix.
void write_merged(const GgufFile& base, const std::string& path, double alpha, double user_scale,
                  const std::vector<Factors>& fs) {
    std::map<std::string, std::vector<float>> merged;
    for (const Factors& f : fs) {
        const GgufTensorInfo* t = base.find_tensor(f.name);
        REQUIRE(t->type == GgmlType::F32);
        const auto* w = static_cast<const float*>(static_cast<const void*>(t->data));
        std::vector<float> m(w, w + f.n_in * f.n_out);
        const double s = user_scale * alpha / double(f.rank);
        for (int64_t o = 0; o < f.n_out; ++o)
            for (int64_t i = 0; i < f.n_in; ++i) {
                double ba = 0;
                for (int64_t r = 0; r < f.rank; ++r)
                    ba += double(f.b[size_t(o * f.rank + r)]) * f.a[size_t(r * f.n_in + i)];
                m[size_t(o * f.n_in + i)] = float(m[size_t(o * f.n_in + i)] + s * ba);
            }
        merged[f.name] = std::move(m);
    }
    GgufWriter w(uint32_t(base.alignment()));
    for (const auto& [key, value] : base.metadata()) w.set_value(key, value);
    for (const GgufTensorInfo& t : base.tensors()) {
        auto it = merged.find(t.name);
        if (it == merged.end())
            w.add_tensor(t.name, t.type, t.dims, t.data, t.n_bytes);
        else
            w.add_tensor(t.name, t.type, t.dims, it->second.data(),
                         it->second.size() * sizeof(float));
    }
    w.write_file(path);
}

// Logits of every token of a 9-token prompt (prefill of 6, then 3 decode steps).
std::vector<float> logits_of(const GgufFile& f, const std::vector<LoraSpec>& lora = {}) {
    BackendOptions o;
    o.kv_block_size = 4;
    o.n_kv_blocks = 8;
    o.n_threads = 2;
    o.kv_type_k = o.kv_type_v = KvType::F32;
    o.lora = lora;
    auto be = make_cpu_backend(f, o);
    const std::vector<int32_t> toks = {1, 17, 250, 4, 99, 31, 7, 123, 88};
    const size_t V = size_t(be->config().n_vocab);
    std::vector<float> out;
    for (size_t start = 0; start < toks.size();) {
        const size_t n = start == 0 ? 6 : 1;
        ForwardBatch b;
        for (size_t i = start; i < start + n; ++i) {
            b.tokens.push_back(toks[i]);
            b.positions.push_back(int32_t(i));
            b.seq_index.push_back(0);
            b.slots.push_back(int32_t(i));
            b.logit_rows.push_back(int32_t(i - start));
        }
        b.block_tables = {{3, 1, 0}};
        std::vector<float> l(n * V);
        be->forward(b, l.data());
        out.insert(out.end(), l.begin(), l.end());
        start += n;
    }
    return out;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double d = 0, m = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        d = std::max(d, double(std::fabs(a[i] - b[i])));
        m = std::max(m, double(std::fabs(b[i])));
    }
    return d / m;
}

SyntheticModelConfig small(const std::string& arch) {
    SyntheticModelConfig c = synthetic_preset("tiny");
    c.arch = arch;
    c.n_layer = 2, c.n_embd = 64, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 96, c.n_vocab = 300;
    c.weight_std = 0.15f;
    c.seed = 5;
    return c;
}

std::string load_error(const GgufFile& base, const std::vector<LoraSpec>& lora) {
    try {
        logits_of(base, lora);
    } catch (const Error& e) {
        return e.what();
    }
    return {};
}

}  // namespace

TEST_CASE("a LoRA adapter gives the logits of the model with its update merged") {
    TempDir dir;
    for (const std::string arch : {"llama", "phi3"}) {
        CAPTURE(arch);
        const std::string base_path = dir.file(arch + ".gguf");
        synthetic_model_write(small(arch), base_path);
        GgufFile base = GgufFile::open(base_path);
        // Attention (phi3: the fused attn_qkv, B's rows split into Q, K, V), FFN (phi3: the
        // fused gate/up) and output matrices, ranks 4 and 8, alpha 8.
        std::vector<Factors> fs;
        if (arch == "phi3") {
            fs.push_back(random_factors(base, "blk.0.attn_qkv.weight", 4, 1));
            fs.push_back(random_factors(base, "blk.1.ffn_up.weight", 8, 2));
        } else {
            fs.push_back(random_factors(base, "blk.0.attn_q.weight", 4, 1));
            fs.push_back(random_factors(base, "blk.0.attn_v.weight", 8, 2));
            fs.push_back(random_factors(base, "blk.1.ffn_gate.weight", 4, 3));
        }
        fs.push_back(random_factors(base, "blk.1.attn_output.weight", 4, 4));
        fs.push_back(random_factors(base, "blk.0.ffn_down.weight", 8, 5));
        fs.push_back(random_factors(base, "output.weight", 4, 6));
        const std::string adapter = dir.file(arch + "-lora.gguf");
        write_adapter(adapter, arch, 8.0, fs);
        const std::vector<float> plain = logits_of(base);
        for (double scale : {1.0, 0.5}) {
            CAPTURE(scale);
            const std::string merged_path = dir.file(arch + "-merged.gguf");
            write_merged(base, merged_path, 8.0, scale, fs);
            const std::vector<float> merged = logits_of(GgufFile::open(merged_path));
            const std::vector<float> got = logits_of(base, {{adapter, float(scale)}});
            CHECK(rel_diff(got, merged) < 1e-5);
            CHECK(rel_diff(got, plain) > 1e-2);  // the adapter does change the model
        }
        // Scale 0 is the base model, bit for bit; two adapters add up.
        CHECK(logits_of(base, {{adapter, 0.0f}}) == plain);
        write_merged(base, dir.file("twice.gguf"), 8.0, 2.0, fs);
        CHECK(rel_diff(logits_of(base, {{adapter, 1.0f}, {adapter, 1.0f}}),
                       logits_of(GgufFile::open(dir.file("twice.gguf")))) < 1e-5);
    }
}

TEST_CASE("bad LoRA adapters get one clear error") {
    TempDir dir;
    synthetic_model_write(small("llama"), dir.file("base.gguf"));
    GgufFile base = GgufFile::open(dir.file("base.gguf"));
    const Factors q = random_factors(base, "blk.0.attn_q.weight", 4, 1);
    auto adapter = [&](const std::string& name, const std::string& arch,
                       const std::vector<Factors>& fs) {
        write_adapter(dir.file(name), arch, 4.0, fs);
        return dir.file(name);
    };
    CHECK(load_error(base, {{dir.file("base.gguf"), 1.0f}}).find("is not a LoRA adapter") !=
          std::string::npos);
    CHECK(load_error(base, {{adapter("qwen.gguf", "qwen2", {q}), 1.0f}})
              .find("LoRA adapter for architecture 'qwen2', but the model is 'llama'") !=
          std::string::npos);
    Factors wrong = q;
    wrong.n_in = 32, wrong.a.resize(size_t(4 * 32));
    CHECK(load_error(base, {{adapter("shape.gguf", "llama", {wrong}), 1.0f}})
              .find("'blk.0.attn_q.weight.lora_a' has shape [32, 4], expected [64, 4]") !=
          std::string::npos);
    Factors embd = random_factors(base, "token_embd.weight", 4, 2);
    CHECK(load_error(base, {{adapter("embd.gguf", "llama", {embd}), 1.0f}})
              .find("kvrun adapts the attention, dense FFN and output matrices only") !=
          std::string::npos);
    Factors ghost = q;
    ghost.name = "blk.7.attn_q.weight";
    CHECK(load_error(base, {{adapter("ghost.gguf", "llama", {ghost}), 1.0f}})
              .find("which the model has no matrix of") != std::string::npos);
    // A lone half of a pair.
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_string("general.type", "adapter");
    w.set_string("adapter.type", "lora");
    w.add_tensor("blk.0.attn_q.weight.lora_a", GgmlType::F32, {64, 4}, q.a.data(),
                 q.a.size() * sizeof(float));
    w.write_file(dir.file("half.gguf"));
    CHECK(load_error(base, {{dir.file("half.gguf"), 1.0f}})
              .find("'blk.0.attn_q.weight' has .lora_a but no .lora_b") != std::string::npos);
    CHECK(load_error(base, {{dir.file("missing.gguf"), 1.0f}}).find("missing.gguf") !=
          std::string::npos);
}

TEST_CASE("--lora and --lora-scaled: the CLI runs the adapted model") {
    TempDir dir;
    synthetic_model_write(small("llama"), dir.file("base.gguf"));
    GgufFile base = GgufFile::open(dir.file("base.gguf"));
    const std::vector<Factors> fs = {random_factors(base, "blk.0.attn_q.weight", 8, 1),
                                     random_factors(base, "output.weight", 8, 2)};
    write_adapter(dir.file("lora.gguf"), "llama", 16.0, fs);
    write_merged(base, dir.file("merged.gguf"), 16.0, 1.0, fs);
    const std::string bin = kvrun::test::kvrun_binary();
    auto run = [&](const std::string& model, const std::string& extra) {
        auto r = kvrun::test::run_command(bin + " run -m " + model +
                                          " -p 'Once upon' -n 12 --temp 0 --device cpu " + extra);
        CHECK_MESSAGE(r.exit_code == 0, r.err);
        return r.out;
    };
    const std::string plain = run(dir.file("base.gguf"), "");
    const std::string merged = run(dir.file("merged.gguf"), "");
    CHECK(merged != plain);
    CHECK(run(dir.file("base.gguf"), "--lora " + dir.file("lora.gguf")) == merged);
    CHECK(run(dir.file("base.gguf"), "--lora-scaled " + dir.file("lora.gguf") + " 0") == plain);
    // A prompt cache made with the adapter does not serve the base model (nor another scale).
    const std::string pc = " --prompt-cache " + dir.file("p.cache");
    CHECK(run(dir.file("base.gguf"), "--lora " + dir.file("lora.gguf") + pc) == merged);
    CHECK(run(dir.file("base.gguf"), "--lora " + dir.file("lora.gguf") + pc) == merged);
    auto other = kvrun::test::run_command(bin + " run -m " + dir.file("base.gguf") +
                                          " -p 'Once upon' -n 12 --temp 0 --device cpu" + pc);
    CHECK(other.out == plain);
    CHECK(other.err.find("it was made with another model (or other --rope-*, --lora or "
                         "--control-vector settings)") != std::string::npos);
    auto bad = kvrun::test::run_command(bin + " run -m " + dir.file("base.gguf") +
                                        " -p hi -n 2 --device cpu --lora-scaled " +
                                        dir.file("lora.gguf") + " x");
    CHECK(bad.exit_code == 1);
    CHECK(bad.err.find("the scale must be a finite number") != std::string::npos);
    // The adapter file itself: info describes it, run says what it is.
    auto info = kvrun::test::run_command(bin + " info -m " + dir.file("lora.gguf"));
    CHECK(info.exit_code == 0);
    CHECK(info.out.find("adapter         lora for architecture llama") != std::string::npos);
    CHECK(info.out.find("blk.0.attn_q.weight") != std::string::npos);
    CHECK(info.out.find("rank 8") != std::string::npos);
    auto as_model = kvrun::test::run_command(bin + " run -m " + dir.file("lora.gguf") + " -p hi");
    CHECK(as_model.exit_code == 1);
    CHECK(as_model.err.find("is a LoRA adapter, not a model (hint: pass it with --lora") !=
          std::string::npos);
}

TEST_CASE("per-sequence LoRA scales: one batch gives each sequence the logits of its own scale") {
    TempDir dir;
    synthetic_model_write(small("llama"), dir.file("base.gguf"));
    GgufFile base = GgufFile::open(dir.file("base.gguf"));
    const std::vector<Factors> fa = {random_factors(base, "blk.0.attn_q.weight", 4, 1),
                                     random_factors(base, "blk.1.ffn_down.weight", 8, 2),
                                     random_factors(base, "output.weight", 4, 3)};
    const std::vector<Factors> fb = {random_factors(base, "blk.1.attn_v.weight", 4, 4)};
    write_adapter(dir.file("a.gguf"), "llama", 8.0, fa);
    write_adapter(dir.file("b.gguf"), "llama", 4.0, fb);
    // One batch of three sequences (a 5-token prompt each; logits of every token).
    auto run = [&](const std::vector<LoraSpec>& loaded,
                   const std::vector<std::vector<float>>& rows) {
        BackendOptions o;
        o.kv_block_size = 4;
        o.n_kv_blocks = 12;
        o.n_threads = 2;
        o.lora = loaded;
        auto be = make_cpu_backend(base, o);
        CHECK(be->lora_scales().size() == loaded.size());
        ForwardBatch b;
        for (int32_t s = 0; s < 3; ++s)
            for (int32_t i = 0; i < 5; ++i) {
                b.tokens.push_back((s * 31 + i * 7 + 3) % 300);
                b.positions.push_back(i);
                b.seq_index.push_back(s);
                b.slots.push_back(i);
                b.logit_rows.push_back(s * 5 + i);
            }
        b.block_tables = {{0, 1}, {2, 3}, {4, 5}};
        for (size_t s = 0; s < rows.size(); ++s)
            if (!rows[s].empty()) b.set_lora_scales(int32_t(s), rows[s]);
        std::vector<float> l(15 * 300);
        be->forward(b, l.data());
        return l;
    };
    auto rows_of = [](const std::vector<float>& l, int s) {
        return std::vector<float>(l.begin() + s * 5 * 300, l.begin() + (s + 1) * 5 * 300);
    };
    const std::string a = dir.file("a.gguf"), bb = dir.file("b.gguf");
    // Loaded at (1, 1); sequence 0 keeps them, 1 runs (0.5, 0), 2 runs (2, 1.5).
    const auto mixed = run({{a, 1.0f}, {bb, 1.0f}}, {{}, {0.5f, 0.0f}, {2.0f, 1.5f}});
    const auto at_1 = run({{a, 1.0f}, {bb, 1.0f}}, {});
    const auto at_half = run({{a, 0.5f}, {bb, 0.0f}}, {});
    const auto at_2 = run({{a, 2.0f}, {bb, 1.5f}}, {});
    CHECK(rows_of(mixed, 0) == rows_of(at_1, 0));  // bit for bit
    CHECK(rows_of(mixed, 1) == rows_of(at_half, 1));
    CHECK(rows_of(mixed, 2) == rows_of(at_2, 2));
    CHECK(rows_of(mixed, 1) != rows_of(at_1, 1));
    // Scales (0, 0) are the base model's logits.
    const auto none = run({{a, 1.0f}, {bb, 1.0f}}, {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}});
    CHECK(none == run({}, {}));
    // A row must have one finite scale per adapter.
    CHECK_THROWS_AS(run({{a, 1.0f}, {bb, 1.0f}}, {{1.0f}}), Error);
    CHECK_THROWS_AS(run({{a, 1.0f}, {bb, 1.0f}}, {{1.0f, std::nanf("")}}), Error);
}

TEST_CASE("a request's \"lora\" scales: the CLI, the engine's prefix cache, and errors") {
    TempDir dir;
    synthetic_model_write(small("llama"), dir.file("base.gguf"));
    GgufFile base = GgufFile::open(dir.file("base.gguf"));
    const std::vector<Factors> fs = {random_factors(base, "blk.0.attn_k.weight", 8, 1),
                                     random_factors(base, "output.weight", 8, 2)};
    write_adapter(dir.file("lora.gguf"), "llama", 16.0, fs);
    const std::string bin = kvrun::test::kvrun_binary();
    const std::string common = " -n 12 --temp 0 --device cpu --kv-block-size 4";
    const std::string p = "\"prompt\": \"Once upon a time there\", \"n_predict\": 12";
    // The generated tokens of one JSONL request with these flags.
    auto tokens = [&](const std::string& extra) {
        auto r = kvrun::test::run_command(
            bin + " run --jsonl -m " + dir.file("base.gguf") + common + extra, "{" + p + "}\n");
        CHECK_MESSAGE(r.exit_code == 0, r.err);
        return nlohmann::json::parse(r.out)["tokens"];
    };
    const auto plain = tokens("");
    const auto full = tokens(" --lora " + dir.file("lora.gguf"));
    const auto half = tokens(" --lora-scaled " + dir.file("lora.gguf") + " 0.5");
    CHECK(plain != full);
    CHECK(half != full);
    // JSONL requests with their own scales, all in one run (batched together).
    const std::string input =
        "{" + p + ", \"lora\": [{\"id\": 0, \"scale\": 0.5}]}\n{" + p + "}\n{" + p +
        ", \"lora\": []}\n{" + p + ", \"lora\": [{\"id\": 0, \"scale\": 1}]}\n{" + p +
        ", \"lora\": [{\"id\": 3, \"scale\": 1}]}\n{" + p + ", \"lora\": {\"id\": 0}}\n";
    for (const std::string& mode :
         std::vector<std::string>{"run --jsonl", "batch --parallel 4 -f " + dir.file("in.jsonl")}) {
        CAPTURE(mode);
        std::ofstream(dir.file("in.jsonl")) << input;
        auto r = kvrun::test::run_command(bin + " " + mode + " -m " + dir.file("base.gguf") +
                                              common + " --lora " + dir.file("lora.gguf"),
                                          input);
        std::istringstream in(r.out);
        std::vector<nlohmann::json> res;
        for (std::string line; std::getline(in, line);) res.push_back(nlohmann::json::parse(line));
        REQUIRE(res.size() == 6);
        CHECK(res[0]["tokens"] == half);
        CHECK(res[1]["tokens"] == full);   // no "lora": the loaded scales
        CHECK(res[2]["tokens"] == plain);  // []: every adapter at 0
        CHECK(res[3]["tokens"] == full);
        CHECK(res[4]["error"] == "'lora': adapter id 3 is not loaded (ids 0..0)");
        CHECK(res[5]["error"].get<std::string>().find("'lora' must be an array") == 0);
    }
    // --lora-init-without-apply: loaded at 0 (the base model) unless a request sets a scale.
    auto lazy = kvrun::test::run_command(
        bin + " run --jsonl -m " + dir.file("base.gguf") + common + " --lora " +
            dir.file("lora.gguf") + " --lora-init-without-apply",
        "{" + p + "}\n{" + p + ", \"lora\": [{\"id\": 0, \"scale\": 0.5}]}\n");
    std::istringstream lazy_in(lazy.out);
    std::string l0, l1;
    std::getline(lazy_in, l0);
    std::getline(lazy_in, l1);
    CHECK(nlohmann::json::parse(l0)["tokens"] == plain);
    CHECK(nlohmann::json::parse(l1)["tokens"] == half);
    auto none = kvrun::test::run_command(bin + " run --jsonl -m " + dir.file("base.gguf") + common,
                                         "{" + p + ", \"lora\": []}\n");
    CHECK(nlohmann::json::parse(none.out)["error"].get<std::string>().find(
              "'lora': no LoRA adapter is loaded") == 0);

    // The engine: sequences with other scales never adopt each other's cached blocks.
    std::vector<LoraSpec> spec = {{dir.file("lora.gguf"), 1.0f}};
    BackendOptions o;
    o.kv_block_size = 4;
    o.n_kv_blocks = 64;
    o.lora = spec;
    auto be = make_cpu_backend(base, o);
    auto tok = Tokenizer::from_gguf(base);
    Engine engine(*be, *tok, EngineOptions{});
    std::vector<GenerationResult> results;
    engine.on_finish([&](const GenerationResult& g) { results.push_back(g); });
    GenerationRequest r;
    r.prompt = tok->encode("Once upon a time there was a little", true);
    r.n_predict = 4;
    r.sampling.temperature = 0;
    auto hits = [&](std::vector<float> lora) {
        r.lora = std::move(lora);
        const int64_t before = engine.stats().prefix_hit_tokens;
        engine.submit(r);
        engine.run();
        return engine.stats().prefix_hit_tokens - before;
    };
    CHECK(hits({}) == 0);
    CHECK(hits({0.5f}) == 0);  // other scales: nothing shared
    CHECK(hits({0.5f}) > 0);   // the same scales: the prompt's blocks are reused
    CHECK(hits({1.0f}) > 0);   // the loaded scale is the plain chain of the first request
    CHECK(results[1].tokens == results[2].tokens);
    CHECK_THROWS_AS(engine.submit([&] {
        GenerationRequest bad = r;
        bad.lora = {1.0f, 2.0f};
        return bad;
    }()),
                    Error);
}

TEST_CASE("export-lora writes the model the adapters make at run time") {
    using kvrun::test::run_command;
    TempDir dir;
    const std::string bin = kvrun::test::kvrun_binary();
    for (const std::string arch : {"llama", "phi3"}) {
        CAPTURE(arch);
        const std::string base_path = dir.file(arch + ".gguf");
        synthetic_model_write(small(arch), base_path);
        GgufFile base = GgufFile::open(base_path);
        std::vector<Factors> fa, fb;
        fa.push_back(random_factors(
            base, arch == "phi3" ? "blk.0.attn_qkv.weight" : "blk.0.attn_q.weight", 4, 11));
        fa.push_back(random_factors(base, "blk.1.ffn_down.weight", 8, 12));
        fa.push_back(random_factors(base, "output.weight", 4, 13));
        fb.push_back(random_factors(base, "blk.1.ffn_down.weight", 4, 14));  // both adapt it
        fb.push_back(random_factors(base, "blk.0.attn_output.weight", 4, 15));
        const std::string a = dir.file(arch + "-a.gguf"), b = dir.file(arch + "-b.gguf");
        write_adapter(a, arch, 8.0, fa);
        write_adapter(b, arch, 0.0, fb);
        const std::string out = dir.file(arch + "-merged.gguf");
        auto r = run_command(bin + " export-lora -m " + base_path + " --lora-scaled " + a +
                             " 0.5 --lora " + b + " -o " + out);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        CHECK(r.err.find("4 matrices merged") != std::string::npos);
        GgufFile merged = GgufFile::open(out);
        const std::vector<float> runtime = logits_of(base, {{a, 0.5f}, {b, 1.0f}});
        CHECK(rel_diff(logits_of(merged), runtime) < 1e-5);
        CHECK(rel_diff(runtime, logits_of(base)) > 1e-2);
        // Every other tensor is copied byte for byte, F32 stays F32, the metadata stays.
        REQUIRE(merged.tensors().size() == base.tensors().size());
        for (const GgufTensorInfo& t : base.tensors()) {
            const GgufTensorInfo* m = merged.find_tensor(t.name);
            REQUIRE(m);
            CHECK(m->type == t.type);
            const bool adapted = t.name == "output.weight" || t.name == "blk.1.ffn_down.weight" ||
                                 t.name == "blk.0.attn_output.weight" || t.name == fa[0].name;
            CHECK((std::memcmp(m->data, t.data, t.n_bytes) != 0) == adapted);
        }
        CHECK(merged.get_string_or("general.architecture", "") == arch);
    }
    // A quantized base: the merged matrices become F16, close to the run-time adapter.
    SyntheticModelConfig q = small("llama");
    q.type = GgmlType::Q8_0;
    const std::string qpath = dir.file("q8.gguf");
    synthetic_model_write(q, qpath);
    GgufFile qbase = GgufFile::open(qpath);
    std::vector<Factors> f = {random_factors(qbase, "blk.0.attn_q.weight", 4, 21),
                              random_factors(qbase, "blk.1.ffn_up.weight", 4, 22)};
    write_adapter(dir.file("q-lora.gguf"), "llama", 8.0, f);
    auto r = run_command(bin + " export-lora -m " + qpath + " --lora " + dir.file("q-lora.gguf") +
                         " -o " + dir.file("q-merged.gguf"));
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    GgufFile qm = GgufFile::open(dir.file("q-merged.gguf"));
    CHECK(qm.find_tensor("blk.0.attn_q.weight")->type == GgmlType::F16);
    CHECK(qm.find_tensor("blk.0.attn_k.weight")->type == GgmlType::Q8_0);
    CHECK(rel_diff(logits_of(qm), logits_of(qbase, {{dir.file("q-lora.gguf"), 1.0f}})) < 2e-3);

    // Bad input: one clear line each.
    auto err_of = [&](const std::string& args) {
        auto e = run_command(bin + " export-lora " + args);
        CHECK(e.exit_code == 1);
        CHECK(e.out.empty());
        CHECK_MESSAGE(e.err.find('\n') == e.err.size() - 1, e.err);
        return e.err;
    };
    CHECK(err_of("-m " + qpath + " -o " + dir.file("x.gguf")).find("no adapter") !=
          std::string::npos);
    CHECK(err_of("-m " + dir.file("q-lora.gguf") + " --lora " + dir.file("q-lora.gguf") + " -o " +
                 dir.file("x.gguf"))
              .find("not a base model") != std::string::npos);
    CHECK(err_of("-m " + qpath + " --lora " + dir.file("phi3-a.gguf") + " -o " + dir.file("x.gguf"))
              .find("architecture 'phi3'") != std::string::npos);
    CHECK(!std::filesystem::exists(dir.file("x.gguf")));
    CHECK(!std::filesystem::exists(dir.file("x.gguf.part")));
}
