// Text embeddings (llama-embedding): each prompt's final hidden states after the output
// norm, pooled per prompt (mean, first token, last token) or kept per token, then
// normalized. Prompts are packed into forward passes of up to n_batch tokens on the paged
// KV cache; a prompt longer than a pass continues in the next one.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend.h"
#include "gguf.h"
#include "kv_block_table.h"
#include "tokenizer.h"

namespace kvrun {

// llama.cpp's pooling types (the GGUF key {arch}.pooling_type numbers them 0..4).
enum class Pooling { None = 0, Mean = 1, Cls = 2, Last = 3, Rank = 4 };

// "none", "mean", "cls", "last", "rank"; nullopt for anything else.
std::optional<Pooling> pooling_from_name(std::string_view name);
const char* pooling_name(Pooling p);
// The model's {arch}.pooling_type, or None when the file has none (llama.cpp's default).
Pooling model_pooling(const GgufFile& file);

// One vector per prompt (pooled), or per token of every prompt in order (Pooling::None).
// Throws Error for an empty prompt, a prompt longer than max_tokens, Pooling::Rank (a
// reranker's classifier head, which kvrun does not load) or a KV pool too small for a
// prompt.
std::vector<std::vector<float>> compute_embeddings(Backend& backend,
                                                   const std::vector<std::vector<TokenId>>& prompts,
                                                   Pooling pooling, int32_t n_batch,
                                                   int32_t max_tokens);

// The same on `table`, a block table of the backend that other sequences may share (the
// server's engine, between its steps): the prompts' sequences are freed before it returns,
// also when it throws. `lora`: the LoRA scales to embed with (empty: the loaded ones).
std::vector<std::vector<float>> compute_embeddings(Backend& backend, KvBlockTable& table,
                                                   const std::vector<std::vector<TokenId>>& prompts,
                                                   Pooling pooling, int32_t n_batch,
                                                   int32_t max_tokens,
                                                   const std::vector<float>& lora = {});

// What errors call the prompts of run_prompt_passes: "{what} {index}", index from `first`.
struct PromptNames {
    const char* what = "prompt";
    int first = 1;
};

// Runs `prompts` through the backend on `table`, packed several to a forward pass of at most
// n_batch tokens (a prompt longer than a pass continues in the next one; compute_embeddings'
// and rerank_scores' engine). For each pass it builds the batch with the token rows
// `wanted(prompt, pos)` asks for as its logit rows, in order, and calls `run(batch, rows)`,
// rows[r] = (prompt, pos) of the batch's row r; the callback runs the batch (forward or
// forward_embeddings) and reads the rows. A pass where no row is wanted still runs, with
// `rows` empty and one filler row, to fill the cache. `lora`: every sequence's LoRA scales
// (ForwardBatch::set_lora_scales; empty: the loaded ones). Prompts' sequences are freed as
// they finish, and all of them when it throws: Error for an empty prompt, one longer than
// max_tokens, or a KV pool that cannot hold one.
void run_prompt_passes(
    Backend& backend, KvBlockTable& table, const std::vector<std::vector<TokenId>>& prompts,
    int32_t n_batch, int32_t max_tokens, const std::function<bool(size_t, int32_t)>& wanted,
    const std::function<void(const ForwardBatch&, const std::vector<std::pair<size_t, int32_t>>&)>&
        run,
    PromptNames names = {}, const std::vector<float>& lora = {});

// llama.cpp's --embd-normalize: -1 none, 0 max-abs scaled to the int16 range (32760),
// 1 taxicab, 2 euclidean (the default), p > 2 the p-norm. In place; a zero vector stays zero.
void normalize_embedding(std::vector<float>& v, int norm);

// Cosine similarity of two vectors of equal size (0 when either is zero).
double cosine_similarity(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace kvrun
