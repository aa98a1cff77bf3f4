// `kvrun server` end to end, in-process: an ApiServer on a real shared model (CPU) answering
// a socket client. Checks that the HTTP API gives exactly what the engine gives alone
// (greedy, concurrently and one by one), that streamed chunks add up to the whole response,
// that stop strings are cut (also across chunks), chat formatting, the llama.cpp endpoints,
// one clear 4xx per bad request, that a client hanging up cancels its generation and frees
// its KV blocks, and that stopping the server ends running requests. Also the pieces
// underneath: StopTextStream, the OpenAI request translation, Engine::cancel and
// EngineWorker. And the executable: `kvrun server --port 0` serves, and Ctrl-C exits 0.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "chat_template.h"
#include "common.h"
#include "embedding.h"
#include "engine_worker.h"
#include "http_client.h"
#include "modes/model_options.h"
#include "modes/server.h"
#include "modes/server_api.h"
#include "server_test_util.h"
#include "stop_text.h"
#include "test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;

namespace {

// Pushes the pieces one by one and returns everything shown.
std::string stream_all(StopTextStream& s, const std::vector<std::string>& pieces) {
    std::string out;
    for (const auto& p : pieces) out += s.push(p);
    return out + s.finish();
}

}  // namespace

TEST_CASE("StopTextStream: holds back a possible stop string and cuts before it") {
    {
        StopTextStream s({"<|im_end|>"});
        CHECK(s.push("Hello <|im") == "Hello ");  // "<|im" may begin the stop string
        CHECK(s.push("_e") == "");
        CHECK(s.push("nd|> more") == "");
        CHECK(s.stopped());
        CHECK(s.stop_word() == "<|im_end|>");
        CHECK(s.finish() == "");
        CHECK(s.shown() == "Hello ");
    }
    {
        StopTextStream s({"<|im_end|>"});
        CHECK(s.push("a <|i") == "a ");
        CHECK(s.push("x") == "<|ix");  // not a stop string after all: released
        CHECK(s.push("<") == "");
        CHECK(s.finish() == "<");  // the end of generation releases what was held
        CHECK(!s.stopped());
    }
    // The earliest stop string wins; one byte at a time gives the same text as all at once.
    const std::string text = "one two. three\n\nfour";
    for (size_t step : {size_t(1), size_t(3), text.size()}) {
        StopTextStream s({"\n\n", "two", "o."});
        std::vector<std::string> pieces;
        for (size_t i = 0; i < text.size(); i += step) pieces.push_back(text.substr(i, step));
        CHECK(stream_all(s, pieces) == "one ");
        CHECK(s.stop_word() == "two");
    }
    StopTextStream none({});
    CHECK(stream_all(none, {"a", "b"}) == "ab");
    CHECK(stop_string_holdback("abc</", {"</s>", "c</x"}) == 3);
}

TEST_CASE("server: completions give what the engine gives alone, also concurrently and streamed") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path);
    const std::vector<std::string> prompts = {"Once upon a time", "The little dog",
                                              "Lily wanted to play", "Tom had a red ball"};
    std::vector<std::string> expected;
    for (const auto& p : prompts) expected.push_back(s.reference(p, 24));
    Running run(s.config(), s);

    // Four clients at once: each gets its own prompt's continuation.
    std::vector<HttpReply> replies(prompts.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < prompts.size(); ++i)
        clients.emplace_back([&, i] {
            replies[i] = run.post(
                "/v1/completions",
                {{"model", "x"}, {"prompt", prompts[i]}, {"max_tokens", 24}, {"temperature", 0}});
        });
    for (auto& t : clients) t.join();
    for (size_t i = 0; i < prompts.size(); ++i) {
        INFO(prompts[i]);
        REQUIRE(replies[i].status == 200);
        CHECK(replies[i].headers["content-type"].find("application/json") == 0);
        const json j = json::parse(replies[i].body);
        CHECK(j["object"] == "text_completion");
        CHECK(j["model"] == "stories");
        CHECK(j["choices"][0]["text"] == expected[i]);
        CHECK(j["choices"][0]["finish_reason"] == "length");
        CHECK(j["usage"]["completion_tokens"] == 24);
        const auto n_prompt =
            s.m.tokenizer->encode(prompts[i], s.m.tokenizer->add_bos(), false).size();
        CHECK(j["usage"]["prompt_tokens"] == n_prompt);
        CHECK(j["usage"]["total_tokens"] == n_prompt + 24);
    }

    // Streamed: the chunks add up to the same text, then a finish chunk, usage, [DONE].
    HttpClient c(run.server.port());
    const HttpReply r = c.request("POST", "/v1/completions",
                                  json{{"prompt", prompts[0]},
                                       {"max_tokens", 24},
                                       {"temperature", 0},
                                       {"stream", true},
                                       {"stream_options", {{"include_usage", true}}}}
                                      .dump());
    REQUIRE(r.status == 200);
    CHECK(r.headers.at("content-type") == "text/event-stream");
    CHECK(r.headers.at("transfer-encoding") == "chunked");
    const auto events = sse_data(r.body);
    REQUIRE(events.size() >= 4);
    CHECK(events.back() == "[DONE]");
    std::string text;
    int n_finish = 0;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
        const json e = json::parse(events[i]);
        if (e["choices"].empty()) {  // the usage chunk, last before [DONE]
            CHECK(i + 2 == events.size());
            CHECK(e["usage"]["completion_tokens"] == 24);
            continue;
        }
        text += e["choices"][0]["text"].get<std::string>();
        if (!e["choices"][0]["finish_reason"].is_null()) {
            ++n_finish;
            CHECK(e["choices"][0]["finish_reason"] == "length");
        }
    }
    CHECK(n_finish == 1);
    CHECK(text == expected[0]);

    // A list of prompts, two samples each (greedy: equal): choices prompt by prompt, whole
    // and streamed.
    for (bool stream : {false, true}) {
        INFO("stream " << stream);
        const HttpReply lr = run.post("/v1/completions", {{"prompt", {prompts[2], prompts[3]}},
                                                          {"max_tokens", 24},
                                                          {"temperature", 0},
                                                          {"n", 2},
                                                          {"stream", stream}});
        REQUIRE(lr.status == 200);
        std::vector<std::string> texts(4);
        std::vector<int> finished(4, 0);
        if (!stream) {
            const json j = json::parse(lr.body);
            REQUIRE(j["choices"].size() == 4);
            for (const json& c : j["choices"]) {
                texts[c["index"].get<size_t>()] = c["text"];
                ++finished[c["index"].get<size_t>()];
            }
            CHECK(j["usage"]["completion_tokens"] == 4 * 24);
        } else {
            for (const auto& e : sse_data(lr.body)) {
                if (e == "[DONE]") continue;
                const json c = json::parse(e)["choices"][0];
                texts[c["index"].get<size_t>()] += c["text"].get<std::string>();
                if (!c["finish_reason"].is_null()) ++finished[c["index"].get<size_t>()];
            }
        }
        for (size_t i = 0; i < 4; ++i) {
            CHECK(texts[i] == expected[2 + i / 2]);
            CHECK(finished[i] == 1);
        }
    }

    // A client resending a long prompt (a conversation so far) prefills only what the prefix
    // cache lacks.
    std::string story = "Once upon a time";
    for (int i = 0; i < 12; ++i) story += " there was a little dog who liked to run";
    const json first =
        json::parse(run.post("/v1/completions", {{"prompt", story}, {"max_tokens", 4}}).body);
    const json second = json::parse(
        run.post("/v1/completions", {{"prompt", story + " and jump"}, {"max_tokens", 4}}).body);
    const int n_prompt2 = second["usage"]["prompt_tokens"];
    CHECK(first["timings"]["prompt_tokens_computed"] == first["usage"]["prompt_tokens"]);
    CHECK(second["timings"]["prompt_tokens_computed"].get<int>() <= n_prompt2 % 16 + 16);

    // Keep-alive: a second request on the same connection.
    const HttpReply again =
        c.request("POST", "/v1/completions",
                  json{{"prompt", prompts[1]}, {"max_tokens", 24}, {"temperature", 0}}.dump());
    REQUIRE(again.status == 200);
    CHECK(json::parse(again.body)["choices"][0]["text"] == expected[1]);
}

TEST_CASE("server: speculative decoding (prompt lookup) gives the same greedy texts") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served plain(path);
    Served spec(path, 512, 4, 3);
    REQUIRE(spec.engine->speculative());
    const std::string prompt = "Once upon a time, there was a little girl. Once upon a time";
    const std::string expected = plain.reference(prompt, 48);
    Running run(spec.config(), spec);
    std::vector<HttpReply> replies(3);
    std::vector<std::thread> clients;
    for (auto& r : replies)
        clients.emplace_back([&] {
            r = run.post("/v1/completions",
                         {{"prompt", prompt}, {"max_tokens", 48}, {"temperature", 0}});
        });
    for (auto& t : clients) t.join();
    for (const HttpReply& r : replies) {
        REQUIRE(r.status == 200);
        CHECK(json::parse(r.body)["choices"][0]["text"] == expected);
    }
    SpeculativeStats st;
    run.server.worker().call([&](Engine& e) { st = e.stats().spec; });
    CHECK(st.drafted > 0);  // it did speculate
    CHECK(st.accepted > 0);
}

TEST_CASE("server: stop strings end the text before them, streamed or not") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path);
    const std::string prompt = "Once upon a time";
    const std::string full = s.reference(prompt, 40);
    // A stop string from the middle of the reply: its third word with the space before it.
    const size_t a = full.find(' ', full.find(' ', 1) + 1);
    const size_t b = full.find(' ', a + 1);
    REQUIRE(a != std::string::npos);
    REQUIRE(b != std::string::npos);
    const std::string stop = full.substr(a, b - a);
    const std::string expected = full.substr(0, full.find(stop));
    CHECK(s.reference(prompt, 40, {stop}) == expected);
    Running run(s.config(), s);
    for (bool stream : {false, true}) {
        INFO("stream " << stream);
        const HttpReply r = run.post("/v1/completions", {{"prompt", prompt},
                                                         {"max_tokens", 40},
                                                         {"temperature", 0},
                                                         {"stop", stop},
                                                         {"stream", stream}});
        REQUIRE(r.status == 200);
        std::string text, finish;
        if (!stream) {
            const json j = json::parse(r.body);
            text = j["choices"][0]["text"];
            finish = j["choices"][0]["finish_reason"];
        } else {
            for (const auto& e : sse_data(r.body)) {
                if (e == "[DONE]") continue;
                const json c = json::parse(e)["choices"][0];
                text += c["text"].get<std::string>();
                if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
            }
        }
        CHECK(text == expected);
        CHECK(finish == "stop");
    }
    // llama.cpp's /completion names the stop word.
    const HttpReply r = run.post(
        "/completion",
        {{"prompt", prompt}, {"n_predict", 40}, {"temperature", 0}, {"stop", json::array({stop})}});
    REQUIRE(r.status == 200);
    const json j = json::parse(r.body);
    CHECK(j["content"] == expected);
    CHECK(j["stop_type"] == "word");
    CHECK(j["stopping_word"] == stop);
}

TEST_CASE("server: chat completions, llama.cpp endpoints, multiple samples and logprobs") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path);
    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::ChatML);
    const std::vector<ChatMessage> msgs = {{"system", "You tell stories."},
                                           {"user", "Tell me about a cat."}};
    const std::string rendered = chat_template_apply(ChatTemplateKind::ChatML, msgs, true);
    const std::vector<TokenId> prompt =
        s.m.tokenizer->encode(rendered, s.m.tokenizer->add_bos(), true);
    Running run(cfg, s);
    const json body = {
        {"messages",
         {{{"role", "system"}, {"content", "You tell stories."}},
          {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Tell me about a cat."}}}}}}},
        {"max_tokens", 16},
        {"temperature", 0}};
    const HttpReply r = run.post("/v1/chat/completions", body);
    REQUIRE(r.status == 200);
    const json j = json::parse(r.body);
    CHECK(j["object"] == "chat.completion");
    CHECK(j["choices"][0]["message"]["role"] == "assistant");
    CHECK(j["usage"]["prompt_tokens"] == prompt.size());
    const std::string reply = j["choices"][0]["message"]["content"];
    // The same request as tokens through /completion gives the same text.
    const HttpReply n = run.post("/completion", {{"prompt", prompt},
                                                 {"n_predict", 16},
                                                 {"temperature", 0},
                                                 {"stop", json::array({"<|im_end|>"})}});
    REQUIRE(n.status == 200);
    CHECK(json::parse(n.body)["content"] == reply);
    CHECK(json::parse(n.body)["tokens_evaluated"] == prompt.size());
    // Streamed chat: a role in the first delta, the same content in all.
    json sb = body;
    sb["stream"] = true;
    const HttpReply st = run.post("/v1/chat/completions", sb);
    REQUIRE(st.status == 200);
    std::string streamed;
    const auto events = sse_data(st.body);
    REQUIRE(!events.empty());
    CHECK(events.back() == "[DONE]");
    for (size_t i = 0; i + 1 < events.size(); ++i) {
        const json e = json::parse(events[i]);
        CHECK(e["object"] == "chat.completion.chunk");
        const json& d = e["choices"][0]["delta"];
        if (i == 0 && !reply.empty()) CHECK(d["role"] == "assistant");
        if (d.contains("content")) streamed += d["content"].get<std::string>();
    }
    CHECK(streamed == reply);

    // A conversation ending with the assistant's words continues them (assistant prefill).
    const HttpReply pre = run.post("/v1/chat/completions",
                                   {{"messages",
                                     {{{"role", "user"}, {"content", "Tell me about a cat."}},
                                      {{"role", "assistant"}, {"content", "Once upon a time"}}}},
                                    {"max_tokens", 8},
                                    {"temperature", 0}});
    REQUIRE(pre.status == 200);
    const std::string pre_prompt =
        chat_template_apply(ChatTemplateKind::ChatML, {{"user", "Tell me about a cat."}}, true) +
        "Once upon a time";
    CHECK(json::parse(pre.body)["usage"]["prompt_tokens"] ==
          s.m.tokenizer->encode(pre_prompt, s.m.tokenizer->add_bos(), true).size());

    // A reasoning budget: a reply that starts inside "<think>" (here the assistant's words
    // open it) thinks 4 tokens, then the message and the end tag are forced.
    const json think_msgs = {{{"role", "user"}, {"content", "Tell me about a cat."}},
                             {{"role", "assistant"}, {"content", "<think>"}}};
    const std::vector<TokenId> think_prompt = s.m.tokenizer->encode(
        chat_template_apply(ChatTemplateKind::ChatML, {{"user", "Tell me about a cat."}}, true) +
            "<think>",
        s.m.tokenizer->add_bos(), true);
    const HttpReply own =
        run.post("/completion", {{"prompt", think_prompt}, {"n_predict", 4}, {"temperature", 0}});
    REQUIRE(own.status == 200);
    const HttpReply cut =
        run.post("/v1/chat/completions", {{"messages", think_msgs},
                                          {"max_tokens", 16},
                                          {"temperature", 0},
                                          {"reasoning_budget_tokens", 4},
                                          {"reasoning_budget_message", " Done."}});
    REQUIRE(cut.status == 200);
    const std::string cut_text = json::parse(cut.body)["choices"][0]["message"]["content"];
    CHECK_MESSAGE(cut_text.starts_with(json::parse(own.body)["content"].get<std::string>() +
                                       " Done.</think>"),
                  cut_text);
    const HttpReply bad_budget = run.post(
        "/v1/chat/completions", {{"messages", think_msgs}, {"thinking_budget_tokens", -5}});
    CHECK(bad_budget.status == 400);
    CHECK(bad_budget.body.find("thinking_budget_tokens") != std::string::npos);

    // response_format json_schema: the reply is JSON of that schema.
    const HttpReply js = run.post(
        "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "How is the cat?"}}}},
                                 {"max_tokens", 200},
                                 {"response_format",
                                  {{"type", "json_schema"},
                                   {"json_schema",
                                    {{"name", "mood"},
                                     {"schema",
                                      {{"type", "object"},
                                       {"properties", {{"mood", {{"enum", {"happy", "sad"}}}}}},
                                       {"required", {"mood"}},
                                       {"additionalProperties", false}}}}}}}});
    REQUIRE(js.status == 200);
    const json jj = json::parse(js.body);
    CHECK(jj["choices"][0]["finish_reason"] == "stop");
    const json mood = json::parse(jj["choices"][0]["message"]["content"].get<std::string>());
    CHECK((mood == json{{"mood", "happy"}} || mood == json{{"mood", "sad"}}));

    // n = 3 samples: three choices; logprobs with two alternatives each.
    const HttpReply m = run.post("/v1/completions", {{"prompt", "Once upon a time"},
                                                     {"max_tokens", 8},
                                                     {"temperature", 1.0},
                                                     {"seed", 7},
                                                     {"n", 3},
                                                     {"logprobs", 2}});
    REQUIRE(m.status == 200);
    const json mj = json::parse(m.body);
    REQUIRE(mj["choices"].size() == 3);
    for (int i = 0; i < 3; ++i) {
        const json& c = mj["choices"][i];
        CHECK(c["index"] == i);
        REQUIRE(c["logprobs"]["tokens"].size() == 8);
        CHECK(c["logprobs"]["top_logprobs"][0].size() <= 2);
        CHECK(c["logprobs"]["token_logprobs"][0].get<double>() <= 0.0);
    }
    CHECK(mj["usage"]["completion_tokens"] == 24);

    // tokenize / detokenize round trip; models, props, health.
    const HttpReply t = run.post("/tokenize", {{"content", "Once upon a time"}});
    REQUIRE(t.status == 200);
    const auto ids = json::parse(t.body)["tokens"];
    CHECK(ids == json(s.m.tokenizer->encode("Once upon a time", false, true)));
    const HttpReply d = run.post("/detokenize", {{"tokens", ids}});
    CHECK(json::parse(d.body)["content"] == "Once upon a time");
    CHECK(json::parse(run.get("/v1/models").body)["data"][0]["id"] == "stories");
    CHECK(json::parse(run.get("/props").body)["chat_template"] == "chatml");
    CHECK(json::parse(run.get("/health").body)["status"] == "ok");
    // The chat page: one HTML file that talks to the chat endpoint.
    const HttpReply page = run.get("/");
    CHECK(page.status == 200);
    CHECK(page.headers.at("content-type").rfind("text/html", 0) == 0);
    CHECK(page.body.find("v1/chat/completions") != std::string::npos);
}

namespace {

std::vector<float> floats_of_base64(const std::string& b64) {
    const std::optional<std::string> decoded = base64_decode(b64);
    REQUIRE(decoded);
    const std::string& bytes = *decoded;
    std::vector<float> out(bytes.size() / sizeof(float));
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
    return out;
}

}  // namespace

TEST_CASE("server: /v1/embeddings gives compute_embeddings' unit vectors, between generations") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path);
    const std::vector<std::string> texts = {"A cat sat on the mat.", "The dog ran home.", "Lily"};
    std::vector<std::vector<TokenId>> prompts;
    for (const auto& t : texts) prompts.push_back(s.m.tokenizer->encode(t, true, false));
    auto expected = compute_embeddings(*s.m.backend, prompts, Pooling::Mean, 512, 512);
    for (auto& v : expected) normalize_embedding(v, 2);
    CHECK(base64_encode("Man") == "TWFu");
    CHECK(base64_encode("Ma") == "TWE=");
    CHECK(base64_encode("M") == "TQ==");
    for (const std::string bytes : {"", "M", "Ma", "Man", "Many hands\n\xff"})
        CHECK(base64_decode(base64_encode(bytes)) == bytes);
    for (const char* bad : {"TQ=", "T===", "TQ==TWFu", "TW-u", "=QQQ"})
        CHECK_MESSAGE(!base64_decode(bad), bad);
    Running run(s.config(), s);
    // A generation runs while the embeddings are computed.
    HttpReply gen;
    std::thread g([&] {
        gen = run.post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 64}});
    });
    const HttpReply r = run.post("/v1/embeddings", {{"model", "x"}, {"input", texts}});
    g.join();
    CHECK(gen.status == 200);
    REQUIRE(r.status == 200);
    const json j = json::parse(r.body);
    CHECK(j["object"] == "list");
    REQUIRE(j["data"].size() == texts.size());
    size_t n_tokens = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
        n_tokens += prompts[i].size();
        const auto v = j["data"][i]["embedding"].get<std::vector<float>>();
        REQUIRE(v.size() == expected[i].size());
        double dot = 0, err = 0;
        for (size_t d = 0; d < v.size(); ++d) {
            dot += double(v[d]) * v[d];
            err = std::max(err, double(std::fabs(v[d] - expected[i][d])));
        }
        CHECK(dot == doctest::Approx(1.0).epsilon(1e-4));
        CHECK(err < 1e-5);
    }
    CHECK(j["usage"]["prompt_tokens"] == n_tokens);
    // Token ids and base64: the same first vector.
    const HttpReply b =
        run.post("/v1/embeddings", {{"input", prompts[0]}, {"encoding_format", "base64"}});
    REQUIRE(b.status == 200);
    const auto v = floats_of_base64(json::parse(b.body)["data"][0]["embedding"]);
    REQUIRE(v.size() == expected[0].size());
    for (size_t d = 0; d < v.size(); ++d)
        CHECK(v[d] == doctest::Approx(expected[0][d]).epsilon(1e-5));
    CHECK(run.post("/v1/embeddings", {{"input", ""}}).status == 400);
    CHECK(run.post("/v1/embeddings", {{"input", 3}}).status == 400);
    CHECK(run.metric("kv_blocks_used") == 0);
}

TEST_CASE("server: bad requests get one clear error each") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, 128);
    ServerConfig cfg = s.config();
    Running run(cfg, s);
    auto error_of = [](const HttpReply& r) {
        const json j = json::parse(r.body);
        return j["error"]["message"].get<std::string>();
    };
    struct Case {
        std::string path, body;
        int status;
        std::string needle;
    };
    std::string long_prompt;
    for (int i = 0; i < 200; ++i) long_prompt += "once upon a time ";
    const std::vector<Case> cases = {
        {"/v1/completions", "{\"prompt\": ", 400, "malformed JSON"},
        {"/v1/completions", "[1, 2]", 400, "JSON object"},
        {"/v1/completions", "{\"max_tokens\": 3}", 400, "'prompt'"},
        {"/v1/completions", json{{"prompt", "hi"}, {"temperature", -1}}.dump(), 400, "temperature"},
        {"/v1/completions", json{{"prompt", "hi"}, {"max_tokens", "many"}}.dump(), 400,
         "bad field type"},
        {"/v1/completions", json{{"prompt", long_prompt}}.dump(), 400, "context"},
        {"/v1/completions", json{{"prompt", json::array({"a", 5})}}.dump(), 400, "'prompt'"},
        {"/v1/chat/completions",
         json{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"echo", true}}.dump(), 400,
         "'echo' is for /v1/completions"},
        {"/v1/completions", json{{"prompt", json::array({1, 999999})}}.dump(), 400,
         "outside the vocabulary"},
        {"/v1/chat/completions", json{{"messages", json::array()}}.dump(), 400, "'messages'"},
        {"/v1/chat/completions",
         json{{"messages", {{{"role", "function"}, {"content", "x"}}}}}.dump(), 400,
         "a 'function' message needs the function's 'name'"},
        {"/v1/chat/completions",
         json{{"messages", {{{"role", "critic"}, {"content", "x"}}}}}.dump(), 400,
         "role 'critic' is not supported"},
        {"/v1/chat/completions",
         json{{"messages", {{{"role", "user"}, {"content", "x"}}}},
              {"response_format", {{"type", "yaml"}}}}
             .dump(),
         400, "response_format"},
        {"/tokenize", "{}", 400, "'content'"},
        {"/detokenize", json{{"tokens", {-1}}}.dump(), 400, "outside the vocabulary"},
        {"/v1/nothing", "{}", 404, "/v1/nothing"},
    };
    for (const Case& c : cases) {
        INFO(c.path << " " << c.body.substr(0, 80));
        HttpClient client(run.server.port());
        const HttpReply r = client.request("POST", c.path, c.body);
        CHECK(r.status == c.status);
        const std::string msg = error_of(r);
        CHECK_MESSAGE(msg.find(c.needle) != std::string::npos, msg);
    }
    CHECK(run.get("/v1/completions").status == 405);
    // Invalid UTF-8 in a body is malformed JSON, not a crash.
    CHECK(run.post("/v1/completions", json::object()).status == 400);
    HttpClient raw(run.server.port());
    const HttpReply bad = raw.request("POST", "/v1/completions", "{\"prompt\": \"\xff\xfe\"}");
    CHECK(bad.status == 400);
    // The server still serves after all that.
    CHECK(run.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}}).status == 200);
}

TEST_CASE("server: an API key is required when set") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path);
    ServerConfig cfg = s.config();
    cfg.api_key = "sesame";
    Running run(cfg, s);
    const json body = {{"prompt", "hi"}, {"max_tokens", 2}};
    const HttpReply no = run.post("/v1/completions", body);
    CHECK(no.status == 401);
    CHECK(json::parse(no.body)["error"]["type"] == "authentication_error");
    CHECK(run.post("/v1/completions", body, "Authorization: Bearer wrong\r\n").status == 401);
    CHECK(run.post("/v1/completions", body, "Authorization: Bearer sesame\r\n").status == 200);
    CHECK(run.get("/health").status == 200);  // health needs no key
}

TEST_CASE("server: a client that hangs up cancels its generation; stopping ends requests") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, 8192, 4);
    Running run(s.config(), s);
    // Four samples of a whole context each: far longer than the test waits.
    const json endless = {{"prompt", "Once upon a time"}, {"max_tokens", -1},
                          {"ignore_eos", true},           {"n", 4},
                          {"temperature", 1.0},           {"stream", true}};
    {
        HttpClient c(run.server.port());
        REQUIRE(c.send_raw("POST /v1/completions HTTP/1.1\r\nContent-Length: " +
                           std::to_string(endless.dump().size()) + "\r\n\r\n" + endless.dump()));
        const HttpReply head = c.read_head();
        REQUIRE(head.status == 200);
        bool ok = false;
        CHECK(c.read_chunk(&ok).find("data: ") == 0);
        CHECK(ok);
    }  // hang up mid-stream
    const auto t0 = std::chrono::steady_clock::now();
    while (run.metric("requests_processing") > 0 &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(run.metric("requests_processing") == 0);
    CHECK(run.metric("requests_cancelled_total") == 1);
    CHECK(run.metric("kv_blocks_used") == 0);
    CHECK(run.metric("tokens_predicted_total") < 4 * 8000);

    // Stopping the server while a whole (not streamed) response is pending: 503, and
    // serve() returns.
    json whole = endless;
    whole["stream"] = false;
    HttpReply pending;
    std::thread client([&] { pending = run.post("/v1/completions", whole); });
    while (run.metric("requests_processing") == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    run.stop = true;
    client.join();
    CHECK(pending.status == 503);
    run.thread.join();
    run.thread = std::thread([] {});  // for ~Running
}

TEST_CASE("EngineWorker: jobs from many threads; cancel frees blocks; multi-sample ends count") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, 256, 8);
    EngineWorker w(*s.engine);
    // A request cancelled before its samples forked still ends each of its samples.
    GenerationRequest r;
    r.prompt = s.m.tokenizer->encode("Once upon a time", true, false);
    r.n_predict = -1;
    r.ignore_eos = true;
    r.n_samples = 3;
    auto job = w.submit(r);
    w.cancel(*job);
    int finished = 0;
    while (!job->done()) {
        auto e = job->next(std::chrono::milliseconds(1000));
        REQUIRE(e);
        if (e->kind == EngineWorker::Event::Kind::Finished) {
            ++finished;
            CHECK(e->result.stop == StopReason::Cancelled);
        }
    }
    CHECK(finished == 3);
    int32_t used = -1;
    w.call([&](Engine& e) { used = e.kv_table().stats().used_blocks; });
    CHECK(used == 0);
    CHECK(w.n_jobs() == 0);
    // A refused request throws the engine's message.
    GenerationRequest too_long = r;
    too_long.prompt.assign(400, too_long.prompt[1]);
    CHECK_THROWS_WITH_AS(w.submit(too_long), doctest::Contains("context"), Error);
    w.stop();
    CHECK_THROWS_AS(w.submit(r), Error);
}

TEST_CASE("kvrun server: serves on --port 0, refuses bad flags, Ctrl-C exits 0") {
    const std::string path = model_path();
    if (path.empty()) return;
    using kvrun::test::run_command;
    const std::string bin = kvrun::test::kvrun_binary();
    auto bad = run_command(bin + " server -m " + path + " --port 70000");
    CHECK(bad.exit_code == 1);
    CHECK(bad.err.find("--port") != std::string::npos);
    bad = run_command(bin + " server -m " + path + " --reasoning-budget -2");
    CHECK(bad.exit_code == 1);
    CHECK(bad.err.find("--reasoning-budget") != std::string::npos);
    bad = run_command(bin + " server -m " + path + " --chat-template-kwargs nope");
    CHECK(bad.exit_code == 1);
    CHECK(bad.err.find("must be a JSON object") != std::string::npos);
    bad = run_command(bin + " server -m " + path + " --rerank");  // no one-token yes/no
    CHECK(bad.exit_code == 1);
    CHECK(bad.err.find("\"yes\" or \"no\" in one token") != std::string::npos);
    // A Qwen 3 style switch, turned off by --reasoning-budget 0.
    kvrun::test::TempDir dir;
    const std::string tmpl = dir.file("thinking.jinja");
    std::ofstream(tmpl)
        << "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
           "<|im_end|>\n{% endfor %}<|im_start|>assistant\n{% if enable_thinking "
           "is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}";

    const std::string err_file =
        std::filesystem::temp_directory_path() / ("kvrun_server_err_" + std::to_string(getpid()));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    std::vector<std::string> args = {bin, "server", "-m", path, "--port", "0", "--device", "cpu",
                                     "--chat-template-file", tmpl, "--reasoning-budget", "0",
                                     // llama-server's switches for what kvrun always does
                                     "--metrics", "--cont-batching", "-cb", "--embedding",
                                     "--no-warmup", "-to", "30", "--context-shift", "--keep", "4"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    REQUIRE(posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    int port = 0;
    std::string err;
    const std::regex re("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    for (int i = 0; i < 600 && port == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        std::ifstream in(err_file);
        err.assign(std::istreambuf_iterator<char>(in), {});
        std::smatch m;
        if (std::regex_search(err, m, re)) port = std::stoi(m[1]);
    }
    REQUIRE_MESSAGE(port > 0, err);
    // A second server on the same port: one clear error.
    auto busy = run_command(bin + " server -m " + path + " --port " + std::to_string(port));
    CHECK(busy.exit_code == 1);
    CHECK_MESSAGE(busy.err.find("cannot listen on") != std::string::npos, busy.err);
    HttpClient c(port);
    const HttpReply r =
        c.request("POST", "/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 4}}.dump());
    CHECK(r.status == 200);
    const HttpReply t =
        c.request("POST", "/apply-template",
                  json{{"messages", {{{"role", "user"}, {"content", "Hi"}}}}}.dump());
    CHECK(t.status == 200);
    CHECK(json::parse(t.body)["prompt"].get<std::string>().ends_with("<think>\n\n</think>\n\n"));
    c.close();
    kill(pid, SIGINT);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    std::ifstream in(err_file);
    err.assign(std::istreambuf_iterator<char>(in), {});
    CHECK_MESSAGE(err.find("kvrun server: stopped") != std::string::npos, err);
    std::filesystem::remove(err_file);
}

TEST_CASE("server: cache_prompt, /apply-template and /slots") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/2048, /*parallel=*/1);
    ServerConfig cfg = s.config();
    cfg.parallel = 1;
    s.set_chat(cfg, ChatTemplateKind::ChatML);
    Running run(cfg, s);

    // cache_prompt: false computes the whole prompt again (same text); the default reuses it.
    const std::string prompt = "Once upon a time, there was a little girl named Lily. She liked";
    const json body = {{"prompt", prompt}, {"n_predict", 8}, {"temperature", 0}};
    const json first = json::parse(run.post("/completion", body).body);
    json nocache = body;
    nocache["cache_prompt"] = false;
    const json again = json::parse(run.post("/completion", nocache).body);
    CHECK(again["tokens_cached"] == 0);
    CHECK(again["timings"]["prompt_n"] == again["tokens_evaluated"]);
    CHECK(again["content"] == first["content"]);
    const json cached = json::parse(run.post("/completion", body).body);
    CHECK(cached["tokens_cached"].get<int>() > 0);
    CHECK(cached["content"] == first["content"]);

    // /apply-template: the prompt a chat request generates from.
    const json chat = {{"messages",
                        {{{"role", "system"}, {"content", "Be kind."}},
                         {{"role", "user"}, {"content", "Hello"}}}}};
    HttpReply r = run.post("/apply-template", chat);
    REQUIRE(r.status == 200);
    CHECK(json::parse(r.body)["prompt"] ==
          chat_template_apply(ChatTemplateKind::ChatML, {{"system", "Be kind."}, {"user", "Hello"}},
                              true));
    CHECK(run.post("/apply-template", json{{"messages", 3}}).status == 400);

    // /slots: idle, then busy while a long generation runs, then idle again.
    json slots = json::parse(run.get("/slots").body);
    REQUIRE(slots.size() == 1);
    CHECK(slots[0]["is_processing"] == false);
    CHECK(slots[0]["n_ctx"] == 2048);
    std::thread long_request([&] {
        run.post("/completion", {{"prompt", "Tom"}, {"n_predict", 1900}, {"ignore_eos", true}});
    });
    bool seen = false;
    for (int i = 0; i < 4000 && !seen; ++i) {
        slots = json::parse(run.get("/slots").body);
        if (slots[0]["is_processing"] == true) {
            seen = true;
            CHECK(slots[0]["id_task"].is_number_integer());
            CHECK(slots[0]["n_prompt_tokens"].get<int>() >= 1);
            CHECK(slots[0]["kv_blocks"].get<int>() >= 1);
            CHECK(run.get("/slots?fail_on_no_slot=1").status == 503);
        } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }
    long_request.join();
    CHECK(seen);
    CHECK(json::parse(run.get("/slots").body)[0]["is_processing"] == false);
    CHECK(run.get("/slots?fail_on_no_slot=1").status == 200);
}

TEST_CASE("server: /completion with a list of prompts answers a list of results") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path);
    const std::vector<std::string> prompts = {"Once upon a time", "Tom had a", "The sun"};
    std::vector<std::string> expected;  // (the engine alone, before the server owns it)
    for (const std::string& p : prompts) expected.push_back(s.reference(p, 10));
    Running run(s.config(), s);
    const HttpReply r =
        run.post("/completion", {{"prompt", prompts}, {"n_predict", 10}, {"temperature", 0}});
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json j = json::parse(r.body);
    REQUIRE(j.is_array());
    REQUIRE(j.size() == 3);
    for (size_t i = 0; i < prompts.size(); ++i) {
        CHECK(j[i]["index"] == i);
        CHECK(j[i]["content"] == expected[i]);
        CHECK(j[i]["tokens_evaluated"] ==
              s.m.tokenizer->encode(prompts[i], s.m.tokenizer->add_bos(), false).size());
    }
    // Streamed: chunks carry each prompt's index; per index they add up to its content.
    const HttpReply st =
        run.post("/completion",
                 {{"prompt", prompts}, {"n_predict", 10}, {"temperature", 0}, {"stream", true}});
    REQUIRE(st.status == 200);
    std::vector<std::string> texts(prompts.size());
    int n_stop = 0;
    for (const std::string& e : sse_data(st.body)) {
        const json c = json::parse(e);
        texts.at(c["index"].get<size_t>()) += c["content"].get<std::string>();
        n_stop += c["stop"].get<bool>();
    }
    CHECK(n_stop == 3);
    for (size_t i = 0; i < prompts.size(); ++i) CHECK(texts[i] == j[i]["content"]);
    // One prompt (not a list): one object, as before.
    CHECK(json::parse(run.post("/completion", {{"prompt", "Tom had a"}, {"n_predict", 4}}).body)
              .is_object());
}

TEST_CASE("server --context-shift: a reply longer than the context goes on, whole and streamed") {
    // As `run --context-shift`: the same tokens as run_with_context_shift on an engine of the
    // same context; each request shifts on its own while another runs beside it.
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/64, /*parallel=*/2);
    const Tokenizer& tok = *s.m.tokenizer;
    const std::vector<TokenId> prompt = tok.encode("Once upon a time", true);
    GenerationRequest req;
    req.prompt = prompt;
    req.n_predict = 150;
    req.ignore_eos = true;
    req.sampling.temperature = 0;
    ContextShiftOptions o;
    o.enabled = true;
    o.n_keep = 2;
    int32_t n_shifts = 0;
    const GenerationResult want =
        run_with_context_shift(*s.engine, req, o, tok, nullptr, &n_shifts);
    REQUIRE(want.tokens.size() == 150);
    REQUIRE(n_shifts >= 2);
    const std::string want_text = tok.decode(want.tokens, false);
    ContextShiftOptions all = o;  // the whole prompt kept
    all.n_keep = -1;
    const std::string want_all_text = tok.decode(
        run_with_context_shift(*s.engine, req, all, tok, nullptr, nullptr).tokens, false);

    const json body = {
        {"prompt", prompt}, {"n_predict", 150}, {"temperature", 0}, {"ignore_eos", true}};
    ServerConfig cfg = s.config();
    {
        Running off(cfg, s);  // without the flag: the context ends the reply
        const json j = json::parse(off.post("/completion", body).body);
        CHECK(j["tokens_predicted"] == 64 - int(prompt.size()));
    }
    cfg.context_shift = o;
    Running run(cfg, s);
    std::vector<std::thread> beside;
    std::vector<json> answers(2);
    for (int k = 0; k < 2; ++k)
        beside.emplace_back(
            [&, k] { answers[size_t(k)] = json::parse(run.post("/completion", body).body); });
    for (std::thread& t : beside) t.join();
    for (const json& j : answers) {
        CHECK(j["content"] == want_text);
        CHECK(j["tokens_predicted"] == 150);
        CHECK(j["stop_type"] == "limit");
    }
    // Streamed: the same text; OpenAI's endpoint says "length".
    json stream_body = body;
    stream_body["stream"] = true;
    std::string text;
    for (const std::string& e : sse_data(run.post("/completion", stream_body).body))
        text += json::parse(e)["content"].get<std::string>();
    CHECK(text == want_text);
    const json oa = json::parse(
        run.post(
               "/v1/completions",
               {{"prompt", prompt}, {"max_tokens", 150}, {"temperature", 0}, {"ignore_eos", true}})
            .body);
    CHECK(oa["choices"][0]["text"] == want_text);
    CHECK(oa["choices"][0]["finish_reason"] == "length");
    CHECK(oa["usage"]["completion_tokens"] == 150);
    CHECK(oa["usage"]["prompt_tokens"] == int(prompt.size()));
    // A request's "n_keep" (llama-server's) replaces --keep for it; bad values are refused.
    json keep_all = body;
    keep_all["n_keep"] = -1;
    const json k = json::parse(run.post("/completion", keep_all).body);
    CHECK(k["tokens_predicted"] == 150);
    CHECK(k["content"] == want_all_text);
    CHECK(k["content"] != want_text);
    CHECK(run.post("/completion", {{"prompt", prompt}, {"n_keep", -2}}).status == 400);
    CHECK(run.post("/completion", {{"prompt", prompt}, {"n_keep", "all"}}).status == 400);
}
