// Control vector generation (llama.cpp's cvector-generator, repeng's idea): pairs of prompts
// that differ in one trait (a positive and a negative version) run through the model; per
// layer, the difference of their last tokens' layer outputs points along the trait. The
// directions go into a control vector file (control_vector.h) that steers the model with
// --control-vector.
//
//   mean: per layer, the mean of the pairs' differences (its natural size: scale 1 moves a
//         negative prompt's layer output by the average gap to the positive one).
//   pca:  per layer, the first principal direction of the differences (the top right
//         singular vector of the pairs x n_embd matrix, not centred, so one pair gives its
//         own difference), unit length, signed to agree with the mean difference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend.h"
#include "tokenizer.h"

namespace kvrun {

enum class CvectorMethod { Pca, Mean };

// [pairs][n_layer][n_embd]: layer outputs of positives[i]'s last token minus negatives[i]'s,
// through the backend's layer observer (the CPU backend). Prompts are token ids (BOS
// included as wanted). Throws Error when the backend cannot observe layers, the lists differ
// in length or are empty, or a prompt does not fit (max_tokens).
std::vector<std::vector<std::vector<float>>> cvector_differences(
    Backend& backend, const std::vector<std::vector<TokenId>>& positives,
    const std::vector<std::vector<TokenId>>& negatives, int32_t n_batch, int32_t max_tokens);

// The first principal direction of `rows` (each n values; see pca above), after at most
// `iterations` power iterations (fewer once it settles). All-zero rows give all zeros.
std::vector<float> principal_direction(const std::vector<std::vector<float>>& rows,
                                       int32_t iterations);

// Directions [n_layer][n_embd] from the differences.
std::vector<std::vector<float>> cvector_directions(
    const std::vector<std::vector<std::vector<float>>>& differences, CvectorMethod method,
    int32_t pca_iterations);

// Writes llama.cpp's control vector GGUF: general.architecture "controlvector",
// controlvector.model_hint, controlvector.layer_count, and F32 "direction.L" for layers
// 1..n_layer-1 (layer 0 is never steered).
void cvector_write(const std::string& path, const std::vector<std::vector<float>>& directions,
                   const std::string& model_hint);

}  // namespace kvrun
