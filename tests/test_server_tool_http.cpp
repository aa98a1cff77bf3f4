// Tools in a model family's own syntax over HTTP: stories260K through each test template
// (tool_templates.h) writes well-formed calls when one is required, whole and streamed alike,
// gets its calls and their results back into the next prompt, and answers in plain content
// (streamed the same) when it may; and on a copy of the model with Mistral's control tokens,
// the grammar writes them as tokens and the reply shows them (preserved_tokens).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "chat_template.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "grammar.h"
#include "modes/server_tools.h"
#include "server_test_util.h"
#include "tool_templates.h"
#include "tool_test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// A copy of the model with three byte tokens its stories never use (<0x00>, <0x01>, <0x02>)
// turned into Mistral's control tokens [TOOL_CALLS], [ARGS] and [CALL_ID]: the native tool syntax
// through real control tokens (no text of their own) on a model that runs here.
std::string with_mistral_tokens(const std::string& path) {
    return with_control_tokens(
        path, {{"<0x00>", "[TOOL_CALLS]"}, {"<0x01>", "[ARGS]"}, {"<0x02>", "[CALL_ID]"}},
        "kvrun-test-mistral-tokens.gguf");
}

}  // namespace

TEST_CASE("server: tools in each template's own syntax, whole and streamed") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/2048);
    const json tools = json::parse(weather_and_add().dump());
    const json messages = {{{"role", "user"}, {"content", "What is 2 plus 3?"}}};
    const std::set<std::string> both = {"get_weather", "add"};
    const struct {
        const char* source;
        ChatTemplateKind kind;  // its end-of-turn texts stop replies
    } templates[] = {
        {kHermes, ChatTemplateKind::ChatML},
        {kLlama3, ChatTemplateKind::Llama3},
        {kMistral, ChatTemplateKind::MistralV3},
        {kMistralV11, ChatTemplateKind::MistralV3},
        {kQwen3Coder, ChatTemplateKind::ChatML},
        // (ChatML's stops: with DeepSeek3's the chat would think, and this model never stops)
        {kDeepSeekR1, ChatTemplateKind::ChatML},
        {kDeepSeekV31, ChatTemplateKind::ChatML},
        {kGranite, ChatTemplateKind::Granite},
        {kGlm45, ChatTemplateKind::ChatML},
        {kKimiK2, ChatTemplateKind::ChatML},
        {kCommandR7B, ChatTemplateKind::ChatML},
        {kPhi4Mini, ChatTemplateKind::Phi3},
        {kFunctionaryV31, ChatTemplateKind::Llama3},
        {kFunctionaryV32, ChatTemplateKind::Llama3},
        {kFireFunctionV2, ChatTemplateKind::Llama3}};
    for (const auto& tc : templates) {
        ServerConfig cfg = s.config();
        s.set_chat(cfg, tc.kind,
                   std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(tc.source)));
        const ToolFormat format = tool_format_detect(tc.source);
        CAPTURE(tool_format_name(format));
        Running run(cfg, s);

        // A required call: well formed, whole and streamed alike.
        json body = {{"messages", messages},      {"tools", tools},
                     {"tool_choice", "required"}, {"parallel_tool_calls", false},
                     {"max_tokens", 400},         {"temperature", 0}};
        HttpReply r = run.post("/v1/chat/completions", body);
        REQUIRE_MESSAGE(r.status == 200, r.body);
        const json choice = json::parse(r.body)["choices"][0];
        CHECK_MESSAGE(choice["finish_reason"] == "tool_calls", choice.dump());
        REQUIRE(choice["message"]["tool_calls"].size() == 1);
        const json call = choice["message"]["tool_calls"][0];
        check_call(call, both);
        if (format == ToolFormat::MistralNemo || format == ToolFormat::MistralV11)
            CHECK(call["id"].get<std::string>().size() == 9);
        if (format == ToolFormat::KimiK2)  // the model's own id
            CHECK(call["id"].get<std::string>().starts_with(
                "functions." + call["function"]["name"].get<std::string>() + ":"));
        // Cut one token short, the reply says "length" (its call may be incomplete), as
        // llama.cpp's server does.
        json cut = body;
        cut["max_tokens"] = json::parse(r.body)["usage"]["completion_tokens"].get<int>() - 1;
        CHECK(json::parse(
                  run.post("/v1/chat/completions", cut).body)["choices"][0]["finish_reason"] ==
              "length");
        const json streamed_calls = streamed_tool_calls(run, body);
        REQUIRE(streamed_calls.size() == 1);
        CHECK(streamed_calls[0]["function"] == call["function"]);

        // The prompt the template wrote: its own tool list; with Mistral's required call the
        // reply starts after [TOOL_CALLS].
        const std::string prompt =
            run.post("/apply-template",
                     {{"messages", messages}, {"tools", tools}, {"tool_choice", "required"}})
                .body;
        CHECK(prompt.find("get_weather") != std::string::npos);
        if (format == ToolFormat::MistralNemo) {
            const std::string text = json::parse(prompt)["prompt"];
            CHECK(text.size() >= 12);
            CHECK(text.substr(text.size() - 12) == "[TOOL_CALLS]");
        }

        // The next turn: our call and its result, written back by the template (Mistral's
        // demands the 9-character id it got).
        json history = messages;
        history.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}});
        history.push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "5"}});
        const HttpReply next =
            run.post("/apply-template", {{"messages", history}, {"tools", tools}});
        REQUIRE_MESSAGE(next.status == 200, next.body);
        const std::string next_prompt = json::parse(next.body)["prompt"];
        CHECK(next_prompt.find(call["function"]["name"].get<std::string>()) != std::string::npos);
        if (format == ToolFormat::MistralNemo || format == ToolFormat::KimiK2)
            CHECK(next_prompt.find(call["id"].get<std::string>()) != std::string::npos);

        // "auto": the story model answers in words (the grammar waits for a call that does not
        // come); streamed, the deltas add up to the whole content.
        json answer = {
            {"messages", messages}, {"tools", tools}, {"max_tokens", 40}, {"temperature", 0}};
        const json whole = json::parse(run.post("/v1/chat/completions", answer).body)["choices"][0];
        CHECK(whole["finish_reason"] != "tool_calls");
        const std::string content = whole["message"]["content"];
        CHECK(!content.empty());
        CHECK(streamed_content(run, answer) == content);
    }
}

TEST_CASE("server: Functionary v3.2 without tools, the reply's text is its \"all\" part") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/2048);
    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::Llama3,
               std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(kFunctionaryV32)));
    Running run(cfg, s);
    const json messages = {{{"role", "user"}, {"content", "Say hello."}}};
    // (A grammar makes the story model write the part as Functionary does.)
    for (const char* reply : {"all\nHello there!", ">>>all\nHello there!"}) {
        CAPTURE(reply);
        json body = {{"messages", messages},
                     {"grammar", "root ::= " + json(std::string(reply)).dump()},
                     {"max_tokens", 40},
                     {"temperature", 0}};
        const json whole = json::parse(run.post("/v1/chat/completions", body).body);
        CHECK(whole["choices"][0]["message"]["content"] == "Hello there!");
        CHECK(streamed_content(run, body) == "Hello there!");
    }
    // A reply that is not a part stays as written.
    const json free =
        json::parse(run.post("/v1/chat/completions", {{"messages", messages},
                                                      {"grammar", "root ::= \"Hi\\nthere\""},
                                                      {"max_tokens", 8}})
                        .body);
    CHECK(free["choices"][0]["message"]["content"] == "Hi\nthere");
}

TEST_CASE("server: Mistral's control tokens written by the grammar and shown in the reply") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(with_mistral_tokens(path), /*n_ctx=*/2048);
    const Tokenizer& tok = *s.m.tokenizer;
    const TokenId calls_tag = tok.find_token("[TOOL_CALLS]"), args_tag = tok.find_token("[ARGS]");
    REQUIRE(calls_tag >= 0);
    REQUIRE(args_tag >= 0);
    REQUIRE(tok.is_control(calls_tag));
    const std::vector<TokenId> parsed = tok.encode("x[TOOL_CALLS]y", false, true);
    CHECK(std::count(parsed.begin(), parsed.end(), calls_tag) == 1);

    // The grammars name the tokens; their texts are preserved in the reply.
    const ToolGrammar v11 = chat_tools_grammar(tools_for(ToolFormat::MistralV11, "required"), tok);
    CHECK(v11.gbnf.find(fmt::format("<[{}]>", calls_tag)) != std::string::npos);
    CHECK(v11.gbnf.find(fmt::format("<[{}]>", args_tag)) != std::string::npos);
    CHECK(v11.preserved == std::vector<std::string>{"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"});
    {  // A call with or without an id: the tags as tokens, the rest as text.
        const TokenId id_tag = tok.find_token("[CALL_ID]");
        auto g = Grammar::parse(v11.gbnf);
        for (bool with_id : {false, true}) {
            GrammarState st(g);
            REQUIRE(st.advance_token(calls_tag, ""));
            REQUIRE(st.advance("add"));
            if (with_id) {
                REQUIRE(st.advance_token(id_tag, ""));
                CHECK_FALSE(st.accepts("abc!"));
                REQUIRE(st.advance("abcDEF123"));
            }
            CHECK_FALSE(st.accepts("{"));  // the arguments come after [ARGS]
            REQUIRE(st.advance_token(args_tag, ""));
            REQUIRE(st.advance(R"({"a": 1, "b": 2})"));
            CHECK(st.complete());
        }
    }
    const ToolGrammar v11_auto = chat_tools_grammar(tools_for(ToolFormat::MistralV11), tok);
    CHECK(v11_auto.triggers ==
          json::parse(fmt::format(R"([{{"type": "token", "token": {}}}])", calls_tag)));
    CHECK(chat_tools_grammar(tools_for(ToolFormat::MistralNemo), tok).preserved ==
          std::vector<std::string>{"[TOOL_CALLS]"});

    const json tools = json::parse(weather_and_add().dump());
    const json messages = {{{"role", "user"}, {"content", "What is 2 plus 3?"}}};
    for (const char* source : {kMistralV11, kMistral}) {
        ServerConfig cfg = s.config();
        s.set_chat(cfg, ChatTemplateKind::MistralV3,
                   std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(source)));
        const std::string format = tool_format_name(tool_format_detect(source));
        CAPTURE(format);
        Running run(cfg, s);
        // Required calls (v11: parallel allowed; Nemo's list would go on past max_tokens with
        // this model): every one well formed, streamed alike.
        json body = {{"messages", messages},      {"tools", tools},
                     {"tool_choice", "required"}, {"parallel_tool_calls", format == "mistral-v11"},
                     {"max_tokens", 300},         {"temperature", 0}};
        const HttpReply r = run.post("/v1/chat/completions", body);
        REQUIRE_MESSAGE(r.status == 200, r.body);
        const json choice = json::parse(r.body)["choices"][0];
        CHECK(choice["finish_reason"] == "tool_calls");
        const json calls = choice["message"]["tool_calls"];
        REQUIRE(calls.size() >= 1);
        for (const json& c : calls) check_call(c, {"get_weather", "add"});
        CHECK(choice["message"]["content"].is_null());
        const json streamed = streamed_tool_calls(run, body);
        REQUIRE(streamed.size() == calls.size());
        for (size_t k = 0; k < calls.size(); ++k)
            CHECK(streamed[k]["function"] == calls[k]["function"]);
        // The calls go back into the next prompt as the control tokens.
        json history = messages;
        history.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", calls}});
        for (const json& c : calls)
            history.push_back({{"role", "tool"}, {"tool_call_id", c["id"]}, {"content", "5"}});
        const HttpReply applied =
            run.post("/apply-template", {{"messages", history}, {"tools", tools}});
        REQUIRE_MESSAGE(applied.status == 200, applied.body);
        const std::string next = json::parse(applied.body)["prompt"];
        const std::vector<TokenId> ids = tok.encode(next, false, true);
        CHECK(std::count(ids.begin(), ids.end(), calls_tag) >= 1);
    }

    // llama.cpp's "preserved_tokens" on /completion: a control token shown as its text.
    ServerConfig cfg = s.config();
    Running run(cfg, s);
    const std::string g = fmt::format(R"(root ::= " Once" <[{}]> " upon")", calls_tag);
    json body = {{"prompt", "Hi"}, {"grammar", g}, {"n_predict", 10}, {"temperature", 0}};
    CHECK(json::parse(run.post("/completion", body).body)["content"] == " Once upon");
    body["preserved_tokens"] = {"[TOOL_CALLS]"};
    CHECK(json::parse(run.post("/completion", body).body)["content"] == " Once[TOOL_CALLS] upon");
    // Logprobs show the token's text too, and text offsets count it.
    body["n_probs"] = 2;
    const json probs = json::parse(run.post("/completion", body).body);
    bool seen = false;
    for (const json& p : probs["completion_probabilities"]) seen |= p["token"] == "[TOOL_CALLS]";
    CHECK(seen);
    const json oa = {{"prompt", "Hi"},   {"grammar", g},  {"max_tokens", 10},
                     {"temperature", 0}, {"logprobs", 1}, {"preserved_tokens", {"[TOOL_CALLS]"}}};
    const json c = json::parse(run.post("/v1/completions", oa).body)["choices"][0];
    const std::string text = c["text"];
    CHECK(text == " Once[TOOL_CALLS] upon");
    const json& pieces = c["logprobs"]["tokens"];
    REQUIRE(pieces.size() == c["logprobs"]["text_offset"].size());
    for (size_t k = 0; k < pieces.size(); ++k)
        CHECK(text.substr(c["logprobs"]["text_offset"][k].get<size_t>(),
                          pieces[k].get<std::string>().size()) == pieces[k].get<std::string>());
    // A stop string sees the token's text: generation ends right after it.
    json stop_body = body;
    stop_body.erase("n_probs");
    stop_body["grammar"] =
        fmt::format(R"(root ::= " Once" <[{}]> (" upon" | " a" | " time"){{3,20}})", calls_tag);
    stop_body["n_predict"] = 30;
    stop_body["stop"] = {"[TOOL_CALLS]"};
    const json stopped = json::parse(run.post("/completion", stop_body).body);
    CHECK(stopped["content"] == " Once");
    CHECK(stopped["stopping_word"] == "[TOOL_CALLS]");
    CHECK(stopped["timings"]["predicted_n"].get<int>() <= 5);  // " Once" is 4 tokens here
    body.erase("n_probs");
    body["preserved_tokens"] = {"two words"};
    const HttpReply bad = run.post("/completion", body);
    CHECK(bad.status == 400);
    CHECK(bad.body.find("is not one token") != std::string::npos);
}

TEST_CASE("server: with a built-in format, requests with tools use the model's own syntax") {
    // Which templates can serve: a native syntax that renders a call and shows the tools.
    CHECK(native_tools_template(kHermes) != nullptr);
    CHECK(native_tools_template(kDeepSeekR1) != nullptr);  // (with the arguments as text)
    CHECK(native_tools_template("") == nullptr);
    CHECK(native_tools_template("{% for m in messages %}{{ m.content }}{% endfor %}") == nullptr);
    CHECK(native_tools_template("{# <tool_call> #}{% for m in messages %}{% endfor %}") ==
          nullptr);                                                   // cannot show the tools
    CHECK(native_tools_template("<tool_call>{% for %}") == nullptr);  // does not parse

    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/2048);
    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::ChatML);  // built in, as for Qwen without --jinja
    cfg.api.chat.tools_jinja = native_tools_template(kHermes);
    Running run(cfg, s);
    const json tools = json::parse(weather_and_add().dump());
    const json messages = {{{"role", "user"}, {"content", "What is 2 plus 3?"}}};
    auto prompt = [&](const json& body) {
        const HttpReply r = run.post("/apply-template", body);
        REQUIRE_MESSAGE(r.status == 200, r.body);
        return json::parse(r.body)["prompt"].get<std::string>();
    };
    // With tools: the template writes them; without: the built-in format as before.
    CHECK(prompt({{"messages", messages}, {"tools", tools}}).find("Their signatures:\n<tools>") !=
          std::string::npos);
    CHECK(prompt({{"messages", messages}}) ==
          "<|im_start|>user\nWhat is 2 plus 3?<|im_end|>\n<|im_start|>assistant\n");
    const json body = {{"messages", messages},      {"tools", tools},
                       {"tool_choice", "required"}, {"parallel_tool_calls", false},
                       {"max_tokens", 200},         {"temperature", 0}};
    const HttpReply r = run.post("/v1/chat/completions", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json choice = json::parse(r.body)["choices"][0];
    CHECK(choice["finish_reason"] == "tool_calls");
    REQUIRE(choice["message"]["tool_calls"].size() == 1);
    check_call(choice["message"]["tool_calls"][0], {"get_weather", "add"});
}

TEST_CASE("server: Llama 3.1's built-in tools, the python tag a control token") {
    // A required call to the one listed built-in tool: <|python_tag|> (a control token here,
    // shown in the reply) and brave_search.call(query="..."), read back as the tool's call
    // with its arguments, whole and streamed; the next turn's prompt writes it the same way.
    const std::string path = model_path();
    if (path.empty()) return;
    const std::string model = with_control_tokens(path, {{"<0x03>", "<|python_tag|>"}},
                                                  "kvrun-test-python-tag-tokens.gguf");
    Served s(model, /*n_ctx=*/2048);
    REQUIRE(s.m.tokenizer->is_control(s.m.tokenizer->find_token("<|python_tag|>")));
    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::Llama3,
               std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(kLlama31)));
    Running run(cfg, s);
    const json tools = json::parse(R"([{"type": "function", "function": {"name": "brave_search",
        "description": "Search the web", "parameters": {"type": "object",
        "properties": {"query": {"type": "string"}}, "required": ["query"]}}}])");
    const json messages = {{{"role", "user"}, {"content", "Weather in Oslo?"}}};
    const json body = {{"messages", messages},
                       {"tools", tools},
                       {"tool_choice", "required"},
                       {"max_tokens", 200},
                       {"temperature", 0}};
    const HttpReply r = run.post("/v1/chat/completions", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json choice = json::parse(r.body)["choices"][0];
    CAPTURE(choice.dump());
    CHECK(choice["finish_reason"] == "tool_calls");
    REQUIRE(choice["message"]["tool_calls"].size() == 1);
    const json call = choice["message"]["tool_calls"][0];
    CHECK(call["function"]["name"] == "brave_search");
    const json args = json::parse(call["function"]["arguments"].get<std::string>());
    REQUIRE(args.contains("query"));
    CHECK(args["query"].is_string());
    const json streamed = streamed_tool_calls(run, body);
    REQUIRE(streamed.size() == 1);
    CHECK(streamed[0]["function"] == call["function"]);
    json history = messages;
    history.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}});
    history.push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "Sunny"}});
    const std::string next = json::parse(
        run.post("/apply-template", {{"messages", history}, {"tools", tools}}).body)["prompt"];
    CHECK(next.find("Tools: brave_search") != std::string::npos);
    CHECK(next.find("<|python_tag|>brave_search.call(query=\"" + args["query"].get<std::string>() +
                    "\")<|eom_id|>") != std::string::npos);
}
