// The synthetic models' presets (synthetic_model.h): the shapes of well-known models of each
// architecture kvrun runs, from their published configs, for benchmarks and tests.
#include <string>
#include <string_view>
#include <vector>

#include "common.h"
#include "synthetic_model.h"

namespace kvrun {

std::vector<std::string> synthetic_preset_names() {
    return {"llama2-7b",
            "llama3-8b",
            "llama3.1-8b",
            "llama-1b",
            "qwen2.5-7b",
            "qwen3-0.6b",
            "qwen3-8b",
            "qwen3-30b-a3b",
            "mixtral-8x7b",
            "phi3-mini",
            "phi3-mini-128k",
            "phi4",
            "gemma2-2b",
            "gemma3-1b",
            "gemma3-4b",
            "granite3-8b",
            "granite3-3b-a800m",
            "smollm3-3b",
            "phi4-mini",
            "gpt-oss-20b",
            "gpt-oss-120b",
            "glm4.5-air",
            "ernie4.5-0.3b",
            "ernie4.5-21b-a3b",
            "olmo2-7b",
            "olmo3-7b",
            "olmoe-1b-7b",
            "exaone4-32b",
            "qwen1.5-moe-a2.7b",
            "qwen2-57b-a14b",
            "deepseek-v2-lite",
            "deepseek-v3",
            "bitnet-b1.58-large",
            "bitnet-b1.58-3b",
            "glm4-9b",
            "glm4-32b",
            "seed-oss-36b",
            "llama4-scout",
            "llama4-maverick",
            "dots1",
            "exaone3.5-7.8b",
            "phi2",
            "starcoder2-3b",
            "starcoder2-7b",
            "command-r-35b",
            "command-r7b",
            "tiny"};
}

SyntheticModelConfig synthetic_preset(std::string_view name) {
    SyntheticModelConfig c;
    c.name = std::string(name);
    if (name == "llama2-7b") {
        c.n_layer = 32, c.n_embd = 4096, c.n_head = 32, c.n_head_kv = 32, c.n_ff = 11008;
        c.n_vocab = 32000, c.rope_base = 10000, c.n_ctx = 4096, c.norm_eps = 1e-5;
    } else if (name == "llama3-8b") {
        c.n_layer = 32, c.n_embd = 4096, c.n_head = 32, c.n_head_kv = 8, c.n_ff = 14336;
        c.n_vocab = 128256, c.rope_base = 500000, c.n_ctx = 8192, c.norm_eps = 1e-5;
    } else if (name == "llama3.1-8b") {  // llama3-8b with Llama 3.1's 128K-context RoPE
        c.n_layer = 32, c.n_embd = 4096, c.n_head = 32, c.n_head_kv = 8, c.n_ff = 14336;
        c.n_vocab = 128256, c.rope_base = 500000, c.n_ctx = 131072, c.norm_eps = 1e-5;
        c.rope_scaling = "llama3", c.rope_factor = 8, c.rope_orig_ctx = 8192;
    } else if (name == "llama-1b") {  // shaped like Llama-3.2-1B
        c.n_layer = 16, c.n_embd = 2048, c.n_head = 32, c.n_head_kv = 8, c.n_ff = 8192;
        c.n_vocab = 128256, c.rope_base = 500000, c.n_ctx = 8192, c.norm_eps = 1e-5;
    } else if (name == "qwen2.5-7b") {  // Q/K/V biases, GQA 7:1
        c.arch = "qwen2";
        c.n_layer = 28, c.n_embd = 3584, c.n_head = 28, c.n_head_kv = 4, c.n_ff = 18944;
        c.n_vocab = 152064, c.rope_base = 1000000, c.n_ctx = 32768, c.norm_eps = 1e-6;
    } else if (name == "qwen3-0.6b") {  // per-head Q/K norms, head_dim 128 != n_embd / n_head
        c.arch = "qwen3", c.head_dim = 128, c.tied_output = true;
        c.n_layer = 28, c.n_embd = 1024, c.n_head = 16, c.n_head_kv = 8, c.n_ff = 3072;
        c.n_vocab = 151936, c.rope_base = 1000000, c.n_ctx = 40960, c.norm_eps = 1e-6;
    } else if (name == "qwen3-8b") {
        c.arch = "qwen3", c.head_dim = 128;
        c.n_layer = 36, c.n_embd = 4096, c.n_head = 32, c.n_head_kv = 8, c.n_ff = 12288;
        c.n_vocab = 151936, c.rope_base = 1000000, c.n_ctx = 40960, c.norm_eps = 1e-6;
    } else if (name == "qwen3-30b-a3b") {  // 128 experts of width 768, 8 per token
        c.arch = "qwen3moe", c.head_dim = 128;
        c.n_layer = 48, c.n_embd = 2048, c.n_head = 32, c.n_head_kv = 4, c.n_ff = 6144;
        c.n_expert = 128, c.n_expert_used = 8, c.n_ff_exp = 768;
        c.n_vocab = 151936, c.rope_base = 1000000, c.n_ctx = 40960, c.norm_eps = 1e-6;
    } else if (name == "qwen1.5-moe-a2.7b") {  // 60 experts of width 1408, 4 per token, MHA
        c.arch = "qwen2moe";
        c.n_layer = 24, c.n_embd = 2048, c.n_head = 16, c.n_head_kv = 16, c.n_ff = 5632;
        c.n_expert = 60, c.n_expert_used = 4, c.n_ff_exp = 1408, c.n_ff_shexp = 5632;
        c.n_vocab = 151936, c.rope_base = 1000000, c.n_ctx = 8192, c.norm_eps = 1e-6;
    } else if (name == "qwen2-57b-a14b") {  // 64 experts of width 2560, 8 per token, GQA 7:1
        c.arch = "qwen2moe";
        c.n_layer = 28, c.n_embd = 3584, c.n_head = 28, c.n_head_kv = 4, c.n_ff = 18944;
        c.n_expert = 64, c.n_expert_used = 8, c.n_ff_exp = 2560, c.n_ff_shexp = 20480;
        c.n_vocab = 151936, c.rope_base = 1000000, c.n_ctx = 32768, c.norm_eps = 1e-6;
    } else if (name == "deepseek-v2-lite" || name == "deepseek-v3") {  // latent attention
        // (shapes from the published configs; V2-Lite: 64 experts of width 1408, 6 per token,
        // 2 shared, softmax weights unnormalized; V3: 256 of width 2048, 8 per token from 4 of
        // 8 groups, 1 shared, a sigmoid router with selection bias, weights normalized x 2.5)
        c.arch = "deepseek2";
        c.mla_rank = 512, c.mla_nope = 128, c.mla_v = 128, c.rope_dims = 64;
        c.rope_base = 10000, c.n_ctx = 163840, c.norm_eps = 1e-6;
        c.rope_scaling = "yarn", c.rope_factor = 40, c.rope_orig_ctx = 4096;
        if (name == "deepseek-v2-lite") {
            c.n_layer = 27, c.n_embd = 2048, c.n_head = 16, c.n_head_kv = 16, c.n_ff = 10944;
            c.n_expert = 64, c.n_expert_used = 6, c.n_ff_exp = 1408, c.n_expert_shared = 2;
            c.n_layer_dense = 1, c.expert_weights_norm = false, c.expert_weights_scale = 1.0;
            c.n_vocab = 102400, c.yarn_log_mul = 0.707;
        } else {
            c.n_layer = 61, c.n_embd = 7168, c.n_head = 128, c.n_head_kv = 128, c.n_ff = 18432;
            c.n_expert = 256, c.n_expert_used = 8, c.n_ff_exp = 2048, c.n_expert_shared = 1;
            c.n_layer_dense = 3, c.expert_weights_norm = true, c.expert_weights_scale = 2.5;
            c.expert_gating = 2, c.n_group = 8, c.n_group_used = 4, c.mla_q_rank = 1536;
            c.n_vocab = 129280, c.yarn_log_mul = 1.0;
        }
    } else if (name == "mixtral-8x7b") {  // llama with 8 experts, 2 per token
        c.n_layer = 32, c.n_embd = 4096, c.n_head = 32, c.n_head_kv = 8, c.n_ff = 14336;
        c.n_expert = 8, c.n_expert_used = 2;
        c.n_vocab = 32000, c.rope_base = 1000000, c.n_ctx = 32768, c.norm_eps = 1e-5;
    } else if (name == "phi3-mini" || name == "phi3-mini-128k") {  // fused QKV and gate/up
        c.arch = "phi3";
        c.n_layer = 32, c.n_embd = 3072, c.n_head = 32, c.n_head_kv = 32, c.n_ff = 8192;
        c.n_vocab = 32064, c.rope_base = 10000, c.n_ctx = 4096, c.norm_eps = 1e-5;
        if (name == "phi3-mini-128k")
            c.n_ctx = 131072, c.rope_scaling = "longrope", c.rope_factor = 64,
            c.rope_orig_ctx = 4096;
    } else if (name == "phi4") {  // Phi-4 14B: phi3 architecture, GQA 4:1
        c.arch = "phi3";
        c.n_layer = 40, c.n_embd = 5120, c.n_head = 40, c.n_head_kv = 10, c.n_ff = 17920;
        c.n_vocab = 100352, c.rope_base = 250000, c.n_ctx = 16384, c.norm_eps = 1e-5;
    } else if (name == "phi4-mini") {  // 3.8B: 96 of 128 head dims rotate, LongRoPE, tied
        c.arch = "phi3", c.tied_output = true, c.rope_dims = 96;
        c.n_layer = 32, c.n_embd = 3072, c.n_head = 24, c.n_head_kv = 8, c.n_ff = 8192;
        c.n_vocab = 200064, c.rope_base = 10000, c.n_ctx = 131072, c.norm_eps = 1e-5;
        c.rope_scaling = "longrope", c.rope_factor = 32, c.rope_orig_ctx = 4096;
    } else if (name == "gemma2-2b") {  // soft caps, a 4096-token window on every other layer
        c.arch = "gemma2", c.head_dim = 256;
        c.n_layer = 26, c.n_embd = 2304, c.n_head = 8, c.n_head_kv = 4, c.n_ff = 9216;
        c.n_vocab = 256000, c.rope_base = 10000, c.n_ctx = 8192, c.norm_eps = 1e-6;
    } else if (name == "gemma3-1b") {  // Q/K norms, a 512-token window on 5 of 6 layers
        c.arch = "gemma3", c.head_dim = 256, c.sliding_window = 512;
        c.n_layer = 26, c.n_embd = 1152, c.n_head = 4, c.n_head_kv = 1, c.n_ff = 6912;
        c.n_vocab = 262144, c.rope_base = 1000000, c.n_ctx = 32768, c.norm_eps = 1e-6;
    } else if (name == "gemma3-4b") {  // global layers: linear RoPE scaling x8
        c.arch = "gemma3", c.head_dim = 256, c.sliding_window = 1024;
        c.n_layer = 34, c.n_embd = 2560, c.n_head = 8, c.n_head_kv = 4, c.n_ff = 10240;
        c.n_vocab = 262208, c.rope_base = 1000000, c.n_ctx = 131072, c.norm_eps = 1e-6;
        c.rope_scaling = "linear", c.rope_factor = 8;
    } else if (name == "granite3-8b") {  // Granite 3.x 8B: multipliers, tied output
        c.arch = "granite", c.tied_output = true;
        c.n_layer = 40, c.n_embd = 4096, c.n_head = 32, c.n_head_kv = 8, c.n_ff = 12800;
        c.n_vocab = 49155, c.rope_base = 10000000, c.n_ctx = 131072, c.norm_eps = 1e-5;
    } else if (name == "granite3-3b-a800m") {  // Granite 3.x MoE: 40 experts, 8 per token
        c.arch = "granitemoe", c.tied_output = true;
        c.n_layer = 32, c.n_embd = 1536, c.n_head = 24, c.n_head_kv = 8, c.n_ff = 512;
        c.n_expert = 40, c.n_expert_used = 8;
        c.granite_embedding_scale = 12, c.granite_residual_scale = 0.22;
        c.granite_logit_scale = 6, c.granite_attention_scale = 0.015625;
        c.n_vocab = 49155, c.rope_base = 10000, c.n_ctx = 4096, c.norm_eps = 1e-6;
    } else if (name == "smollm3-3b") {  // SmolLM3: no RoPE on every fourth layer, tied output
        c.arch = "smollm3", c.tied_output = true;
        c.n_layer = 36, c.n_embd = 2048, c.n_head = 16, c.n_head_kv = 4, c.n_ff = 11008;
        c.n_vocab = 128256, c.rope_base = 5000000, c.n_ctx = 65536, c.norm_eps = 1e-6;
    } else if (name == "gpt-oss-20b" || name == "gpt-oss-120b") {  // MXFP4 experts, 4 per token
        c.arch = "gpt-oss", c.head_dim = 64, c.sliding_window = 128;
        c.n_layer = name == "gpt-oss-20b" ? 24 : 36, c.n_embd = 2880, c.n_head = 64;
        c.n_head_kv = 8, c.n_ff = 2880;
        c.n_expert = name == "gpt-oss-20b" ? 32 : 128, c.n_expert_used = 4, c.n_ff_exp = 2880;
        c.expert_type = GgmlType::MXFP4;
        c.n_vocab = 201088, c.rope_base = 150000, c.n_ctx = 131072, c.norm_eps = 1e-5;
        c.rope_scaling = "yarn", c.rope_factor = 32, c.rope_orig_ctx = 4096;
    } else if (name == "glm4.5-air") {  // 128 experts of width 1408, 8 per token, 1 shared
        c.arch = "glm4moe", c.head_dim = 128, c.rope_dims = 64;
        c.n_layer = 46, c.n_nextn = 1, c.n_layer_dense = 1, c.n_embd = 4096, c.n_head = 96;
        c.n_head_kv = 8, c.n_ff = 10944;
        c.n_expert = 128, c.n_expert_used = 8, c.n_ff_exp = 1408, c.n_expert_shared = 1;
        c.expert_weights_scale = 1.0, c.expert_weights_norm = true;
        c.n_vocab = 151552, c.rope_base = 1000000, c.n_ctx = 131072, c.norm_eps = 1e-5;
    } else if (name == "glm4-9b" || name == "glm4-32b") {  // GLM-4-0414: GQA 16:1 and 24:1
        const bool small = name == "glm4-9b";
        c.arch = "glm4", c.head_dim = 128, c.rope_dims = 64;
        c.n_layer = small ? 40 : 61, c.n_embd = small ? 4096 : 6144, c.n_head = small ? 32 : 48;
        c.n_head_kv = 2, c.n_ff = small ? 13696 : 23040;
        c.n_vocab = 151552, c.rope_base = 10000, c.n_ctx = 32768, c.norm_eps = 1e-5;
    } else if (name == "llama4-scout" || name == "llama4-maverick") {  // 17B active, top-1
        const bool scout = name == "llama4-scout";
        c.arch = "llama4", c.head_dim = 128;
        c.n_layer = 48, c.n_embd = 5120, c.n_head = 40, c.n_head_kv = 8, c.n_ff = 16384;
        c.n_expert = scout ? 16 : 128, c.n_expert_used = 1, c.n_ff_exp = 8192;
        c.moe_step = scout ? 1 : 2;  // (Maverick: experts on every other layer)
        c.n_vocab = 202048, c.rope_base = 500000, c.norm_eps = 1e-5;
        c.n_ctx = scout ? 10485760 : 1048576;
        c.rope_scaling = "llama3", c.rope_factor = scout ? 16 : 8, c.rope_orig_ctx = 8192;
    } else if (name == "dots1") {  // dots.llm1: 128 experts of 1408, 6 per token, 2 shared
        c.arch = "dots1", c.head_dim = 128;
        c.n_layer = 62, c.n_layer_dense = 1, c.n_embd = 4096, c.n_head = 32, c.n_head_kv = 32;
        c.n_ff = 10944, c.n_expert = 128, c.n_expert_used = 6, c.n_ff_exp = 1408;
        c.n_expert_shared = 2, c.expert_weights_scale = 2.5, c.expert_weights_norm = true;
        c.n_vocab = 152064, c.rope_base = 10000000, c.n_ctx = 32768, c.norm_eps = 1e-5;
    } else if (name == "exaone3.5-7.8b") {  // EXAONE 3.5: llama with NeoX pairs
        c.arch = "exaone";
        c.n_layer = 32, c.n_embd = 4096, c.n_head = 32, c.n_head_kv = 8, c.n_ff = 14336;
        c.n_vocab = 102400, c.rope_base = 1000000, c.n_ctx = 32768, c.norm_eps = 1e-5;
    } else if (name == "phi2") {  // Phi-2 (2.7B): MHA heads of 80, 32 of them rotated
        c.arch = "phi2", c.fused_qkv = true, c.rope_dims = 32;
        c.n_layer = 32, c.n_embd = 2560, c.n_head = 32, c.n_head_kv = 32, c.n_ff = 10240;
        c.n_vocab = 51200, c.rope_base = 10000, c.n_ctx = 2048, c.norm_eps = 1e-5;
    } else if (name == "starcoder2-3b" || name == "starcoder2-7b") {  // GQA, 4096-token windows
        // in the checkpoints, which llama.cpp does not apply (nor does kvrun)
        const bool small = name == "starcoder2-3b";
        c.arch = "starcoder2", c.tied_output = small;
        c.n_layer = small ? 30 : 32, c.n_embd = small ? 3072 : 4608;
        c.n_head = small ? 24 : 36, c.n_head_kv = small ? 2 : 4, c.n_ff = small ? 12288 : 18432;
        c.n_vocab = 49152, c.rope_base = small ? 999999.4 : 1000000, c.n_ctx = 16384;
        c.norm_eps = 1e-5;
    } else if (name == "command-r-35b") {  // Command-R v01: MHA, a tied output
        c.arch = "command-r";
        c.n_layer = 40, c.n_embd = 8192, c.n_head = 64, c.n_head_kv = 64, c.n_ff = 22528;
        c.n_vocab = 256000, c.rope_base = 8000000, c.n_ctx = 131072, c.norm_eps = 1e-5;
    } else if (name == "command-r7b") {  // Command R7B (cohere2): 4096-token windows
        c.arch = "cohere2", c.sliding_window = 4096;
        c.n_layer = 32, c.n_embd = 4096, c.n_head = 32, c.n_head_kv = 8, c.n_ff = 14336;
        c.n_vocab = 256000, c.rope_base = 50000, c.n_ctx = 131072, c.norm_eps = 1e-5;
    } else if (name == "seed-oss-36b") {  // Seed-OSS-36B: 80 heads of 128 (wider than n_embd)
        c.arch = "seed_oss", c.head_dim = 128;
        c.n_layer = 64, c.n_embd = 5120, c.n_head = 80, c.n_head_kv = 8, c.n_ff = 27648;
        c.n_vocab = 155136, c.rope_base = 10000000, c.n_ctx = 524288, c.norm_eps = 1e-6;
    } else if (name == "olmo2-7b" || name == "olmo3-7b") {  // MHA; OLMo 3: 4096-token windows
        c.arch = "olmo2";
        c.n_layer = 32, c.n_embd = 4096, c.n_head = 32, c.n_head_kv = 32, c.n_ff = 11008;
        c.n_vocab = 100352, c.rope_base = 500000, c.n_ctx = 4096, c.norm_eps = 1e-6;
        if (name == "olmo3-7b")  // on 3 layers of 4; YaRN x8 on the others
            c.sliding_window = 4096, c.n_ctx = 65536, c.rope_scaling = "yarn", c.rope_factor = 8,
            c.rope_orig_ctx = 8192;
    } else if (name == "bitnet-b1.58-large" || name == "bitnet-b1.58-3b") {  // 1bitLLM's, MHA
        const bool large = name == "bitnet-b1.58-large";
        c.arch = "bitnet", c.tied_output = true;
        c.n_layer = large ? 24 : 26, c.n_embd = large ? 1536 : 3200;
        c.n_head = c.n_head_kv = large ? 16 : 32, c.n_ff = large ? 4096 : 8640;
        c.n_vocab = 32002, c.rope_base = 10000, c.n_ctx = 2048, c.norm_eps = 1e-5;
    } else if (name == "olmoe-1b-7b") {  // 64 experts of width 1024, 8 per token, MHA
        c.arch = "olmoe";
        c.n_layer = 16, c.n_embd = 2048, c.n_head = 16, c.n_head_kv = 16, c.n_ff = 1024;
        c.n_expert = 64, c.n_expert_used = 8;
        c.n_vocab = 50304, c.rope_base = 10000, c.n_ctx = 4096, c.norm_eps = 1e-5;
    } else if (name == "exaone4-32b") {  // windows on 3 layers of 4, the others without RoPE
        c.arch = "exaone4", c.head_dim = 128, c.sliding_window = 4096;
        c.n_layer = 64, c.n_embd = 5120, c.n_head = 40, c.n_head_kv = 8, c.n_ff = 27392;
        c.n_vocab = 102400, c.rope_base = 1000000, c.n_ctx = 131072, c.norm_eps = 1e-5;
    } else if (name == "ernie4.5-0.3b") {  // dense, tied output
        c.arch = "ernie4_5", c.tied_output = true, c.head_dim = 64;
        c.n_layer = 18, c.n_embd = 1024, c.n_head = 16, c.n_head_kv = 2, c.n_ff = 3072;
        c.n_vocab = 103424, c.rope_base = 500000, c.n_ctx = 131072, c.norm_eps = 1e-5;
    } else if (name == "ernie4.5-21b-a3b") {  // 64 experts of width 1536, 6 per token, 2 shared
        c.arch = "ernie4_5-moe", c.tied_output = true, c.head_dim = 128;
        c.n_layer = 28, c.n_layer_dense = 1, c.moe_step = 1, c.n_embd = 2560, c.n_head = 20;
        c.n_head_kv = 4, c.n_ff = 12288;
        c.n_expert = 64, c.n_expert_used = 6, c.n_ff_exp = 1536, c.n_expert_shared = 2;
        c.n_ff_shexp = 3072;
        c.n_vocab = 103424, c.rope_base = 500000, c.n_ctx = 131072, c.norm_eps = 1e-5;
    } else if (name == "tiny") {
        c.n_layer = 2, c.n_embd = 256, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 512;
        c.n_vocab = 512, c.rope_base = 10000, c.n_ctx = 2048, c.norm_eps = 1e-5;
    } else {
        std::string known;
        for (const auto& n : synthetic_preset_names()) known += (known.empty() ? "" : ", ") + n;
        throw Error(fmt::format("unknown synthetic model preset '{}'", name),
                    fmt::format("known presets: {}", known));
    }
    return c;
}

}  // namespace kvrun
