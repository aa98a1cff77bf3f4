// LoRA adapters in llama.cpp's GGUF form (what its convert_lora_to_gguf.py writes from a PEFT
// directory): general.type "adapter", adapter.type "lora", the base model's
// general.architecture, adapter.lora.alpha, and for each adapted matrix W = "<name>.weight" of
// the base a pair "<name>.weight.lora_a" (GGUF dims {n_in, rank}) and "<name>.weight.lora_b"
// ({rank, n_out}). Applied at run time, unmerged: W x + scale * B (A x) with scale = the user's
// scale x alpha / rank (alpha 0: the user's scale), as llama.cpp does.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gguf.h"
#include "model_config.h"
#include "weights.h"

namespace kvrun {

struct LoraSpec {
    std::string path;
    float scale = 1.0f;  // --lora-scaled FILE SCALE (--lora: 1)
};

// The specs' user scales, one per adapter (Backend::lora_scales).
inline std::vector<float> lora_user_scales(const std::vector<LoraSpec>& specs) {
    std::vector<float> out;
    for (const LoraSpec& s : specs) out.push_back(s.scale);
    return out;
}

// One adapted matrix of an adapter: base matrix `name` ({n_in, n_out}) gains
// scale x per_unit x B A, with A = `a` ({n_in, rank}) and B = `b` ({rank, n_out}).
struct LoraPair {
    std::string name;
    const GgufTensorInfo* a = nullptr;
    const GgufTensorInfo* b = nullptr;
    int64_t n_in = 0, n_out = 0, rank = 0;
    double per_unit = 1.0;  // alpha / rank (1 without alpha)
};

// Opens an adapter and checks it against the base model file (general.type and adapter.type,
// the architecture `arch`, every tensor paired, a base matrix for each pair, every shape);
// `pairs` receives its matrices. Throws Error naming the file and tensor.
std::unique_ptr<GgufFile> lora_open(const LoraSpec& spec, const GgufFile& base,
                                    const std::string& arch, std::vector<LoraPair>& pairs);

// Opens each adapter, checks it against the base model `base` (architecture, tensor names,
// shapes, types) and appends its updates to `weights` (LayerWeights::lora_*, lora_output).
// The attention, output and dense FFN matrices can be adapted (a fused attn_qkv or gate/up
// ffn_up too: B's rows split like the matrix); token embeddings and experts cannot. Throws
// Error naming the file and tensor. The returned files hold the adapter weights: keep them
// as long as `weights`.
std::vector<std::unique_ptr<GgufFile>> lora_attach(ModelWeights& weights, const ModelConfig& c,
                                                   const GgufFile& base,
                                                   const std::vector<LoraSpec>& specs);

}  // namespace kvrun
