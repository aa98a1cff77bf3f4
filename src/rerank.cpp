// Reranking with a generative judge (see rerank.h).
#include "rerank.h"

#include <cmath>

#include "common.h"

namespace kvrun {

const char* const kRerankTemplate =
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: {instruction}\n<Query>: {query}\n<Document>: "
    "{document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

const char* const kRerankInstruction =
    "Given a web search query, retrieve relevant passages that answer the query";

namespace {

constexpr std::string_view kPlaceholders[] = {"{instruction}", "{query}", "{document}"};

}  // namespace

RerankJudge rerank_judge(const Tokenizer& tok, std::string prompt) {
    RerankJudge j;
    auto one = [&](const char* word) {
        const std::vector<TokenId> ids = tok.encode(word, false);
        if (ids.size() != 1)
            throw Error(fmt::format("reranking needs a model that answers \"yes\" or \"no\" in one "
                                    "token each; this vocabulary writes \"{}\" in {} tokens",
                                    word, ids.size()),
                        "a Qwen3-Reranker style model (BERT-style rerankers with a "
                        "classification head are not supported)");
        return ids[0];
    };
    j.yes = one("yes");
    j.no = one("no");
    for (std::string_view p : {std::string_view("{query}"), std::string_view("{document}")})
        if (prompt.find(p) == std::string::npos)
            fail("the rerank template must contain {} (and may contain {{instruction}})", p);
    j.prompt = std::move(prompt);
    return j;
}

std::vector<TokenId> rerank_tokens(const Tokenizer& tok, const RerankJudge& judge,
                                   std::string_view instruction, std::string_view query,
                                   std::string_view document) {
    const std::string_view values[] = {instruction, query, document};
    std::vector<TokenId> out;
    if (tok.add_bos() && tok.bos() >= 0) out.push_back(tok.bos());
    auto add = [&](std::string_view text, bool special) {
        if (text.empty()) return;
        const std::vector<TokenId> ids = tok.encode(std::string(text), false, special);
        out.insert(out.end(), ids.begin(), ids.end());
    };
    // One pass over the template: a value is never searched for placeholders itself.
    std::string_view rest = judge.prompt;
    while (!rest.empty()) {
        size_t at = std::string_view::npos, which = 0;
        for (size_t k = 0; k < std::size(kPlaceholders); ++k)
            if (const size_t p = rest.find(kPlaceholders[k]); p < at) at = p, which = k;
        add(rest.substr(0, at), true);
        if (at == std::string_view::npos) break;
        add(values[which], false);
        rest.remove_prefix(at + kPlaceholders[which].size());
    }
    return out;
}

std::vector<double> rerank_scores(Backend& backend, KvBlockTable& table, const RerankJudge& judge,
                                  const std::vector<std::vector<TokenId>>& prompts, int32_t n_batch,
                                  int32_t max_tokens, PromptNames names,
                                  const std::vector<float>& lora) {
    std::vector<double> out(prompts.size(), 0.0);
    const auto n_vocab = size_t(backend.config().n_vocab);
    std::vector<float> logits;
    auto last = [&](size_t p, int32_t pos) { return pos == int32_t(prompts[p].size()) - 1; };
    auto run = [&](const ForwardBatch& fb, const std::vector<std::pair<size_t, int32_t>>& rows) {
        logits.resize(fb.logit_rows.size() * n_vocab);
        backend.forward(fb, logits.data());
        for (size_t r = 0; r < rows.size(); ++r) {
            const float* l = logits.data() + r * n_vocab;
            // P(yes) / (P(yes) + P(no)) = 1 / (1 + exp(no - yes)).
            const double d = double(l[size_t(judge.no)]) - double(l[size_t(judge.yes)]);
            out[rows[r].first] = 1.0 / (1.0 + std::exp(d));
        }
    };
    run_prompt_passes(backend, table, prompts, n_batch, max_tokens, last, run, names, lora);
    return out;
}

}  // namespace kvrun
