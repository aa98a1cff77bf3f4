// The CUDA backend vs the CPU backend on the shared models (float, legacy, K-quant and IQ4
// mixes; llama GQA/MQA and qwen2 with biases): prompt prefill (tensor-core GEMM path),
// decode steps (GEMV path, replayed from CUDA graphs after the first step), a two-sequence
// batch, copy-on-write block copies and input validation. Logits compared by normalized MSE.
// Also: graph replay equals eager execution across block seals of q8/q4 KV caches (with and
// without rotation) and after the scratch buffer grows; forward_sample picks the tokens the
// host Sampler picks from forward()'s logits (several rows, vocabularies of 512 and 128256);
// the engine's device-sampling path gives the host path's tokens.
// Exits 77 (skipped) without a GPU; skips a model when ../shared is absent.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend.h"
#include "common.h"
#include "cuda_backend_test_util.h"
#include "cuda_test_util.h"
#include "embedding.h"
#include "engine.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "imatrix.h"
#include "kv_block_table.h"
#include "kv_format.h"
#include "lora_test_util.h"
#include "prompt_cache.h"
#include "sampler.h"
#include "synthetic_model.h"
#include "test_util.h"
#include "tokenizer.h"

#ifdef KVRUN_HAS_CUDA
#include "cuda/cuda_backend.h"

using namespace kvrun;
using namespace kvrun::test;

namespace {

const char* const kModels[] = {
    "stories260K.gguf",
    "stories260K-Q4_0.gguf",
    "stories260K-w256-Q4_K_M.gguf",
    "stories260K-w256-Q2_K.gguf",
    "stories260K-w256-IQ4_XS.gguf",
    "stories260K-w256-BF16.gguf",
    "synth-llama-hd64-gqa4-Q4_0.gguf",
    "synth-llama-hd128-mqa-theta500k-Q8_0.gguf",
    "synth-qwen2-hd64-gqa2-Q5_K_M.gguf",
};

// A CUDA backend with CUDA graphs on (the default) or off (KVRUN_CUDA_GRAPHS=0).
std::unique_ptr<Backend> cuda_backend(const GgufFile& file, const BackendOptions& o, bool graphs) {
    if (!graphs) setenv("KVRUN_CUDA_GRAPHS", "0", 1);
    auto b = make_cuda_backend(file, o, 0);
    unsetenv("KVRUN_CUDA_GRAPHS");
    return b;
}

// Logits of a batch from one backend.
std::vector<float> logits_of(Backend& be, const ForwardBatch& b) {
    std::vector<float> l(b.logit_rows.size() * size_t(be.config().n_vocab));
    be.forward(b, l.data());
    return l;
}

// A small llama with llama3-8b's vocabulary of 128256 tokens (written once per run).
std::filesystem::path big_vocab_model() {
    const auto path = std::filesystem::temp_directory_path() / "kvrun-test-cuda-vocab128256.gguf";
    SyntheticModelConfig c;
    c.n_layer = 2;
    c.n_embd = 128;
    c.n_head = 2;
    c.n_head_kv = 1;
    c.n_ff = 256;
    c.n_vocab = 128256;
    c.weight_std = 0.1f;  // logits spread over a few units, like a real model's
    synthetic_set_type(c, "Q8_0");
    synthetic_model_write(c, path.string());
    return path;
}

// Sampling rows exercising every filter, greedy and the penalty; u from each row's Sampler.
std::vector<RowSampling> sampling_rows(size_t n, int64_t n_vocab, uint64_t salt) {
    std::vector<RowSampling> rows(n);
    for (size_t r = 0; r < n; ++r) {
        SamplingParams& sp = rows[r].params;
        sp.seed = salt * 31 + r;
        // greedy, greedy penalized, the defaults, filters off, top-p alone, wide top-k
        if (r % 6 <= 1) sp.temperature = 0.0f;
        if (r % 6 == 1) sp.repeat_penalty = 1.5f;
        if (r % 6 == 3) sp.top_k = 0, sp.top_p = 1.0f, sp.min_p = 0.0f;
        if (r % 6 == 4) sp.top_k = 0, sp.top_p = 0.9f, sp.repeat_penalty = 1.3f;
        if (r % 6 == 5) sp.temperature = 1.4f, sp.top_k = 500, sp.min_p = 0.01f;
        Sampler draw(sp);
        rows[r].u = sp.temperature > 0.0f ? draw.uniform() : 0.0;
        for (int k = 0; k < 12; ++k)
            rows[r].recent.push_back(TokenId((salt * 7919 + r * 131 + k * k * 17) % n_vocab));
    }
    return rows;
}

// Host Sampler on logits [rows][n_vocab].
std::vector<int32_t> host_sample(const std::vector<float>& logits, int64_t n_vocab,
                                 const std::vector<RowSampling>& rows) {
    std::vector<int32_t> out;
    for (size_t r = 0; r < rows.size(); ++r) {
        Sampler s(rows[r].params);
        out.push_back(s.sample_with(logits.data() + r * size_t(n_vocab), int(n_vocab),
                                    rows[r].recent, rows[r].u));
    }
    return out;
}

// A shared model on both backends (16 blocks of 16 tokens); file is null when it is absent.
struct CpuGpu {
    std::unique_ptr<GgufFile> file;
    std::unique_ptr<Backend> cpu, gpu;
};

CpuGpu cpu_and_gpu(const char* name) {
    CpuGpu p;
    const auto path = shared_model(name);
    if (path.empty()) return p;
    p.file = std::make_unique<GgufFile>(GgufFile::open(path.string()));
    BackendOptions o;
    o.kv_block_size = 16;
    o.n_kv_blocks = 16;
    p.cpu = make_cpu_backend(*p.file, o);
    p.gpu = make_cuda_backend(*p.file, o, 0);
    return p;
}

}  // namespace

TEST_CASE("cuda backend logits match the cpu backend on the shared models") {
    for (const char* name : kModels) {
        CAPTURE(name);
        CpuGpu pair = cpu_and_gpu(name);
        if (!pair.file) continue;
        Backend *cpu = pair.cpu.get(), *gpu = pair.gpu.get();
        const int64_t n_vocab = cpu->config().n_vocab;
        CHECK(gpu->config().n_vocab == n_vocab);
        CHECK(gpu->n_kv_blocks() == 16);
        CHECK(gpu->name() == "cuda");

        // Sequence 0: a 24-token prompt (GEMM path), then decode steps (GEMV + graphs).
        std::vector<int32_t> prompt;
        for (int32_t i = 0; i < 24; ++i) prompt.push_back(int32_t((i * 37 + 11) % n_vocab));
        const std::vector<std::vector<int32_t>> tables = {{3, 0, 5, 1}, {2, 7, 4, 6}};
        int32_t next = 0;
        CHECK(compare(*cpu, *gpu, batch_of(prompt, 0, 0, tables), &next) < kLogitBound);
        for (int32_t step = 0; step < 5; ++step) {
            CAPTURE(step);
            CHECK(compare(*cpu, *gpu, batch_of({next}, 24 + step, 0, tables), &next) < kLogitBound);
        }

        // Sequence 1: a 10-token prompt, then decode steps for both sequences in one batch
        // (two logit rows, in reverse order).
        std::vector<int32_t> p1;
        for (int32_t i = 0; i < 10; ++i) p1.push_back(int32_t((i * 53 + 5) % n_vocab));
        CHECK(compare(*cpu, *gpu, batch_of(p1, 0, 1, tables)) < kLogitBound);
        for (int rep = 0; rep < 3; ++rep) {  // eager, capture, replay
            ForwardBatch both;
            both.tokens = {next, int32_t(7 % n_vocab)};
            both.positions = {29, 10};
            both.seq_index = {0, 1};
            both.slots = {29, 10};
            both.block_tables = tables;
            both.logit_rows = {1, 0};
            CHECK(compare(*cpu, *gpu, both) < kLogitBound);
        }

        // Copy-on-write: block 3 (sequence 0's first) copied to block 9 serves the same keys.
        cpu->copy_blocks({{3, 9}});
        gpu->copy_blocks({{3, 9}});
        std::vector<std::vector<int32_t>> cow = tables;
        cow[0][0] = 9;
        CHECK(compare(*cpu, *gpu, batch_of({next}, 29, 0, cow)) < kLogitBound);

        // Bad input throws before touching the cache.
        std::vector<float> l(static_cast<size_t>(n_vocab));
        CHECK_THROWS_AS(gpu->forward(batch_of({int32_t(n_vocab)}, 30, 0, tables), l.data()), Error);
        CHECK_THROWS_AS(gpu->copy_blocks({{0, 16}}), Error);
    }
}

TEST_CASE("cuda backend refuses what its kernels cannot run, with a hint") {
    const auto path = shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path.string());
    BackendOptions o;
    o.n_kv_blocks = 4;
    o.kv_block_size = 300;  // the kernels take blocks of at most 256 tokens
    CHECK_THROWS_AS(make_cuda_backend(file, o, 0), Error);
    o.kv_block_size = 16;
    CHECK_THROWS_AS(make_cuda_backend(file, o, cuda_device_count()), Error);
}

TEST_CASE("cuda backend with a q8 / q4 KV cache matches the cpu backend") {
    for (const char* name : {"stories260K.gguf", "synth-llama-hd64-gqa4-Q4_0.gguf",
                             "synth-llama-hd128-mqa-theta500k-Q8_0.gguf"})
        for (KvType kv : {KvType::Q8, KvType::Q4})
            for (bool rotate : {false, true}) {
                CAPTURE(name);
                CAPTURE(std::string(kv_type_name(kv)));
                CAPTURE(rotate);
                const auto path = shared_model(name);
                if (path.empty()) continue;
                GgufFile file = GgufFile::open(path.string());
                BackendOptions o;
                o.kv_block_size = 16;
                o.n_kv_blocks = 24;
                o.kv_type_k = o.kv_type_v = kv;
                o.kv_rotate = rotate;
                auto cpu = make_cpu_backend(file, o);
                auto gpu = make_cuda_backend(file, o, 0);
                REQUIRE(gpu->n_kv_stages() == cpu->n_kv_stages());
                REQUIRE(cpu->n_kv_stages() > 0);
                // One table drives both backends: a 40-token prompt, decode steps, a fork that
                // copies the partly filled block's stage, and both continuing in one batch.
                KvBlockTable table(24, 16, cpu->n_kv_stages());
                const int64_t n_vocab = cpu->config().n_vocab;
                auto step = [&](const StepParts& parts, int32_t* next) {
                    return compare(*cpu, *gpu, append_step(table, parts, {cpu.get(), gpu.get()}),
                                   next);
                };
                SeqId a = table.create_sequence();
                std::vector<TokenId> prompt;
                for (int32_t i = 0; i < 40; ++i) prompt.push_back(TokenId((i * 37 + 11) % n_vocab));
                int32_t next = 0;
                CHECK(step({{a, prompt}}, &next) < logit_bound(kv));
                for (int i = 0; i < 30; ++i) CHECK(step({{a, {next}}}, &next) < logit_bound(kv));
                SeqId f = table.fork(a);
                for (int i = 0; i < 4; ++i)
                    CHECK(step({{a, {next}}, {f, {TokenId((next + i) % n_vocab)}}}, &next) <
                          logit_bound(kv));
            }
}

TEST_CASE("cuda backend matches the cpu backend with Llama 3.1 factors, YaRN and overrides") {
    // Tiny models written here: rope_freqs.weight (Llama 3.1's rule), YaRN metadata, and the
    // plain model with YaRN and base overrides. Positions far past the original context;
    // fused RoPE + KV write (rotation off) and the unfused path (rotation on).
    const auto dir = std::filesystem::temp_directory_path();
    SyntheticModelConfig c = synthetic_preset("tiny");
    c.n_ctx = 16384;
    c.weight_std = 0.08f;
    synthetic_set_type(c, "Q8_0");
    struct Variant {
        const char* name;
        std::string scaling;
        RopeOverrides rope;
    };
    RopeOverrides yarn_override;
    yarn_override.scaling = "yarn", yarn_override.freq_scale = 0.125f;
    yarn_override.yarn_orig_ctx = 512, yarn_override.freq_base = 50000;
    const Variant variants[] = {{"llama3", "llama3", {}},
                                {"yarn", "yarn", {}},
                                {"plain + overrides", "none", yarn_override}};
    for (const Variant& v : variants)
        for (bool rotate : {false, true}) {
            CAPTURE(v.name);
            CAPTURE(rotate);
            c.rope_scaling = v.scaling, c.rope_factor = 8, c.rope_orig_ctx = 512;
            const auto path = dir / fmt::format("kvrun-test-cuda-rope-{}.gguf", v.scaling);
            synthetic_model_write(c, path.string());
            GgufFile file = GgufFile::open(path.string());
            BackendOptions o;
            o.kv_block_size = 16;
            o.n_kv_blocks = 8;
            o.kv_rotate = rotate;
            o.rope = v.rope;
            auto cpu = make_cpu_backend(file, o);
            auto gpu = make_cuda_backend(file, o, 0);
            std::vector<int32_t> toks;
            for (int32_t i = 0; i < 24; ++i) toks.push_back((i * 37 + 11) % 512);
            ForwardBatch b = batch_of(toks, 0, 0, {{3, 0, 5, 1}});
            for (int32_t& p : b.positions) p += 7000;
            int32_t next = 0;
            CHECK(compare(*cpu, *gpu, b, &next) < kLogitBound);
            for (int32_t step = 0; step < 4; ++step) {
                ForwardBatch d = batch_of({next}, 24 + step, 0, {{3, 0, 5, 1}});
                d.positions[0] += 7000;
                CHECK(compare(*cpu, *gpu, d, &next) < kLogitBound);
            }
            std::filesystem::remove(path);
        }
}

TEST_CASE("cuda backend applies LoRA adapters like the cpu backend") {
    // Adapters on Q, V, the gate (the unfused gate/up path), down and the output of a Q4_K_M
    // llama and a phi3 (fused Q/K/V and gate/up: B's rows split), two adapters stacked;
    // a 24-token prefill (GEMM) and decode steps (GEMV, graphs).
    const auto dir = std::filesystem::temp_directory_path();
    for (const char* arch : {"llama", "phi3"}) {
        CAPTURE(arch);
        SyntheticModelConfig c = synthetic_preset("tiny");
        c.arch = arch;
        c.weight_std = 0.06f;
        synthetic_set_type(c, "Q4_K_M");
        const auto path = dir / fmt::format("kvrun-test-cuda-lora-{}.gguf", arch);
        synthetic_model_write(c, path.string());
        GgufFile file = GgufFile::open(path.string());
        const bool phi = std::string(arch) == "phi3";
        std::vector<test::Factors> fs = {
            test::random_factors(file, phi ? "blk.0.attn_qkv.weight" : "blk.0.attn_q.weight", 8, 1,
                                 0.05f),
            test::random_factors(file, phi ? "blk.1.ffn_up.weight" : "blk.1.ffn_gate.weight", 16, 2,
                                 0.05f),
            test::random_factors(file, "blk.0.ffn_down.weight", 8, 3, 0.05f),
            test::random_factors(file, "output.weight", 8, 4, 0.05f)};
        if (!phi) fs.push_back(test::random_factors(file, "blk.1.attn_v.weight", 4, 5, 0.05f));
        const auto adapter = dir / fmt::format("kvrun-test-cuda-lora-{}-adapter.gguf", arch);
        test::write_adapter(adapter.string(), arch, 16.0, fs);
        BackendOptions o;
        o.kv_block_size = 16;
        o.n_kv_blocks = 8;
        o.lora = {{adapter.string(), 1.0f}, {adapter.string(), -0.5f}};
        auto cpu = make_cpu_backend(file, o);
        auto gpu = make_cuda_backend(file, o, 0);
        KvBlockTable table(8, 16, cpu->n_kv_stages());
        const SeqId a = table.create_sequence();
        int32_t next = check_prefill_decode(*cpu, *gpu, table, a, 6, logit_bound(KvType::F16));
        // A second sequence with its own scales (a request's "lora") in the same batches:
        // prefill beside a's decode step, then decode steps of both.
        const SeqId b = table.create_sequence();
        const std::vector<TokenId> toks = prompt24();
        std::vector<TokenId> btoks(toks.begin(), toks.begin() + 20);
        for (int32_t step = 0; step < 4; ++step) {
            ForwardBatch fb = append_step(
                table, {{a, {next}}, {b, step == 0 ? btoks : std::vector<TokenId>{next}}},
                {cpu.get(), gpu.get()});
            fb.set_lora_scales(1, {0.0f, 2.0f});
            CHECK(compare(*cpu, *gpu, fb, &next) < logit_bound(KvType::F16));
        }
        std::filesystem::remove(path);
        std::filesystem::remove(adapter);
    }
}

TEST_CASE("cuda kv block I/O round-trips, and a prompt cache saved on the cpu serves the gpu") {
    const auto path = shared_model("stories260K.gguf");
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path.string());
    auto tok = Tokenizer::from_gguf(file);
    for (KvType kv : {KvType::F16, KvType::Q8}) {
        CAPTURE(std::string(kv_type_name(kv)));
        BackendOptions o;
        o.kv_block_size = 16;
        o.n_kv_blocks = 32;
        o.kv_type_k = o.kv_type_v = kv;
        auto cpu = make_cpu_backend(file, o);
        auto gpu = make_cuda_backend(file, o, 0);
        REQUIRE(gpu->kv_block_io_bytes(KvPool::Main) == cpu->kv_block_io_bytes(KvPool::Main));
        CHECK(gpu->kv_block_io_bytes(KvPool::Window) == 0);
        std::vector<uint8_t> a(size_t(gpu->kv_block_io_bytes(KvPool::Main))), b(a.size());
        for (size_t i = 0; i < a.size(); ++i) a[i] = uint8_t(i * 7 + 3);
        gpu->write_kv_block(KvPool::Main, 5, a.data());
        gpu->read_kv_block(KvPool::Main, 5, b.data());
        CHECK(a == b);
        CHECK_THROWS_AS(gpu->read_kv_block(KvPool::Main, 32, b.data()), Error);
        CHECK_THROWS_AS(gpu->read_kv_block(KvPool::Window, 0, b.data()), Error);

        const std::vector<TokenId> prompt = tok->encode(
            "Once upon a time, there was a little girl named Lily. She loved to play outside in "
            "the park with her friends.",
            true);
        auto greedy = [&](Backend& be, const std::string& load_from, const std::string& save_to) {
            EngineOptions eo;
            eo.max_parallel = 1;
            Engine e(be, *tok, eo);
            const PromptCacheKey key = prompt_cache_key(file, be, kv, kv, false);
            if (!load_from.empty())
                CHECK(prompt_cache_load(load_from, key, e.kv_table(), be, tok->n_vocab())
                          .blocks_loaded == 2);
            GenerationRequest req;
            req.prompt = prompt;
            req.n_predict = 16;
            req.sampling.temperature = 0.0f;
            GenerationResult out;
            e.on_finish([&](const GenerationResult& r) { out = r; });
            e.submit(req);
            e.run();
            if (!save_to.empty()) prompt_cache_save(save_to, key, e.kv_table(), be, {prompt});
            return out;
        };
        const auto cache = std::filesystem::temp_directory_path() / "kvrun-test-cuda-pc.cache";
        const GenerationResult want = greedy(*cpu, "", cache.string());
        const GenerationResult got = greedy(*gpu, cache.string(), "");
        CHECK(got.tokens == want.tokens);
        CHECK(got.timings.n_prompt_computed == int32_t(prompt.size()) - 32);
        std::filesystem::remove(cache);
    }
}

TEST_CASE("cuda forward_sample returns the tokens the host sampler picks from the same logits") {
    const auto path = shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path.string());
    BackendOptions o;
    o.n_kv_blocks = 16;
    auto cpu = make_cpu_backend(file, o);
    auto gpu = make_cuda_backend(file, o, 0);
    CHECK(gpu->samples_on_device());
    CHECK_FALSE(cpu->samples_on_device());
    // Two sequences; rows: greedy, greedy with a repetition penalty, and sampled rows with
    // the filters on and off, at several uniform numbers.
    std::vector<int32_t> p0 = {1, 403, 407, 261, 378}, p1 = {1, 500, 12, 77};
    const std::vector<std::vector<int32_t>> tables = {{0, 1}, {2, 3}};
    ForwardBatch b = batch_of(p0, 0, 0, tables);
    ForwardBatch b1 = batch_of(p1, 0, 1, tables);
    for (size_t i = 0; i < p1.size(); ++i) {
        b.tokens.push_back(b1.tokens[i]);
        b.positions.push_back(b1.positions[i]);
        b.seq_index.push_back(1);
        b.slots.push_back(b1.slots[i]);
        b.logit_rows.push_back(int32_t(p0.size() + i));
    }
    std::vector<RowSampling> rows(b.logit_rows.size());
    for (size_t r = 0; r < rows.size(); ++r) {
        SamplingParams& sp = rows[r].params;
        sp.seed = r;
        sp.temperature = r % 3 == 0 ? 0.0f : 0.9f;
        if (r % 3 == 2) sp.top_k = 0, sp.top_p = 1.0f, sp.min_p = 0.0f;  // filters off
        if (r % 2 == 1) sp.repeat_penalty = 1.3f;
        rows[r].u = double(r) / double(rows.size()) + 0.01;
        rows[r].recent = {403, 261, 13, 403};
    }
    std::vector<int32_t> tc(rows.size()), tg(rows.size());
    cpu->forward_sample(b, rows, tc.data());
    gpu->forward_sample(b, rows, tg.data());
    CHECK(tc == tg);
    // Frequency / presence penalties (their counts travel with the penalized ids).
    for (size_t r = 0; r < rows.size(); ++r) {
        if (r % 2 == 0) rows[r].params.frequency_penalty = 0.7f;
        if (r % 3 == 1) rows[r].params.presence_penalty = 0.4f;
    }
    std::vector<int32_t> pc(rows.size()), pg(rows.size());
    cpu->forward_sample(b, rows, pc.data());
    gpu->forward_sample(b, rows, pg.data());
    CHECK(pc == pg);
    // Logit biases (ids and float bits travel in the same id list): a ban of the greedy
    // token, boosts, an id given twice; the tokens must change and still agree.
    for (size_t r = 0; r < rows.size(); ++r)
        rows[r].params.logit_bias = {{pc[r], -std::numeric_limits<float>::infinity()},
                                     {int32_t(13 + r), 2.0f},
                                     {int32_t(13 + r), 1.5f},
                                     {403, 0.5f}};
    std::vector<int32_t> bc(rows.size()), bg(rows.size());
    cpu->forward_sample(b, rows, bc.data());
    gpu->forward_sample(b, rows, bg.data());
    CHECK(bc == bg);
    for (size_t r = 0; r < rows.size(); ++r) CHECK(bc[r] != pc[r]);
    rows.pop_back();
    CHECK_THROWS_AS(gpu->forward_sample(b, rows, tg.data()), Error);
}

TEST_CASE("cuda graph replay equals eager steps across block seals and scratch growth") {
    // One block table drives a CPU backend, a CUDA backend with graphs and one without: a
    // 40-token prompt, 30 decode steps (blocks sealed at slots 47 and 63 while the decode
    // graph replays; a quantized cache's steps that seal nothing leave the seal launch out,
    // in graphs of their own, so a missed seal would show in the steps after 47), a fork (stage
    // copy) with two-sequence steps, a 120-token prompt of a third sequence (grows the scratch the
    // captured graphs point at), then more two-sequence steps. Graph and eager logits must agree to
    // rounding noise, and both match the CPU.
    for (const char* name : {"stories260K.gguf", "synth-llama-hd64-gqa4-Q4_0.gguf"})
        for (KvType kv : {KvType::F16, KvType::Q8, KvType::Q4})
            for (bool rotate : {false, true}) {
                CAPTURE(name);
                CAPTURE(std::string(kv_type_name(kv)));
                CAPTURE(rotate);
                const auto path = shared_model(name);
                if (path.empty()) continue;
                GgufFile file = GgufFile::open(path.string());
                BackendOptions o;
                o.kv_block_size = 16;
                o.n_kv_blocks = 32;
                o.kv_type_k = o.kv_type_v = kv;
                o.kv_rotate = rotate;
                auto cpu = make_cpu_backend(file, o);
                auto graph = cuda_backend(file, o, true);
                auto eager = cuda_backend(file, o, false);
                KvBlockTable table(32, 16, cpu->n_kv_stages());
                const int64_t n_vocab = cpu->config().n_vocab;
                int n_steps = 0;
                auto step = [&](const StepParts& parts, int32_t* next) {
                    CAPTURE(n_steps);
                    ++n_steps;
                    const ForwardBatch fb =
                        append_step(table, parts, {cpu.get(), graph.get(), eager.get()});
                    const std::vector<float> lc = logits_of(*cpu, fb);
                    const std::vector<float> lg = logits_of(*graph, fb);
                    const std::vector<float> le = logits_of(*eager, fb);
                    CHECK(nmse(lg, le) < 1e-10);  // the same kernels, replayed or not
                    CHECK(nmse(lg, lc) < logit_bound(kv));
                    const float* last = lc.data() + lc.size() - size_t(n_vocab);
                    *next = int32_t(std::max_element(last, last + n_vocab) - last);
                };
                SeqId a = table.create_sequence();
                std::vector<TokenId> prompt;
                for (int32_t i = 0; i < 40; ++i) prompt.push_back(TokenId((i * 37 + 11) % n_vocab));
                int32_t next = 0;
                step({{a, prompt}}, &next);
                for (int i = 0; i < 30; ++i) step({{a, {next}}}, &next);
                SeqId f = table.fork(a);
                for (int i = 0; i < 4; ++i)
                    step({{a, {next}}, {f, {TokenId((next + i) % n_vocab)}}}, &next);
                SeqId c = table.create_sequence();
                std::vector<TokenId> long_prompt;
                for (int32_t i = 0; i < 120; ++i)
                    long_prompt.push_back(TokenId((i * 53 + 5) % n_vocab));
                int32_t next_c = 0;
                step({{c, long_prompt}}, &next_c);
                for (int i = 0; i < 6; ++i)
                    step({{a, {next}}, {f, {TokenId((next + 3 * i) % n_vocab)}}}, &next);
                for (int i = 0; i < 4; ++i) step({{a, {next}}, {c, {next_c}}}, &next);
            }
}

TEST_CASE("cuda forward_sample picks the host sampler's tokens from forward()'s logits") {
    // Several sequences decode together (graph-sized batches); each step runs forward(),
    // forward_sample() and forward() again on the same batch: eager, captured, replayed. The
    // logits must repeat exactly, and the device must sample what Sampler samples from them.
    std::vector<std::filesystem::path> models;
    if (const auto p = shared_path("models/stories260K.gguf");
        !p.empty() && std::filesystem::exists(p))
        models.push_back(p);
    models.push_back(big_vocab_model());
    for (const auto& path : models) {
        for (KvType kv : {KvType::F16, KvType::Q8}) {
            CAPTURE(path.string());
            CAPTURE(std::string(kv_type_name(kv)));
            GgufFile file = GgufFile::open(path.string());
            BackendOptions o;
            o.kv_block_size = 16;
            o.n_kv_blocks = 64;
            o.kv_type_k = o.kv_type_v = kv;
            auto gpu = cuda_backend(file, o, true);
            CHECK(gpu->samples_on_device());
            const int64_t n_vocab = gpu->config().n_vocab;
            KvBlockTable table(64, 16, gpu->n_kv_stages());
            const size_t n_seqs = 7;
            std::vector<SeqId> seqs;
            ForwardBatch prefill;
            for (size_t q = 0; q < n_seqs; ++q) {
                seqs.push_back(table.create_sequence());
                std::vector<TokenId> p;
                for (size_t i = 0; i < 5 + 4 * q; ++i)
                    p.push_back(TokenId((q * 101 + i * 37 + 1) % size_t(n_vocab)));
                REQUIRE(table.append(seqs.back(), p));
                prefill.add_sequence(table, seqs.back(), 0, int32_t(p.size()));
                prefill.logit_rows.push_back(int32_t(prefill.tokens.size()) - 1);
            }
            kv_apply_pending(table, *gpu);
            std::vector<int32_t> next(n_seqs);
            {
                const std::vector<RowSampling> rows = sampling_rows(n_seqs, n_vocab, 0);
                const std::vector<float> l = logits_of(*gpu, prefill);
                gpu->forward_sample(prefill, rows, next.data());
                CHECK(logits_of(*gpu, prefill) == l);
                CHECK(next == host_sample(l, n_vocab, rows));
            }
            for (uint64_t it = 1; it <= 4; ++it) {
                CAPTURE(it);
                ForwardBatch b;
                for (size_t q = 0; q < n_seqs; ++q) {
                    REQUIRE(table.append(seqs[q], std::vector<TokenId>{next[q]}));
                    b.add_sequence(table, seqs[q], table.n_tokens(seqs[q]) - 1, 1);
                    b.logit_rows.push_back(int32_t(q));
                }
                kv_apply_pending(table, *gpu);
                const std::vector<RowSampling> rows = sampling_rows(n_seqs, n_vocab, it);
                const std::vector<float> l1 = logits_of(*gpu, b);  // eager or replayed
                std::vector<int32_t> got(n_seqs);
                gpu->forward_sample(b, rows, got.data());  // captured on the second step
                const std::vector<float> l3 = logits_of(*gpu, b);
                CHECK(l3 == l1);
                CHECK(got == host_sample(l3, n_vocab, rows));
                next = got;
            }
            // A row count that does not match the logit rows is refused.
            std::vector<RowSampling> short_rows = sampling_rows(n_seqs - 1, n_vocab, 9);
            std::vector<int32_t> out(n_seqs);
            CHECK_THROWS_AS(gpu->forward_sample(prefill, short_rows, out.data()), Error);
        }
    }
}

TEST_CASE("engine with device sampling on the cuda backend gives the host path's tokens") {
    const auto path = shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path.string());
    auto tok = Tokenizer::from_gguf(file);
    const char* texts[] = {"Once upon a time", "The little dog saw a big red ball. He",
                           "Lily and Tom went to the park. They",
                           "One day, a bird flew into the garden and"};
    for (KvType kv : {KvType::F16, KvType::Q8}) {
        CAPTURE(std::string(kv_type_name(kv)));
        auto run = [&](EngineOptions::DeviceSampling mode, EngineStats* stats) {
            BackendOptions o;
            o.kv_block_size = 16;
            o.n_kv_blocks = 128;
            o.kv_type_k = o.kv_type_v = kv;
            auto backend = cuda_backend(file, o, true);
            EngineOptions eo;
            eo.max_parallel = 6;
            eo.device_sampling = mode;
            Engine engine(*backend, *tok, eo);
            std::map<int32_t, std::vector<TokenId>> out;
            for (int i = 0; i < 8; ++i) {
                GenerationRequest r;
                r.prompt = tok->encode(texts[i % 4], true);
                r.n_predict = 40;
                r.sampling.seed = 100 + uint64_t(i);
                r.sampling.temperature = i % 4 == 0 ? 0.0f : 0.9f;
                if (i % 4 == 2) r.sampling.repeat_penalty = 1.3f, r.sampling.repeat_last_n = -1;
                if (i % 4 == 3) r.sampling.repeat_penalty = 1.2f, r.sampling.repeat_last_n = 8;
                if (i == 5) r.sampling.top_k = 0, r.sampling.top_p = 0.8f;
                engine.submit(r);
            }
            engine.on_finish([&](const GenerationResult& r) {
                REQUIRE_MESSAGE(r.stop != StopReason::Error, r.error);
                out[r.request] = r.tokens;
            });
            engine.run();
            *stats = engine.stats();
            return out;
        };
        EngineStats host_stats, dev_stats;
        const auto host = run(EngineOptions::DeviceSampling::Off, &host_stats);
        const auto dev = run(EngineOptions::DeviceSampling::On, &dev_stats);
        CHECK(host.size() == 8);
        CHECK(host == dev);
        CHECK(host_stats.device_sampled_steps == 0);
        CHECK(dev_stats.device_sampled_steps > 0);
    }
}

TEST_CASE("cuda embeddings (normed final hidden states, pooled) match the cpu backend's") {
    for (const char* name : kModels) {
        CAPTURE(name);
        CpuGpu pair = cpu_and_gpu(name);
        if (!pair.file) continue;
        Backend *cpu = pair.cpu.get(), *gpu = pair.gpu.get();
        const int64_t n_vocab = cpu->config().n_vocab;
        std::vector<std::vector<TokenId>> prompts(3);
        for (int32_t i = 0; i < 40; ++i) prompts[0].push_back(TokenId((i * 37 + 11) % n_vocab));
        for (int32_t i = 0; i < 3; ++i) prompts[1].push_back(TokenId((i * 53 + 5) % n_vocab));
        for (int32_t i = 0; i < 17; ++i) prompts[2].push_back(TokenId((i * 29 + 3) % n_vocab));
        for (Pooling pooling : {Pooling::None, Pooling::Mean, Pooling::Last}) {
            CAPTURE(pooling_name(pooling));
            for (int32_t n_batch : {512, 1, 9}) {  // one pass; decode-sized steps (graphs); mixed
                CAPTURE(n_batch);
                const auto c = compute_embeddings(*cpu, prompts, pooling, n_batch, 256);
                const auto g = compute_embeddings(*gpu, prompts, pooling, n_batch, 256);
                REQUIRE(c.size() == g.size());
                for (size_t i = 0; i < c.size(); ++i) CHECK(nmse(g[i], c[i]) < kLogitBound);
            }
        }
    }
}

TEST_CASE("cuda matmul observer (imatrix) sees the cpu backend's activations") {
    for (const char* name : kModels) {
        CAPTURE(name);
        CpuGpu pair = cpu_and_gpu(name);
        if (!pair.file) continue;
        const int64_t n_vocab = pair.cpu->config().n_vocab;
        std::vector<int32_t> prompt;
        for (int32_t i = 0; i < 24; ++i) prompt.push_back(int32_t((i * 37 + 11) % n_vocab));
        const std::vector<std::vector<int32_t>> tables = {{3, 0, 5, 1}};
        std::vector<Imatrix> got;
        for (Backend* be : {pair.cpu.get(), pair.gpu.get()}) {
            ImatrixCollector collector(*pair.file, true);
            REQUIRE(
                be->set_matmul_observer([&](const void* w, int64_t n, const float* x,
                                            int64_t rows) { collector.observe(w, n, x, rows); }));
            logits_of(*be, batch_of(prompt, 0, 0, tables));  // a prefill pass
            logits_of(*be, batch_of({7}, 24, 0, tables));    // a decode step
            REQUIRE(be->set_matmul_observer({}));
            got.push_back(collector.result());
        }
        REQUIRE(got[1].entries.size() == got[0].entries.size());
        CHECK(got[0].entries.size() == size_t(7 * pair.cpu->config().n_layer + 1));
        for (const auto& [tensor, e] : got[0].entries) {
            CAPTURE(tensor);
            REQUIRE(got[1].entries.count(tensor));
            CHECK(got[1].entries.at(tensor).counts == e.counts);
            const auto c = got[0].mean_squares(tensor), g = got[1].mean_squares(tensor);
            CHECK(nmse(g, c) < 1e-3);
        }
    }
}

TEST_CASE("cuda layer observer (cvector-generator) sees the cpu backend's layer outputs") {
    for (const char* name : kModels) {
        CAPTURE(name);
        CpuGpu pair = cpu_and_gpu(name);
        if (!pair.file) continue;
        const ModelConfig& c = pair.cpu->config();
        std::vector<int32_t> prompt;
        for (int32_t i = 0; i < 24; ++i) prompt.push_back(int32_t((i * 37 + 11) % c.n_vocab));
        const std::vector<std::vector<int32_t>> tables = {{3, 0, 5, 1}};
        // Per backend, per pass (a prefill, then a decode step), per layer: the rows seen.
        std::vector<std::vector<std::vector<std::vector<float>>>> seen(2);
        int b = 0;
        for (Backend* be : {pair.cpu.get(), pair.gpu.get()}) {
            auto& passes = seen[size_t(b++)];
            REQUIRE(be->set_layer_observer([&](int32_t layer, const float* x, int64_t rows) {
                if (layer == 0) passes.emplace_back();
                CHECK(size_t(layer) == passes.back().size());  // layers in order
                passes.back().emplace_back(x, x + rows * c.n_embd);
            }));
            const auto prefill = logits_of(*be, batch_of(prompt, 0, 0, tables));
            const auto decode = logits_of(*be, batch_of({7}, 24, 0, tables));
            REQUIRE(be->set_layer_observer({}));
            // Observing changes nothing, and without it nothing more is seen.
            const size_t n_passes = passes.size();
            CHECK(nmse(logits_of(*be, batch_of({7}, 24, 0, tables)), decode) < 1e-6);
            CHECK(passes.size() == n_passes);
            (void)prefill;
        }
        REQUIRE(seen[0].size() == 2);
        REQUIRE(seen[1].size() == 2);
        for (size_t p = 0; p < 2; ++p)
            for (int64_t l = 0; l < c.n_layer; ++l) {
                CAPTURE(p);
                CAPTURE(l);
                const auto& cpu_rows = seen[0][p][size_t(l)];
                const auto& gpu_rows = seen[1][p][size_t(l)];
                REQUIRE(gpu_rows.size() == cpu_rows.size());
                CHECK(gpu_rows.size() == size_t((p == 0 ? 24 : 1) * c.n_embd));
                CHECK(nmse(gpu_rows, cpu_rows) < 1e-3);
            }
    }
}

TEST_CASE("cuda backend applies control vectors like the cpu backend") {
    // Directions on two layers of a Q4_K_M llama (one file at scale 1.5, one with a layer
    // range), through a prefill (GEMM, eager) and decode steps (GEMV, graphs).
    const auto dir = std::filesystem::temp_directory_path();
    SyntheticModelConfig c = synthetic_preset("tiny");
    c.weight_std = 0.06f;
    c.n_layer = 4;
    synthetic_set_type(c, "Q4_K_M");
    const auto path = dir / "kvrun-test-cuda-cvec.gguf";
    synthetic_model_write(c, path.string());
    GgufFile file = GgufFile::open(path.string());
    const int64_t n_embd = c.n_embd;
    GgufWriter w;
    w.set_string("general.architecture", "controlvector");
    std::vector<std::vector<float>> dirs;
    for (int layer = 1; layer <= 2; ++layer) {
        std::vector<float>& v = dirs.emplace_back(size_t(n_embd));
        for (int64_t i = 0; i < n_embd; ++i) v[size_t(i)] = 0.3f * float(std::sin(0.7 * i + layer));
        w.add_tensor(fmt::format("direction.{}", layer), GgmlType::F32, {n_embd}, v.data(),
                     v.size() * sizeof(float));
    }
    const auto cv = dir / "kvrun-test-cuda-cvec-directions.gguf";
    w.write_file(cv.string());
    for (int range : {0, 1}) {
        CAPTURE(range);
        BackendOptions o;
        o.kv_block_size = 16;
        o.n_kv_blocks = 8;
        o.control_vectors.specs = {{cv.string(), 1.5f}};
        if (range) o.control_vectors.layer_start = o.control_vectors.layer_end = 1;
        auto cpu = make_cpu_backend(file, o);
        auto gpu = make_cuda_backend(file, o, 0);
        KvBlockTable table(8, 16, cpu->n_kv_stages());
        const SeqId a = table.create_sequence();
        check_prefill_decode(*cpu, *gpu, table, a, 6, logit_bound(KvType::F16));
    }
    std::filesystem::remove(path);
    std::filesystem::remove(cv);
}
#endif  // KVRUN_HAS_CUDA
