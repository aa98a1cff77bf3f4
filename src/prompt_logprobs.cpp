// Log-probabilities of a text's tokens (see prompt_logprobs.h).
#include "prompt_logprobs.h"

#include <algorithm>

#include "common.h"

namespace kvrun {

namespace {

// Runs tokens [0, n) through the backend in passes of at most n_batch on a sequence of its
// own (freed on return) with the LoRA scales `lora` (empty: the loaded ones), calling
// rows(start, count, logits) after each pass with the logits of its positions.
template <class Rows>
void run_text(Backend& backend, KvBlockTable& table, const std::vector<TokenId>& tokens, int32_t n,
              int32_t n_batch, const std::vector<float>& lora, Rows rows) {
    const int64_t n_vocab = backend.config().n_vocab;
    n_batch = std::max(n_batch, 1);
    const SeqId seq = table.create_sequence();
    struct FreeSeq {
        KvBlockTable& table;
        SeqId seq;
        ~FreeSeq() { table.free_sequence(seq); }
    } free_seq{table, seq};
    std::vector<float> logits;
    for (int32_t start = 0; start < n; start += n_batch) {
        const int32_t count = std::min(n_batch, n - start);
        const KvAppendResult r = table.append(seq, count, tokens.data() + start);
        if (!r)
            throw Error(fmt::format("the KV pool cannot hold a text of {} tokens ({})",
                                    tokens.size(), r.reason()),
                        "a shorter text, or a server with a larger -c / --kv-memory");
        kv_apply_pending(table, backend);
        ForwardBatch fb;
        const int32_t offset = fb.add_sequence(table, seq, start, count);
        if (!lora.empty()) fb.set_lora_scales(0, lora);
        for (int32_t i = 0; i < count; ++i) fb.logit_rows.push_back(offset + i);
        logits.resize(fb.logit_rows.size() * size_t(n_vocab));
        backend.forward(fb, logits.data());
        rows(start, count, logits.data());
    }
}

}  // namespace

std::vector<TokenLogprobs> prompt_logprobs(Backend& backend, KvBlockTable& table,
                                           const std::vector<TokenId>& tokens, int32_t n_top,
                                           int32_t n_batch, const std::vector<float>& lora) {
    std::vector<TokenLogprobs> out;
    if (tokens.size() < 2) return out;
    const int64_t n_vocab = backend.config().n_vocab;
    // The last token needs no logits of its own (nothing follows it): stop before it.
    run_text(
        backend, table, tokens, static_cast<int32_t>(tokens.size()) - 1, n_batch, lora,
        [&](int32_t start, int32_t count, const float* logits) {
            for (int32_t i = 0; i < count; ++i)
                out.push_back(token_logprobs(logits + size_t(i) * size_t(n_vocab), int(n_vocab),
                                             tokens[size_t(start + i + 1)], n_top));
        });
    return out;
}

}  // namespace kvrun
