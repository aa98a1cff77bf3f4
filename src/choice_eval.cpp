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
#include "sampler.h"
#include "text_input.h"

namespace kvrun {
namespace {

// A token to score at a position: its log-probability goes to candidate `tag`'s sum.
struct Target {
    size_t tag;
    TokenId token;
};

// Appends toks[s] to seqs[s] for every s, in passes of at most n_batch tokens, and adds the
// log-probability of each of targets(s, i) (token i of toks[s]'s position predicting it) to
// sum[tag], counting it in count[tag]. Positions without targets compute no logits.
void feed(KvBlockTable& table, Backend& backend, const std::vector<SeqId>& seqs,
          const std::vector<std::vector<TokenId>>& toks, int32_t n_batch,
          const std::function<std::vector<Target>(size_t, size_t)>& targets,
          std::vector<double>& sum, std::vector<int64_t>& count) {
    const int64_t n_vocab = backend.config().n_vocab;
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
        std::vector<std::vector<Target>> rows;  // per logit row
        for (const Part& p : parts) {
            const int32_t offset = static_cast<int32_t>(fb.tokens.size());
            fb.add_sequence(table, seqs[p.s], p.start, p.n);
            for (int32_t i = 0; i < p.n; ++i) {
                std::vector<Target> t = targets(p.s, done[p.s] + size_t(i));
                if (t.empty()) continue;
                fb.logit_rows.push_back(offset + i);
                rows.push_back(std::move(t));
            }
        }
        if (fb.logit_rows.empty()) fb.logit_rows.push_back(0);  // the pass still fills the cache
        logits.resize(fb.logit_rows.size() * size_t(n_vocab));
        backend.forward(fb, logits.data());
        for (size_t r = 0; r < rows.size(); ++r)
            for (const Target& t : rows[r]) {
                sum[t.tag] += token_logprobs(logits.data() + r * size_t(n_vocab),
                                             static_cast<int>(n_vocab), t.token, 0)
                                  .chosen.logprob;
                ++count[t.tag];
            }
        for (const Part& p : parts) done[p.s] += size_t(p.n);
    }
}

// The number of leading tokens every candidate has in common.
size_t shared_prefix(const std::vector<std::vector<TokenId>>& candidates) {
    size_t common = 0;
    while (common < candidates[0].size() &&
           std::all_of(candidates.begin() + 1, candidates.end(), [&](const auto& t) {
               return common < t.size() && t[common] == candidates[0][common];
           }))
        ++common;
    return common;
}

// The mean log-probability of tokens [from[c], to[c]) of each candidate c (1 <= from; -inf
// for an empty range). The tokens all candidates share are computed once, then each
// candidate's own tokens on a fork of them (the paged cache shares their blocks).
std::vector<double> mean_logprobs(KvBlockTable& table, Backend& backend,
                                  const std::vector<std::vector<TokenId>>& candidates,
                                  const std::vector<size_t>& from, const std::vector<size_t>& to,
                                  int32_t n_batch) {
    const size_t n = candidates.size();
    const size_t common = shared_prefix(candidates);
    // Position i predicts token i + 1: every candidate that scores it.
    auto targets_at = [&](size_t pos) {
        std::vector<Target> t;
        for (size_t c = 0; c < n; ++c)
            if (pos + 1 >= from[c] && pos + 1 < to[c]) t.push_back({c, candidates[c][pos + 1]});
        return t;
    };
    std::vector<double> sum(n, 0.0);
    std::vector<int64_t> count(n, 0);
    const SeqId base = table.create_sequence();
    const std::vector<TokenId> shared(candidates[0].begin(),
                                      candidates[0].begin() + std::ptrdiff_t(common));
    feed(
        table, backend, {base}, {shared}, n_batch, [&](size_t, size_t i) { return targets_at(i); },
        sum, count);
    std::vector<SeqId> seqs = {base};
    while (seqs.size() < n) seqs.push_back(table.fork(base));
    std::vector<std::vector<TokenId>> own(n);
    for (size_t c = 0; c < n; ++c)
        own[c].assign(candidates[c].begin() + std::ptrdiff_t(common), candidates[c].end());
    feed(
        table, backend, seqs, own, n_batch,
        [&](size_t c, size_t i) {
            std::vector<Target> t;
            const size_t pos = common + i;
            if (pos + 1 >= from[c] && pos + 1 < to[c]) t.push_back({c, candidates[c][pos + 1]});
            return t;
        },
        sum, count);
    for (SeqId s : seqs) table.free_sequence(s);
    std::vector<double> score(n);
    for (size_t c = 0; c < n; ++c)
        score[c] =
            count[c] > 0 ? sum[c] / double(count[c]) : -std::numeric_limits<double>::infinity();
    return score;
}

// llama.cpp's acc_norm scoring: every token of each candidate after the shared ones.
std::vector<double> score_candidates(KvBlockTable& table, Backend& backend,
                                     const std::vector<std::vector<TokenId>>& candidates,
                                     int32_t n_batch) {
    const size_t common = shared_prefix(candidates);
    std::vector<size_t> from(candidates.size(), std::max<size_t>(common, 1)), to;
    for (const auto& c : candidates) to.push_back(c.size());
    return mean_logprobs(table, backend, candidates, from, to, n_batch);
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

namespace {

// llama.cpp's draw of n of `count` tasks: std::mt19937 seeded 1, a float-scaled index into
// those left, swap-remove.
std::vector<size_t> draw_indices(size_t count, size_t n) {
    std::mt19937 rng(1);
    std::vector<size_t> left(count), out;
    for (size_t i = 0; i < count; ++i) left[i] = i;
    const float scale = 1.f / (1.f + static_cast<float>(std::mt19937::max()));
    for (size_t k = 0; k < std::min(n, count); ++k) {
        // float arithmetic, as llama.cpp computes it (the draw depends on its rounding)
        const float x = scale * static_cast<float>(rng()) * static_cast<float>(left.size());
        const size_t j = std::min(static_cast<size_t>(x), left.size() - 1);
        out.push_back(left[j]);
        left[j] = left.back();
        left.pop_back();
    }
    return out;
}

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
    for (const size_t idx : draw_indices(count, n_tasks)) {
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

std::vector<WinograndeTask> winogrande_parse(const std::string& text, size_t* n_skipped) {
    std::vector<WinograndeTask> out;
    size_t skipped = 0;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) continue;
        // index,sentence,choice1,choice2,answer: the first four commas outside quotes.
        std::vector<size_t> comma;
        bool quoted = false;
        for (size_t i = 0; i < line.size() && comma.size() < 4; ++i) {
            if (line[i] == '"') quoted = !quoted;
            if (line[i] == ',' && !quoted) comma.push_back(i);
        }
        const std::string answer = comma.size() == 4 ? line.substr(comma[3] + 1) : "";
        if (comma.size() != 4 || (answer != "1" && answer != "2")) {
            ++skipped;
            continue;
        }
        std::string sentence = line.substr(comma[0] + 1, comma[1] - comma[0] - 1);
        if (sentence.size() >= 2 && sentence.front() == '"' && sentence.back() == '"')
            sentence = sentence.substr(1, sentence.size() - 2);
        const size_t blank = sentence.find('_');
        if (blank == std::string::npos || utf8_find_invalid(line) != std::string::npos) {
            ++skipped;
            continue;
        }
        WinograndeTask t;
        t.first = sentence.substr(0, blank);
        t.second = sentence.substr(blank + 1);
        t.choices[0] = line.substr(comma[1] + 1, comma[2] - comma[1] - 1);
        t.choices[1] = line.substr(comma[2] + 1, comma[3] - comma[2] - 1);
        t.answer = answer[0] - '0';
        out.push_back(std::move(t));
    }
    if (n_skipped) *n_skipped = skipped;
    return out;
}

std::vector<WinograndeTask> winogrande_select(std::vector<WinograndeTask> tasks, size_t n) {
    if (n == 0 || n >= tasks.size()) return tasks;
    std::vector<WinograndeTask> out;
    for (const size_t i : draw_indices(tasks.size(), n)) out.push_back(std::move(tasks[i]));
    return out;
}

WinograndeScore winogrande_run(Backend& backend, const Tokenizer& tok,
                               const std::vector<WinograndeTask>& tasks, int32_t n_batch,
                               const std::function<void(size_t, const WinograndeTaskResult&,
                                                        const WinograndeScore&)>& on_task) {
    if (n_batch < 1) fail("Winogrande: the batch size must be at least 1 (got {})", n_batch);
    constexpr size_t kMinTrailing = 3;  // llama.cpp's k_min_trailing_ctx
    KvBlockTable table = kv_table_for(backend);
    WinograndeScore sc;
    for (size_t i = 0; i < tasks.size(); ++i) {
        const WinograndeTask& t = tasks[i];
        std::vector<std::vector<TokenId>> seqs;
        std::vector<size_t> n_base;
        for (const std::string& c : t.choices) {
            seqs.push_back(tok.encode(t.first + c + t.second, tok.add_bos()));
            n_base.push_back(tok.encode(t.first + c, tok.add_bos()).size());
        }
        // Score what follows the blank (the choice's effect on the rest of the sentence), but
        // the choice too when that rest is short; not the last token (the final period).
        const size_t common = shared_prefix(seqs);
        const bool skip_choice =
            seqs[0].size() - common > kMinTrailing && seqs[1].size() - common > kMinTrailing;
        std::vector<size_t> from(2), to(2);
        for (size_t c = 0; c < 2; ++c) {
            from[c] = std::max<size_t>(skip_choice ? n_base[c] : common, 1);
            to[c] = seqs[c].size() > from[c] + 1 ? seqs[c].size() - 1 : seqs[c].size();
        }
        const std::vector<double> score = mean_logprobs(table, backend, seqs, from, to, n_batch);
        WinograndeTaskResult r;
        r.score = {score[0], score[1]};
        r.chosen = score[0] > score[1] ? 1 : 2;
        r.correct = r.chosen == t.answer;
        sc.n_tasks += 1;
        sc.n_correct += r.correct ? 1 : 0;
        const double n = double(sc.n_tasks), p = double(sc.n_correct) / n;
        sc.acc = 100 * p;
        sc.sigma = n > 1 ? 100 * std::sqrt(p * (1 - p) / (n - 1)) : 0;
        if (on_task) on_task(i, r, sc);
    }
    return sc;
}

}  // namespace kvrun
