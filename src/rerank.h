// Reranking with a generative judge: a model such as Qwen3-Reranker (and its fine-tunes) reads
// a query and a document in a fixed prompt and answers "yes" or "no"; a document's relevance
// is the probability of "yes" against "no" after the prompt, P(yes) / (P(yes) + P(no)), read
// from the logits of the two tokens as the model's own reference code does. (llama.cpp's
// `--pooling rank` instead applies a classification head that such models do not have in
// their GGUF; BERT-style cross-encoders with such a head are not supported.)
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "backend.h"
#include "embedding.h"
#include "kv_block_table.h"
#include "tokenizer.h"

namespace kvrun {

// The judge prompt, in Qwen3-Reranker's format; "{instruction}", "{query}" and "{document}"
// stand for the request's texts.
extern const char* const kRerankTemplate;
// The task the default prompt states when a request gives none.
extern const char* const kRerankInstruction;

struct RerankJudge {
    TokenId yes = -1, no = -1;  // the vocabulary's one-token answers
    std::string prompt;         // the template (kRerankTemplate by default)
};
// The judge for this vocabulary and template: throws Error when the vocabulary has no
// one-token "yes" and "no", or the template lacks "{query}" or "{document}".
RerankJudge rerank_judge(const Tokenizer& tok, std::string prompt = kRerankTemplate);

// The prompt's tokens for one document: the template's own text with its special tokens, the
// request's texts as plain text (a document cannot write control tokens), BOS where the
// vocabulary adds one.
std::vector<TokenId> rerank_tokens(const Tokenizer& tok, const RerankJudge& judge,
                                   std::string_view instruction, std::string_view query,
                                   std::string_view document);

// P(yes) / (P(yes) + P(no)) for each prompt. The prompts are packed several to a forward
// pass of up to n_batch tokens (run_prompt_passes, embedding.h), each on a sequence of its
// own, freed before returning (also when it throws). Throws Error for a prompt longer than
// max_tokens or one the KV pool cannot hold, naming it "{names.what} {index}". `lora`: the
// LoRA scales to judge with (empty: the loaded ones).
std::vector<double> rerank_scores(Backend& backend, KvBlockTable& table, const RerankJudge& judge,
                                  const std::vector<std::vector<TokenId>>& prompts, int32_t n_batch,
                                  int32_t max_tokens, PromptNames names = {"document", 0},
                                  const std::vector<float>& lora = {});

}  // namespace kvrun
