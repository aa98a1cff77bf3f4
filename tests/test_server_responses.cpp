// OpenAI's Responses API (server_responses.h): requests rewritten into chat completions
// (instructions, input items merged into the conversation, tools, tool_choice, reasoning
// effort, text format, what is refused), answers rewritten into response objects and event
// streams, and over HTTP on stories260K: the same text as the chat endpoint, streamed as the
// Responses events, a required call as a function_call item and its output sent back.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat_template.h"
#include "common.h"
#include "modes/server_responses.h"
#include "server_test_util.h"
#include "tool_test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

TEST_CASE("responses: requests become chat completions requests") {
    const ojson body = ojson::parse(R"({
      "model": "any", "instructions": "Be brief.", "max_output_tokens": 64, "temperature": 0.5,
      "input": [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "2+3?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Add them."}]},
        {"type": "function_call", "call_id": "call_1", "name": "add",
         "arguments": "{\"a\": 2, \"b\": 3}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "5"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "It is 5."}]},
        {"role": "user", "content": "Thanks"}],
      "tools": [{"type": "function", "name": "add", "description": "Adds.",
                 "parameters": {"type": "object"}, "strict": true}],
      "tool_choice": {"type": "function", "name": "add"}, "parallel_tool_calls": false,
      "reasoning": {"effort": "high"},
      "text": {"format": {"type": "json_schema", "name": "r", "schema": {"type": "object"},
                          "strict": true}},
      "store": true, "metadata": {"k": "v"}})");
    const ojson o = responses_to_openai(body);
    CHECK(o == ojson::parse(R"({
      "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "reasoning_content": "Add them.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}],
         "content": null},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
        {"role": "assistant", "content": "It is 5."},
        {"role": "user", "content": "Thanks"}],
      "temperature": 0.5, "parallel_tool_calls": false, "max_tokens": 64,
      "tools": [{"type": "function", "function": {"name": "add", "description": "Adds.",
                                                  "parameters": {"type": "object"}}}],
      "tool_choice": {"type": "function", "function": {"name": "add"}},
      "reasoning_effort": "high",
      "response_format": {"type": "json_schema",
                          "json_schema": {"name": "r", "schema": {"type": "object"},
                                          "strict": true}}})"));
    // A text input; streamed with usage; effort "none" turns thinking off.
    const ojson s = responses_to_openai(
        ojson::parse(R"({"input": "Hi", "stream": true, "reasoning": {"effort": "none"}})"));
    CHECK(s["messages"] == ojson::parse(R"([{"role": "user", "content": "Hi"}])"));
    CHECK(s["stream_options"]["include_usage"] == true);
    CHECK(s["reasoning_budget_tokens"] == 0);
    // Reasoning with nothing readable (encrypted) adds no empty assistant message.
    const ojson e = responses_to_openai(ojson::parse(R"({"input": [
        {"role": "user", "content": "Hi"},
        {"type": "reasoning", "summary": [], "encrypted_content": "xyz"},
        {"role": "assistant", "content": "Hello."}]})"));
    CHECK(e["messages"] == ojson::parse(R"([{"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}])"));
    CHECK(s["chat_template_kwargs"]["enable_thinking"] == false);
    // What kvrun cannot do: one clear error each.
    const std::pair<const char*, const char*> refused[] = {
        {R"({"input": "Hi", "previous_response_id": "resp_1"})", "no stored response"},
        {R"({"model": "m"})", "missing field 'input'"},
        {R"({"input": []})", "non-empty list"},
        {R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})",
         "input_image parts are not supported"},
        {R"({"input": "Hi", "tools": [{"type": "web_search"}]})", "built-in tools"},
        {R"({"input": "Hi", "tool_choice": {"type": "mcp"}})", "'tool_choice' must be"},
        {R"({"input": [{"type": "function_call", "name": "f"}]})", "needs a string 'call_id'"},
        {R"({"input": [{"role": "robot", "content": "x"}]})", "role 'robot'"},
        {R"({"input": [{"type": "item_reference", "id": "x"}]})", "'item_reference'"},
        {R"({"input": "Hi", "text": {"format": {"type": "xml"}}})", "'text.format'"}};
    for (const auto& [text, message] : refused) {
        CAPTURE(text);
        CHECK_THROWS_WITH_AS(responses_to_openai(ojson::parse(text)), doctest::Contains(message),
                             Error);
    }
}

TEST_CASE("responses: answers become response objects and event streams") {
    const ojson request = ojson::parse(R"({"input": "2+3?", "max_output_tokens": 50,
        "tools": [{"type": "function", "name": "add", "parameters": {}}]})");
    const json completion = json::parse(R"({"id": "chatcmpl-7", "created": 100, "model": "m",
      "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
        "reasoning_content": "Add.", "content": "Calling.",
        "tool_calls": [{"id": "call_9", "type": "function",
                        "function": {"name": "add", "arguments": "{\"a\":2}"}}]}}],
      "usage": {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}})");
    const json r = responses_response(completion, request);
    CHECK(r["id"] == "resp_chatcmpl-7");
    CHECK(r["object"] == "response");
    CHECK(r["status"] == "completed");
    CHECK(r["incomplete_details"].is_null());
    CHECK(r["max_output_tokens"] == 50);
    CHECK(r["tools"] == request["tools"]);
    CHECK(r["usage"]["total_tokens"] == 17);
    REQUIRE(r["output"].size() == 3);
    CHECK(r["output"][0]["type"] == "reasoning");
    CHECK(r["output"][0]["content"][0]["text"] == "Add.");
    CHECK(r["output"][1]["type"] == "message");
    CHECK(r["output"][1]["content"][0] ==
          json::parse(R"({"type": "output_text", "text": "Calling.", "annotations": []})"));
    CHECK(r["output"][2] == json::parse(R"({"type": "function_call", "id": "fc_chatcmpl-7_0",
        "call_id": "call_9", "name": "add", "arguments": "{\"a\":2}", "status": "completed"})"));
    json cut = completion;
    cut["choices"][0]["finish_reason"] = "length";
    const json c = responses_response(cut, request);
    CHECK(c["status"] == "incomplete");
    CHECK(c["incomplete_details"]["reason"] == "max_output_tokens");

    // The same answer streamed: created, in_progress, the reasoning item, the message item,
    // the call item, completed; sequence numbers count up; the final response holds the
    // whole answer's output.
    ResponsesStream st(request, 10);
    std::vector<std::pair<std::string, json>> events;
    auto feed = [&](const json& chunk) {
        for (auto& e : st.feed(chunk)) events.push_back(std::move(e));
    };
    const json head = {{"id", "chatcmpl-7"}, {"created", 100}, {"model", "m"}};
    auto delta = [&](const json& d, const json& finish = nullptr) {
        json ch = head;
        ch["choices"] = {{{"index", 0}, {"delta", d}, {"finish_reason", finish}}};
        return ch;
    };
    feed(delta({{"role", "assistant"}}));
    feed(delta({{"reasoning_content", "Ad"}}));
    feed(delta({{"reasoning_content", "d."}}));
    feed(delta({{"content", "Call"}}));
    feed(delta({{"content", "ing."}}));
    feed(delta({{"tool_calls", completion["choices"][0]["message"]["tool_calls"]}}));
    feed(delta(json::object(), "tool_calls"));
    json usage = head;
    usage["choices"] = json::array();
    usage["usage"] = completion["usage"];
    feed(usage);
    feed(usage);  // (nothing after the end)
    std::vector<std::string> names;
    for (size_t i = 0; i < events.size(); ++i) {
        names.push_back(events[i].first);
        CHECK(events[i].second["type"] == events[i].first);
        CHECK(events[i].second["sequence_number"] == i);
    }
    CHECK(names == std::vector<std::string>{"response.created",
                                            "response.in_progress",
                                            "response.output_item.added",
                                            "response.content_part.added",
                                            "response.reasoning_text.delta",
                                            "response.reasoning_text.delta",
                                            "response.reasoning_text.done",
                                            "response.content_part.done",
                                            "response.output_item.done",
                                            "response.output_item.added",
                                            "response.content_part.added",
                                            "response.output_text.delta",
                                            "response.output_text.delta",
                                            "response.output_text.done",
                                            "response.content_part.done",
                                            "response.output_item.done",
                                            "response.output_item.added",
                                            "response.function_call_arguments.delta",
                                            "response.function_call_arguments.done",
                                            "response.output_item.done",
                                            "response.completed"});
    CHECK(events[0].second["response"]["status"] == "in_progress");
    // An error ends the stream with "error" and response.failed; nothing comes after.
    ResponsesStream failing(request, 10);
    CHECK(failing.feed(delta({{"content", "Par"}})).size() == 5);  // created ... delta
    const auto f = failing.fail("out of memory");
    REQUIRE(f.size() == 2);
    CHECK(f[0].first == "error");
    CHECK(f[0].second["message"] == "out of memory");
    CHECK(f[1].first == "response.failed");
    CHECK(f[1].second["response"]["status"] == "failed");
    CHECK(f[1].second["response"]["error"]["message"] == "out of memory");
    CHECK(f[1].second["sequence_number"] == 6);
    CHECK(failing.feed(usage).empty());
    CHECK(ResponsesStream(request, 1).fail("x").size() == 4);  // created, in_progress first
    CHECK(events.back().second["response"]["output"] == r["output"]);
    CHECK(events.back().second["response"]["usage"] == r["usage"]);
}

TEST_CASE("responses: include reasoning.encrypted_content gives reasoning a client sends back") {
    // A client that keeps no state on the server (Codex with "store": false) asks for the
    // reasoning as encrypted_content and sends the items back with the next turn: the
    // reasoning reaches the next conversation, from whole answers and from streams alike.
    const json completion = json::parse(R"({"id": "chatcmpl-8", "created": 1, "model": "m",
      "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
        "reasoning_content": "Two and three make five.", "content": "5"}}],
      "usage": {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}})");
    const ojson asks = ojson::parse(
        R"({"input": "2+3?", "store": false, "include": ["reasoning.encrypted_content"]})");
    const json plain = responses_response(completion, ojson::parse(R"({"input": "2+3?"})"));
    CHECK_FALSE(plain["output"][0].contains("encrypted_content"));
    const json r = responses_response(completion, asks);
    REQUIRE(r["output"][0]["type"] == "reasoning");
    const std::string opaque = r["output"][0]["encrypted_content"];
    CHECK(opaque.find("five") == std::string::npos);  // (not the text as it is)

    // The streamed answer's reasoning item carries the same.
    ResponsesStream st(asks, 4);
    json done_item;
    auto feed = [&](const json& d, const json& finish = nullptr) {
        json ch = {{"id", "chatcmpl-8"}, {"created", 1}, {"model", "m"}};
        ch["choices"] = {{{"index", 0}, {"delta", d}, {"finish_reason", finish}}};
        for (auto& [name, data] : st.feed(ch))
            if (name == "response.output_item.done" && data["item"]["type"] == "reasoning")
                done_item = data["item"];
    };
    feed({{"reasoning_content", "Two and three "}});
    feed({{"reasoning_content", "make five."}});
    feed({{"content", "5"}}, "stop");
    CHECK(done_item["encrypted_content"] == opaque);

    // Sent back with only its encrypted content (the client dropped the text): the next
    // turn's assistant message has its reasoning again.
    ojson item = ojson::parse(r["output"][0].dump());
    item.erase("content");
    ojson next = {{"input", ojson::array({{{"role", "user"}, {"content", "2+3?"}},
                                          item,
                                          {{"role", "assistant"}, {"content", "5"}},
                                          {{"role", "user"}, {"content", "And 4+4?"}}})}};
    const ojson m = responses_to_openai(next)["messages"];
    REQUIRE(m.size() == 3);
    CHECK(m[1] == ojson::parse(R"({"role": "assistant",
        "reasoning_content": "Two and three make five.", "content": "5"})"));
    // Another server's encrypted content (or a damaged one) is skipped, as before.
    for (const char* other : {"xyz", "a3ZydW4tcmVhc29uaW5nLTE="}) {
        next["input"][1]["encrypted_content"] = other;
        CHECK(responses_to_openai(next)["messages"][1] ==
              ojson::parse(R"({"role": "assistant", "content": "5"})"));
    }
}

TEST_CASE("responses: truncation auto drops the oldest messages, a call with its results") {
    const ojson sys = {{"role", "system"}, {"content", "Be brief."}};
    const ojson u1 = {{"role", "user"}, {"content", "one"}};
    const ojson call = {{"role", "assistant"},
                        {"content", nullptr},
                        {"tool_calls", ojson::array({{{"id", "a"}}, {{"id", "b"}}})}};
    const ojson r1 = {{"role", "tool"}, {"tool_call_id", "a"}, {"content", "1"}};
    const ojson r2 = {{"role", "tool"}, {"tool_call_id", "b"}, {"content", "2"}};
    const ojson u2 = {{"role", "user"}, {"content", "two"}};
    const ojson a2 = {{"role", "assistant"}, {"content", "ok"}};
    const ojson u3 = {{"role", "user"}, {"content", "three"}};
    const ojson chat = {{"messages", {sys, u1, call, r1, r2, u2, a2, u3}}, {"max_tokens", 5}};
    auto longer_than = [](size_t n) {
        return [n](const ojson& c) { return c["messages"].size() > n; };
    };
    // Off (absent or "disabled"): as it is, however long.
    CHECK(responses_truncate({{"input", "x"}}, chat, longer_than(1)) == chat);
    CHECK(responses_truncate({{"truncation", "disabled"}}, chat, longer_than(1)) == chat);
    // "auto": the oldest first, after the system message; the call goes with both results.
    const ojson t = responses_truncate({{"truncation", "auto"}}, chat, longer_than(5));
    CHECK(t["messages"] == ojson::array({sys, u2, a2, u3}));
    CHECK(t["max_tokens"] == 5);
    CHECK(responses_truncate({{"truncation", "auto"}}, chat, longer_than(7))["messages"] ==
          ojson::array({sys, call, r1, r2, u2, a2, u3}));
    // Never past the last message (the engine then says what does not fit).
    CHECK(responses_truncate({{"truncation", "auto"}}, chat, longer_than(0))["messages"] ==
          ojson::array({sys, u3}));
    CHECK_THROWS_WITH_AS(responses_truncate({{"truncation", "middle"}}, chat, longer_than(1)),
                         doctest::Contains("'truncation' must be \"auto\" or \"disabled\""),
                         Error);
}

TEST_CASE("server: /v1/responses answers as the chat endpoint does, whole and streamed") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/2048);
    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::ChatML);
    Running run(cfg, s);
    const HttpReply chat = run.post("/v1/chat/completions",
                                    {{"messages",
                                      {{{"role", "system"}, {"content", "You tell stories."}},
                                       {{"role", "user"}, {"content", "Tell me about a cat."}}}},
                                     {"max_tokens", 24},
                                     {"temperature", 0}});
    REQUIRE(chat.status == 200);
    const json want = json::parse(chat.body);
    const json body = {{"model", "any"},
                       {"instructions", "You tell stories."},
                       {"input", "Tell me about a cat."},
                       {"max_output_tokens", 24},
                       {"temperature", 0}};
    const HttpReply r = run.post("/v1/responses", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json m = json::parse(r.body);
    CHECK(m["object"] == "response");
    CHECK(m["status"] == "incomplete");  // max_output_tokens ended it
    REQUIRE(m["output"].size() == 1);
    const std::string text = m["output"][0]["content"][0]["text"];
    CHECK(text == want["choices"][0]["message"]["content"]);
    CHECK(m["usage"]["input_tokens"] == want["usage"]["prompt_tokens"]);
    CHECK(m["usage"]["output_tokens"] == 24);

    // Streamed: the text deltas add up to the whole text; no [DONE].
    json sb = body;
    sb["stream"] = true;
    const HttpReply st = run.post("/responses", sb);
    REQUIRE(st.status == 200);
    CHECK(st.body.find("[DONE]") == std::string::npos);
    const auto events = named_events(st.body);
    REQUIRE(events.size() >= 8);
    CHECK(events.front().first == "response.created");
    std::string streamed;
    for (const auto& [name, data] : events)
        if (name == "response.output_text.delta") streamed += data["delta"].get<std::string>();
    CHECK(streamed == text);
    CHECK(events.back().first == "response.incomplete");
    CHECK(events.back().second["response"]["output"][0]["content"] == m["output"][0]["content"]);

    // A required call: a function_call item; its output sent back gets an answer.
    json tools = json::array();
    for (const json& t : json::parse(weather_and_add().dump())) {
        json fn = t["function"];
        fn["type"] = "function";
        tools.push_back(fn);
    }
    json tb = {{"input", "What is 2 plus 3?"}, {"tools", tools},
               {"tool_choice", "required"},    {"parallel_tool_calls", false},
               {"max_output_tokens", 200},     {"temperature", 0}};
    const json tr = json::parse(run.post("/v1/responses", tb).body);
    CAPTURE(tr.dump());
    REQUIRE(tr["output"].size() == 1);
    const json call = tr["output"][0];
    CHECK(call["type"] == "function_call");
    check_call({{"type", "function"},
                {"id", call["call_id"]},
                {"function", {{"name", call["name"]}, {"arguments", call["arguments"]}}}},
               {"get_weather", "add"});
    tb["stream"] = true;
    bool saw = false;
    for (const auto& [name, data] : named_events(run.post("/v1/responses", tb).body))
        if (name == "response.function_call_arguments.done") {
            saw = true;
            CHECK(data["arguments"] == call["arguments"]);
        }
    CHECK(saw);
    json next = tb;
    next.erase("stream");
    next["tool_choice"] = "auto";
    next["input"] = json::array(
        {{{"role", "user"}, {"content", "What is 2 plus 3?"}},
         call,
         {{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "5"}}});
    const HttpReply nr = run.post("/v1/responses", next);
    CHECK_MESSAGE(nr.status == 200, nr.body);
}

TEST_CASE("server: stored responses: previous_response_id, GET and DELETE /v1/responses/{id}") {
    // A conversation continued by previous_response_id prefills what a request that sends
    // the whole conversation prefills, and answers the same; "store": false keeps nothing.
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/2048);
    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::ChatML);
    Running run(cfg, s);
    const json first = {{"instructions", "You tell stories."},
                        {"input", "Tell me about a cat."},
                        {"max_output_tokens", 12},
                        {"temperature", 0}};
    const json a = json::parse(run.post("/v1/responses", first).body);
    const std::string id = a["id"];
    CHECK(a["store"] == true);
    const HttpReply got = run.get("/v1/responses/" + id);
    REQUIRE(got.status == 200);
    CHECK(json::parse(got.body) == a);
    // The next turn: only the new input (and, as OpenAI's, the instructions again if wanted).
    const json second = {{"previous_response_id", id},
                         {"instructions", "You tell stories."},
                         {"input", "And a dog?"},
                         {"max_output_tokens", 12},
                         {"temperature", 0}};
    const json b = json::parse(run.post("/v1/responses", second).body);
    CHECK(b["previous_response_id"] == id);
    json whole_input = json::array({{{"role", "user"}, {"content", "Tell me about a cat."}}});
    for (const json& item : a["output"]) whole_input.push_back(item);
    whole_input.push_back({{"role", "user"}, {"content", "And a dog?"}});
    json whole = second;
    whole.erase("previous_response_id");
    whole["input"] = whole_input;
    const json c = json::parse(run.post("/v1/responses", whole).body);
    CHECK(b["output"][0]["content"] == c["output"][0]["content"]);
    CHECK(b["usage"]["input_tokens"] == c["usage"]["input_tokens"]);
    // Streamed answers are kept too; "store": false is not.
    json streamed = first;
    streamed["stream"] = true;
    const std::string body = run.post("/v1/responses", streamed).body;
    const size_t at = body.find("\"id\":\"resp_");
    REQUIRE(at != std::string::npos);
    const std::string sid = body.substr(at + 6, body.find('"', at + 6) - at - 6);
    CHECK(run.get("/v1/responses/" + sid).status == 200);
    json unkept = first;
    unkept["store"] = false;
    const json u = json::parse(run.post("/v1/responses", unkept).body);
    CHECK(u["store"] == false);
    CHECK(run.get("/v1/responses/" + u["id"].get<std::string>()).status == 404);
    // DELETE forgets; an unknown id is a 404 for GET, DELETE and previous_response_id.
    const HttpReply del = HttpClient(run.server.port()).request("DELETE", "/v1/responses/" + id);
    REQUIRE(del.status == 200);
    CHECK(json::parse(del.body)["deleted"] == true);
    CHECK(run.get("/v1/responses/" + id).status == 404);
    CHECK(HttpClient(run.server.port()).request("DELETE", "/v1/responses/" + id).status == 404);
    const HttpReply gone = run.post("/v1/responses", second);
    CHECK(gone.status == 404);
    CHECK(json::parse(gone.body)["error"]["message"].get<std::string>().find("no stored") !=
          std::string::npos);
    CHECK(run.post("/v1/responses", {{"input", "Hi"}, {"previous_response_id", 5}}).status == 400);
    // A field of the wrong type is the client's error, here and in Anthropic's API.
    CHECK(run.post("/v1/responses", {{"input", "Hi"}, {"stream", "yes"}}).status == 400);
    CHECK(run.post("/v1/messages", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                    {"max_tokens", 3},
                                    {"stream", "yes"}})
              .status == 400);
}

TEST_CASE("server: /v1/responses truncation auto fits a long conversation into the context") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/64);
    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::ChatML);
    Running run(cfg, s);
    const std::string story = "Once upon a time there was a little cat who liked to play.";
    json input = json::array();
    for (int i = 0; i < 4; ++i) {
        input.push_back({{"role", "user"}, {"content", story}});
        input.push_back({{"role", "assistant"}, {"content", "The cat played."}});
    }
    input.push_back({{"role", "user"}, {"content", "And then?"}});
    json body = {{"input", input}, {"max_output_tokens", 4}, {"temperature", 0}};
    const HttpReply off = run.post("/v1/responses", body);
    CHECK(off.status == 400);
    CHECK(off.body.find("the context holds 64 tokens") != std::string::npos);
    body["truncation"] = "auto";
    const HttpReply r = run.post("/v1/responses", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json m = json::parse(r.body);
    CHECK(m["truncation"] == "auto");
    CHECK(m["usage"]["input_tokens"].get<int>() < 64);
    CHECK(m["usage"]["input_tokens"].get<int>() > 10);  // (the latest items stayed)
    body["truncation"] = "middle";
    CHECK(run.post("/v1/responses", body).status == 400);
}
