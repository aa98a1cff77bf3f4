// The CUDA backend vs the CPU backend on every architecture's parts (split from
// test_cuda_backend.cpp): small synthetic models of each architecture with 128-wide heads,
// K-quant weights and f16 / q8 caches; DeepSeek's latent attention and expert groups; a
// sliding-window pool past its window. Exits 77 (skipped) without a GPU.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "arch_test_util.h"
#include "backend.h"
#include "common.h"
#include "cuda_backend_test_util.h"
#include "cuda_test_util.h"
#include "gguf.h"
#include "kv_block_table.h"
#include "kv_format.h"
#include "synthetic_model.h"
#include "test_util.h"

#ifdef KVRUN_HAS_CUDA
#include "cuda/cuda_backend.h"

using namespace kvrun;
using namespace kvrun::test;

TEST_CASE("cuda backend matches the cpu backend on qwen3, phi3, gemma and wide-head models") {
    // qwen3 (per-head Q/K RMSNorm before RoPE) with head_dim 128 x 4 heads = 512 != n_embd 256
    // and a tied output; qwen2 (biases), phi3 (fused QKV and gate/up, sliced views uploaded
    // separately; LongRoPE factors and attention factor), gemma 1-3 (embedding scale, GeGLU,
    // post norms, soft caps, sliding windows, per-layer RoPE), qwen3moe (router top-k on the
    // device, expert-indexed GEMVs, weighted sum; the 24-token prompt takes the grouped
    // prefill), granite / granitemoe (embedding, q.k, residual and logit multipliers),
    // smollm3 (a layer without RoPE: the unfused KV write), gpt-oss (sinks, biases, MXFP4
    // experts with biases and the clamped SwiGLU), glm4moe (a dense first layer, then the
    // sigmoid router with its selection bias, scaled weights and a shared expert; half of each
    // head rotating; a multi-token-prediction layer left out), ernie4_5-moe (the softmax router
    // with its selection bias, two shared experts, consecutive-pair RoPE), olmo2 (no pre
    // norms, Q/K norms over all heads, OLMo 3's window on layers 0-2 of 4), olmoe (OLMo's Q/K
    // norms, unnormalized softmax weights), exaone4 (no pre norms, per-head Q/K norms), qwen2moe
    // (biases, unnormalized softmax weights, the sigmoid-gated shared expert), glm4 (GLM-4-0414:
    // biases fused in attn_qkv, post norms, fused gate/up, half of each head rotating in
    // consecutive pairs, a multi-token-prediction layer left out), seed_oss (biases, the FFN's
    // norm renamed), llama4 (8-token chunks on layers 0-2, layer 3 global without RoPE, the
    // rotating layers' weightless Q/K norms, experts whose weights scale their inputs, a shared
    // expert), dots1 (GLM 4.5's router and shared experts, per-head Q/K norms), exaone (NeoX
    // pairs), bitnet (TQ2_0 weights), phi2 (LayerNorms with biases, parallel blocks, the plain
    // GELU FFN with biases, 64 of 128 dims rotating, Q/K/V fused with their bias, an output
    // bias), starcoder2 (sequential blocks with LayerNorms and the plain FFN), command-r
    // (LayerNorms without biases, parallel SwiGLU blocks, the logit scale), cohere2 (command-r
    // with 8-token windows on layers 0-2, layer 3 global without RoPE) and llama with the same
    // heads.
    // K-quant weights, f16 and q8 KV (q8 with rotation: the unfused RoPE path).
    const auto dir = std::filesystem::temp_directory_path();
    // KVRUN_TEST_ARCHS=a,b runs only those (the emulator is slow: a developer's filter).
    const char* only = std::getenv("KVRUN_TEST_ARCHS");
    for (const char* arch :
         {"qwen3",   "qwen3moe",   "qwen2",    "phi3",    "gemma",      "gemma2",       "gemma3",
          "granite", "granitemoe", "smollm3",  "gpt-oss", "glm4moe",    "ernie4_5-moe", "olmo2",
          "olmoe",   "exaone4",    "qwen2moe", "llama",   "bitnet",     "glm4",         "seed_oss",
          "llama4",  "dots1",      "exaone",   "phi2",    "starcoder2", "command-r",    "cohere2"})
        for (KvType kv : {KvType::F16, KvType::Q8}) {
            if (only && !contains("," + std::string(only) + ",", "," + std::string(arch) + ","))
                continue;
            CAPTURE(arch);
            CAPTURE(std::string(kv_type_name(kv)));
            SyntheticModelConfig c = synthetic_preset("tiny");
            c.arch = arch, c.head_dim = 128, c.n_head = 4, c.n_head_kv = 2;
            c.tied_output = std::string(arch) == "qwen3";
            c.weight_std = 0.06f;
            if (std::string(arch) == "phi3")
                c.rope_scaling = "longrope", c.rope_factor = 16, c.rope_orig_ctx = 512;
            // Gemma: windows of 8 tokens (layer 0 of gemma2, both layers of gemma3, whose RoPE
            // base there is 10000), gemma2's soft caps small enough to bite.
            c.sliding_window = 8, c.attn_softcap = 2, c.final_softcap = 3;
            // qwen3moe: 4 experts of width 256, all of them used, so that no routing near-tie
            // can make the two backends pick different experts (top-k itself: test_cuda_ops).
            const bool moe = std::string(arch).find("moe") != std::string::npos ||
                             std::string(arch) == "gpt-oss" || std::string(arch) == "llama4" ||
                             std::string(arch) == "dots1";
            if (moe) c.n_expert = 4, c.n_expert_used = 4, c.n_ff_exp = 256;
            if (std::string(arch) == "glm4moe")
                c.rope_dims = 64, c.n_nextn = 1, c.expert_weights_scale = 2.5;
            if (std::string(arch) == "glm4") c.rope_dims = 64, c.n_nextn = 1, c.fused_qkv = true;
            if (std::string(arch) == "phi2") c.rope_dims = 64, c.fused_qkv = true;
            if (std::string(arch) == "gpt-oss") c.expert_type = GgmlType::MXFP4;
            // Granite's multipliers, away from 1 (attention.scale: 1 / head_dim).
            c.granite_embedding_scale = 2, c.granite_residual_scale = 0.5;
            c.granite_logit_scale = 3;
            // smollm3: layer 3 without RoPE; olmo2: layer 3 global
            if (std::string(arch) == "smollm3" || std::string(arch) == "olmo2" ||
                std::string(arch) == "llama4" || std::string(arch) == "cohere2")
                c.n_layer = 4;
            // (BitNet in its ternary type: TQ2_0 weights end to end.)
            synthetic_set_type(c, std::string(arch) == "bitnet" ? "TQ2_0" : "Q4_K_M");
            const auto path = dir / fmt::format("kvrun-test-cuda-arch-{}.gguf", arch);
            synthetic_model_write(c, path.string());
            GgufFile file = GgufFile::open(path.string());
            BackendOptions o;
            o.kv_block_size = 16;
            o.n_kv_blocks = 8;
            o.kv_type_k = o.kv_type_v = kv;
            o.kv_rotate = kv == KvType::Q8;
            auto cpu = make_cpu_backend(file, o);
            auto gpu = make_cuda_backend(file, o, 0);
            CHECK(gpu->config().qk_norm ==
                  (std::string(arch) == "qwen3" || std::string(arch) == "qwen3moe" ||
                   std::string(arch) == "gemma3" || std::string(arch) == "exaone4" ||
                   std::string(arch) == "dots1"));
            // A 24-token prompt, then decode steps (staged q8 blocks seal at 32 tokens).
            KvBlockTable table(8, 16, cpu->n_kv_stages());
            const SeqId a = table.create_sequence();
            check_prefill_decode(*cpu, *gpu, table, a, 12, logit_bound(kv));
            std::filesystem::remove(path);
        }
}

TEST_CASE("cuda backend applies per-tensor and per-expert scales (NAME.scale) as the cpu does") {
    // F32 models whose weights are divided by powers of two that their .scale tensors multiply
    // back (arch_test::gguf_with_scales; the experts' differ): the GEMV epilogue (decode, the
    // experts by device-side ids), the GEMM's alpha and the grouped prefill's expert views.
    const auto dir = std::filesystem::temp_directory_path();
    for (const char* arch : {"llama", "qwen3moe"}) {
        CAPTURE(arch);
        SyntheticModelConfig c = synthetic_preset("tiny");
        c.arch = arch;
        c.weight_std = 0.06f;
        // All 4 experts used: no routing near-tie can part the backends.
        if (std::string(arch) == "qwen3moe") c.n_expert = 4, c.n_expert_used = 4, c.n_ff_exp = 256;
        const auto path = dir / fmt::format("kvrun-test-cuda-scales-{}.gguf", arch);
        synthetic_model_write(c, path.string());
        const GgufFile plain = GgufFile::open(path.string());
        const std::vector<uint8_t> bytes = arch_test::gguf_with_scales(plain);
        const GgufFile file = GgufFile::from_memory(bytes.data(), bytes.size(), "scaled.gguf");
        BackendOptions o;
        o.kv_block_size = 16;
        o.n_kv_blocks = 8;
        auto cpu = make_cpu_backend(file, o);
        auto gpu = make_cuda_backend(file, o, 0);
        KvBlockTable table(8, 16, cpu->n_kv_stages());
        check_prefill_decode(*cpu, *gpu, table, table.create_sequence(), 6, kLogitBound);
        std::filesystem::remove(path);
    }
}

TEST_CASE("cuda backend matches the cpu backend on DeepSeek's latent attention and expert groups") {
    // deepseek2: the latent rows (64 RoPE'd dims + rank 512: the wide attention kernel; rank
    // 32 + 8: the narrow one) as K, V reading them (f16 and q8, one pool) or a V pool of its
    // own (K q8, V f16); Q direct (V2) or through its low rank (V3); the absorption GEMVs per
    // head; YaRN; a dense first layer, then experts: V2's softmax router with unnormalized
    // weights and two shared experts, V3's sigmoid router with its selection bias, normalized
    // and scaled weights and expert groups (4 experts in 2 of 4 groups: every token takes all
    // four of its groups' experts, so no routing near-tie can part the backends), a file with
    // the older attn_kv_b. Prefill (24 tokens: the prefill kernels, per-head GEMVs over 96
    // jobs), decode steps through a q8 seal, a fork (copy-on-write) and both in one batch.
    const auto dir = std::filesystem::temp_directory_path();
    struct Variant {
        const char* name;
        bool v3, legacy, wide;
    };
    for (const Variant& v :
         {Variant{"v2", false, false, true}, Variant{"v3", true, false, true},
          Variant{"v2 legacy", false, true, false}, Variant{"v3 narrow", true, false, false}})
        for (auto [kt, vt] :
             {std::pair{KvType::F16, KvType::F16}, std::pair{KvType::Q8, KvType::Q8},
              std::pair{KvType::Q8, KvType::F16}}) {
            CAPTURE(v.name);
            CAPTURE(std::string(kv_type_name(kt)));
            CAPTURE(std::string(kv_type_name(vt)));
            SyntheticModelConfig c = synthetic_preset("tiny");
            c.arch = "deepseek2";
            c.n_layer = 3, c.n_layer_dense = 1, c.n_embd = 256, c.n_head = 4, c.n_head_kv = 4;
            c.n_ff = 256;
            c.mla_rank = v.wide ? 512 : 32, c.rope_dims = v.wide ? 64 : 8;
            c.mla_nope = v.wide ? 128 : 16, c.mla_v = v.wide ? 128 : 24;
            c.mla_legacy = v.legacy;
            c.rope_scaling = "yarn", c.rope_factor = 4, c.rope_orig_ctx = 256;
            c.yarn_log_mul = 0.707;
            c.n_expert = 8, c.n_ff_exp = 256;
            if (v.v3) {
                c.mla_q_rank = 256, c.n_expert_used = 4, c.n_expert_shared = 1;
                c.expert_gating = 2, c.expert_weights_norm = true, c.expert_weights_scale = 2.5;
                c.n_group = 4, c.n_group_used = 2;
            } else {
                c.n_expert_used = 8, c.n_expert_shared = 2;
                c.expert_gating = 1, c.expert_weights_norm = false;
            }
            c.weight_std = 0.06f;
            synthetic_set_type(c, "Q4_K_M");
            const auto path = dir / "kvrun-test-cuda-deepseek2.gguf";
            synthetic_model_write(c, path.string());
            GgufFile file = GgufFile::open(path.string());
            BackendOptions o;
            o.kv_block_size = 16;
            o.n_kv_blocks = 8;
            o.kv_type_k = kt, o.kv_type_v = vt;
            auto cpu = make_cpu_backend(file, o);
            auto gpu = make_cuda_backend(file, o, 0);
            REQUIRE(gpu->config().mla());
            CHECK(gpu->kv_block_io_bytes(KvPool::Main) == cpu->kv_block_io_bytes(KvPool::Main));
            KvBlockTable table(8, 16, cpu->n_kv_stages());
            const SeqId a = table.create_sequence();
            int32_t next = check_prefill_decode(*cpu, *gpu, table, a, 12, logit_bound(kt));
            const SeqId f = table.fork(a);
            for (int i = 0; i < 3; ++i)
                CHECK(compare(*cpu, *gpu,
                              append_step(table, {{a, {next}}, {f, {TokenId((next + i) % 512)}}},
                                          {cpu.get(), gpu.get()}),
                              &next) < logit_bound(kt));
            std::filesystem::remove(path);
        }
}

TEST_CASE("cuda backend with a sliding-window pool matches the cpu backend past the window") {
    // Gemma 3 with an 8-token window on 5 of 6 layers, blocks of 4: the windowed layers live
    // in the window pool ((8 + 64 + 8) / 4 + 2 = 22 blocks) and drop their early blocks once
    // a sequence is past the window and the rollback margin; a fork copies a partial block in
    // both pools. f16 and q8 (staged) storage.
    const auto dir = std::filesystem::temp_directory_path();
    for (KvType kv : {KvType::F16, KvType::Q8}) {
        CAPTURE(std::string(kv_type_name(kv)));
        SyntheticModelConfig c = synthetic_preset("tiny");
        c.arch = "gemma3", c.n_layer = 6, c.head_dim = 128, c.n_head = 4, c.n_head_kv = 2;
        c.sliding_window = 8, c.weight_std = 0.06f;
        const auto path = dir / "kvrun-test-cuda-swa-pool.gguf";
        synthetic_model_write(c, path.string());
        GgufFile file = GgufFile::open(path.string());
        BackendOptions o;
        o.kv_block_size = 4;
        o.n_kv_blocks = 100;
        o.n_batch = 8;
        o.kv_type_k = o.kv_type_v = kv;
        auto cpu = make_cpu_backend(file, o);
        auto gpu = make_cuda_backend(file, o, 0);
        REQUIRE(gpu->kv_window_pool() == cpu->kv_window_pool());
        REQUIRE(gpu->kv_window_pool().n_blocks == 22);
        KvBlockTable table = kv_table_for(*cpu);
        const SeqId a = table.create_sequence();
        std::vector<TokenId> toks;
        for (int32_t i = 0; i < 24; ++i) toks.push_back((i * 37 + 11) % 512);
        int32_t next = 0;
        for (int32_t at = 0; at < 24; at += 8)
            CHECK(compare(*cpu, *gpu,
                          append_step(table, {{a, {toks.begin() + at, toks.begin() + at + 8}}},
                                      {cpu.get(), gpu.get()}),
                          &next) < logit_bound(kv));
        for (int32_t step = 0; step < 79; ++step)
            CHECK(compare(*cpu, *gpu, append_step(table, {{a, {next}}}, {cpu.get(), gpu.get()}),
                          &next) < logit_bound(kv));
        CHECK(table.window_of(table.block_ids(a)[0]) == -1);  // dropped
        const SeqId b = table.fork(a);                        // 103 tokens: a partial block
        for (int32_t step = 0; step < 6; ++step)
            CHECK(compare(*cpu, *gpu,
                          append_step(table, {{a, {next}}, {b, {(step * 13 + 5) % 512}}},
                                      {cpu.get(), gpu.get()}),
                          &next) < logit_bound(kv));
        // Block I/O (prompt caches) per pool: the main pool holds the one global layer, the
        // window pool the five windowed ones.
        for (KvPool pool : {KvPool::Main, KvPool::Window}) {
            const int64_t n = gpu->kv_block_io_bytes(pool);
            CHECK(n == cpu->kv_block_io_bytes(pool));
            CHECK(n == (pool == KvPool::Main ? 1 : 5) * cpu->kv_block_io_bytes(KvPool::Main));
            std::vector<uint8_t> x(static_cast<size_t>(n)), y(x.size());
            for (size_t i = 0; i < x.size(); ++i) x[i] = uint8_t(i * 5 + 1);
            gpu->write_kv_block(pool, 21, x.data());
            gpu->read_kv_block(pool, 21, y.data());
            CHECK(x == y);
        }
        CHECK_THROWS_AS(gpu->read_kv_block(KvPool::Window, 22, nullptr), Error);
        std::filesystem::remove(path);
    }
}

#endif  // KVRUN_HAS_CUDA
