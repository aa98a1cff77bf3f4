// The server's request and response JSON (see server_api.h).
#include "modes/server_api.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "common.h"
#include "infill.h"
#include "reasoning.h"
#include "rerank.h"
#include "text_input.h"

namespace kvrun {
namespace {

using ojson = nlohmann::ordered_json;

// OpenAI's "prompt": a string, token ids, or a list of either: one prompt each.
std::vector<ojson> prompt_list(const ojson& j) {
    if (!j.contains("prompt") || !j["prompt"].is_array() || j["prompt"].empty()) return {ojson()};
    const ojson& p = j["prompt"];
    if (!p[0].is_string() && !p[0].is_array()) return {ojson()};  // token ids: one prompt
    if (p.size() > kMaxApiPrompts)
        throw Error(
            fmt::format("'prompt' lists {} prompts, more than {}", p.size(), kMaxApiPrompts),
            "send them in several requests");
    return std::vector<ojson>(p.begin(), p.end());
}

// The request's tools, in the template's own syntax where it has one (server_tools.h).
std::optional<ChatTools> request_tools(const ojson& j, const ApiContext& ctx) {
    std::optional<ChatTools> tools = chat_tools_from_json(j);
    if (tools && ctx.chat.tools_template())
        tools->format = tool_format_detect(ctx.chat.tools_template()->source());
    return tools;
}

// "messages" (and "tools") -> the prompt text in the model's chat format.
std::string chat_prompt(const ojson& j, const ApiContext& ctx,
                        const std::optional<ChatTools>& tools) {
    if (!j.contains("messages"))
        fail("missing field 'messages' (a non-empty list of {{\"role\", \"content\"}})");
    // Variables for a Jinja template: the server's, then the request's.
    ojson kwargs = ctx.template_kwargs;
    if (j.contains("chat_template_kwargs")) {
        if (!j["chat_template_kwargs"].is_object())
            fail("'chat_template_kwargs' must be an object of template variables");
        if (kwargs.is_null()) kwargs = ojson::object();
        for (const auto& [k, v] : j["chat_template_kwargs"].items()) kwargs[k] = v;
    }
    // OpenAI's reasoning_effort reaches templates that read it (gpt-oss's), unless the
    // request's template variables set it themselves.
    if (j.contains("reasoning_effort") && !j["reasoning_effort"].is_null()) {
        const ojson& e = j["reasoning_effort"];
        if (!e.is_string() || (e != "minimal" && e != "low" && e != "medium" && e != "high"))
            fail("'reasoning_effort' must be \"minimal\", \"low\", \"medium\" or \"high\" (got {})",
                 e.dump());
        if (kwargs.is_null()) kwargs = ojson::object();
        if (!kwargs.contains("reasoning_effort")) kwargs["reasoning_effort"] = e;
    }
    if (tools && tools->format != ToolFormat::Generic) {  // the template writes the tools
        const ojson msgs = chat_messages_native(j["messages"]);
        if (msgs.size() > 1 && msgs.back()["role"] == "assistant")
            fail("a conversation ending with the assistant's words cannot use 'tools'");
        return chat_tools_render(*ctx.chat.tools_template(), tools->format, msgs,
                                 chat_tools_native_list(*tools), ctx.chat.special, kwargs) +
               chat_tools_prompt_suffix(*tools);
    }
    std::vector<ChatMessage> msgs = chat_messages_from_json(j["messages"]);
    if (tools) {
        const std::string text = chat_tools_instructions(*tools);
        if (msgs[0].role == "system")
            msgs[0].content += "\n\n" + text;
        else
            msgs.insert(msgs.begin(), ChatMessage{"system", text});
    }
    auto render = [&](const std::vector<ChatMessage>& m) {
        return ctx.chat.render(m, true, kwargs);
    };
    // A conversation that ends with the assistant's words is continued from them (assistant
    // prefill, as llama.cpp's server): the reply header, then that text, left open.
    if (msgs.size() > 1 && msgs.back().role == "assistant") {
        if (tools) fail("a conversation ending with the assistant's words cannot use 'tools'");
        const std::string start = msgs.back().content;
        msgs.pop_back();
        return render(msgs) + start;
    }
    return render(msgs);
}

// Whether a chat request's replies have their reasoning returned apart, and whether their
// content keeps it too: the server's --reasoning-format, or the request's "reasoning_format"
// (none, deepseek, deepseek-legacy or auto), when the chat format thinks.
void reasoning_wanted(const ojson& j, const ApiContext& ctx, ApiRequest& out) {
    bool on = ctx.reasoning, keep = ctx.reasoning_keep_content;
    if (j.contains("reasoning_format")) {
        const std::string f = j["reasoning_format"].get<std::string>();
        if (f != "none" && f != "deepseek" && f != "deepseek-legacy" && f != "auto")
            fail(
                "'reasoning_format' must be \"none\", \"deepseek\", \"deepseek-legacy\" or "
                "\"auto\" (got \"{}\")",
                f);
        on = f != "none";
        keep = f == "deepseek-legacy";
    }
    out.reasoning = on && ctx.chat.thinks;
    out.reasoning_keep_content = out.reasoning && keep;
}

// response_format -> json_schema.
void response_format(ojson& j) {
    if (!j.contains("response_format")) return;
    const ojson& f = j["response_format"];
    const std::string type = f.is_object() ? f.value("type", "") : "";
    if (type == "text") return;
    if (type == "json_object") {
        j["json_schema"] = f.contains("schema") ? f["schema"] : ojson{{"type", "object"}};
    } else if (type == "json_schema") {
        if (!f.contains("json_schema") || !f["json_schema"].is_object() ||
            !f["json_schema"].contains("schema"))
            fail(
                "'response_format' of type json_schema needs \"json_schema\": {{\"schema\": ...}}");
        j["json_schema"] = f["json_schema"]["schema"];
    } else {
        fail("'response_format' must have type text, json_object or json_schema");
    }
    j.erase("response_format");
}

// OpenAI's logprobs of a text completion: parallel lists, text offsets from `offset` (with
// echo, the prompt's first token comes first with no logprob: null).
nlohmann::json completion_logprobs(const std::vector<TokenId>& echo_first,
                                   const std::vector<const TokenLogprobs*>& lps, size_t offset,
                                   int32_t k, const Tokenizer& tok,
                                   const std::vector<TokenId>& shown) {
    nlohmann::json tokens = nlohmann::json::array(), values = nlohmann::json::array(),
                   tops = nlohmann::json::array(), offsets = nlohmann::json::array();
    for (TokenId t : echo_first) {
        const std::string piece = token_piece_shown(tok, t, shown);
        tokens.push_back(piece);
        values.push_back(nullptr);
        tops.push_back(nullptr);
        offsets.push_back(offset);
        offset += piece.size();
    }
    for (const TokenLogprobs* p : lps) {
        const TokenLogprobs& lp = *p;
        const std::string piece = token_piece_shown(tok, lp.chosen.token, shown);
        tokens.push_back(piece);
        values.push_back(lp.chosen.logprob);
        nlohmann::json top = nlohmann::json::object();
        for (size_t i = 0; i < lp.top.size() && i < size_t(k); ++i)
            top[token_piece_shown(tok, lp.top[i].token, shown)] = lp.top[i].logprob;
        tops.push_back(std::move(top));
        offsets.push_back(offset);
        offset += piece.size();
    }
    return {{"tokens", tokens},
            {"token_logprobs", values},
            {"top_logprobs", tops},
            {"text_offset", offsets}};
}

// OpenAI's logprobs of a chat completion: {"content": [{"token", "logprob", "bytes",
// "top_logprobs"}]}.
nlohmann::json chat_logprobs(const std::vector<const TokenLogprobs*>& lps, int32_t k,
                             const Tokenizer& tok, const std::vector<TokenId>& shown) {
    auto one = [&](const TokenLogprob& t) {
        const std::string piece = token_piece_shown(tok, t.token, shown);
        return nlohmann::json{{"token", piece},
                              {"logprob", t.logprob},
                              {"bytes", std::vector<uint8_t>(piece.begin(), piece.end())}};
    };
    nlohmann::json content = nlohmann::json::array();
    for (const TokenLogprobs* lp : lps) {
        nlohmann::json x = one(lp->chosen);
        x["top_logprobs"] = nlohmann::json::array();
        for (size_t i = 0; i < lp->top.size() && i < size_t(k); ++i)
            x["top_logprobs"].push_back(one(lp->top[i]));
        content.push_back(std::move(x));
    }
    return {{"content", content}};
}

// The logprobs of `lps` (tokens whose text starts `offset` bytes into the choice's text) in
// the request's format; null without logprobs.
nlohmann::json logprobs_of(const ApiRequest& req, const std::vector<TokenId>& echo_first,
                           const std::vector<const TokenLogprobs*>& lps, size_t offset,
                           const Tokenizer& tok) {
    if (req.top_logprobs < 0) return nullptr;
    return req.format == ApiFormat::OpenAiChat
               ? chat_logprobs(lps, req.top_logprobs, tok, req.preserved_tokens)
               : completion_logprobs(echo_first, lps, offset, req.top_logprobs, tok,
                                     req.preserved_tokens);
}

// A choice's logprob entries [from, to): with echo the prompt's tokens come first (the first
// without a logprob), then the generated tokens'.
nlohmann::json choice_logprobs(const ApiRequest& req, const ApiChoiceResult& c,
                               const Tokenizer& tok, size_t from = 0,
                               size_t to = std::string::npos) {
    std::vector<TokenId> echo_first;
    std::vector<const TokenLogprobs*> lps;
    size_t offset = 0, k = 0;  // text bytes of the entries before `from`; entries seen
    auto skip = [&](TokenId t) {
        if (k++ >= from) return false;
        offset += token_piece_shown(tok, t, req.preserved_tokens).size();
        return true;
    };
    if (!c.echo_tokens.empty() && !skip(c.echo_tokens[0]) && k <= to)
        echo_first.push_back(c.echo_tokens[0]);
    for (const std::vector<TokenLogprobs>* list : {&c.echo_logprobs, &c.result.logprobs})
        for (const TokenLogprobs& lp : *list)
            if (!skip(lp.chosen.token) && k <= to) lps.push_back(&lp);
    return logprobs_of(req, echo_first, lps, offset, tok);
}

const char* stop_type(StopReason r) {
    switch (r) {
        case StopReason::Eos:
            return "eos";
        case StopReason::StopString:
            return "word";
        case StopReason::Length:
        case StopReason::Context:
            return "limit";
        default:
            return "none";
    }
}

// llama.cpp server's /completion result.
nlohmann::json native_result(const ApiRequest& req, const ApiResponseMeta& meta,
                             const ApiChoiceResult& c, const std::string& content,
                             const Tokenizer& tok, size_t logprobs_sent = 0) {
    const GenerationTimings& t = c.result.timings;
    nlohmann::json j = {
        {"index", c.index},
        {"content", content},
        {"stop", true},
        {"model", meta.model},
        {"tokens_predicted", t.n_generated},
        {"tokens_evaluated", req.requests.at(size_t(c.index)).prompt.size()},
        {"tokens_cached", t.n_prompt - t.n_prompt_computed},
        {"stop_type", stop_type(c.result.stop)},
        {"stopping_word", c.stop_word},
        {"truncated", req.truncated},
        {"timings",
         {{"prompt_n", t.n_prompt_computed},
          {"prompt_ms", t.prefill_ms},
          {"prompt_per_second", t.prefill_tokens_per_s()},
          {"predicted_n", t.n_generated},
          {"predicted_ms", t.decode_ms},
          {"predicted_per_second", t.has_decode_rate() ? t.decode_tokens_per_s() : 0.0}}}};
    if (c.result.logprobs.size() > logprobs_sent)
        j["completion_probabilities"] = logprobs_to_json(
            std::vector<TokenLogprobs>(c.result.logprobs.begin() + std::ptrdiff_t(logprobs_sent),
                                       c.result.logprobs.end()),
            tok, req.preserved_tokens);
    return j;
}

nlohmann::json usage(const ApiRequest& req, const std::vector<ApiChoiceResult>& choices) {
    int64_t generated = 0;
    for (const ApiChoiceResult& c : choices) generated += c.result.timings.n_generated;
    int64_t prompt = 0;
    for (const GenerationRequest& r : req.requests) prompt += static_cast<int64_t>(r.prompt.size());
    return {{"prompt_tokens", prompt},
            {"completion_tokens", generated},
            {"total_tokens", prompt + generated}};
}

nlohmann::json envelope(const ApiRequest& req, const ApiResponseMeta& meta, bool chunk) {
    const bool chat = req.format == ApiFormat::OpenAiChat;
    return {{"id", meta.id},
            {"object",
             chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
            {"created", meta.created},
            {"model", meta.model}};
}

// /infill's fields -> the pieces of a fill-in-the-middle prompt.
InfillInput infill_input(const ojson& j, const ApiContext& ctx) {
    InfillInput in;
    in.prefix = j.value("input_prefix", "");
    in.suffix = j.value("input_suffix", "");
    in.prompt = j.contains("prompt") ? j["prompt"].get<std::string>() : "";
    in.spm = j.value("spm_infill", ctx.spm_infill);
    if (j.contains("input_extra")) {
        if (!j["input_extra"].is_array())
            fail("'input_extra' must be a list of {{\"filename\", \"text\"}}");
        for (const ojson& e : j["input_extra"]) {
            if (!e.is_object() || !e.contains("text") || !e["text"].is_string())
                fail("'input_extra' must be a list of {{\"filename\", \"text\"}}");
            in.extra.push_back({e.value("filename", ""), e["text"].get<std::string>()});
        }
    }
    for (const std::string* text : {&in.prefix, &in.suffix, &in.prompt})
        utf8_require_valid(*text, "the infill text");
    return in;
}

// The token prompt for `in`, fitted to the context less the tokens to generate (a quarter
// of it when generation is unbounded).
ojson fill_in_the_middle(const InfillInput& in, const ojson& j, const RequestDefaults& d,
                         const ApiContext& ctx, const Tokenizer& tok, ApiRequest& out) {
    int64_t budget = 0;
    if (ctx.n_ctx_seq > 0) {
        const int64_t n_predict = j.value("n_predict", int64_t(d.n_predict));
        const int64_t reserve =
            n_predict > 0 ? std::min(n_predict, ctx.n_ctx_seq / 2) : ctx.n_ctx_seq / 4;
        budget = ctx.n_ctx_seq - reserve;
    }
    InfillPrompt p = infill_prompt(tok, in, budget);
    out.truncated = out.truncated || p.truncated;
    return p.tokens;
}

// A chat choice's text less its reasoning (all of it without reasoning), and for
// Functionary v3.2 its "all" part.
std::string answer_text(const ApiRequest& req, const ApiChoiceResult& c) {
    std::string text = req.reasoning ? reasoning_split(c.text, req.reasoning_open).content : c.text;
    return req.v32_text ? chat_tools_parse(ToolFormat::FunctionaryV32, text, "").content : text;
}

// A chat choice's reply as tools read it (ids unique per response and choice).
ChatToolReply tool_reply(const ApiRequest& req, const ApiResponseMeta& meta,
                         const ApiChoiceResult& c) {
    // (Harmony's calls are messages of their own, which the reasoning split leaves out.)
    return chat_tools_parse(req.tools->format,
                            req.tools->format == ToolFormat::Harmony ? c.text : answer_text(req, c),
                            fmt::format("call_{}_{}", meta.id, c.index), &*req.tools);
}

// A choice's tool reply, read once and shared by its message and finish_reason; empty when
// the request has no tools.
std::optional<ChatToolReply> choice_tools(const ApiRequest& req, const ApiResponseMeta& meta,
                                          const ApiChoiceResult& c) {
    if (!req.tools) return std::nullopt;
    return tool_reply(req, meta, c);
}

nlohmann::json finish_reason(const ApiRequest& req, const ApiChoiceResult& c,
                             const std::optional<ChatToolReply>& tools) {
    // A reply cut short by max_tokens or the context says "length" even when it holds calls
    // (the last may be incomplete), as llama.cpp's server does.
    const bool cut = c.result.stop == StopReason::Length || c.result.stop == StopReason::Context;
    if (tools && !cut && !tools->calls.empty())
        return req.legacy_functions ? "function_call" : "tool_calls";
    return api_finish_reason(c.result.stop);
}

// A chat choice's message (or, streamed, its delta); `tools`: choice_tools of the choice.
nlohmann::json chat_message(const ApiRequest& req, const ApiChoiceResult& c,
                            const std::optional<ChatToolReply>& tools, bool delta) {
    nlohmann::json m = {{"role", "assistant"}};
    if (req.reasoning) {
        const ReasoningSplit r = reasoning_split(c.text, req.reasoning_open);
        if (!r.reasoning.empty()) m["reasoning_content"] = r.reasoning;
    }
    if (!req.tools) {
        m["content"] = req.reasoning_keep_content ? c.text : answer_text(req, c);
        return m;
    }
    const ChatToolReply& r = *tools;
    if (r.calls.empty()) {
        m["content"] = r.content;
    } else if (req.legacy_functions) {  // one call (parallel_tool_calls is off)
        m["content"] = r.content.empty() ? nlohmann::json() : nlohmann::json(r.content);
        m["function_call"] = {{"name", r.calls[0].name}, {"arguments", r.calls[0].arguments}};
    } else {  // (native formats may write some text before the calls)
        m["content"] = r.content.empty() ? nlohmann::json() : nlohmann::json(r.content);
        m["tool_calls"] = tool_calls_json(r.calls, delta);
    }
    return m;
}

}  // namespace

std::string error_text(const Error& e) {
    return e.hint().empty() ? std::string(e.what())
                            : fmt::format("{} (hint: {})", e.what(), e.hint());
}

std::string api_chat_prompt(const std::string& body, const ApiContext& ctx) {
    const ojson j = ojson::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) fail("malformed JSON");
    if (!j.is_object()) fail("the request body must be a JSON object");
    try {
        ojson req = j;
        chat_functions_to_tools(req);
        return chat_prompt(req, ctx, request_tools(req, ctx));
    } catch (const nlohmann::json::exception& e) {
        fail("bad field type: {}", e.what());
    }
}

ApiRequest api_request_from_json(ApiFormat format, const std::string& body, const ApiContext& ctx,
                                 const Tokenizer& tok) {
    ojson j;
    try {
        j = ojson::parse(body);
    } catch (const nlohmann::json::exception& e) {
        fail("malformed JSON: {}", e.what());
    }
    if (!j.is_object()) fail("the request body must be a JSON object");
    for (auto it = j.begin(); it != j.end();) it = it->is_null() ? j.erase(it) : std::next(it);
    ApiRequest out;
    out.format = format;
    RequestDefaults d = ctx.defaults;
    try {
        out.stream = j.value("stream", false);
        if (j.contains("id_slot")) {
            if (!j["id_slot"].is_number_integer() || j["id_slot"].get<int64_t>() < -1)
                fail("'id_slot' must be a slot number (-1: any)");
            out.id_slot = j["id_slot"].get<int32_t>();
        }
        if (j.contains("stream_options") && j["stream_options"].is_object())
            out.include_usage = j["stream_options"].value("include_usage", false);
        if (j.contains("response_fields") && !j["response_fields"].is_null()) {
            if (!api_native(format)) fail("'response_fields' is for /completion and /infill");
            const ojson& f = j["response_fields"];
            if (!f.is_array()) fail("'response_fields' must be a list of field paths");
            for (const ojson& p : f) {
                if (!p.is_string()) fail("'response_fields' must be a list of field paths");
                out.response_fields.push_back(p.get<std::string>());
            }
        }
        if (j.value("echo", false)) {
            if (format != ApiFormat::OpenAiCompletion)
                fail("'echo' is for /v1/completions (text completions)");
            out.echo = true;
        }
        if (j.contains("suffix") && format != ApiFormat::OpenAiCompletion)
            fail("'suffix' is for /v1/completions (use /infill's input_suffix)");
        if (format == ApiFormat::OpenAiChat) {
            out.legacy_functions = chat_functions_to_tools(j);
            out.tools = request_tools(j, ctx);
            out.v32_text = !out.tools && ctx.chat.tools_template() &&
                           tool_format_detect(ctx.chat.tools_template()->source()) ==
                               ToolFormat::FunctionaryV32;
        } else if (j.contains("tools") && !j["tools"].empty()) {
            fail("'tools' are for /v1/chat/completions");
        } else if (j.contains("functions") && !j["functions"].empty()) {
            fail("'functions' are for /v1/chat/completions");
        }
        if (out.tools && (j.contains("grammar") || j.contains("json_schema") ||
                          (j.contains("response_format") &&
                           j["response_format"].value("type", "text") != "text")))
            fail(
                "'tools' constrain the reply themselves: drop 'grammar', 'json_schema' or "
                "'response_format'");
        if (!api_native(format)) {
            if (j.contains("max_completion_tokens"))
                j["n_predict"] = j["max_completion_tokens"];
            else if (j.contains("max_tokens"))
                j["n_predict"] = j["max_tokens"];
            if (j.contains("n")) j["n_samples"] = j["n"];
            if (j.contains("best_of") && j["best_of"] != j.value("n_samples", ojson(1)))
                fail("'best_of' other than 'n' is not supported");
            // OpenAI: logprobs (completions: a count; chat: a flag with top_logprobs).
            const bool chat = format == ApiFormat::OpenAiChat;
            if (chat ? j.value("logprobs", false) : j.contains("logprobs")) {
                const int32_t k = chat ? j.value("top_logprobs", 0) : j["logprobs"].get<int32_t>();
                if (k < 0 || k > 20)
                    fail("'{}' must be between 0 and 20 (got {})",
                         chat ? "top_logprobs" : "logprobs", k);
                out.top_logprobs = k;
                j["n_probs"] = std::max(k, 1);
            }
        }
        if (j.contains("stop") && j["stop"].is_string()) j["stop"] = ojson::array({j["stop"]});
        response_format(j);
        if (format == ApiFormat::OpenAiChat) {
            j["prompt"] = chat_prompt(j, ctx, out.tools);
            d.parse_special = true;
            d.chat_prompt = true;  // (its reasoning budget)
            reasoning_wanted(j, ctx, out);
            out.reasoning_open =
                out.reasoning && prompt_opens_reasoning(j["prompt"].get<std::string>());
            if (out.tools && out.tools->format == ToolFormat::Generic) {
                j["json_schema"] = chat_tools_schema(*out.tools);
            } else if (out.tools) {
                // (The model thinks whether or not its reasoning is returned apart.)
                const std::string& prompt = j["prompt"].get_ref<const std::string&>();
                const ToolThinking thinking =
                    !ctx.chat.thinks || prompt_closes_reasoning(prompt) ? ToolThinking::None
                    : prompt_opens_reasoning(prompt)                    ? ToolThinking::Open
                                                                        : ToolThinking::Optional;
                const ToolGrammar g = chat_tools_grammar(*out.tools, tok, thinking);
                j["grammar"] = g.gbnf;
                for (const std::string& p : g.preserved) j["preserved_tokens"].push_back(p);
                if (!g.triggers.empty()) {
                    j["grammar_lazy"] = true;
                    j["grammar_triggers"] = g.triggers;
                }
            }
        }
        if (j.contains("preserved_tokens") && !j["preserved_tokens"].is_null()) {
            if (!j["preserved_tokens"].is_array())
                fail("'preserved_tokens' must be a list of token texts");
            for (const ojson& p : j["preserved_tokens"]) {
                const std::vector<TokenId> ids = p.is_string()
                                                     ? tok.encode(p.get<std::string>(), false, true)
                                                     : std::vector<TokenId>{};
                if (ids.size() != 1)
                    fail("'preserved_tokens': {} is not one token of the model", p.dump());
                out.preserved_tokens.push_back(ids[0]);
            }
            std::sort(out.preserved_tokens.begin(), out.preserved_tokens.end());
        }
        if (api_native(format) && j.value("n_samples", 1) != 1)
            fail("/completion returns one generation; use /v1/completions with \"n\" for more");
        if (format == ApiFormat::Infill) {
            InfillInput in = infill_input(j, ctx);
            j["prompt"] = fill_in_the_middle(in, j, d, ctx, tok, out);
        }
    } catch (const nlohmann::json::exception& e) {
        fail("bad field type: {}", e.what());
    }
    std::vector<ojson> prompts =
        format == ApiFormat::OpenAiCompletion || format == ApiFormat::Completion
            ? prompt_list(j)
            : std::vector<ojson>{ojson()};
    out.prompt_list = !prompts[0].is_null();
    for (ojson& prompt : prompts) {
        if (!prompt.is_null()) j["prompt"] = std::move(prompt);
        if (format == ApiFormat::OpenAiCompletion && j.contains("suffix") &&
            !j["suffix"].get<std::string>().empty()) {
            if (!j.contains("prompt") || !j["prompt"].is_string())
                fail("'suffix' (fill in the middle) needs a text 'prompt'");
            InfillInput in;
            in.prefix = j["prompt"].get<std::string>();
            in.suffix = j["suffix"].get<std::string>();
            in.spm = ctx.spm_infill;
            j["prompt"] = fill_in_the_middle(in, j, d, ctx, tok, out);
        }
        ParsedRequest parsed = request_from_json(j.dump(), d, tok);
        out.n_keep = parsed.n_keep;
        out.prompt_texts.push_back(std::move(parsed.prompt_text));
        GenerationRequest r = std::move(parsed.request);
        r.shown_tokens = out.preserved_tokens;
        if (format == ApiFormat::OpenAiChat) {
            if (!r.ignore_eos) r.stop_tokens = ctx.chat.stops.tokens;
            for (const std::string& s : ctx.chat.stops.strings) r.stop_strings.push_back(s);
        }
        out.requests.push_back(std::move(r));
    }
    out.stop = out.requests[0].stop_strings;
    return out;
}

nlohmann::json api_finish_reason(StopReason stop) {
    switch (stop) {
        case StopReason::Eos:
        case StopReason::StopString:
            return "stop";
        case StopReason::Length:
        case StopReason::Context:
            return "length";
        default:
            return nullptr;
    }
}

ApiStreamView api_stream_view(const ApiRequest& req, std::string_view reply) {
    ApiStreamView v;
    std::string content;
    if (req.reasoning) {
        ReasoningSplit r = reasoning_stream(reply, req.reasoning_open);
        v.reasoning = std::move(r.reasoning);
        content = std::move(r.content);
    } else {
        content = reply;
    }
    if (!req.tools && req.v32_text) {
        v.content = tool_stream_content(ToolFormat::FunctionaryV32, content).text;
    } else if (!req.tools) {
        v.content = req.reasoning_keep_content ? std::string(reply) : std::move(content);
    } else if (const ToolAnswerPrefix a = tool_stream_content(req.tools->format, content);
               a.answer) {
        v.content = a.text;
    }
    return v;
}

nlohmann::json api_stream_chunk(const ApiRequest& req, const ApiResponseMeta& meta, int32_t index,
                                const std::string& delta, bool first, const Tokenizer& tok,
                                const std::vector<TokenLogprobs>& logprobs, size_t offset,
                                const std::string& reasoning) {
    std::vector<const TokenLogprobs*> lps;
    for (const TokenLogprobs& lp : logprobs) lps.push_back(&lp);
    if (api_native(req.format)) {
        nlohmann::json j = {{"index", index}, {"content", delta}, {"stop", false}};
        if (!lps.empty())
            j["completion_probabilities"] = logprobs_to_json(logprobs, tok, req.preserved_tokens);
        return j;
    }
    nlohmann::json j = envelope(req, meta, true);
    nlohmann::json choice = {
        {"index", index},
        {"logprobs", lps.empty() ? nlohmann::json() : logprobs_of(req, {}, lps, offset, tok)},
        {"finish_reason", nullptr}};
    if (req.format == ApiFormat::OpenAiChat) {
        nlohmann::json d = nlohmann::json::object();
        if (first) d["role"] = "assistant";
        if (!reasoning.empty()) d["reasoning_content"] = reasoning;
        if (!delta.empty() || reasoning.empty()) d["content"] = delta;
        choice["delta"] = std::move(d);
    } else {
        choice["text"] = delta;
    }
    j["choices"] = nlohmann::json::array({choice});
    return j;
}

nlohmann::json api_stream_echo_chunk(const ApiRequest& req, const ApiResponseMeta& meta,
                                     const ApiChoiceResult& c, const Tokenizer& tok) {
    nlohmann::json j = envelope(req, meta, true);
    const size_t n = c.echo_tokens.empty() ? 0 : 1 + c.echo_logprobs.size();
    j["choices"] = nlohmann::json::array(
        {{{"index", c.index},
          {"text", c.echo_text},
          {"logprobs", n > 0 ? choice_logprobs(req, c, tok, 0, n) : nlohmann::json()},
          {"finish_reason", nullptr}}});
    return j;
}

nlohmann::json api_stream_reply_chunk(const ApiRequest& req, const ApiResponseMeta& meta,
                                      const ApiChoiceResult& c, size_t content_sent,
                                      size_t reasoning_sent, bool first) {
    nlohmann::json delta = chat_message(req, c, choice_tools(req, meta, c), /*delta=*/true);
    // What was not streamed yet (api_stream_view showed prefixes of these).
    for (const char* key : {"content", "reasoning_content"}) {
        const size_t sent = std::string_view(key) == "content" ? content_sent : reasoning_sent;
        const std::string text =
            delta.contains(key) && delta[key].is_string() ? delta[key].get<std::string>() : "";
        if (text.size() > sent)
            delta[key] = text.substr(sent);
        else
            delta.erase(key);
    }
    if (!delta.contains("content") && !delta.contains("reasoning_content") &&
        !delta.contains("tool_calls") && !delta.contains("function_call"))
        return nullptr;
    if (!first) delta.erase("role");
    nlohmann::json j = envelope(req, meta, true);
    j["choices"] = nlohmann::json::array({{{"index", c.index},
                                           {"delta", delta},
                                           {"logprobs", nullptr},
                                           {"finish_reason", nullptr}}});
    return j;
}

nlohmann::json api_stream_final_chunk(const ApiRequest& req, const ApiResponseMeta& meta,
                                      const ApiChoiceResult& c, const Tokenizer& tok,
                                      size_t logprobs_sent) {
    if (api_native(req.format)) return native_result(req, meta, c, "", tok, logprobs_sent);
    nlohmann::json j = envelope(req, meta, true);
    const size_t entries =
        (c.echo_tokens.empty() ? 0 : 1) + c.echo_logprobs.size() + c.result.logprobs.size();
    const bool rest = logprobs_sent < entries || logprobs_sent == 0;
    nlohmann::json choice = {
        {"index", c.index},
        {"logprobs", rest ? choice_logprobs(req, c, tok, logprobs_sent) : nlohmann::json()},
        {"finish_reason", finish_reason(req, c, choice_tools(req, meta, c))}};
    if (req.format == ApiFormat::OpenAiChat)
        choice["delta"] = nlohmann::json::object();
    else
        choice["text"] = "";
    j["choices"] = nlohmann::json::array({choice});
    return j;
}

nlohmann::json api_usage_chunk(const ApiRequest& req, const ApiResponseMeta& meta,
                               const std::vector<ApiChoiceResult>& choices) {
    nlohmann::json j = envelope(req, meta, true);
    j["choices"] = nlohmann::json::array();
    j["usage"] = usage(req, choices);
    return j;
}

nlohmann::json api_response(const ApiRequest& req, const ApiResponseMeta& meta,
                            const std::vector<ApiChoiceResult>& choices, const Tokenizer& tok) {
    if (api_native(req.format)) {
        // A list of prompts (/completion): a list of results, as llama.cpp's server.
        if (!req.prompt_list)
            return native_result(req, meta, choices.at(0), choices.at(0).text, tok);
        nlohmann::json all = nlohmann::json::array();
        for (const ApiChoiceResult& c : choices)
            all.push_back(native_result(req, meta, c, c.text, tok));
        return all;
    }
    nlohmann::json j = envelope(req, meta, false);
    j["choices"] = nlohmann::json::array();
    for (const ApiChoiceResult& c : choices) {
        const std::optional<ChatToolReply> tools = choice_tools(req, meta, c);
        nlohmann::json choice = {{"index", c.index},
                                 {"logprobs", choice_logprobs(req, c, tok)},
                                 {"finish_reason", finish_reason(req, c, tools)}};
        if (req.format == ApiFormat::OpenAiChat)
            choice["message"] = chat_message(req, c, tools, /*delta=*/false);
        else
            choice["text"] = c.echo_text + c.text;
        j["choices"].push_back(std::move(choice));
    }
    j["usage"] = usage(req, choices);
    if (!choices.empty()) j["timings"] = timings_to_json(choices[0].result.timings);
    return j;
}

std::vector<std::vector<TokenId>> api_embedding_inputs(const nlohmann::json& body,
                                                       const Tokenizer& tok) {
    const char* key = body.contains("input") ? "input" : "content";
    if (!body.contains(key)) fail("missing field 'input' (a string or a list of strings)");
    const nlohmann::json& in = body[key];
    auto ids_of = [&](const nlohmann::json& list) {
        std::vector<TokenId> ids;
        for (const auto& v : list) {
            if (!v.is_number_integer())
                fail("'{}' must be a string, a list of strings, or token ids", key);
            const int64_t id = v.get<int64_t>();
            if (id < 0 || id >= tok.n_vocab())
                fail("'{}': token id {} is outside the vocabulary (0..{})", key, id,
                     tok.n_vocab() - 1);
            ids.push_back(static_cast<TokenId>(id));
        }
        return ids;
    };
    auto text_of = [&](const nlohmann::json& v) {
        const std::string text = v.get<std::string>();
        utf8_require_valid(text, fmt::format("'{}'", key));
        if (text.empty()) fail("'{}' holds an empty text: nothing to embed", key);
        return tok.encode(text, tok.add_bos(), false);
    };
    std::vector<std::vector<TokenId>> out;
    if (in.is_string()) {
        out.push_back(text_of(in));
    } else if (in.is_array() && !in.empty() && in[0].is_number_integer()) {
        out.push_back(ids_of(in));
    } else if (in.is_array()) {
        for (const auto& v : in) {
            if (v.is_string())
                out.push_back(text_of(v));
            else if (v.is_array())
                out.push_back(ids_of(v));
            else
                fail("'{}' must be a string, a list of strings, or token ids", key);
        }
    } else {
        fail("'{}' must be a string, a list of strings, or token ids", key);
    }
    if (out.empty()) fail("'{}' is empty: nothing to embed", key);
    for (const auto& p : out)
        if (p.empty()) fail("'{}' holds an empty token list: nothing to embed", key);
    return out;
}

nlohmann::json api_embedding_response(const std::vector<std::vector<float>>& vectors,
                                      const std::string& model, int64_t n_prompt_tokens,
                                      bool base64) {
    nlohmann::json data = nlohmann::json::array();
    for (size_t i = 0; i < vectors.size(); ++i) {
        nlohmann::json e = {{"object", "embedding"}, {"index", i}};
        if (base64) {
            std::string bytes(vectors[i].size() * sizeof(float), '\0');
            std::memcpy(bytes.data(), vectors[i].data(), bytes.size());  // little-endian hosts
            e["embedding"] = base64_encode(bytes);
        } else {
            e["embedding"] = vectors[i];
        }
        data.push_back(std::move(e));
    }
    return {{"object", "list"},
            {"data", data},
            {"model", model},
            {"usage", {{"prompt_tokens", n_prompt_tokens}, {"total_tokens", n_prompt_tokens}}}};
}

ApiRerankRequest api_rerank_request(const nlohmann::json& j) {
    ApiRerankRequest out;
    if (!j.contains("query") || !j["query"].is_string()) fail("'query' must be a string");
    const char* key = j.contains("documents") ? "documents" : "texts";  // (TEI says "texts")
    if (!j.contains(key) || !j[key].is_array() || j[key].empty())
        fail("'documents' must be a non-empty list of texts");
    constexpr size_t kMaxDocuments = 4096;
    if (j[key].size() > kMaxDocuments)
        fail("at most {} documents per request (got {})", kMaxDocuments, j[key].size());
    for (const nlohmann::json& d : j[key]) {
        if (d.is_string())
            out.documents.push_back(d.get<std::string>());
        else if (d.is_object() && d.contains("text") && d["text"].is_string())
            out.documents.push_back(d["text"].get<std::string>());
        else
            fail("document {} must be a text or an object with a \"text\"", out.documents.size());
    }
    out.top_n = j.contains("top_n") && !j["top_n"].is_null()
                    ? j["top_n"].get<int64_t>()
                    : static_cast<int64_t>(out.documents.size());
    if (out.top_n < 1) fail("'top_n' must be at least 1 (got {})", out.top_n);
    out.with_text = j.value("return_text", false) || j.value("return_documents", false);
    out.instruction = j.value("instruction", std::string(kRerankInstruction));
    out.query = j["query"].get<std::string>();
    return out;
}

nlohmann::json api_rerank_response(const ApiRerankRequest& req, const std::vector<double>& scores,
                                   const std::string& model_id, int64_t n_tokens) {
    std::vector<size_t> order(req.documents.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return scores[a] > scores[b]; });
    order.resize(static_cast<size_t>(std::min<int64_t>(req.top_n, int64_t(order.size()))));
    nlohmann::json results = nlohmann::json::array();
    for (size_t i : order) {
        nlohmann::json r = {{"index", i}, {"relevance_score", scores[i]}};
        if (req.with_text) r["document"] = {{"text", req.documents[i]}};
        results.push_back(std::move(r));
    }
    return {{"model", model_id},
            {"object", "list"},
            {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}},
            {"results", std::move(results)}};
}

nlohmann::json api_pick_fields(const nlohmann::json& answer,
                               const std::vector<std::string>& paths) {
    if (answer.is_array()) {
        nlohmann::json out = nlohmann::json::array();
        for (const nlohmann::json& a : answer) out.push_back(api_pick_fields(a, paths));
        return out;
    }
    nlohmann::json out = nlohmann::json::object();
    for (const std::string& path : paths) {
        const nlohmann::json* v = &answer;
        for (size_t at = 0; v && at <= path.size();) {
            const size_t slash = std::min(path.find('/', at), path.size());
            const std::string key = path.substr(at, slash - at);
            v = v->is_object() && v->contains(key) ? &(*v)[key] : nullptr;
            at = slash + 1;
        }
        if (v) out[path] = *v;
    }
    return out;
}

}  // namespace kvrun
