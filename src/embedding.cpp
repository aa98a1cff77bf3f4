#include "embedding.h"

#include <algorithm>
#include <cmath>

#include "common.h"
#include "kv_block_table.h"

namespace kvrun {
namespace {

constexpr const char* kPoolingNames[] = {"none", "mean", "cls", "last", "rank"};

// A prompt being embedded: its sequence and how many of its tokens have been computed.
struct Active {
    size_t prompt = 0;
    SeqId seq = 0;
    int32_t done = 0;
};

// A pass's share of one prompt: tokens [start, start + n).
struct Part {
    size_t active = 0;  // index into the active list
    int32_t start = 0, n = 0;
};

}  // namespace

std::optional<Pooling> pooling_from_name(std::string_view name) {
    for (int i = 0; i < 5; ++i)
        if (name == kPoolingNames[i]) return Pooling(i);
    return std::nullopt;
}

const char* pooling_name(Pooling p) {
    return kPoolingNames[int(p)];
}

Pooling model_pooling(const GgufFile& file) {
    const std::string arch = file.get_string_or("general.architecture", "llama");
    const int64_t v = file.get_int_or(arch + ".pooling_type", 0);
    if (v < 0 || v > 4)
        file.fail_key(arch + ".pooling_type", fmt::format("unknown pooling type {}", v));
    return Pooling(v);
}

std::vector<std::vector<float>> compute_embeddings(Backend& backend,
                                                   const std::vector<std::vector<TokenId>>& prompts,
                                                   Pooling pooling, int32_t n_batch,
                                                   int32_t max_tokens) {
    KvBlockTable table = kv_table_for(backend);
    return compute_embeddings(backend, table, prompts, pooling, n_batch, max_tokens);
}

void run_prompt_passes(
    Backend& backend, KvBlockTable& table, const std::vector<std::vector<TokenId>>& prompts,
    int32_t n_batch, int32_t max_tokens, const std::function<bool(size_t, int32_t)>& wanted,
    const std::function<void(const ForwardBatch&, const std::vector<std::pair<size_t, int32_t>>&)>&
        run,
    PromptNames names, const std::vector<float>& lora) {
    for (size_t p = 0; p < prompts.size(); ++p) {
        const size_t n = prompts[p].size();
        if (n == 0) fail("{} {} has no tokens", names.what, p + size_t(names.first));
        if (int64_t(n) > max_tokens)
            throw Error(fmt::format("{} {} has {} tokens, more than the context of {}", names.what,
                                    p + size_t(names.first), n, max_tokens),
                        "give a larger -c, or a shorter text");
    }
    n_batch = std::max(n_batch, 1);
    std::vector<Active> active;
    // The table may be shared (a server's engine): sequences of a failed call go back too.
    struct FreeOnError {
        KvBlockTable& table;
        std::vector<Active>& active;
        ~FreeOnError() {
            for (const Active& a : active) table.free_sequence(a.seq);
        }
    } free_on_error{table, active};
    size_t next = 0;
    while (next < prompts.size() || !active.empty()) {
        // Fill a pass: the prompt left unfinished by the last pass, then new ones.
        std::vector<Part> parts;
        int32_t budget = n_batch;
        for (size_t a = 0; a < active.size() && budget > 0; ++a) {
            const std::vector<TokenId>& toks = prompts[active[a].prompt];
            const int32_t n = std::min(budget, int32_t(toks.size()) - active[a].done);
            const KvAppendResult r = table.append(active[a].seq, n, toks.data() + active[a].done);
            if (!r) {
                if (parts.empty())
                    fail("KV pool exhausted at {} {} ({})", names.what,
                         active[a].prompt + size_t(names.first), r.reason());
                break;
            }
            parts.push_back({a, active[a].done, n});
            budget -= n;
        }
        while (budget > 0 && next < prompts.size()) {
            const std::vector<TokenId>& toks = prompts[next];
            const int32_t n = std::min(budget, int32_t(toks.size()));
            const SeqId seq = table.create_sequence();
            const KvAppendResult r = table.append(seq, n, toks.data());
            if (!r) {
                table.free_sequence(seq);
                if (parts.empty())
                    throw Error(fmt::format("the KV pool cannot hold {} {} ({})", names.what,
                                            next + size_t(names.first), r.reason()),
                                "give a larger --kv-memory or -c");
                break;
            }
            active.push_back({next++, seq, 0});
            parts.push_back({active.size() - 1, 0, n});
            budget -= n;
        }
        kv_apply_pending(table, backend);

        ForwardBatch fb;
        std::vector<std::pair<size_t, int32_t>> rows;  // per output row: (prompt, position)
        for (const Part& part : parts) {
            const Active& a = active[part.active];
            const int32_t offset = fb.add_sequence(table, a.seq, part.start, part.n);
            if (!lora.empty()) fb.set_lora_scales(int32_t(fb.block_tables.size()) - 1, lora);
            for (int32_t i = 0; i < part.n; ++i) {
                if (!wanted(a.prompt, part.start + i)) continue;
                fb.logit_rows.push_back(offset + i);
                rows.emplace_back(a.prompt, part.start + i);
            }
        }
        if (fb.logit_rows.empty()) fb.logit_rows.push_back(0);  // the pass still fills the cache
        run(fb, rows);
        // Finished prompts give their blocks back.
        for (const Part& part : parts) active[part.active].done += part.n;
        std::vector<Active> still;
        for (const Active& a : active) {
            if (a.done == int32_t(prompts[a.prompt].size()))
                table.free_sequence(a.seq);
            else
                still.push_back(a);
        }
        active = std::move(still);
    }
}

std::vector<std::vector<float>> compute_embeddings(Backend& backend, KvBlockTable& table,
                                                   const std::vector<std::vector<TokenId>>& prompts,
                                                   Pooling pooling, int32_t n_batch,
                                                   int32_t max_tokens,
                                                   const std::vector<float>& lora) {
    if (pooling == Pooling::Rank)
        throw Error(
            "--pooling rank needs a reranker's classification head, which kvrun does not load",
            "use mean, cls, last or none");
    const int64_t n_embd = backend.config().n_embd;
    std::vector<size_t> first_row(prompts.size() + 1, 0);  // output index of each prompt
    for (size_t p = 0; p < prompts.size(); ++p)
        first_row[p + 1] = first_row[p] + (pooling == Pooling::None ? prompts[p].size() : 1);
    std::vector<std::vector<float>> out(first_row.back(), std::vector<float>(size_t(n_embd), 0.0f));
    std::vector<float> hidden;
    auto wanted = [&](size_t p, int32_t pos) {
        return pooling == Pooling::None || pooling == Pooling::Mean ||
               (pooling == Pooling::Cls && pos == 0) ||
               (pooling == Pooling::Last && pos == int32_t(prompts[p].size()) - 1);
    };
    auto run = [&](const ForwardBatch& fb, const std::vector<std::pair<size_t, int32_t>>& rows) {
        hidden.resize(fb.logit_rows.size() * size_t(n_embd));
        backend.forward_embeddings(fb, hidden.data());
        for (size_t r = 0; r < rows.size(); ++r) {
            const auto [p, pos] = rows[r];
            const float* h = hidden.data() + r * size_t(n_embd);
            if (pooling == Pooling::None) {
                std::copy(h, h + n_embd, out[first_row[p] + size_t(pos)].begin());
            } else if (pooling == Pooling::Mean) {
                std::vector<float>& v = out[first_row[p]];
                const float w = 1.0f / float(prompts[p].size());
                for (int64_t d = 0; d < n_embd; ++d) v[size_t(d)] += w * h[d];
            } else {
                std::copy(h, h + n_embd, out[first_row[p]].begin());
            }
        }
    };
    run_prompt_passes(backend, table, prompts, n_batch, max_tokens, wanted, run, {}, lora);
    return out;
}

void normalize_embedding(std::vector<float>& v, int norm) {
    double sum = 0;
    if (norm < 0) return;
    if (norm == 0) {
        for (float x : v) sum = std::max(sum, double(std::fabs(x)));
        sum /= 32760.0;  // the int16 range
    } else if (norm == 2) {
        for (float x : v) sum += double(x) * x;
        sum = std::sqrt(sum);
    } else {
        for (float x : v) sum += std::pow(std::fabs(double(x)), norm);
        sum = std::pow(sum, 1.0 / norm);
    }
    if (sum <= 0) return;
    for (float& x : v) x = float(x / sum);
}

double cosine_similarity(const std::vector<float>& a, const std::vector<float>& b) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i)
        ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
    return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

}  // namespace kvrun
