// HellaSwag scoring (see hellaswag.h).
#include "hellaswag.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include "common.h"
#include "kv_block_table.h"

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

HellaswagTaskResult score_task(KvBlockTable& table, Backend& backend, const Tokenizer& tok,
                               const HellaswagTask& task, int32_t n_batch) {
    std::array<std::vector<TokenId>, 4> seq_tokens;
    for (size_t s = 0; s < 4; ++s)
        seq_tokens[s] = tok.encode(task.context + " " + task.endings[s], tok.add_bos());
    size_t common = 0;
    while (common < seq_tokens[0].size() &&
           std::all_of(seq_tokens.begin() + 1, seq_tokens.end(), [&](const auto& t) {
               return common < t.size() && t[common] == seq_tokens[0][common];
           }))
        ++common;
    std::vector<std::vector<TokenId>> endings(4);
    for (size_t s = 0; s < 4; ++s)
        endings[s].assign(seq_tokens[s].begin() + std::ptrdiff_t(common), seq_tokens[s].end());

    // The shared tokens once: their last position scores every ending's first token.
    std::array<double, 4> sum{};
    std::array<int64_t, 4> count{};
    const SeqId base = table.create_sequence();
    const std::vector<TokenId> shared(seq_tokens[0].begin(),
                                      seq_tokens[0].begin() + std::ptrdiff_t(common));
    const auto first = feed(table, backend, {base}, {shared}, n_batch, [&](size_t, size_t i) {
        std::vector<TokenId> t;
        if (i + 1 == common)
            for (const auto& e : endings)
                if (!e.empty()) t.push_back(e[0]);
        return t;
    });
    for (size_t s = 0, k = 0; s < 4 && common > 0; ++s)
        if (!endings[s].empty()) sum[s] += first[0][k++], ++count[s];
    // Then each ending on its own fork of them (the paged cache shares their blocks).
    const std::vector<SeqId> seqs = {base, table.fork(base), table.fork(base), table.fork(base)};
    const auto rest = feed(table, backend, seqs, endings, n_batch, [&](size_t s, size_t i) {
        return i + 1 < endings[s].size() ? std::vector<TokenId>{endings[s][i + 1]}
                                         : std::vector<TokenId>{};
    });
    for (SeqId s : seqs) table.free_sequence(s);

    HellaswagTaskResult r;
    for (size_t s = 0; s < 4; ++s) {
        for (double x : rest[s]) sum[s] += x, ++count[s];
        r.score[s] =
            count[s] > 0 ? sum[s] / double(count[s]) : -std::numeric_limits<double>::infinity();
        if (r.score[s] > r.score[size_t(r.chosen)]) r.chosen = static_cast<int32_t>(s);
    }
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

}  // namespace kvrun
