// Tool calling on /v1/chat/completions (server_tools.h): the request's tools become a
// system-prompt text and a grammar, so whatever the model writes is a call of a listed tool
// with arguments matching its schema (or, with tool_choice "auto", an answer); the reply comes
// back as OpenAI's tool_calls, streamed the same as whole; earlier calls and their results in
// the conversation are written into the prompt; bad tool requests get one clear 400 each;
// OpenAI's older functions / function_call work the same, their call as "function_call".
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "grammar.h"
#include "json_schema.h"
#include "modes/server_tools.h"
#include "server_test_util.h"
#include "tool_test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

std::shared_ptr<const Grammar> schema_grammar(const ojson& schema) {
    return Grammar::parse(json_schema_to_grammar(schema));
}

}  // namespace

TEST_CASE("tools: the reply schema admits exactly calls of listed tools (or an answer)") {
    ojson req = {{"tools", weather_and_add()}};
    std::optional<ChatTools> t = chat_tools_from_json(req);
    REQUIRE(t);
    CHECK(t->functions.size() == 2);
    CHECK(!t->required);
    auto g = schema_grammar(chat_tools_schema(*t));
    CHECK(
        grammar_accepts(*g, R"({"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]})"));
    CHECK(grammar_accepts(
        *g, R"({"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo","unit":"celsius"}},)"
            R"({"name":"add","arguments":{"a":3,"b":4}}]})"));
    CHECK(grammar_accepts(*g, R"({"response": "It is sunny."})"));
    CHECK(!grammar_accepts(*g, R"({"tool_calls": [{"name": "mul", "arguments": {}}]})"));
    CHECK(!grammar_accepts(*g, R"({"tool_calls": [{"name": "add", "arguments": {"a": 1}}]})"));
    CHECK(!grammar_accepts(
        *g, R"({"tool_calls": [{"name": "add", "arguments": {"a": "1", "b": 2}}]})"));
    CHECK(!grammar_accepts(*g, R"({"tool_calls": []})"));
    CHECK(!grammar_accepts(*g, "It is sunny."));

    // "required", no parallel calls: one call, no answer.
    req["tool_choice"] = "required";
    req["parallel_tool_calls"] = false;
    t = chat_tools_from_json(req);
    REQUIRE(t);
    g = schema_grammar(chat_tools_schema(*t));
    CHECK(
        grammar_accepts(*g, R"({"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]})"));
    CHECK(!grammar_accepts(*g, R"({"response": "It is sunny."})"));
    CHECK(!grammar_accepts(*g, R"({"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}},)"
                               R"({"name": "add", "arguments": {"a": 1, "b": 2}}]})"));
    CHECK(chat_tools_instructions(*t).find("exactly one call") != std::string::npos);
    CHECK(chat_tools_instructions(*t).find("\"response\"") == std::string::npos);

    // One named tool: only it.
    req["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
    t = chat_tools_from_json(req);
    REQUIRE(t);
    CHECK(t->only == "get_weather");
    g = schema_grammar(chat_tools_schema(*t));
    CHECK(grammar_accepts(
        *g,
        R"({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}]})"));
    CHECK(!grammar_accepts(*g,
                           R"({"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]})"));

    // "none" and no tools: plain chat.
    req["tool_choice"] = "none";
    CHECK(!chat_tools_from_json(req));
    CHECK(!chat_tools_from_json(ojson{{"tools", ojson::array()}}));

    // A tool without parameters takes {}; $defs of a tool's parameters reach the root.
    const ojson defs = ojson::parse(R"({"tools": [
      {"type": "function", "function": {"name": "now"}},
      {"type": "function", "function": {"name": "move", "parameters": {"type": "object",
        "properties": {"to": {"$ref": "#/$defs/Point"}}, "required": ["to"],
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}},
                            "required": ["x"]}}}}}]})");
    t = chat_tools_from_json(defs);
    REQUIRE(t);
    g = schema_grammar(chat_tools_schema(*t));
    CHECK(grammar_accepts(*g, R"({"tool_calls": [{"name": "now", "arguments": {}}]})"));
    CHECK(grammar_accepts(*g,
                          R"({"tool_calls": [{"name": "move", "arguments": {"to": {"x": 5}}}]})"));
    CHECK(!grammar_accepts(
        *g, R"({"tool_calls": [{"name": "move", "arguments": {"to": {"x": "5"}}}]})"));
}

TEST_CASE("tools: bad tool requests are refused with a clear message") {
    struct Case {
        std::string request;
        std::string message;
    };
    const std::vector<Case> cases = {
        {R"({"tools": {"type": "function"}})", "'tools' must be a list"},
        {R"({"tools": [{"type": "retrieval"}]})", "'tools'[0] must be"},
        {R"({"tools": [{"type": "function", "function": {"description": "x"}}]})",
         "non-empty string 'name'"},
        {R"({"tools": [{"function": {"name": "a"}}, {"function": {"name": "a"}}]})", "'a' twice"},
        {R"({"tools": [{"function": {"name": "a", "parameters": 3}}]})",
         "must be a JSON schema object"},
        {R"({"tools": [{"function": {"name": "a"}}], "tool_choice": "sometimes"})",
         "\"sometimes\""},
        {R"({"tools": [{"function": {"name": "a"}}], "tool_choice": {"type": "function",
            "function": {"name": "b"}}})",
         "'b', which 'tools' does not list"},
        {R"({"tool_choice": {"type": "function", "function": {"name": "b"}}})", "lists no 'tools'"},
        {R"({"tools": [{"function": {"name": "a"}}], "parallel_tool_calls": "yes"})",
         "true or false"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.request);
        try {
            chat_tools_from_json(ojson::parse(c.request));
            FAIL("no error");
        } catch (const Error& e) {
            CHECK_MESSAGE(std::string(e.what()).find(c.message) != std::string::npos, e.what());
        }
    }
}

TEST_CASE("tools: earlier calls and their results are written into the conversation") {
    const ojson messages = ojson::parse(R"([
      {"role": "user", "content": "Weather in Oslo and Rome?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
        {"id": "c2", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "rain"},
      {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "sun"}]},
      {"role": "developer", "content": "Be brief."}
    ])");
    const std::vector<ChatMessage> m = chat_messages_from_json(messages);
    REQUIRE(m.size() == 4);
    CHECK(m[0] == ChatMessage{"user", "Weather in Oslo and Rome?"});
    CHECK(m[1].role == "assistant");
    CHECK(m[1].content == R"({"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}},)"
                          R"({"name":"get_weather","arguments":{"city":"Rome"}}]})");
    CHECK(m[2].role == "user");  // both results in one message, with the tools' names
    CHECK(m[2].content ==
          R"({"tool_results":[{"tool_call_id":"c1","name":"get_weather","content":"rain"},)"
          R"({"tool_call_id":"c2","name":"get_weather","content":"sun"}]})");
    CHECK(m[3] == ChatMessage{"system", "Be brief."});

    // Replies read back.
    ChatToolReply r = chat_tools_parse_generic(
        R"({"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "now", "arguments": {}}]})",
        "call_x");
    REQUIRE(r.calls.size() == 2);
    CHECK(r.calls[0].id == "call_x_0");
    CHECK(r.calls[0].name == "add");
    CHECK(r.calls[0].arguments == R"({"a":1,"b":2})");
    CHECK(r.calls[1].id == "call_x_1");
    r = chat_tools_parse_generic(R"({"response": "Hello"})", "c");
    CHECK(r.calls.empty());
    CHECK(r.content == "Hello");
    r = chat_tools_parse_generic(R"({"tool_calls": [{"name": "ad)", "c");  // cut short: shown whole
    CHECK(r.calls.empty());
    CHECK(r.content == R"({"tool_calls": [{"name": "ad)");
}

TEST_CASE("tools: an answer's text is known while it is generated") {
    const std::string reply = R"({ "response" : "Hi \"there\"\n\u00e9\ud83d\ude00 end"})";
    const std::string answer = "Hi \"there\"\n\u00e9\U0001F600 end";
    std::string last;
    for (size_t n = 0; n <= reply.size(); ++n) {
        CAPTURE(reply.substr(0, n));
        const ToolAnswerPrefix a = tool_answer_prefix(reply.substr(0, n));
        if (n <= reply.find('"', reply.find(':'))) {  // before the string opens
            CHECK(!a.answer);
            CHECK(!a.decided);
            continue;
        }
        REQUIRE(a.answer);
        CHECK(answer.rfind(a.text, 0) == 0);  // a prefix of the answer, growing
        CHECK(a.text.size() >= last.size());
        last = a.text;
    }
    CHECK(last == answer);
    CHECK(!tool_answer_prefix(R"({"tool_calls": [)").answer);
    CHECK(tool_answer_prefix(R"({"tool_calls": [)").decided);
    CHECK(!tool_answer_prefix("{\"resp").decided);
    // Cut short (max_tokens): the answer so far.
    CHECK(chat_tools_parse_generic(R"({"response": "It is sun)", "c").content == "It is sun");
}

TEST_CASE("server: tool calls on /v1/chat/completions, whole and streamed") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/2048);
    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::ChatML);
    Running run(cfg, s);
    const std::set<std::string> both = {"get_weather", "add"};
    const json tools = json::parse(weather_and_add().dump());
    const json messages = {{{"role", "user"}, {"content", "What is 2 plus 3?"}}};

    // "required", one call: the model (a 260K-parameter story model, which knows nothing of
    // tools) still produces a well-formed call of a listed tool.
    json body = {{"messages", messages},         {"tools", tools},    {"tool_choice", "required"},
                 {"parallel_tool_calls", false}, {"max_tokens", 200}, {"temperature", 0}};
    HttpReply r = run.post("/v1/chat/completions", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    json j = json::parse(r.body);
    json choice = j["choices"][0];
    CHECK(choice["finish_reason"] == "tool_calls");
    CHECK(choice["message"]["role"] == "assistant");
    CHECK(choice["message"]["content"].is_null());
    REQUIRE(choice["message"]["tool_calls"].size() == 1);
    check_call(choice["message"]["tool_calls"][0], both);
    const json whole_calls = choice["message"]["tool_calls"];

    // Streamed: no text deltas, then one delta with the same calls (indexed), then the finish.
    body["stream"] = true;
    r = run.post("/v1/chat/completions", body);
    REQUIRE(r.status == 200);
    const auto events = sse_data(r.body);
    REQUIRE(events.size() == 3);
    CHECK(events[2] == "[DONE]");
    const json delta = json::parse(events[0])["choices"][0]["delta"];
    CHECK(delta["role"] == "assistant");
    REQUIRE(delta["tool_calls"].size() == 1);
    CHECK(delta["tool_calls"][0]["index"] == 0);
    CHECK(delta["tool_calls"][0]["function"] == whole_calls[0]["function"]);
    CHECK(json::parse(events[1])["choices"][0]["finish_reason"] == "tool_calls");

    // A named tool, several samples: every sample calls it.
    body = {{"messages", messages},
            {"tools", tools},
            {"tool_choice", {{"type", "function"}, {"function", {{"name", "add"}}}}},
            {"parallel_tool_calls", false},
            {"n", 3},
            {"seed", 7},
            {"max_tokens", 200}};
    r = run.post("/v1/chat/completions", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    j = json::parse(r.body);
    REQUIRE(j["choices"].size() == 3);
    std::set<std::string> ids;
    for (const json& c : j["choices"]) {
        CHECK(c["finish_reason"] == "tool_calls");
        REQUIRE(c["message"]["tool_calls"].size() == 1);
        check_call(c["message"]["tool_calls"][0], {"add"});
        ids.insert(c["message"]["tool_calls"][0]["id"].get<std::string>());
    }
    CHECK(ids.size() == 3);  // unique per choice

    // "auto" after a call and its result: a call or an answer, either well formed.
    const json history = json::parse(R"([
      {"role": "user", "content": "What is 2 plus 3?"},
      {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "5"}])");
    body = {{"messages", history},
            {"tools", tools},
            {"parallel_tool_calls", false},
            {"max_tokens", 300},
            {"temperature", 0}};
    r = run.post("/v1/chat/completions", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    choice = json::parse(r.body)["choices"][0];
    if (choice["finish_reason"] == "tool_calls") {
        for (const json& c : choice["message"]["tool_calls"]) check_call(c, both);
    } else {
        INFO(choice.dump());
        CHECK(choice["finish_reason"] == "stop");
        CHECK(choice["message"]["content"].is_string());
        CHECK(!choice["message"].contains("tool_calls"));
    }
    // Streamed: an answer comes as it is generated (several content deltas adding up to the
    // whole response's content), calls as one delta.
    json sbody = body;
    sbody["stream"] = true;
    const HttpReply sr = run.post("/v1/chat/completions", sbody);
    REQUIRE(sr.status == 200);
    std::string streamed;
    int content_chunks = 0;
    json streamed_calls = json::array();
    for (const std::string& e : sse_data(sr.body)) {
        if (e == "[DONE]") continue;
        const json d = json::parse(e)["choices"][0]["delta"];
        if (d.contains("content") && d["content"].is_string() &&
            !d["content"].get<std::string>().empty()) {
            streamed += d["content"].get<std::string>();
            ++content_chunks;
        }
        if (d.contains("tool_calls"))
            for (const json& c : d["tool_calls"]) streamed_calls.push_back(c);
    }
    if (choice["finish_reason"] == "tool_calls") {
        CHECK(streamed_calls.size() == choice["message"]["tool_calls"].size());
        CHECK(streamed.empty());
    } else {
        CHECK(streamed == choice["message"]["content"]);
        CHECK(content_chunks > 1);
    }
    MESSAGE("auto after a result: ", choice["finish_reason"]);

    // An answer, streamed: a bias on the token "re" tips this model to {"response": ...}.
    const TokenId re = s.m.tokenizer->find_token("re");
    REQUIRE(re >= 0);
    json answer_body = {{"messages", messages},
                        {"tools", tools},
                        {"max_tokens", 60},
                        {"temperature", 0},
                        {"logit_bias", json::array({json::array({re, 10})})}};
    const json whole_answer =
        json::parse(run.post("/v1/chat/completions", answer_body).body)["choices"][0];
    REQUIRE(whole_answer["finish_reason"] != "tool_calls");
    const std::string answer_text = whole_answer["message"]["content"];
    CHECK(!answer_text.empty());
    CHECK(answer_text.find("response") == std::string::npos);  // the answer, not the JSON
    answer_body["stream"] = true;
    std::string streamed_answer;
    int answer_chunks = 0;
    for (const std::string& e : sse_data(run.post("/v1/chat/completions", answer_body).body)) {
        if (e == "[DONE]") continue;
        const json d = json::parse(e)["choices"][0]["delta"];
        if (d.contains("content") && d["content"].is_string() &&
            !d["content"].get<std::string>().empty()) {
            streamed_answer += d["content"].get<std::string>();
            ++answer_chunks;
        }
        CHECK(!d.contains("tool_calls"));
    }
    CHECK(streamed_answer == answer_text);
    CHECK(answer_chunks > 1);

    // The prompt the server built holds the tools, the call and its result.
    ApiContext ctx = cfg.api;
    const ApiRequest ar =
        api_request_from_json(ApiFormat::OpenAiChat, body.dump(), ctx, *s.m.tokenizer);
    const std::string& prompt = ar.prompt_texts[0];
    CHECK(prompt.find(R"({"name":"get_weather","description":"The weather in a city.")") !=
          std::string::npos);
    CHECK(prompt.find(R"({"tool_calls":[{"name":"add","arguments":{"a":2,"b":3}}]})") !=
          std::string::npos);
    CHECK(prompt.find(R"({"tool_results":[{"tool_call_id":"c1","name":"add","content":"5"}]})") !=
          std::string::npos);

    // Bad combinations: one clear 400 each.
    struct Bad {
        std::string path;
        json body;
        std::string message;
    };
    const std::vector<Bad> bad = {
        {"/v1/completions", {{"prompt", "x"}, {"tools", tools}}, "/v1/chat/completions"},
        {"/v1/chat/completions",
         {{"messages", messages}, {"tools", tools}, {"response_format", {{"type", "json_object"}}}},
         "drop 'grammar'"},
        {"/v1/chat/completions",
         {{"messages", messages}, {"tools", tools}, {"grammar", "root ::= \"x\""}},
         "drop 'grammar'"},
        {"/v1/chat/completions",
         {{"messages",
           {{{"role", "user"}, {"content", "x"}}, {{"role", "assistant"}, {"content", "y"}}}},
          {"tools", tools}},
         "cannot use 'tools'"},
        {"/v1/chat/completions",
         {{"messages", messages},
          {"tools", json::parse(R"([{"type": "function", "function": {"name": "f",
              "parameters": {"type": "object",
                             "properties": {"s": {"type": "string", "pattern": "^(a)\\1$"}}}}}])")}},
         "pattern"},
        {"/v1/chat/completions",
         {{"messages", messages},
          {"functions", json::array({tools[0]["function"]})},
          {"tools", tools}},
         "give one"},
        {"/v1/chat/completions",
         {{"messages", messages}, {"functions", tools}},
         "needs a non-empty string 'name'"},
        {"/v1/chat/completions",
         {{"messages", messages},
          {"functions", json::array({tools[0]["function"]})},
          {"function_call", "maybe"}},
         "'function_call'"},
        {"/v1/chat/completions",
         {{"messages", {{{"role", "function"}, {"content", "5"}}}}},
         "needs the function's 'name'"},
        {"/v1/completions",
         {{"prompt", "x"}, {"functions", json::array({tools[0]["function"]})}},
         "for /v1/chat/completions"},
    };
    for (const Bad& b : bad) {
        CAPTURE(b.body.dump());
        const HttpReply e = run.post(b.path, b.body);
        CHECK(e.status == 400);
        CHECK_MESSAGE(e.body.find(b.message) != std::string::npos, e.body);
    }
}

TEST_CASE("server: OpenAI's older functions and function_call, whole and streamed") {
    // The older form, rewritten into the newer one.
    const json tools = json::parse(weather_and_add().dump());
    json fns = json::array();
    for (const json& t : tools) fns.push_back(t["function"]);
    ojson req = ojson::parse(json{{"functions", fns}, {"function_call", {{"name", "add"}}}}.dump());
    CHECK(chat_functions_to_tools(req));
    CHECK_FALSE(req.contains("functions"));
    CHECK(req["tools"].size() == 2);
    CHECK(req["tools"][1]["function"]["name"] == "add");
    CHECK(req["tool_choice"]["function"]["name"] == "add");
    CHECK(req["parallel_tool_calls"] == false);
    ojson plain = ojson::parse(R"({"function_call": "none"})");
    CHECK_FALSE(chat_functions_to_tools(plain));
    CHECK(plain["tool_choice"] == "none");
    // A conversation in the older form is the same prompt as in the newer one.
    const json old_history = json::parse(R"([
      {"role": "user", "content": "What is 2 plus 3?"},
      {"role": "assistant", "content": null,
       "function_call": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}},
      {"role": "function", "name": "add", "content": "5"}])");
    const json new_history = json::parse(R"([
      {"role": "user", "content": "What is 2 plus 3?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "5"}])");

    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/2048);
    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::ChatML);
    Running run(cfg, s);
    const HttpReply a =
        run.post("/apply-template", {{"messages", old_history}, {"functions", fns}});
    const HttpReply b =
        run.post("/apply-template",
                 {{"messages", new_history}, {"tools", tools}, {"parallel_tool_calls", false}});
    REQUIRE_MESSAGE(a.status == 200, a.body);
    CHECK(json::parse(a.body)["prompt"] == json::parse(b.body)["prompt"]);

    // A named function: the message's function_call, finish_reason "function_call".
    json body = {{"messages", {{{"role", "user"}, {"content", "What is 2 plus 3?"}}}},
                 {"functions", fns},
                 {"function_call", {{"name", "add"}}},
                 {"max_tokens", 200},
                 {"temperature", 0}};
    HttpReply r = run.post("/v1/chat/completions", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json choice = json::parse(r.body)["choices"][0];
    CHECK(choice["finish_reason"] == "function_call");
    CHECK_FALSE(choice["message"].contains("tool_calls"));
    CHECK(choice["message"]["content"].is_null());
    const json fc = choice["message"]["function_call"];
    check_call({{"type", "function"}, {"id", "x"}, {"function", fc}}, {"add"});
    // Streamed: one delta with the same function_call, then the finish.
    body["stream"] = true;
    r = run.post("/v1/chat/completions", body);
    REQUIRE(r.status == 200);
    const auto events = sse_data(r.body);
    REQUIRE(events.size() == 3);
    CHECK(json::parse(events[0])["choices"][0]["delta"]["function_call"] == fc);
    CHECK(json::parse(events[1])["choices"][0]["finish_reason"] == "function_call");
    // "auto" after the older history: a call or an answer, in the older form.
    body = {{"messages", old_history}, {"functions", fns}, {"max_tokens", 300}, {"temperature", 0}};
    r = run.post("/v1/chat/completions", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json after = json::parse(r.body)["choices"][0];
    CHECK_FALSE(after["message"].contains("tool_calls"));
    if (after["finish_reason"] == "function_call")
        check_call(
            {{"type", "function"}, {"id", "x"}, {"function", after["message"]["function_call"]}},
            {"get_weather", "add"});
    else
        CHECK(after["message"]["content"].is_string());
}
