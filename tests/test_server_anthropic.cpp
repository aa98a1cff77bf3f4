// Anthropic's Messages API (server_anthropic.h): requests rewritten into chat completions
// (system, content blocks, tool use and results, tools and tool_choice, thinking budgets,
// what is refused), answers rewritten into messages and event streams, and over HTTP on
// stories260K: the same text as the chat endpoint, streamed as Anthropic's events, a
// required tool call as a tool_use block, stop reasons, count_tokens, Anthropic's errors.
#include <doctest/doctest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat_template.h"
#include "common.h"
#include "modes/server_anthropic.h"
#include "server_test_util.h"
#include "tool_test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

TEST_CASE("anthropic: requests become chat completions requests") {
    const ojson body = ojson::parse(R"({
      "model": "x", "max_tokens": 64, "temperature": 0.5, "top_k": 7, "stream": true,
      "system": [{"type": "text", "text": "Be brief."}],
      "stop_sequences": ["END"],
      "thinking": {"type": "enabled", "budget_tokens": 32},
      "tools": [{"name": "add", "description": "Adds.", "input_schema": {"type": "object"}}],
      "tool_choice": {"type": "tool", "name": "add", "disable_parallel_tool_use": true},
      "messages": [
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": [
          {"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
          {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 2, "b": 3}}]},
        {"role": "user", "content": [
          {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "5"}]},
          {"type": "text", "text": "And 4+4?"}]}]})");
    const ojson o = anthropic_to_openai(body);
    CHECK(o["max_tokens"] == 64);
    CHECK(o["temperature"] == 0.5);
    CHECK(o["top_k"] == 7);
    CHECK(o["stream"] == true);
    CHECK(o["stream_options"]["include_usage"] == true);
    CHECK(o["stop"] == ojson::array({"END"}));
    CHECK(o["reasoning_budget_tokens"] == 32);
    CHECK(o["tools"][0]["function"]["name"] == "add");
    CHECK(o["tools"][0]["function"]["parameters"] == ojson{{"type", "object"}});
    CHECK(o["tool_choice"]["function"]["name"] == "add");
    CHECK(o["parallel_tool_calls"] == false);
    const ojson& m = o["messages"];
    REQUIRE(m.size() == 5);
    CHECK(m[0] == ojson{{"role", "system"}, {"content", "Be brief."}});
    CHECK(m[1] == ojson{{"role", "user"}, {"content", "2+3?"}});
    CHECK(m[2]["content"].is_null());
    CHECK(m[2]["reasoning_content"] == "Use the tool.");
    CHECK(m[2]["tool_calls"][0]["id"] == "t1");
    CHECK(m[2]["tool_calls"][0]["function"]["arguments"] == R"({"a":2,"b":3})");
    CHECK(m[3] == ojson{{"role", "tool"}, {"tool_call_id", "t1"}, {"content", "5"}});
    CHECK(m[4] == ojson{{"role", "user"}, {"content", "And 4+4?"}});

    auto choice = [](const char* c) {
        return anthropic_to_openai(ojson::parse(
            std::string(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": )") + c +
            "}"))["tool_choice"];
    };
    CHECK(choice(R"({"type": "auto"})") == "auto");
    CHECK(choice(R"({"type": "any"})") == "required");
    CHECK(choice(R"({"type": "none"})") == "none");
    const ojson off = anthropic_to_openai(ojson::parse(
        R"({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "disabled"}})"));
    CHECK(off["reasoning_budget_tokens"] == 0);
    CHECK(off["chat_template_kwargs"]["enable_thinking"] == false);

    const char* bad[] = {
        R"({"messages": []})",
        R"({"messages": [{"role": "system", "content": "x"}]})",
        R"({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})",
        R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305", "name": "s"}]})",
        R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "maybe"}})",
        R"({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled"}})",
        R"({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b"}]}]})",
    };
    for (const char* b : bad) {
        CAPTURE(b);
        CHECK_THROWS_AS(anthropic_to_openai(ojson::parse(b)), Error);
    }
}

TEST_CASE("anthropic: answers become messages and event streams") {
    const json completion = json::parse(R"({"id": "chatcmpl-1", "model": "m",
      "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
        "reasoning_content": "Hm.", "content": null, "tool_calls": [{"id": "c_0",
        "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}}]}}],
      "usage": {"prompt_tokens": 11, "completion_tokens": 7}})");
    const json m = anthropic_response(completion, "");
    CHECK(m["id"] == "msg_chatcmpl-1");
    CHECK(m["type"] == "message");
    CHECK(m["stop_reason"] == "tool_use");
    CHECK(m["usage"] == json{{"input_tokens", 11}, {"output_tokens", 7}});
    REQUIRE(m["content"].size() == 2);
    CHECK(m["content"][0]["type"] == "thinking");
    CHECK(m["content"][0]["thinking"] == "Hm.");
    CHECK(m["content"][1] == json{{"type", "tool_use"},
                                  {"id", "c_0"},
                                  {"name", "add"},
                                  {"input", {{"a", 2}, {"b", 3}}}});
    CHECK(anthropic_stop_reason("length", false) == "max_tokens");
    CHECK(anthropic_stop_reason("stop", true) == "stop_sequence");
    CHECK(anthropic_stop_reason("stop", false) == "end_turn");

    AnthropicStream s(11);
    std::vector<std::string> names;
    std::vector<json> data;
    auto feed = [&](const char* chunk) {
        for (auto& [n, d] : s.feed(json::parse(chunk))) names.push_back(n), data.push_back(d);
    };
    feed(R"({"id": "x", "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant",
           "reasoning_content": "Hm"}, "finish_reason": null}]})");
    feed(
        R"({"id": "x", "choices": [{"index": 0, "delta": {"content": "It"}, "finish_reason": null}]})");
    feed(
        R"({"id": "x", "choices": [{"index": 0, "delta": {"content": " is."}, "finish_reason": null}]})");
    feed(R"({"id": "x", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c_0",
           "type": "function", "function": {"name": "add", "arguments": "{}"}}]}, "finish_reason": null}]})");
    s.set_stop_word("");
    feed(R"({"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})");
    feed(R"({"id": "x", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 9}})");
    CHECK(names == std::vector<std::string>{"message_start", "content_block_start",
                                            "content_block_delta", "content_block_stop",
                                            "content_block_start", "content_block_delta",
                                            "content_block_delta", "content_block_stop",
                                            "content_block_start", "content_block_delta",
                                            "content_block_stop", "message_delta", "message_stop"});
    CHECK(data[0]["message"]["usage"]["input_tokens"] == 11);
    CHECK(data[1]["content_block"]["type"] == "thinking");
    CHECK(data[2]["delta"] == json{{"type", "thinking_delta"}, {"thinking", "Hm"}});
    CHECK(data[4]["index"] == 1);
    CHECK(data[6]["delta"]["text"] == " is.");
    CHECK(data[8]["content_block"]["type"] == "tool_use");
    CHECK(data[8]["index"] == 2);
    CHECK(data[9]["delta"] == json{{"type", "input_json_delta"}, {"partial_json", "{}"}});
    CHECK(data[11]["delta"]["stop_reason"] == "tool_use");
    CHECK(data[11]["usage"]["output_tokens"] == 9);
    CHECK(s.feed(json::parse(R"({"choices": [], "usage": {}})")).empty());  // done
    CHECK(json::parse(anthropic_error_body(400, "no"))["error"]["type"] == "invalid_request_error");
    CHECK(json::parse(anthropic_error_body(500, "bad \xff byte"))["error"]["type"] == "api_error");
}

TEST_CASE("server: /v1/messages answers as the chat endpoint does, whole and streamed") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/2048);
    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::ChatML);
    Running run(cfg, s);
    const json messages = {{{"role", "user"}, {"content", "Tell me about a cat."}}};
    const HttpReply chat = run.post(
        "/v1/chat/completions",
        {{"messages",
          json::array({{{"role", "system"}, {"content", "You tell stories."}}, messages[0]})},
         {"max_tokens", 24},
         {"temperature", 0}});
    REQUIRE(chat.status == 200);
    const json want = json::parse(chat.body);
    const json body = {{"model", "any"},
                       {"system", "You tell stories."},
                       {"messages", messages},
                       {"max_tokens", 24},
                       {"temperature", 0}};
    const HttpReply r = run.post("/v1/messages", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json m = json::parse(r.body);
    CHECK(m["type"] == "message");
    CHECK(m["role"] == "assistant");
    CHECK(m["id"].get<std::string>().starts_with("msg_"));
    REQUIRE(m["content"].size() == 1);
    CHECK(m["content"][0]["type"] == "text");
    CHECK(m["content"][0]["text"] == want["choices"][0]["message"]["content"]);
    CHECK(m["stop_reason"] == "max_tokens");
    CHECK(m["usage"]["input_tokens"] == want["usage"]["prompt_tokens"]);
    CHECK(m["usage"]["output_tokens"] == 24);
    // count_tokens: the same prompt.
    const HttpReply n = run.post("/v1/messages/count_tokens", body);
    REQUIRE(n.status == 200);
    CHECK(json::parse(n.body)["input_tokens"] == want["usage"]["prompt_tokens"]);

    // Streamed: Anthropic's events, the text deltas adding up to the whole text.
    json sb = body;
    sb["stream"] = true;
    const HttpReply st = run.post("/v1/messages", sb);
    REQUIRE(st.status == 200);
    CHECK(st.body.find("[DONE]") == std::string::npos);
    const auto events = named_events(st.body);
    REQUIRE(events.size() >= 5);
    CHECK(events.front().first == "message_start");
    CHECK(events.front().second["message"]["usage"]["input_tokens"] ==
          want["usage"]["prompt_tokens"]);
    CHECK(events[1].first == "content_block_start");
    CHECK(events[1].second["content_block"]["type"] == "text");
    std::string text;
    for (size_t i = 2; i + 3 < events.size(); ++i) {
        CHECK(events[i].first == "content_block_delta");
        text += events[i].second["delta"]["text"].get<std::string>();
    }
    CHECK(text == m["content"][0]["text"]);
    CHECK(events[events.size() - 3].first == "content_block_stop");
    CHECK(events[events.size() - 2].first == "message_delta");
    CHECK(events[events.size() - 2].second["delta"]["stop_reason"] == "max_tokens");
    CHECK(events[events.size() - 2].second["usage"]["output_tokens"] == 24);
    CHECK(events.back().first == "message_stop");

    // A stop sequence found in the text: stop_reason stop_sequence, the text before it.
    const std::string whole = m["content"][0]["text"];
    const std::string word = whole.substr(whole.size() / 2, 3);
    json stop = body;
    stop["stop_sequences"] = {word};
    const json sm = json::parse(run.post("/v1/messages", stop).body);
    CHECK(sm["stop_reason"] == "stop_sequence");
    CHECK(sm["stop_sequence"] == word);
    CHECK(whole.starts_with(sm["content"][0]["text"].get<std::string>()));

    // A required tool call: a tool_use block whose input matches the tool's schema.
    json tools = json::array();
    for (const json& t : json::parse(weather_and_add().dump()))
        tools.push_back({{"name", t["function"]["name"]},
                         {"description", t["function"]["description"]},
                         {"input_schema", t["function"]["parameters"]}});
    json tb = {{"messages", {{{"role", "user"}, {"content", "What is 2 plus 3?"}}}},
               {"tools", tools},
               {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}},
               {"max_tokens", 200},
               {"temperature", 0}};
    const HttpReply tr = run.post("/v1/messages", tb);
    REQUIRE_MESSAGE(tr.status == 200, tr.body);
    const json tm = json::parse(tr.body);
    CHECK(tm["stop_reason"] == "tool_use");
    REQUIRE(tm["content"].size() == 1);
    const json use = tm["content"][0];
    CHECK(use["type"] == "tool_use");
    check_call({{"type", "function"},
                {"id", use["id"]},
                {"function", {{"name", use["name"]}, {"arguments", use["input"].dump()}}}},
               {"get_weather", "add"});
    tb["stream"] = true;
    const auto tev = named_events(run.post("/v1/messages", tb).body);
    bool saw = false;
    for (size_t i = 0; i < tev.size(); ++i)
        if (tev[i].first == "content_block_start" &&
            tev[i].second["content_block"]["type"] == "tool_use") {
            saw = true;
            CHECK(tev[i].second["content_block"]["name"] == use["name"]);
            REQUIRE(i + 1 < tev.size());
            CHECK(json::parse(tev[i + 1].second["delta"]["partial_json"].get<std::string>()) ==
                  use["input"]);
        }
    CHECK(saw);

    // A result back, then an answer or another call; a bad request in Anthropic's error shape.
    json next = tb;
    next.erase("stream");
    next["tool_choice"] = {{"type", "auto"}};
    next["messages"].push_back({{"role", "assistant"}, {"content", json::array({use})}});
    const json result = {{"type", "tool_result"}, {"tool_use_id", use["id"]}, {"content", "5"}};
    next["messages"].push_back({{"role", "user"}, {"content", json::array({result})}});
    CHECK(run.post("/v1/messages", next).status == 200);
    const HttpReply bad = run.post("/v1/messages", {{"messages", json::array()}});
    CHECK(bad.status == 400);
    CHECK(json::parse(bad.body)["type"] == "error");
    CHECK(json::parse(bad.body)["error"]["type"] == "invalid_request_error");
}

TEST_CASE("server: /v1/messages with a thinking model: a thinking block, then the text") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/2048);
    ServerConfig cfg = s.config();
    // A template whose reply starts inside <think> (as Qwen 3's and DeepSeek R1's do).
    s.set_chat(cfg, ChatTemplateKind::ChatML,
               std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(
                   "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                   "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n"
                   "{% endif %}")));
    REQUIRE(cfg.api.chat.thinks);
    Running run(cfg, s);
    json body = {{"messages", {{{"role", "user"}, {"content", "Tell me about a cat."}}}},
                 {"max_tokens", 30},
                 {"temperature", 0},
                 {"thinking", {{"type", "enabled"}, {"budget_tokens", 4}}}};
    const HttpReply r = run.post("/v1/messages", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json m = json::parse(r.body);
    REQUIRE_MESSAGE(m["content"].size() == 2, r.body);
    CHECK(m["content"][0]["type"] == "thinking");
    CHECK(m["content"][1]["type"] == "text");
    const std::string thinking = m["content"][0]["thinking"];
    CHECK(!thinking.empty());
    // The budget: 4 tokens of thinking; without it the block runs on.
    json free = body;
    free.erase("thinking");
    const json f = json::parse(run.post("/v1/messages", free).body);
    const std::string long_thinking = f["content"][0].value("thinking", "");
    CHECK(long_thinking.size() > thinking.size());
    CHECK(long_thinking.starts_with(thinking));
    // Streamed: the thinking block (index 0), then the text block (index 1), the same texts.
    body["stream"] = true;
    const auto events = named_events(run.post("/v1/messages", body).body);
    std::string streamed_thinking, streamed_text;
    std::vector<std::string> starts;
    for (const auto& [name, d] : events) {
        if (name == "content_block_start") {
            starts.push_back(d["content_block"]["type"]);
            CHECK(d["index"] == int(starts.size()) - 1);
        }
        if (name != "content_block_delta") continue;
        if (d["delta"]["type"] == "thinking_delta")
            streamed_thinking += d["delta"]["thinking"].get<std::string>();
        else
            streamed_text += d["delta"]["text"].get<std::string>();
    }
    CHECK(starts == std::vector<std::string>{"thinking", "text"});
    CHECK(streamed_thinking == thinking);
    CHECK(streamed_text == m["content"][1]["text"]);
}
