// ChatFormat: a chat template together with the vocabulary's special texts and end-of-turn
// stops (see chat_format.h).
#include "chat_format.h"

#include "reasoning.h"

namespace kvrun {

ChatSpecialTexts chat_special_texts(const Tokenizer& tok) {
    ChatSpecialTexts t;
    if (tok.bos() >= 0) t.bos = tok.token_text(tok.bos());
    if (tok.eos() >= 0) t.eos = tok.token_text(tok.eos());
    return t;
}

ChatStops chat_stops(ChatTemplateKind kind, const Tokenizer& tok) {
    ChatStops out;
    for (const std::string& s : chat_template_stop_strings(kind)) {
        const TokenId id = tok.find_token(s);
        if (id >= 0)
            out.tokens.push_back(id);
        else
            out.strings.push_back(s);
    }
    return out;
}

std::string ChatFormat::render(const std::vector<ChatMessage>& msgs, bool add_generation_prompt,
                               const nlohmann::ordered_json& kwargs) const {
    return chat_template_render(kind, jinja.get(), msgs, add_generation_prompt, special, kwargs);
}

ChatFormat chat_format_make(const ChatTemplateChoice& choice, const Tokenizer& tok) {
    ChatFormat f;
    f.kind = choice.kind;
    f.jinja = choice.jinja;
    f.special = chat_special_texts(tok);
    // A Jinja template no built-in format matches (kind Plain) ends replies with the model's
    // end-of-generation tokens alone: the plain format's "\nUser:" is not its turn syntax
    // (gpt-oss's harmony, say).
    f.stops = choice.jinja && choice.kind == ChatTemplateKind::Plain ? ChatStops{}
                                                                     : chat_stops(choice.kind, tok);
    f.thinks = choice.thinks ||
               chat_template_thinks(choice.kind, choice.jinja ? choice.jinja->source() : "");
    return f;
}

}  // namespace kvrun
