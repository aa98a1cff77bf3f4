// Control vectors (llama.cpp's --control-vector): a direction per layer added to the residual
// stream after that layer's feed-forward block, steering the model (e.g. towards a mood). The
// files are llama.cpp's (its cvector-generator and repeng write them): GGUF with
// general.architecture "controlvector" and an F32 (or F16) tensor "direction.N" of n_embd
// values for layer N (N >= 1: counted as the model's layers from 0, so layer 0's output is
// never steered, as in llama.cpp). Several files add up, each times its scale;
// --control-vector-layer-range START END keeps only layers START..END.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model_config.h"

namespace kvrun {

struct ControlVectorSpec {
    std::string path;
    float scale = 1.0f;
};

struct ControlVectorOptions {
    std::vector<ControlVectorSpec> specs;
    int32_t layer_start = -1;  // -1: from the first layer a file steers
    int32_t layer_end = -1;    // -1: to the last
    bool empty() const { return specs.empty(); }
};

// The summed, scaled directions: [n_layer][n_embd], layers without one all zero, and
// `steered[l]` telling which layers have one. Throws Error naming the file and tensor for a
// file that is not a control vector, a direction of the wrong size or type, a layer outside
// 1..n_layer-1, or a bad layer range.
struct ControlVector {
    std::vector<float> values;
    std::vector<bool> steered;
    bool empty() const { return values.empty(); }
};
ControlVector control_vector_load(const ControlVectorOptions& o, const ModelConfig& c);

}  // namespace kvrun
