// Fill-in-the-middle prompts (see infill.h).
#include "infill.h"

#include <algorithm>

#include "common.h"

namespace kvrun {

bool infill_supported(const Tokenizer& tok) {
    const Tokenizer::FimTokens& f = tok.fim();
    return f.pre >= 0 && f.suf >= 0 && f.mid >= 0;
}

InfillPrompt infill_prompt(const Tokenizer& tok, const InfillInput& in, int64_t budget) {
    if (!infill_supported(tok))
        throw Error("this model's vocabulary has no fill-in-the-middle tokens",
                    "infill needs a code model trained for it (tokenizer.ggml.fim_pre_token_id, "
                    "fim_suf_token_id and fim_mid_token_id, or tokens like <|fim_prefix|>)");
    const Tokenizer::FimTokens& f = tok.fim();
    auto encode = [&](const std::string& text) { return tok.encode(text, false, false); };
    std::vector<TokenId> prefix = encode(in.prefix), suffix = encode(in.suffix);
    const std::vector<TokenId> prompt = encode(in.prompt);
    const bool bos = tok.add_bos() && tok.bos() >= 0;
    const int64_t fixed = int64_t(bos) + 3 + static_cast<int64_t>(prompt.size());
    if (budget <= 0) budget = INT64_MAX;
    if (fixed >= budget)
        fail("the infill 'prompt' ({} tokens) leaves no room in the context ({} tokens)",
             prompt.size(), budget);
    InfillPrompt out;
    const int64_t room = budget - fixed;
    const int64_t n_pre = static_cast<int64_t>(prefix.size());
    const int64_t n_suf = static_cast<int64_t>(suffix.size());
    int64_t take_suf = std::min(n_suf, room / 4);
    const int64_t take_pre = std::min(n_pre, room - take_suf);
    take_suf = std::min(n_suf, room - take_pre);  // a short prefix leaves the suffix more
    if (take_pre < n_pre) {
        prefix.erase(prefix.begin(), prefix.end() - take_pre);
        out.truncated = true;
    }
    if (take_suf < n_suf) {
        suffix.resize(static_cast<size_t>(take_suf));
        out.truncated = true;
    }
    // Extra files, in order, while they fit whole.
    int64_t left = room - take_pre - take_suf;
    std::vector<TokenId> extra;
    for (const InfillInput::File& file : in.extra) {
        std::vector<TokenId> chunk;
        if (f.sep >= 0) {
            chunk.push_back(f.sep);
            const std::vector<TokenId> name = encode(file.filename + "\n");
            chunk.insert(chunk.end(), name.begin(), name.end());
        }
        std::string text = file.text;
        if (f.sep < 0 && !text.empty() && text.back() != '\n') text += '\n';
        const std::vector<TokenId> body = encode(text);
        chunk.insert(chunk.end(), body.begin(), body.end());
        if (static_cast<int64_t>(chunk.size()) > left) {
            out.truncated = true;
            break;
        }
        left -= static_cast<int64_t>(chunk.size());
        extra.insert(extra.end(), chunk.begin(), chunk.end());
    }
    std::vector<TokenId>& t = out.tokens;
    if (bos) t.push_back(tok.bos());
    t.insert(t.end(), extra.begin(), extra.end());
    auto put = [&](TokenId special, const std::vector<TokenId>& text) {
        t.push_back(special);
        t.insert(t.end(), text.begin(), text.end());
    };
    if (in.spm) {
        put(f.suf, suffix);
        put(f.pre, prefix);
    } else {
        put(f.pre, prefix);
        put(f.suf, suffix);
    }
    put(f.mid, prompt);
    return out;
}

}  // namespace kvrun
