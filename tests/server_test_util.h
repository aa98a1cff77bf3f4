// The server tests' fixtures: a shared model served in-process by an ApiServer on a thread,
// and a socket client for it.
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "chat_format.h"
#include "engine.h"
#include "http_client.h"
#include "modes/model_options.h"
#include "modes/server.h"
#include "modes/server_api.h"
#include "test_util.h"

namespace kvrun::test {

using nlohmann::json;

// The shared stories260K model on the CPU, with an engine, for the server tests.
struct Served {
    LoadedModel m;
    std::unique_ptr<Engine> engine;
    // kv_overrides: --override-kv texts ("KEY=TYPE:VALUE").
    explicit Served(const std::string& path, int32_t n_ctx = 512, int32_t parallel = 4,
                    int32_t draft_ngram = 0, std::vector<std::string> kv_overrides = {})
        : Served(options(path, n_ctx, std::move(kv_overrides)), parallel, draft_ngram) {}
    // The CPU options of a model file (more to set before the other constructor).
    static ModelOptions options(const std::string& path, int32_t n_ctx = 512,
                                std::vector<std::string> kv_overrides = {}) {
        ModelOptions o;
        o.model = path;
        o.device = "cpu";
        o.n_ctx = n_ctx;
        o.kv_overrides = std::move(kv_overrides);
        return o;
    }
    Served(const ModelOptions& o, int32_t parallel, int32_t draft_ngram = 0) {
        m = load_model(o, parallel);
        EngineOptions eo = engine_options(o, parallel);
        eo.draft_ngram = draft_ngram;
        engine = std::make_unique<Engine>(*m.backend, *m.tokenizer, eo);
    }
    ServerConfig config() const {
        ServerConfig c;
        c.http.port = 0;
        c.api.model_id = "stories";
        c.api.defaults.n_predict = 32;
        set_chat(c, ChatTemplateKind::Plain);
        c.api.n_ctx_seq = engine->n_ctx();
        return c;
    }
    // The chat format `kind` (its end-of-turn texts stop replies), rendered by `jinja` when
    // set, with the model's special texts.
    ChatFormat chat_format(ChatTemplateKind kind,
                           std::shared_ptr<const JinjaTemplate> jinja = nullptr) const {
        ChatTemplateChoice choice;
        choice.kind = kind;
        choice.jinja = std::move(jinja);
        return chat_format_make(choice, *m.tokenizer);
    }
    // Serves chats in that format.
    void set_chat(ServerConfig& c, ChatTemplateKind kind,
                  std::shared_ptr<const JinjaTemplate> jinja = nullptr) const {
        c.api.chat = chat_format(kind, std::move(jinja));
    }
    // What the engine alone generates (greedy) for a prompt text, as the API shows it.
    std::string reference(const std::string& prompt, int32_t n_predict,
                          const std::vector<std::string>& stops = {}) {
        return reference(m.tokenizer->encode(prompt, m.tokenizer->add_bos(), false), n_predict,
                         stops);
    }
    std::string reference(const std::vector<TokenId>& prompt, int32_t n_predict,
                          const std::vector<std::string>& stops = {}) {
        GenerationRequest r;
        r.prompt = prompt;
        r.n_predict = n_predict;
        r.sampling.temperature = 0;
        r.stop_strings = stops;
        std::vector<TokenId> toks;
        engine->on_finish([&](const GenerationResult& g) { toks = g.tokens; });
        engine->submit(r);
        engine->run();
        engine->on_finish(nullptr);
        ApiTextStream text(*m.tokenizer, stops);
        for (TokenId t : toks) text.push(t);
        text.finish();
        return text.text();
    }
};

// Runs an ApiServer on a thread for the scope.
struct Running {
    ApiServer server;
    std::atomic<bool> stop{false};
    std::thread thread;
    Running(ServerConfig cfg, Served& s) : server(std::move(cfg), *s.engine, *s.m.tokenizer) {
        thread = std::thread([this] { server.serve(stop); });
    }
    ~Running() {
        stop = true;
        thread.join();
    }
    HttpReply post(const std::string& path, const json& body, const std::string& headers = {}) {
        HttpClient c(server.port());
        return c.request("POST", path, body.dump(), headers);
    }
    HttpReply get(const std::string& path) {
        HttpClient c(server.port());
        return c.request("GET", path);
    }
    // A Prometheus counter or gauge from /metrics.
    double metric(const std::string& name) {
        const HttpReply r = get("/metrics");
        std::smatch m;
        const std::regex re("\nkvrun:" + name + " ([0-9.e+-]+)");
        REQUIRE_MESSAGE(std::regex_search(r.body, m, re), r.body);
        return std::stod(m[1]);
    }
};

inline std::string model_path() {
    return kvrun::test::shared_model("stories260K.gguf").string();
}

// (event name, data) pairs of a stream of named server-sent events (Anthropic's, the
// Responses API's).
inline std::vector<std::pair<std::string, json>> named_events(const std::string& body) {
    std::vector<std::pair<std::string, json>> out;
    size_t at = 0;
    while ((at = body.find("event: ", at)) != std::string::npos) {
        const size_t nl = body.find('\n', at);
        const std::string name = body.substr(at + 7, nl - at - 7);
        const size_t data = body.find("data: ", nl);
        const size_t end = body.find("\n\n", data);
        out.emplace_back(name, json::parse(body.substr(data + 6, end - data - 6)));
        at = end;
    }
    return out;
}

// The content text a streamed chat completion of `body` adds up to, checking that no delta
// carries tool calls.
inline std::string streamed_content(Running& run, json body) {
    body["stream"] = true;
    std::string text;
    for (const std::string& e : sse_data(run.post("/v1/chat/completions", body).body)) {
        if (e == "[DONE]") continue;
        const json d = json::parse(e)["choices"][0]["delta"];
        if (d.contains("content") && d["content"].is_string())
            text += d["content"].get<std::string>();
        CHECK(!d.contains("tool_calls"));
    }
    return text;
}

// The tool calls a streamed chat completion of `body` ends with (its last "tool_calls" delta),
// checking that no delta carries content text on the way.
inline json streamed_tool_calls(Running& run, json body) {
    body["stream"] = true;
    json calls;
    for (const std::string& e : sse_data(run.post("/v1/chat/completions", body).body)) {
        if (e == "[DONE]") continue;
        const json d = json::parse(e)["choices"][0]["delta"];
        CHECK(!(d.contains("content") && d["content"].is_string()));  // no text
        if (d.contains("tool_calls")) calls = d["tool_calls"];
    }
    return calls;
}

}  // namespace kvrun::test
