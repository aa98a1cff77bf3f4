// Logprobs over the server: echo scores the prompt's tokens as generation scores its own,
// and streamed logprobs come with their chunks and add up to the whole response's (text
// completions with and without echo, chat, llama.cpp's /completion).
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "server_test_util.h"
#include "test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;

TEST_CASE("server: echo with logprobs scores the prompt's tokens as generation scores its own") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path);
    Running run(s.config(), s);
    // Greedy continuation with its tokens' log-probabilities (llama.cpp's endpoint gives ids).
    const HttpReply g = run.post(
        "/completion",
        {{"prompt", "Once upon a time"}, {"n_predict", 6}, {"temperature", 0}, {"n_probs", 2}});
    REQUIRE(g.status == 200);
    const json probs = json::parse(g.body)["completion_probabilities"];
    REQUIRE(probs.size() == 6);
    std::vector<TokenId> ids = s.m.tokenizer->encode("Once upon a time", true, false);
    const size_t n_prompt = ids.size();
    for (const json& p : probs) ids.push_back(p["id"].get<TokenId>());
    // The whole text as the prompt, nothing generated: the last six logprobs are those.
    const HttpReply e = run.post(
        "/v1/completions", {{"prompt", ids}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 2}});
    REQUIRE(e.status == 200);
    const json lp = json::parse(e.body)["choices"][0]["logprobs"];
    REQUIRE(lp["token_logprobs"].size() == ids.size());
    CHECK(lp["token_logprobs"][0].is_null());
    CHECK(lp["top_logprobs"][0].is_null());
    for (size_t i = 0; i < 6; ++i) {
        CAPTURE(i);
        CHECK(lp["token_logprobs"][n_prompt + i].get<double>() ==
              doctest::Approx(probs[i]["logprob"].get<double>()).epsilon(1e-4));
        CHECK(lp["top_logprobs"][n_prompt + i].size() == 2);
    }
    CHECK(lp["tokens"].size() == ids.size());
    // lm-evaluation-harness's request: one generated token after the echoed prompt.
    const HttpReply h = run.post("/v1/completions", {{"prompt", "Once upon a time"},
                                                     {"max_tokens", 1},
                                                     {"temperature", 0},
                                                     {"echo", true},
                                                     {"logprobs", 1}});
    REQUIRE(h.status == 200);
    const json hj = json::parse(h.body)["choices"][0];
    CHECK(hj["text"].get<std::string>().rfind("Once upon a time", 0) == 0);
    CHECK(hj["logprobs"]["token_logprobs"].size() == n_prompt + 1);
    // Streamed: the prompt comes first; echo without logprobs needs no scoring pass.
    const HttpReply st = run.post(
        "/v1/completions",
        {{"prompt", "Once upon a time"}, {"max_tokens", 3}, {"echo", true}, {"stream", true}});
    REQUIRE(st.status == 200);
    const auto events = sse_data(st.body);
    REQUIRE(!events.empty());
    CHECK(json::parse(events[0])["choices"][0]["text"] == "Once upon a time");
    CHECK(run.metric("kv_blocks_used") == 0);
}

TEST_CASE("server: streamed logprobs come with their chunks and add up to the whole response's") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path);
    Running run(s.config(), s);
    // Text completion: tokens, logprobs, alternatives and text offsets, whole and streamed.
    // A stream's chunks pieced together: the text, the logprob lists, how many chunks with
    // text carried logprobs, and the first chunk.
    struct Pieced {
        std::string text;
        json logprobs = {{"tokens", json::array()},
                         {"token_logprobs", json::array()},
                         {"top_logprobs", json::array()},
                         {"text_offset", json::array()}};
        int chunks_with_logprobs = 0;
        json first;
    };
    auto whole_and_streamed = [&](json body) {
        body.erase("stream");
        const json whole = json::parse(run.post("/v1/completions", body).body)["choices"][0];
        body["stream"] = true;
        Pieced p;
        for (const std::string& e : sse_data(run.post("/v1/completions", body).body)) {
            if (e == "[DONE]") continue;
            const json c = json::parse(e)["choices"][0];
            if (p.first.is_null()) p.first = c;
            p.text += c["text"].get<std::string>();
            if (c["logprobs"].is_null()) continue;
            if (!c["text"].get<std::string>().empty()) ++p.chunks_with_logprobs;
            for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
                for (const json& v : c["logprobs"][k]) p.logprobs[k].push_back(v);
        }
        CHECK(p.text == whole["text"]);
        CHECK(p.logprobs == whole["logprobs"]);
        return p;
    };
    json body = {
        {"prompt", "Once upon a time"}, {"max_tokens", 12}, {"logprobs", 2}, {"temperature", 0}};
    const Pieced plain = whole_and_streamed(body);
    CHECK(plain.chunks_with_logprobs > 1);  // not all in the last chunk
    const json& got = plain.logprobs;
    for (size_t i = 0; i < got["tokens"].size(); ++i)  // offsets point at each token's text
        CHECK(plain.text.substr(got["text_offset"][i].get<size_t>(),
                                got["tokens"][i].get<std::string>().size()) == got["tokens"][i]);

    // With echo the prompt's entries come first (its first token's logprob null), in the
    // first chunk with the prompt's text; the generated tokens' follow in their chunks.
    body["echo"] = true;
    const Pieced echo = whole_and_streamed(body);
    CHECK(echo.first["text"] == "Once upon a time");
    REQUIRE(!echo.first["logprobs"].is_null());
    CHECK(echo.first["logprobs"]["token_logprobs"][0].is_null());
    CHECK(echo.first["logprobs"]["text_offset"][0] == 0);
    CHECK(echo.chunks_with_logprobs > 2);

    // Chat: {"content": [...]} per chunk.
    json chat = {{"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}},
                 {"max_tokens", 12},
                 {"logprobs", true},
                 {"top_logprobs", 3},
                 {"temperature", 0}};
    const json cwhole = json::parse(run.post("/v1/chat/completions", chat).body)["choices"][0];
    chat["stream"] = true;
    json content = json::array();
    for (const std::string& e : sse_data(run.post("/v1/chat/completions", chat).body)) {
        if (e == "[DONE]") continue;
        const json c = json::parse(e)["choices"][0];
        if (!c["logprobs"].is_null())
            for (const json& v : c["logprobs"]["content"]) content.push_back(v);
    }
    CHECK(content == cwhole["logprobs"]["content"]);
    CHECK(content.size() == 12);

    // llama.cpp's /completion: completion_probabilities per chunk.
    json native = {
        {"prompt", "Once upon a time"}, {"n_predict", 12}, {"n_probs", 2}, {"temperature", 0}};
    const json nwhole = json::parse(run.post("/completion", native).body);
    native["stream"] = true;
    json probs = json::array();
    for (const std::string& e : sse_data(run.post("/completion", native).body)) {
        const json c = json::parse(e);
        if (c.contains("completion_probabilities"))
            for (const json& v : c["completion_probabilities"]) probs.push_back(v);
    }
    CHECK(probs == nwhole["completion_probabilities"]);
    CHECK(probs.size() == 12);
}
