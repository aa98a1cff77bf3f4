// HellaSwag scoring (see hellaswag.h).
#include "choice_eval.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

#include "common.h"
#include "kv_block_table.h"
#include "text_input.h"

namespace kvrun {
namespace {

// log p(t) under the softmax of `logits`, in double.
double token_logprob(const float* logits, int64_t n, TokenId t) {
    float mx = logits[0];
    for (int64_t i = 1; i < n; ++i) mx = std::max(mx, logits[i]);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - mx);
    return double(logits[t]) - mx - std::log(sum);
}

// Appends toks[s] to seqs[s] for every s, in passes of at most n_batch tokens, and returns,
// per sequence, the log-probabilities of targets(s, i) at each new position i, in position
// order then target order (no targets: the position's logits are not computed).
std::vector<std::vector<double>> feed(
    KvBlockTable& table, Backend& backend, const std::vector<SeqId>& seqs,
    const std::vector<std::vector<TokenId>>& toks, int32_t n_batch,
    const std::function<std::vector<TokenId>(size_t, size_t)>& targets) {
    const int64_t n_vocab = backend.config().n_vocab;
    std::vector<std::vector<double>> out(seqs.size());
    std::vector<size_t> done(seqs.size(), 0);
    std::vector<float> logits;
    for (;;) {
        struct Part {
            size_t s;
            int32_t start, n;
        };
        std::vector<Part> parts;
        int32_t budget = n_batch;
        for (size_t s = 0; s < seqs.size() && budget > 0; ++s) {
            const int32_t n = static_cast<int32_t>(
                std::min<size_t>(toks[s].size() - done[s], static_cast<size_t>(budget)));
            if (n == 0) continue;
            const int32_t start = table.n_tokens(seqs[s]);
            const KvAppendResult r = table.append(seqs[s], n, toks[s].data() + done[s]);
            if (!r)
                throw Error(
                    fmt::format("HellaSwag: a task does not fit in the KV pool ({})", r.reason()),
                    "give a larger -c or --kv-memory");
            parts.push_back({s, start, n});
            budget -= n;
        }
        if (parts.empty()) break;
        kv_apply_pending(table, backend);
        ForwardBatch fb;
        std::vector<std::pair<size_t, std::vector<TokenId>>> rows;  // per logit row
        for (const Part& p : parts) {
            const int32_t offset = static_cast<int32_t>(fb.tokens.size());
            fb.add_sequence(table, seqs[p.s], p.start, p.n);
            for (int32_t i = 0; i < p.n; ++i) {
                std::vector<TokenId> t = targets(p.s, done[p.s] + size_t(i));
                if (t.empty()) continue;
                fb.logit_rows.push_back(offset + i);
                rows.emplace_back(p.s, std::move(t));
            }
        }
        const bool none = fb.logit_rows.empty();
        if (none) fb.logit_rows.push_back(0);  // the pass still fills the cache
        logits.resize(fb.logit_rows.size() * size_t(n_vocab));
        backend.forward(fb, logits.data());
        for (size_t r = 0; r < rows.size(); ++r)
            for (TokenId t : rows[r].second)
                out[rows[r].first].push_back(
                    token_logprob(logits.data() + r * size_t(n_vocab), n_vocab, t));
        for (const Part& p : parts) done[p.s] += size_t(p.n);
    }
    return out;
}

// llama.cpp's acc_norm scoring of one question: the mean log-probability of each candidate's
// tokens after the tokens all candidates share (-inf for a candidate with none of its own).
std::vector<double> score_candidates(KvBlockTable& table, Backend& backend,
                                     const std::vector<std::vector<TokenId>>& candidates,
                                     int32_t n_batch) {
    const size_t n = candidates.size();
    size_t common = 0;
    while (common < candidates[0].size() &&
           std::all_of(candidates.begin() + 1, candidates.end(), [&](const auto& t) {
               return common < t.size() && t[common] == candidates[0][common];
           }))
        ++common;
    std::vector<std::vector<TokenId>> own(n);
    for (size_t s = 0; s < n; ++s)
        own[s].assign(candidates[s].begin() + std::ptrdiff_t(common), candidates[s].end());

    // The shared tokens once: their last position scores every candidate's first token.
    std::vector<double> sum(n, 0.0);
    std::vector<int64_t> count(n, 0);
    const SeqId base = table.create_sequence();
    const std::vector<TokenId> shared(candidates[0].begin(),
                                      candidates[0].begin() + std::ptrdiff_t(common));
    const auto first = feed(table, backend, {base}, {shared}, n_batch, [&](size_t, size_t i) {
        std::vector<TokenId> t;
        if (i + 1 == common)
            for (const auto& e : own)
                if (!e.empty()) t.push_back(e[0]);
        return t;
    });
    for (size_t s = 0, k = 0; s < n && common > 0; ++s)
        if (!own[s].empty()) sum[s] += first[0][k++], ++count[s];
    // Then each candidate on its own fork of them (the paged cache shares their blocks).
    std::vector<SeqId> seqs = {base};
    while (seqs.size() < n) seqs.push_back(table.fork(base));
    const auto rest = feed(table, backend, seqs, own, n_batch, [&](size_t s, size_t i) {
        return i + 1 < own[s].size() ? std::vector<TokenId>{own[s][i + 1]} : std::vector<TokenId>{};
    });
    for (SeqId s : seqs) table.free_sequence(s);

    std::vector<double> score(n);
    for (size_t s = 0; s < n; ++s) {
        for (double x : rest[s]) sum[s] += x, ++count[s];
        score[s] =
            count[s] > 0 ? sum[s] / double(count[s]) : -std::numeric_limits<double>::infinity();
    }
    return score;
}

// The first candidate of the highest score.
size_t best_of(const std::vector<double>& score) {
    size_t best = 0;
    for (size_t s = 1; s < score.size(); ++s)
        if (score[s] > score[best]) best = s;
    return best;
}

std::vector<TokenId> candidate_tokens(const Tokenizer& tok, const std::string& context,
                                      const std::string& answer) {
    return tok.encode(context + " " + answer, tok.add_bos());
}

HellaswagTaskResult score_task(KvBlockTable& table, Backend& backend, const Tokenizer& tok,
                               const HellaswagTask& task, int32_t n_batch) {
    std::vector<std::vector<TokenId>> candidates;
    for (const std::string& e : task.endings)
        candidates.push_back(candidate_tokens(tok, task.context, e));
    const std::vector<double> score = score_candidates(table, backend, candidates, n_batch);
    HellaswagTaskResult r;
    std::copy(score.begin(), score.end(), r.score.begin());
    r.chosen = static_cast<int32_t>(best_of(score));
    r.correct = r.chosen == task.gold;
    return r;
}

}  // namespace

std::vector<HellaswagTask> hellaswag_parse(const std::string& text, const std::string& name) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        lines.push_back(std::move(line));
    }
    if (lines.empty() || lines.size() % 6 != 0)
        throw Error(fmt::format("{}: {} lines, not a multiple of 6 (HellaSwag tasks: context, "
                                "gold index, four endings)",
                                name, lines.size()),
                    "use llama.cpp's hellaswag_val_full.txt layout");
    std::vector<HellaswagTask> tasks(lines.size() / 6);
    for (size_t i = 0; i < tasks.size(); ++i) {
        HellaswagTask& t = tasks[i];
        t.context = lines[6 * i];
        const std::string& gold = lines[6 * i + 1];
        if (gold.size() != 1 || gold[0] < '0' || gold[0] > '3')
            throw Error(fmt::format("{}:{}: the gold ending index is '{}', not 0..3", name,
                                    6 * i + 2, gold),
                        "use llama.cpp's hellaswag_val_full.txt layout");
        t.gold = gold[0] - '0';
        for (size_t e = 0; e < 4; ++e) t.endings[e] = lines[6 * i + 2 + e];
    }
    return tasks;
}

std::vector<HellaswagTask> hellaswag_select(std::vector<HellaswagTask> tasks, size_t n) {
    std::mt19937 rng(1);
    std::vector<HellaswagTask> out;
    n = std::min(n, tasks.size());
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        std::uniform_int_distribution<size_t> pick(0, tasks.size() - 1);
        const size_t at = pick(rng);
        out.push_back(std::move(tasks[at]));
        tasks.erase(tasks.begin() + std::ptrdiff_t(at));
    }
    return out;
}

HellaswagScore hellaswag_score(int64_t n_correct, int64_t n_tasks) {
    HellaswagScore s;
    s.n_tasks = n_tasks;
    s.n_correct = n_correct;
    if (n_tasks <= 0) return s;
    const double n = double(n_tasks), p = double(n_correct) / n;
    const double z = 1.959963984540054, z2 = z * z;
    // Wilson score interval.
    const double center = (p + z2 / (2 * n)) / (1 + z2 / n);
    const double half = z / (1 + z2 / n) * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n));
    s.acc = 100 * p;
    s.lo = 100 * (center - half);
    s.hi = 100 * (center + half);
    return s;
}

HellaswagScore hellaswag_run(
    Backend& backend, const Tokenizer& tok, const std::vector<HellaswagTask>& tasks,
    int32_t n_batch,
    const std::function<void(size_t, const HellaswagTaskResult&, const HellaswagScore&)>& on_task) {
    if (n_batch < 1) fail("HellaSwag: the batch size must be at least 1 (got {})", n_batch);
    KvBlockTable table = kv_table_for(backend);
    int64_t correct = 0;
    HellaswagScore score;
    for (size_t i = 0; i < tasks.size(); ++i) {
        const HellaswagTaskResult r = score_task(table, backend, tok, tasks[i], n_batch);
        correct += r.correct ? 1 : 0;
        score = hellaswag_score(correct, int64_t(i + 1));
        if (on_task) on_task(i, r, score);
    }
    return score;
}

namespace {

// A cursor over a multiple-choice file that throws the file's Error on any overrun.
struct ChoiceReader {
    const std::string& bytes;
    const std::string& name;
    size_t at = 0;

    [[noreturn]] void bad(const std::string& what) const {
        throw Error(fmt::format("{}: {} (byte {})", name, what, at),
                    "use llama.cpp's multiple-choice files (ARC, MMLU, TruthfulQA)");
    }
    uint32_t u32() {
        if (bytes.size() - at < 4 || at > bytes.size()) bad("the file ends inside a number");
        uint32_t v;
        std::memcpy(&v, bytes.data() + at, 4);
        at += 4;
        return v;
    }
    std::string text(const char* what) {
        const uint32_t n = u32();
        if (n > bytes.size() - at) bad(fmt::format("{} runs past the end of the file", what));
        std::string s = bytes.substr(at, n);
        at += n;
        if (utf8_find_invalid(s) != std::string::npos) bad(fmt::format("{} is not UTF-8", what));
        return s;
    }
    ChoiceTask task(size_t index) {
        ChoiceTask t;
        t.question = text("a question");
        for (int set = 0; set < 2; ++set) {  // mc1, then mc2 (read to validate, not scored)
            const uint32_t n = u32();
            if (n == 0 || n > 100)
                bad(fmt::format("task {} has {} answers (1..100)", index + 1, n));
            std::vector<std::string> answers(n);
            for (auto& a : answers) a = text("an answer");
            std::vector<int32_t> labels(n);
            for (auto& l : labels) l = static_cast<int32_t>(u32());
            if (set == 0) {
                t.answers = std::move(answers);
                t.labels = std::move(labels);
            }
        }
        if (t.question.empty()) bad(fmt::format("task {} has an empty question", index + 1));
        for (const auto& a : t.answers)
            if (a.empty()) bad(fmt::format("task {} has an empty answer", index + 1));
        return t;
    }
};

}  // namespace

std::vector<ChoiceTask> multiple_choice_load(const std::string& bytes, const std::string& name,
                                             size_t n_tasks, size_t* n_in_file) {
    ChoiceReader r{bytes, name};
    const uint32_t count = r.u32();
    if (count == 0) r.bad("no tasks");
    if (count > (bytes.size() - 4) / 4) r.bad(fmt::format("{} tasks do not fit the file", count));
    std::vector<uint32_t> pos(count);
    for (auto& p : pos) p = r.u32();
    if (n_in_file) *n_in_file = count;
    std::vector<ChoiceTask> out;
    if (n_tasks == 0 || n_tasks >= count) {
        for (size_t i = 0; i < count; ++i) out.push_back(r.task(i));
        return out;
    }
    std::mt19937 rng(1);
    std::vector<uint32_t> left(count);
    for (uint32_t i = 0; i < count; ++i) left[i] = i;
    const float scale = 1.f / (1.f + static_cast<float>(std::mt19937::max()));
    for (size_t k = 0; k < n_tasks; ++k) {
        const float x = scale * static_cast<float>(rng()) * static_cast<float>(left.size());
        const size_t j = std::min(static_cast<size_t>(x), left.size() - 1);
        const uint32_t idx = left[j];
        left[j] = left.back();
        left.pop_back();
        if (pos[idx] >= bytes.size())
            r.bad(fmt::format("task {}'s offset is past the end", idx + 1));
        r.at = pos[idx];
        out.push_back(r.task(idx));
    }
    return out;
}

ChoiceScore multiple_choice_run(
    Backend& backend, const Tokenizer& tok, const std::vector<ChoiceTask>& tasks, int32_t n_batch,
    const std::function<void(size_t, const ChoiceTaskResult&, const ChoiceScore&)>& on_task) {
    if (n_batch < 1) fail("multiple choice: the batch size must be at least 1 (got {})", n_batch);
    KvBlockTable table = kv_table_for(backend);
    ChoiceScore sc;
    for (size_t i = 0; i < tasks.size(); ++i) {
        const ChoiceTask& t = tasks[i];
        std::vector<std::vector<TokenId>> candidates;
        for (const std::string& a : t.answers)
            candidates.push_back(candidate_tokens(tok, t.question, a));
        ChoiceTaskResult r;
        r.score = score_candidates(table, backend, candidates, n_batch);
        r.chosen = best_of(r.score);
        r.correct = t.labels[r.chosen] == 1;
        sc.n_tasks += 1;
        sc.n_correct += r.correct ? 1 : 0;
        sc.n_answers += static_cast<int64_t>(t.answers.size());
        const double n = double(sc.n_tasks);
        const double p = double(sc.n_correct) / n, q = n / double(sc.n_answers);
        sc.acc = 100 * p;
        sc.chance = 100 * q;
        sc.acc_sigma = n > 1 ? 100 * std::sqrt(p * (1 - p) / (n - 1)) : 0;
        sc.chance_sigma = n > 1 ? 100 * std::sqrt(q * (1 - q) / (n - 1)) : 0;
        if (on_task) on_task(i, r, sc);
    }
    return sc;
}

}  // namespace kvrun
