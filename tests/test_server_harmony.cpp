// gpt-oss's harmony format end to end on a model that runs here: stories260K with seven byte
// tokens it never uses renamed to harmony's tags. The vocabulary follows llama.cpp's rule (the
// reply ends at <|return|> or <|call|>, not <|end|>; the tags show in the text), replies come
// back with the analysis channel as reasoning_content and the final one as content, and a tool
// call is a commentary message to its function, whole and streamed alike.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "chat_template.h"
#include "modes/server_tools.h"
#include "server_test_util.h"
#include "tool_templates.h"
#include "tool_test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;

TEST_CASE("server: gpt-oss's harmony replies: reasoning apart, calls as messages") {
    const std::string path = model_path();
    if (path.empty()) return;
    const std::string model = with_control_tokens(path,
                                                  {{"<0x03>", "<|start|>"},
                                                   {"<0x04>", "<|channel|>"},
                                                   {"<0x05>", "<|message|>"},
                                                   {"<0x06>", "<|end|>"},
                                                   {"<0x07>", "<|return|>"},
                                                   {"<0x08>", "<|call|>"},
                                                   {"<0x0B>", "<|constrain|>"}},
                                                  "kvrun-test-harmony-tokens.gguf");
    Served s(model, /*n_ctx=*/2048);
    const Tokenizer& tok = *s.m.tokenizer;
    const TokenId end = tok.find_token("<|end|>"), channel = tok.find_token("<|channel|>");
    CHECK(tok.is_eog(tok.find_token("<|return|>")));
    CHECK(tok.is_eog(tok.find_token("<|call|>")));
    CHECK_FALSE(tok.is_eog(end));          // it ends a message, not the reply
    CHECK_FALSE(tok.is_control(channel));  // shown as its text
    CHECK(tok.token_to_piece(channel) == "<|channel|>");

    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::Plain,
               std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(kHarmony)));
    CHECK(cfg.api.chat.thinks);
    // Not a built-in format: no "\nUser:" stop, only the end-of-generation tokens.
    CHECK(cfg.api.chat.stops.strings.empty());
    CHECK(cfg.api.chat.stops.tokens.empty());
    Running run(cfg, s);
    const json messages = {{{"role", "user"}, {"content", "What is 2 plus 3?"}}};
    // OpenAI's reasoning_effort reaches the template's variable (the request's
    // chat_template_kwargs win); other values are refused.
    auto applied = [&](const json& extra) {
        json body = {{"messages", messages}};
        if (!extra.is_null()) body.update(extra);
        return run.post("/apply-template", body);
    };
    CHECK(applied(json()).body.find("Reasoning: medium") != std::string::npos);
    CHECK(applied({{"reasoning_effort", "high"}}).body.find("Reasoning: high") !=
          std::string::npos);
    CHECK(applied({{"reasoning_effort", "high"},
                   {"chat_template_kwargs", {{"reasoning_effort", "low"}}}})
              .body.find("Reasoning: low") != std::string::npos);
    const HttpReply bad = applied({{"reasoning_effort", "max"}});
    CHECK(bad.status == 400);
    CHECK(bad.body.find("reasoning_effort") != std::string::npos);

    // A reply in two channels (a grammar makes the story model write one): the analysis is the
    // reasoning, the final message the content, streamed alike.
    json body = {{"messages", messages},
                 {"grammar",
                  "root ::= \"<|channel|>analysis<|message|>\" [a-z ]{5,30} "
                  "\"<|end|><|start|>assistant<|channel|>final<|message|>\" [a-z ]{5,30}"},
                 {"max_tokens", 300},
                 {"temperature", 0}};
    const HttpReply r = run.post("/v1/chat/completions", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json msg = json::parse(r.body)["choices"][0]["message"];
    REQUIRE_MESSAGE(msg.contains("reasoning_content"), r.body);
    const std::string reasoning = msg["reasoning_content"], content = msg["content"];
    CHECK(!reasoning.empty());
    CHECK_MESSAGE(!content.empty(), r.body);
    CHECK(reasoning.find('<') == std::string::npos);
    CHECK(content.find('<') == std::string::npos);
    body["stream"] = true;
    std::string streamed_r, streamed_c;
    for (const std::string& e : sse_data(run.post("/v1/chat/completions", body).body)) {
        if (e == "[DONE]") continue;
        const json d = json::parse(e)["choices"][0]["delta"];
        if (d.contains("reasoning_content"))
            streamed_r += d["reasoning_content"].get<std::string>();
        if (d.contains("content") && d["content"].is_string())
            streamed_c += d["content"].get<std::string>();
    }
    CHECK(streamed_r == reasoning);
    CHECK(streamed_c == content);

    // A reasoning budget ends the analysis message after 4 tokens: <|end|> and the final
    // channel's header are forced (the grammar allows them), the answer follows.
    json think = {{"messages", messages},
                  {"grammar",
                   "root ::= \"<|channel|>analysis<|message|>\" [a-z ]+ "
                   "\"<|end|><|start|>assistant<|channel|>final<|message|>\" [a-z ]+"},
                  {"max_tokens", 300},
                  {"temperature", 0}};
    const json long_msg =
        json::parse(run.post("/v1/chat/completions", think).body)["choices"][0]["message"];
    think["reasoning_budget_tokens"] = 4;
    const HttpReply cut = run.post("/v1/chat/completions", think);
    REQUIRE_MESSAGE(cut.status == 200, cut.body);
    const json cut_msg = json::parse(cut.body)["choices"][0]["message"];
    REQUIRE_MESSAGE(cut_msg.contains("reasoning_content"), cut.body);
    const std::string cut_reasoning = cut_msg["reasoning_content"];
    const std::string long_reasoning = long_msg.value("reasoning_content", "");
    CHECK(!cut_reasoning.empty());
    CHECK_MESSAGE(cut_reasoning.size() < long_reasoning.size(), cut.body);
    CHECK(long_reasoning.starts_with(cut_reasoning));  // the same greedy tokens up to the cut
    CHECK_MESSAGE(!cut_msg["content"].get<std::string>().empty(), cut.body);

    // A required call: a commentary message to a listed function, whole and streamed alike.
    const json tools = json::parse(weather_and_add().dump());
    json call_body = {{"messages", messages},
                      {"tools", tools},
                      {"tool_choice", "required"},
                      {"max_tokens", 300},
                      {"temperature", 0}};
    const HttpReply c = run.post("/v1/chat/completions", call_body);
    REQUIRE_MESSAGE(c.status == 200, c.body);
    const json choice = json::parse(c.body)["choices"][0];
    CHECK_MESSAGE(choice["finish_reason"] == "tool_calls", choice.dump());
    REQUIRE(choice["message"]["tool_calls"].size() == 1);
    const json call = choice["message"]["tool_calls"][0];
    check_call(call, {"get_weather", "add"});
    const json streamed_calls = streamed_tool_calls(run, call_body);
    REQUIRE(streamed_calls.size() == 1);
    CHECK(streamed_calls[0]["function"] == call["function"]);
    // The call and its result go back into the next prompt in the template's syntax.
    json history = messages;
    history.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}});
    history.push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "5"}});
    const HttpReply next = run.post("/apply-template", {{"messages", history}, {"tools", tools}});
    REQUIRE_MESSAGE(next.status == 200, next.body);
    const std::string name = call["function"]["name"];
    CHECK(json::parse(next.body)["prompt"].get<std::string>().find(
              "<|start|>assistant to=functions." + name) != std::string::npos);
}
