// Multiple-choice evaluations as llama-perplexity scores them (acc_norm): for each question
// the candidates are tokenized as context + " " + answer (BOS as the vocabulary wants); the
// tokens they all share are computed once and forked (the paged cache shares their blocks);
// a candidate's score is the mean log-probability of its own tokens, the first scored from
// the shared part's last position; the model's choice is the best score (the first of equal
// ones).
//
// HellaSwag (--hellaswag): llama.cpp's hellaswag_val_full.txt layout, six lines per task —
// the context (activity label + ": " + context), the gold ending's index 0..3, the four
// endings; accuracy with a 95% Wilson interval.
// Multiple choice (--multiple-choice: ARC, MMLU, TruthfulQA as llama.cpp's binary files):
// u32 task count, u32 byte offset of each task, then per task a string question and two
// answer sets (mc1: one correct answer, the one scored; mc2: read, not scored), each a u32
// count (<= 100), that many strings and that many i32 labels (1: correct); a string is a u32
// byte count and the bytes.
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
struct ChoiceTask {
    std::string question;
    std::vector<std::string> answers;
    std::vector<int32_t> labels;  // [answers.size()], 1 for a correct answer
};

// Reads a multiple-choice file's tasks: n_tasks 0 (or at least the count) takes every task
// in file order, fewer draws them as llama.cpp does (std::mt19937 seeded 1, float scaling,
// swap-remove). `n_in_file` receives the count. Throws Error naming the problem for a
// truncated or malformed file (offsets, counts, empty or non-UTF-8 texts).
std::vector<ChoiceTask> multiple_choice_load(const std::string& bytes, const std::string& name,
                                             size_t n_tasks, size_t* n_in_file = nullptr);

struct ChoiceTaskResult {
    std::vector<double> score;  // per answer
    size_t chosen = 0;
    bool correct = false;
};

struct ChoiceScore {
    int64_t n_tasks = 0, n_correct = 0, n_answers = 0;
    double acc = 0, acc_sigma = 0;        // percent, and its standard error
    double chance = 0, chance_sigma = 0;  // percent a random pick would get
};

// Scores `tasks` in order, calling `on_task` after each. Throws Error when a task does not fit
// in the KV pool.
ChoiceScore multiple_choice_run(
    Backend& backend, const Tokenizer& tok, const std::vector<ChoiceTask>& tasks, int32_t n_batch,
    const std::function<void(size_t, const ChoiceTaskResult&, const ChoiceScore&)>& on_task = {});

// Winogrande (--winogrande): llama.cpp's CSV, one task per line "index,sentence,choice1,
// choice2,answer" (the sentence quoted when it holds commas; "_" marks the blank; answer 1 or
// 2). Each choice fills the blank; scored is the mean log-probability of what follows the
// blank, less the last token — or from the first differing token when either rest is 3
// tokens or fewer — and the higher score is the model's choice (2 on a tie).
struct WinograndeTask {
    std::string first, second;  // the sentence before and after the blank
    std::array<std::string, 2> choices;
    int32_t answer = 1;  // 1 or 2
};

// Parses the CSV; lines that are not tasks (a header, no blank, an answer other than 1 or 2,
// not UTF-8) are skipped and counted in `n_skipped`.
std::vector<WinograndeTask> winogrande_parse(const std::string& text, size_t* n_skipped);
// n tasks (0 or at least the count: all, in order) drawn as llama.cpp draws them.
std::vector<WinograndeTask> winogrande_select(std::vector<WinograndeTask> tasks, size_t n);

struct WinograndeTaskResult {
    std::array<double, 2> score{};
    int32_t chosen = 1;  // 1 or 2
    bool correct = false;
};

struct WinograndeScore {
    int64_t n_tasks = 0, n_correct = 0;
    double acc = 0, sigma = 0;  // percent and its standard error
};

WinograndeScore winogrande_run(Backend& backend, const Tokenizer& tok,
                               const std::vector<WinograndeTask>& tasks, int32_t n_batch,
                               const std::function<void(size_t, const WinograndeTaskResult&,
                                                        const WinograndeScore&)>& on_task = {});

HellaswagScore hellaswag_run(Backend& backend, const Tokenizer& tok,
                             const std::vector<HellaswagTask>& tasks, int32_t n_batch,
                             const std::function<void(size_t, const HellaswagTaskResult&,
                                                      const HellaswagScore&)>& on_task = {});

}  // namespace kvrun
