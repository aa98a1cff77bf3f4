// The log-probability the model gives each token of a text after the tokens before it (what
// OpenAI's "echo" with "logprobs" reports, and what lm-evaluation-harness reads to score
// continuations). Runs the text through the backend on a block table that other sequences
// may share (a server's engine, between its steps), in passes of at most n_batch tokens with
// every position's logits, and frees its sequence before returning, also when it throws.
#pragma once

#include <vector>

#include "backend.h"
#include "kv_block_table.h"
#include "sampler.h"

namespace kvrun {

// [tokens.size() - 1]: entry i is token i + 1's log-probability after tokens 0..i, with the
// n_top most likely tokens there, under the LoRA scales `lora` (empty: the loaded ones).
// Throws Error when the KV pool cannot hold the text.
std::vector<TokenLogprobs> prompt_logprobs(Backend& backend, KvBlockTable& table,
                                           const std::vector<TokenId>& tokens, int32_t n_top,
                                           int32_t n_batch, const std::vector<float>& lora = {});

}  // namespace kvrun
