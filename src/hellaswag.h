// HellaSwag scoring as llama-perplexity's --hellaswag does it: for each task a context and
// four endings; the model's choice is the ending whose tokens have the highest mean
// log-probability after the context ("acc_norm"); the score is the share of tasks where that
// is the gold ending, with a 95% Wilson interval.
//
// Task file (llama.cpp's hellaswag_val_full.txt layout): six lines per task — the context
// (activity label + ": " + context), the gold ending's index 0..3, then the four endings.
// Each candidate is tokenized as context + " " + ending (BOS as the vocabulary wants); the
// tokens the four share are computed once and forked (the paged cache shares their blocks),
// and every ending token is scored, the first from the shared part's last position.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend.h"
#include "tokenizer.h"

namespace kvrun {

struct HellaswagTask {
    std::string context;
    int32_t gold = 0;  // 0..3
    std::array<std::string, 4> endings;
};

// Parses a task file; `name` is used in errors. Throws Error when the line count is not a
// multiple of six or a gold index is not 0..3.
std::vector<HellaswagTask> hellaswag_parse(const std::string& text, const std::string& name);

// llama.cpp's selection: n tasks (all when n >= the count) drawn one by one uniformly from
// those left, with std::mt19937 seeded 1, so the same file gives the same tasks in the same
// order on every run (and as llama-perplexity built with the same C++ library).
std::vector<HellaswagTask> hellaswag_select(std::vector<HellaswagTask> tasks, size_t n);

struct HellaswagTaskResult {
    std::array<double, 4> score{};  // mean log-probability of each ending's tokens
    int32_t chosen = 0;             // argmax (the first of equal scores)
    bool correct = false;
};

struct HellaswagScore {
    int64_t n_tasks = 0, n_correct = 0;
    double acc = 0, lo = 0, hi = 0;  // percent: accuracy and its 95% Wilson interval
};
HellaswagScore hellaswag_score(int64_t n_correct, int64_t n_tasks);

// Scores `tasks` in order on `backend` (passes of at most n_batch tokens), calling `on_task`
// after each with the task's result and the running score. Throws Error when a task does not
// fit in the KV pool.
HellaswagScore hellaswag_run(Backend& backend, const Tokenizer& tok,
                             const std::vector<HellaswagTask>& tasks, int32_t n_batch,
                             const std::function<void(size_t, const HellaswagTaskResult&,
                                                      const HellaswagScore&)>& on_task = {});

}  // namespace kvrun
