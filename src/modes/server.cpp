// `kvrun server`: llama-server's and OpenAI's HTTP API on the engine.
//
// Every connection runs on its own thread (HttpServer); generation requests go to the one
// EngineWorker thread that owns the engine, so concurrent clients share its continuous
// batching, prefix cache (a chat client resending its conversation prefills only the new
// turn) and speculative decoding. A connection turns its job's token events into text
// (whole UTF-8 characters, cut before stop strings) and either streams it as server-sent
// events or answers once the job ends. A client that hangs up cancels its generation, which
// frees its KV blocks at the next step. Ctrl-C ends running generations and exits 0.
//
// Endpoints: GET / (a chat page, server_ui.cpp); POST /v1/completions,
// /v1/chat/completions, /v1/embeddings (OpenAI), /completion, /infill, /apply-template
// (llama.cpp), /tokenize, /detokenize; GET /health, /v1/models, /props, /slots, /metrics
// (Prometheus text).
#include "modes/server.h"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <optional>

#include "common.h"
#include "gguf.h"
#include "model_config.h"
#include "modes/draft_options.h"
#include "modes/model_options.h"
#include "modes/modes.h"
#include "modes/prompt_cache_options.h"
#include "modes/server_anthropic.h"
#include "modes/server_lora.h"
#include "modes/server_responses.h"
#include "modes/server_slots.h"
#include "prompt_logprobs.h"
#include "text_input.h"

namespace kvrun {

struct ApiServer::Impl {
    ServerConfig cfg;
    Engine& engine;
    const Tokenizer& tok;
    EngineWorker* worker = nullptr;
    std::unique_ptr<HttpServer> http;
    const std::atomic<bool>* stop = nullptr;
    std::atomic<int64_t> next_id{0};
    std::atomic<int64_t> n_requests{0}, n_prompt_tokens{0}, n_generated_tokens{0}, n_cancelled{0};
    ResponsesStore responses_store;  // /v1/responses answers, for previous_response_id
    LoraAdapters lora;               // /lora-adapters: the scales of requests without "lora"
    ServerSlots slot_store;          // id_slot and POST /slots/{id}?action=...

    Impl(ServerConfig c, Engine& e, const Tokenizer& t)
        : cfg(std::move(c)),
          engine(e),
          tok(t),
          lora(cfg.lora_paths, e.backend().lora_scales()),
          slot_store(cfg.parallel, cfg.slot_save_path, cfg.slot_key) {}

    void handle(const HttpRequest& req, HttpConnection& conn);
    // The client's API: OpenAI's, or a body in Anthropic's Messages API
    // (server_anthropic.h) or OpenAI's Responses API (server_responses.h), rewritten into a
    // chat request (`format` is then OpenAiChat) and answered in that API.
    enum class Dialect { OpenAi, Anthropic, Responses };
    void generate(ApiFormat format, const HttpRequest& req, HttpConnection& conn,
                  Dialect dialect = Dialect::OpenAi);
    nlohmann::json count_tokens(const std::string& body);
    // JSON in, JSON out (json_endpoint answers 400 for what they throw).
    nlohmann::json tokenize(const nlohmann::json& body);
    nlohmann::json detokenize(const nlohmann::json& body);
    nlohmann::json embeddings(const nlohmann::json& body);
    nlohmann::json rerank(const nlohmann::json& body);
    std::string metrics();
    nlohmann::json props();
    void slots(const HttpRequest& req, HttpConnection& conn);
    bool stopping() const { return stop && stop->load(); }
};

namespace {

bool send_json(HttpConnection& conn, int status, const nlohmann::json& j) {
    return conn.send(status, "application/json; charset=utf-8", json_line(j));
}

bool send_error(HttpConnection& conn, int status, std::string_view message) {
    return conn.send(status, "application/json; charset=utf-8", http_error_body(status, message));
}

// One server-sent event.
bool send_event(HttpConnection& conn, const nlohmann::json& j) {
    return conn.send_chunk("data: " + json_line(j) + "\n\n");
}

// The body as JSON: an object unless `any` (a list, say).
nlohmann::json parse_body(const HttpRequest& req, bool any = false) {
    try {
        nlohmann::json j = nlohmann::json::parse(req.body);
        if (!any && !j.is_object()) fail("the request body must be a JSON object");
        return j;
    } catch (const nlohmann::json::exception& e) {
        fail("malformed JSON: {}", e.what());
    }
}

// "Authorization: Bearer KEY" (or llama.cpp's "X-Api-Key: KEY").
bool authorized(const HttpRequest& req, const std::string& key) {
    if (key.empty()) return true;
    if (req.header("x-api-key") == key) return true;
    return req.header("authorization") == "Bearer " + key;
}

// A JSON endpoint: the body parsed (an object unless `any_body`), `answer` run on it; 200
// with what it returns, 400 with the reason for a bad body or what it throws.
template <class Answer>
void json_endpoint(const HttpRequest& req, HttpConnection& conn, Answer answer,
                   bool any_body = false) {
    try {
        send_json(conn, 200, answer(parse_body(req, any_body)));
    } catch (const nlohmann::json::exception& e) {
        send_error(conn, 400, fmt::format("bad field type: {}", e.what()));
    } catch (const Error& e) {
        send_error(conn, 400, error_text(e));
    }
}

}  // namespace

void ApiServer::Impl::handle(const HttpRequest& req, HttpConnection& conn) {
    const std::string& p = req.path;
    if (req.method == "OPTIONS") {  // CORS preflight from browser clients
        conn.send(204, "text/plain", "",
                  {{"Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS"},
                   {"Access-Control-Allow-Headers", "Content-Type, Authorization, X-Api-Key"}});
        return;
    }
    if (req.method == "GET" && (p == "/" || p == "/index.html") && cfg.web_ui) {
        conn.send(200, "text/html; charset=utf-8", server_ui_html());
        return;
    }
    if (p == "/health" || p == "/v1/health") {
        send_json(conn, 200, {{"status", "ok"}});
        return;
    }
    if (!authorized(req, cfg.api_key)) {
        send_error(conn, 401, "invalid or missing API key (send \"Authorization: Bearer KEY\")");
        return;
    }
    // A stored response: GET gives it, DELETE forgets it.
    for (const std::string_view prefix : {"/v1/responses/", "/responses/"}) {
        if (!p.starts_with(prefix) || p.size() == prefix.size()) continue;
        const std::string id = p.substr(prefix.size());
        if (req.method == "GET") {
            if (const auto e = responses_store.get(id))
                send_json(conn, 200, e->response);
            else
                send_error(conn, 404, fmt::format("no stored response '{}'", id));
        } else if (req.method == "DELETE") {
            if (responses_store.erase(id))
                send_json(conn, 200, {{"id", id}, {"object", "response"}, {"deleted", true}});
            else
                send_error(conn, 404, fmt::format("no stored response '{}'", id));
        } else {
            send_error(conn, 405, fmt::format("{} is not allowed on {}", req.method, p));
        }
        return;
    }
    if (p.starts_with("/slots/")) {
        const SlotAnswer a =
            slot_store.action(req.method, p.substr(7), req.query, req.body, *worker, tok.n_vocab());
        a.status == 200 ? send_json(conn, 200, a.body) : send_error(conn, a.status, a.error);
        return;
    }
    auto rerank_endpoint = [&] {
        if (!cfg.rerank) {
            send_error(conn, 501,
                       "reranking is off: start the server with --rerank (a Qwen3-Reranker "
                       "style model)");
            return;
        }
        json_endpoint(req, conn, [&](const auto& j) { return rerank(j); });
    };
    struct Route {
        const char* method;
        const char* path;
        std::function<void()> run;
    };
    const Route routes[] = {
        {"POST", "/v1/completions", [&] { generate(ApiFormat::OpenAiCompletion, req, conn); }},
        {"POST", "/completions", [&] { generate(ApiFormat::OpenAiCompletion, req, conn); }},
        {"POST", "/v1/chat/completions", [&] { generate(ApiFormat::OpenAiChat, req, conn); }},
        {"POST", "/chat/completions", [&] { generate(ApiFormat::OpenAiChat, req, conn); }},
        {"POST", "/v1/messages",
         [&] { generate(ApiFormat::OpenAiChat, req, conn, Dialect::Anthropic); }},
        {"POST", "/v1/responses",
         [&] { generate(ApiFormat::OpenAiChat, req, conn, Dialect::Responses); }},
        {"POST", "/responses",
         [&] { generate(ApiFormat::OpenAiChat, req, conn, Dialect::Responses); }},
        {"POST", "/v1/messages/count_tokens",
         [&] {
             try {
                 send_json(conn, 200, count_tokens(req.body));
             } catch (const Error& e) {
                 conn.send(400, "application/json; charset=utf-8",
                           anthropic_error_body(400, error_text(e)));
             }
         }},
        {"POST", "/completion", [&] { generate(ApiFormat::Completion, req, conn); }},
        {"POST", "/infill", [&] { generate(ApiFormat::Infill, req, conn); }},
        {"POST", "/v1/embeddings",
         [&] { json_endpoint(req, conn, [&](const auto& j) { return embeddings(j); }); }},
        {"POST", "/embeddings",
         [&] { json_endpoint(req, conn, [&](const auto& j) { return embeddings(j); }); }},
        {"POST", "/rerank", [&] { rerank_endpoint(); }},
        {"POST", "/v1/rerank", [&] { rerank_endpoint(); }},
        {"POST", "/reranking", [&] { rerank_endpoint(); }},
        {"POST", "/v1/reranking", [&] { rerank_endpoint(); }},
        {"POST", "/tokenize",
         [&] { json_endpoint(req, conn, [&](const auto& j) { return tokenize(j); }); }},
        {"POST", "/detokenize",
         [&] { json_endpoint(req, conn, [&](const auto& j) { return detokenize(j); }); }},
        {"GET", "/v1/models",
         [&] {
             send_json(conn, 200,
                       {{"object", "list"},
                        {"data",
                         {{{"id", cfg.api.model_id},
                           {"object", "model"},
                           {"created", 0},
                           {"owned_by", "kvrun"},
                           {"meta", {{"n_vocab", tok.n_vocab()}, {"n_ctx", engine.n_ctx()}}}}}}});
         }},
        {"GET", "/props", [&] { send_json(conn, 200, props()); }},
        {"GET", "/lora-adapters", [&] { send_json(conn, 200, lora.list()); }},
        {"POST", "/lora-adapters",
         [&] {
             json_endpoint(
                 req, conn,
                 [&](const auto& j) {
                     lora.set(j);
                     return nlohmann::json{{"success", true}};
                 },
                 /*any_body=*/true);
         }},
        {"GET", "/slots", [&] { slots(req, conn); }},
        {"POST", "/apply-template",
         [&] {
             try {
                 send_json(conn, 200, {{"prompt", api_chat_prompt(req.body, cfg.api)}});
             } catch (const Error& e) {
                 send_error(conn, 400, error_text(e));
             }
         }},
        {"GET", "/metrics",
         [&] { conn.send(200, "text/plain; version=0.0.4; charset=utf-8", metrics()); }},
    };
    bool known_path = false;
    for (const Route& r : routes) {
        if (p != r.path && !(p == "/models" && std::string_view(r.path) == "/v1/models")) continue;
        known_path = true;
        if (req.method == r.method) {
            r.run();
            return;
        }
    }
    if (known_path)
        send_error(conn, 405, fmt::format("{} is not allowed on {}", req.method, p));
    else
        send_error(conn, 404, fmt::format("no endpoint {} (see `kvrun server --help`)", p));
}

void ApiServer::Impl::generate(ApiFormat format, const HttpRequest& req, HttpConnection& conn,
                               Dialect dialect) {
    const bool anthropic = dialect == Dialect::Anthropic;
    const bool responses = dialect == Dialect::Responses;
    // Errors and events in the client's API.
    auto fail_with = [&](int status, std::string_view message) {
        if (anthropic)
            return conn.send(status, "application/json; charset=utf-8",
                             anthropic_error_body(status, message));
        return send_error(conn, status, message);
    };
    std::optional<AnthropicStream> astream;
    std::optional<ResponsesStream> rstream;
    auto send_named = [&](const auto& events) {
        for (const auto& [name, data] : events)
            if (!conn.send_chunk("event: " + name + "\ndata: " + json_line(data) + "\n\n"))
                return false;
        return true;
    };
    auto send = [&](const nlohmann::json& chunk) {
        if (astream) return send_named(astream->feed(chunk));
        if (rstream) return send_named(rstream->feed(chunk));
        return send_event(conn, chunk);
    };
    // /v1/responses: the body (its settings are echoed in the answer) and its chat request.
    nlohmann::ordered_json responses_body, responses_chat;
    // A finished answer kept for previous_response_id and GET /v1/responses/{id}, unless
    // the request said "store": false; returns the response object.
    auto keep_response = [&](const nlohmann::json& answer) {
        nlohmann::json response = responses_response(answer, responses_body);
        const nlohmann::ordered_json& store = responses_body.contains("store")
                                                  ? responses_body["store"]
                                                  : nlohmann::ordered_json(true);
        if (store != false)
            responses_store.put(
                response["id"].get<std::string>(),
                {responses_conversation(responses_chat, responses_body, answer), response});
        return response;
    };
    ApiRequest ar;
    // One job per prompt (OpenAI's list of prompts); their samples are the choices, prompt
    // by prompt.
    std::vector<std::shared_ptr<EngineWorker::Job>> jobs;
    int32_t slot = 0;  // where the first choice's tokens are remembered (server_slots.h)
    // echo with logprobs: each prompt's token log-probabilities, computed between steps.
    std::vector<std::vector<TokenLogprobs>> echo_lps;
    try {
        if (anthropic) {
            const nlohmann::ordered_json body =
                nlohmann::ordered_json::parse(req.body, nullptr, /*allow_exceptions=*/false);
            if (body.is_discarded()) fail("malformed JSON");
            ar = api_request_from_json(format, anthropic_to_openai(body).dump(), cfg.api, tok);
            if (ar.requests.size() != 1 || ar.requests[0].n_samples != 1)
                fail("the Messages API gives one reply per request");
            if (ar.stream) astream.emplace(int64_t(ar.requests[0].prompt.size()));
        } else if (responses) {
            responses_body =
                nlohmann::ordered_json::parse(req.body, nullptr, /*allow_exceptions=*/false);
            if (responses_body.is_discarded()) fail("malformed JSON");
            std::optional<ResponsesStore::Entry> previous;
            if (responses_body.is_object() && responses_body.contains("previous_response_id") &&
                !responses_body["previous_response_id"].is_null()) {
                const auto& id = responses_body["previous_response_id"];
                if (!id.is_string()) fail("'previous_response_id' must be a response id");
                previous = responses_store.get(id.get<std::string>());
                if (!previous) {
                    fail_with(404, fmt::format("no stored response '{}' (kvrun keeps the newest "
                                               "responses in memory until it stops)",
                                               id.get<std::string>()));
                    return;
                }
            }
            std::optional<ApiRequest> checked;
            responses_chat = responses_truncate(
                responses_body,
                responses_to_openai(responses_body, previous ? &previous->conversation : nullptr),
                [&](const auto& c) {  // (the engine needs one token's room after the prompt)
                    checked = api_request_from_json(format, c.dump(), cfg.api, tok);
                    return checked->requests[0].prompt.size() >= size_t(engine.n_ctx());
                });
            // (The truncation's last check read the request it returns.)
            ar = checked ? std::move(*checked)
                         : api_request_from_json(format, responses_chat.dump(), cfg.api, tok);
            if (ar.requests.size() != 1 || ar.requests[0].n_samples != 1)
                fail("the Responses API gives one reply per request");
            if (ar.stream) rstream.emplace(responses_body, int64_t(ar.requests[0].prompt.size()));
        } else {
            ar = api_request_from_json(format, req.body, cfg.api, tok);
        }
        if (const std::vector<float> scales = lora.scales(); !scales.empty())
            for (GenerationRequest& r : ar.requests)
                if (r.lora.empty()) r.lora = scales;  // POST /lora-adapters' scales
        if (ar.echo && ar.top_logprobs >= 0)
            for (const GenerationRequest& r : ar.requests)
                worker->call([&](Engine& e) {
                    echo_lps.push_back(prompt_logprobs(e.backend(), e.kv_table(), r.prompt,
                                                       std::max(ar.top_logprobs, 1), cfg.n_batch,
                                                       r.lora));
                });
        slot = slot_store.take(ar.id_slot);
        for (const GenerationRequest& r : ar.requests) jobs.push_back(worker->submit(r));
    } catch (const Error& e) {
        for (const auto& job : jobs) worker->cancel(*job);
        fail_with(stopping() ? 503 : 400, error_text(e));
        return;
    } catch (const nlohmann::json::exception& e) {  // (a field of the wrong type)
        for (const auto& job : jobs) worker->cancel(*job);
        fail_with(400, fmt::format("bad field type: {}", e.what()));
        return;
    }
    ++n_requests;
    for (const GenerationRequest& r : ar.requests)
        n_prompt_tokens += static_cast<int64_t>(r.prompt.size());
    const bool openai = !api_native(format);
    ApiResponseMeta meta;
    meta.id =
        fmt::format("{}-{}", format == ApiFormat::OpenAiChat ? "chatcmpl" : "cmpl", next_id++);
    meta.created = static_cast<int64_t>(std::time(nullptr));
    meta.model = cfg.api.model_id;

    const int32_t n = ar.requests[0].n_samples;
    const size_t n_choices = jobs.size() * static_cast<size_t>(n);
    // --context-shift: each single-sample request whose context fills goes on in further
    // rounds, its tokens streamed on as one reply.
    std::vector<std::optional<ContextShiftRun>> shifts(jobs.size());
    ContextShiftOptions shift = cfg.context_shift;
    if (ar.n_keep) shift.n_keep = *ar.n_keep;  // (the request's "n_keep")
    if (shift.enabled && n == 1)
        for (size_t j = 0; j < jobs.size(); ++j) shifts[j].emplace(ar.requests[j], shift, tok);
    std::vector<ApiTextStream> texts(n_choices, ApiTextStream(tok, ar.stop, ar.preserved_tokens));
    std::vector<ApiChoiceResult> choices(n_choices);
    for (size_t i = 0; i < n_choices; ++i) choices[i].index = int32_t(i);
    std::vector<bool> started(n_choices, false);
    if (ar.echo)
        for (size_t i = 0; i < n_choices; ++i) {
            const size_t p = i / size_t(n);
            choices[i].echo_text = ar.prompt_texts[p];
            if (p < echo_lps.size()) {
                choices[i].echo_tokens = ar.requests[p].prompt;
                choices[i].echo_logprobs = echo_lps[p];
            }
        }
    bool client_gone = false, cancelled = false;
    if (ar.stream &&
        !conn.begin_chunked(200, "text/event-stream",
                            {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}}))
        client_gone = true;
    // Streamed logprobs go with the chunk that shows their tokens' text: per choice, those
    // not sent yet, how many were, and the bytes of text they covered.
    std::vector<std::vector<TokenLogprobs>> lp_pending(n_choices);
    std::vector<size_t> lp_sent(n_choices, 0), lp_offset(n_choices, 0);
    // With tools or reasoning: the reply's text so far, and the bytes of its content and
    // reasoning already streamed (each streams as it comes, api_stream_view; tool calls show
    // once whole, api_stream_reply_chunk).
    const bool views = ar.tools || ar.reasoning || ar.v32_text;
    std::vector<std::string> reply_text(n_choices);
    std::vector<size_t> content_sent(n_choices, 0), reasoning_sent(n_choices, 0);
    auto emit = [&](size_t i, const std::string& piece) {
        if (!ar.stream || piece.empty() || client_gone) return;
        std::string delta = piece, reasoning;
        if (views) {
            reply_text[i] += piece;
            const ApiStreamView v = api_stream_view(ar, reply_text[i]);
            delta = v.content.size() > content_sent[i] ? v.content.substr(content_sent[i]) : "";
            reasoning =
                v.reasoning.size() > reasoning_sent[i] ? v.reasoning.substr(reasoning_sent[i]) : "";
            if (delta.empty() && reasoning.empty()) return;
            content_sent[i] += delta.size();
            reasoning_sent[i] += reasoning.size();
        }
        if (!send(api_stream_chunk(ar, meta, int32_t(i), delta, !started[i], tok, lp_pending[i],
                                   lp_offset[i], reasoning)))
            client_gone = true;
        started[i] = true;
        for (const TokenLogprobs& lp : lp_pending[i])
            lp_offset[i] += token_piece_shown(tok, lp.chosen.token, ar.preserved_tokens).size();
        lp_sent[i] += lp_pending[i].size();
        lp_pending[i].clear();
    };
    // Echo: the prompt first, with its tokens' logprobs; the generated tokens' entries and
    // text offsets follow on from them.
    for (size_t i = 0; i < n_choices && ar.echo && ar.stream && !client_gone; ++i) {
        const ApiChoiceResult& c = choices[i];
        if (c.echo_text.empty() && c.echo_tokens.empty()) continue;
        if (!send(api_stream_echo_chunk(ar, meta, c, tok))) client_gone = true;
        started[i] = true;
        if (c.echo_tokens.empty()) continue;
        lp_sent[i] = 1 + c.echo_logprobs.size();
        for (TokenId t : c.echo_tokens)
            lp_offset[i] += token_piece_shown(tok, t, ar.preserved_tokens).size();
    }
    auto handle = [&](size_t job, EngineWorker::Event& e) {
        const size_t i = job * size_t(n) + size_t(e.sample);
        if (e.kind == EngineWorker::Event::Kind::Token) {
            if (e.logprobs) lp_pending[i].push_back(std::move(*e.logprobs));
            emit(i, texts[i].push(e.token));
            return;
        }
        if (shifts[job]) {
            std::string refused;
            if (shifts[job]->add(e.result, cancelled)) {
                try {
                    jobs[job] = worker->submit(shifts[job]->request());  // the next round
                    return;
                } catch (const Error& err) {  // (the server is stopping)
                    refused = error_text(err);
                }
            }
            e.result = shifts[job]->result();  // every round's tokens
            if (!refused.empty()) {
                e.result.stop = StopReason::Error;
                e.result.error = refused;
            }
        }
        emit(i, texts[i].finish());
        ApiChoiceResult& c = choices[i];
        c.index = int32_t(i);
        c.text = texts[i].text();
        c.result = std::move(e.result);
        c.stop_word = texts[i].stops().stopped() ? texts[i].stops().stop_word() : "";
        n_generated_tokens += c.result.timings.n_generated;
        if (i == 0 && c.result.stop != StopReason::Error)
            slot_store.finish(slot, ar.requests[0].prompt, c.result.tokens);
        if (!ar.stream || client_gone) return;
        if (c.result.stop == StopReason::Error) {
            const bool sent =
                anthropic ? conn.send_chunk("event: error\ndata: " +
                                            anthropic_error_body(500, c.result.error) + "\n\n")
                : responses
                    ? send_named(rstream->fail(c.result.error))
                    : send_event(conn, nlohmann::json::parse(http_error_body(500, c.result.error)));
            if (!sent) client_gone = true;
        } else {
            const nlohmann::json reply =
                views ? api_stream_reply_chunk(ar, meta, c, content_sent[i], reasoning_sent[i],
                                               !started[i])
                      : nlohmann::json();
            if (astream) astream->set_stop_word(c.stop_word);
            if ((!reply.is_null() && !send(reply)) ||
                !send(api_stream_final_chunk(ar, meta, c, tok, lp_sent[i])))
                client_gone = true;
        }
    };
    auto last_check = std::chrono::steady_clock::now();
    for (;;) {
        // A client that left, or Ctrl-C: cancel once, then take the Cancelled results.
        const auto now = std::chrono::steady_clock::now();
        if (!cancelled && now - last_check > std::chrono::milliseconds(100)) {
            last_check = now;
            if (!client_gone && conn.peer_closed()) client_gone = true;
            if (client_gone || stopping()) {
                for (const auto& job : jobs) worker->cancel(*job);
                cancelled = true;
                ++n_cancelled;
            }
        }
        // Take what every job has; when none had anything, wait on one that is not done.
        bool any = false;
        std::shared_ptr<EngineWorker::Job> waiting;
        size_t waiting_index = 0;
        for (size_t j = 0; j < jobs.size(); ++j) {
            while (std::optional<EngineWorker::Event> e =
                       jobs[j]->next(std::chrono::milliseconds(0))) {
                handle(j, *e);
                any = true;
            }
            if (!waiting && !jobs[j]->done()) {
                waiting = jobs[j];
                waiting_index = j;
            }
        }
        if (!waiting) break;
        if (any) continue;
        if (std::optional<EngineWorker::Event> e = waiting->next(std::chrono::milliseconds(50)))
            handle(waiting_index, *e);
    }
    if (ar.stream) {
        if (client_gone) return;
        if (openai && ar.include_usage) send(api_usage_chunk(ar, meta, choices));
        if (openai && dialect == Dialect::OpenAi) conn.send_chunk("data: [DONE]\n\n");
        if (responses && choices[0].result.stop != StopReason::Error &&
            choices[0].result.stop != StopReason::Cancelled)
            keep_response(api_response(ar, meta, choices, tok));
        conn.end_chunked();
        return;
    }
    if (client_gone) return;
    for (const ApiChoiceResult& c : choices) {
        if (c.result.stop == StopReason::Error) {
            fail_with(500, c.result.error);
            return;
        }
        if (c.result.stop == StopReason::Cancelled) {
            fail_with(503, "the server is shutting down");
            return;
        }
    }
    const nlohmann::json answer = api_response(ar, meta, choices, tok);
    send_json(conn, 200,
              anthropic                    ? anthropic_response(answer, choices[0].stop_word)
              : responses                  ? keep_response(answer)
              : ar.response_fields.empty() ? answer
                                           : api_pick_fields(answer, ar.response_fields));
}

// Anthropic's /v1/messages/count_tokens: the prompt's tokens as /v1/messages would give them.
nlohmann::json ApiServer::Impl::count_tokens(const std::string& text) {
    const nlohmann::ordered_json body =
        nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) fail("malformed JSON");
    const std::string prompt = api_chat_prompt(anthropic_to_openai(body).dump(), cfg.api);
    return {{"input_tokens", tok.encode(prompt, tok.add_bos(), /*parse_special=*/true).size()}};
}

nlohmann::json ApiServer::Impl::tokenize(const nlohmann::json& j) {
    if (!j.contains("content") || !j["content"].is_string()) fail("missing string field 'content'");
    const std::string text = j["content"].get<std::string>();
    utf8_require_valid(text, "'content'");
    const bool add_special = j.value("add_special", false);
    const bool parse_special = j.value("parse_special", true);
    const bool with_pieces = j.value("with_pieces", false);
    nlohmann::json tokens = nlohmann::json::array();
    for (TokenId id : tok.encode(text, add_special && tok.add_bos(), parse_special)) {
        if (with_pieces)
            tokens.push_back({{"id", id}, {"piece", tok.token_to_piece(id)}});
        else
            tokens.push_back(id);
    }
    return {{"tokens", tokens}};
}

nlohmann::json ApiServer::Impl::detokenize(const nlohmann::json& j) {
    if (!j.contains("tokens") || !j["tokens"].is_array())
        fail("missing field 'tokens' (a list of token ids)");
    std::vector<TokenId> ids;
    for (const auto& v : j["tokens"]) {
        const int64_t id = v.get<int64_t>();
        if (id < 0 || id >= tok.n_vocab())
            fail("token id {} is outside the vocabulary (0..{})", id, tok.n_vocab() - 1);
        ids.push_back(static_cast<TokenId>(id));
    }
    return {{"content", tok.decode(ids)}};
}

// Embedding passes run on the worker thread between engine steps, on the engine's block
// table (generation pauses for them; their prompt blocks stay in the prefix cache).
nlohmann::json ApiServer::Impl::embeddings(const nlohmann::json& j) {
    const std::string format = j.value("encoding_format", "float");
    if (format != "float" && format != "base64")
        fail("'encoding_format' must be float or base64 (got '{}')", format);
    const std::vector<std::vector<TokenId>> prompts = api_embedding_inputs(j, tok);
    int64_t n_tokens = 0;
    for (const auto& p : prompts) n_tokens += static_cast<int64_t>(p.size());
    std::vector<std::vector<float>> vectors;
    worker->call([&](Engine& e) {
        vectors = compute_embeddings(e.backend(), e.kv_table(), prompts, cfg.pooling, cfg.n_batch,
                                     e.n_ctx(), lora.scales());
    });
    for (auto& v : vectors) normalize_embedding(v, 2);  // OpenAI's are unit vectors
    return api_embedding_response(vectors, cfg.api.model_id, n_tokens, format == "base64");
}

// /rerank (llama-server's and Jina's / Cohere's shape): the documents' relevance to the
// query (rerank.h), most relevant first, the first top_n of them.
nlohmann::json ApiServer::Impl::rerank(const nlohmann::json& j) {
    const ApiRerankRequest in = api_rerank_request(j);
    std::vector<std::vector<TokenId>> prompts;
    int64_t n_tokens = 0;
    for (const std::string& d : in.documents) {
        prompts.push_back(rerank_tokens(tok, *cfg.rerank, in.instruction, in.query, d));
        n_tokens += static_cast<int64_t>(prompts.back().size());
    }
    std::vector<double> scores;
    worker->call([&](Engine& e) {
        scores = rerank_scores(e.backend(), e.kv_table(), *cfg.rerank, prompts, cfg.n_batch,
                               e.n_ctx(), {"document", 0}, lora.scales());
    });
    return api_rerank_response(in, scores, cfg.api.model_id, n_tokens);
}

nlohmann::json ApiServer::Impl::props() {
    const SamplingParams& s = cfg.api.defaults.sampling;
    return {{"default_generation_settings",
             {{"n_ctx", engine.n_ctx()},
              {"params",
               {{"n_predict", cfg.api.defaults.n_predict},
                {"temperature", s.temperature},
                {"top_k", s.top_k},
                {"top_p", s.top_p},
                {"min_p", s.min_p},
                {"repeat_penalty", s.repeat_penalty},
                {"seed", s.seed},
                {"stop", cfg.api.defaults.stop}}}}},
            {"total_slots", cfg.parallel},
            {"model_path", cfg.model_path},
            {"model_alias", cfg.api.model_id},
            {"chat_template", cfg.api.chat.jinja ? cfg.api.chat.jinja->source()
                                                 : chat_template_name(cfg.api.chat.kind)},
            {"build_info", "kvrun"}};
}

// llama.cpp server's GET /slots: one entry per place for a sequence (--parallel), the running
// sequences first. ?fail_on_no_slot=1 answers 503 when every place is taken.
void ApiServer::Impl::slots(const HttpRequest& req, HttpConnection& conn) {
    if (!cfg.slots_endpoint) {
        send_error(conn, 501, "/slots is off (--no-slots)");
        return;
    }
    std::vector<EngineSequenceInfo> seqs;
    std::vector<int32_t> blocks;
    worker->call([&](Engine& e) {
        seqs = e.running_sequences();
        for (const EngineSequenceInfo& s : seqs)
            blocks.push_back(static_cast<int32_t>(e.kv_table().block_ids(s.kv).size()));
    });
    const size_t n = std::max(static_cast<size_t>(cfg.parallel), seqs.size());
    if (req.query.find("fail_on_no_slot=1") != std::string::npos && seqs.size() >= n) {
        send_error(conn, 503, "no slot available");
        return;
    }
    nlohmann::json out = nlohmann::json::array();
    for (size_t i = 0; i < n; ++i) {
        nlohmann::json s = {
            {"id", i}, {"n_ctx", engine.n_ctx()}, {"is_processing", i < seqs.size()}};
        if (i < seqs.size()) {
            const EngineSequenceInfo& q = seqs[i];
            s["id_task"] = q.request;
            s["sample"] = q.sample;
            s["n_prompt_tokens"] = q.n_prompt;
            s["n_past"] = q.n_computed;
            s["n_decoded"] = q.n_tokens - q.n_prompt;
            s["kv_blocks"] = blocks[i];
        }
        out.push_back(std::move(s));
    }
    send_json(conn, 200, out);
}

std::string ApiServer::Impl::metrics() {
    EngineStats st;
    KvBlockStats kv;
    int32_t running = 0, waiting = 0;
    worker->call([&](Engine& e) {
        st = e.stats();
        kv = e.kv_table().stats();
        running = e.n_running();
        waiting = e.n_waiting();
    });
    std::string out;
    auto metric = [&](const char* name, const char* type, const char* help, double value) {
        out += fmt::format("# HELP kvrun:{} {}\n# TYPE kvrun:{} {}\nkvrun:{} {}\n", name, help,
                           name, type, name, value);
    };
    metric("requests_total", "counter", "Generation requests accepted.", double(n_requests));
    metric("requests_cancelled_total", "counter",
           "Generations cancelled (the client went away, or the server stopped).",
           double(n_cancelled));
    metric("prompt_tokens_total", "counter", "Prompt tokens of accepted requests.",
           double(n_prompt_tokens));
    metric("tokens_predicted_total", "counter", "Tokens generated.", double(n_generated_tokens));
    metric("prompt_tokens_computed_total", "counter",
           "Prompt tokens run through the model (the rest came from the prefix cache).",
           double(st.tokens_prefilled));
    metric("prefix_cache_hit_tokens_total", "counter", "Prompt tokens reused from the KV cache.",
           double(st.prefix_hit_tokens));
    metric("preemptions_total", "counter", "Sequences preempted for KV blocks.",
           double(st.preemptions));
    metric("requests_processing", "gauge", "Sequences generating now.", running);
    metric("requests_deferred", "gauge", "Sequences waiting for KV blocks.", waiting);
    metric("kv_blocks_used", "gauge", "KV blocks in use.", kv.used_blocks);
    metric("kv_blocks_total", "gauge", "KV blocks in the pool.", kv.n_blocks);
    metric("kv_cache_usage_ratio", "gauge", "Fraction of the KV pool in use.",
           kv.n_blocks > 0 ? double(kv.used_blocks) / kv.n_blocks : 0.0);
    return out;
}

ApiServer::ApiServer(ServerConfig config, Engine& engine, const Tokenizer& tok)
    : impl_(std::make_unique<Impl>(std::move(config), engine, tok)) {
    Impl* impl = impl_.get();
    impl->http = std::make_unique<HttpServer>(
        impl->cfg.http, [impl](const HttpRequest& r, HttpConnection& c) { impl->handle(r, c); });
    worker_ = std::make_unique<EngineWorker>(engine);
    impl->worker = worker_.get();
}

ApiServer::~ApiServer() {
    worker_->stop();
}

int ApiServer::port() const {
    return impl_->http->port();
}

void ApiServer::serve(const std::atomic<bool>& stop) {
    impl_->stop = &stop;
    impl_->http->serve(stop);
    worker_->stop();
}

namespace {

struct ServerOptions {
    ModelOptions model;
    DraftOptions draft;
    SamplingParams sampling;
    std::string host = "127.0.0.1";
    int port = 8080;
    int32_t parallel = 4;
    int32_t n_predict = -1;
    std::vector<std::string> stop;
    std::string api_key, chat_template, alias, pooling;
    double timeout_s = 600;
    bool no_webui = false;
    bool spm_infill = false;
    bool no_slots = false;
    bool jinja = false;
    std::string chat_template_file;
    std::string reasoning_format = "deepseek";
    std::string template_kwargs;    // JSON object text
    int32_t reasoning_budget = -1;  // -1: unrestricted; 0: thinking off; N: at most N tokens
    std::string reasoning_budget_message;
    ContextShiftOptions shift;
    bool rerank = false;
    std::string rerank_template, slot_save_path;
};

int run_server(const ServerOptions& o) {
    // Without -c (and --kv-memory), each sequence gets at most kDefaultContext tokens, as
    // llama.cpp's server: a pool of --parallel whole 128K contexts would not fit most GPUs.
    ModelOptions mo = o.model;
    if (mo.n_ctx == 0 && mo.kv_memory_mib <= 0) {
        constexpr int64_t kDefaultContext = 4096;
        const int64_t train = model_config_from_gguf(*open_model_file(mo)).n_ctx_train;
        mo.n_ctx =
            static_cast<int32_t>(train > 0 ? std::min(train, kDefaultContext) : kDefaultContext);
    }
    LoadedModel m = load_model(mo, o.parallel);
    LoadedModel draft;
    if (o.draft.enabled()) draft = load_draft_model(o.draft, mo, m, o.parallel);
    Engine engine(*m.backend, *m.tokenizer,
                  generation_engine_options(mo, o.parallel, o.draft, draft));
    warn_if_context_capped(engine, mo);

    ServerConfig cfg;
    cfg.http.host = o.host;
    cfg.http.port = o.port;
    cfg.http.idle_timeout_s = o.timeout_s;
    cfg.api_key = o.api_key;
    cfg.web_ui = !o.no_webui;
    cfg.slots_endpoint = !o.no_slots;
    cfg.parallel = o.parallel;
    cfg.context_shift = o.shift;
    if (o.rerank)
        cfg.rerank = std::make_shared<const RerankJudge>(rerank_judge(
            *m.tokenizer, o.rerank_template.empty() ? kRerankTemplate : o.rerank_template));
    cfg.model_path = mo.model;
    cfg.n_batch = mo.n_batch;
    // /v1/embeddings pools: --pooling, else the model's; a model without one (a generative
    // model) is mean-pooled.
    cfg.pooling = o.pooling.empty() ? model_pooling(*m.file) : *pooling_from_name(o.pooling);
    if (cfg.pooling == Pooling::None) cfg.pooling = Pooling::Mean;
    RequestDefaults& d = cfg.api.defaults;
    d.sampling = o.sampling;
    d.n_predict = o.n_predict;
    d.stop = o.stop;
    for (const LoraSpec& l : lora_specs(mo)) cfg.lora_paths.push_back(l.path);
    cfg.slot_save_path = o.slot_save_path;  // (ServerSlots checks it)
    if (!o.slot_save_path.empty()) cfg.slot_key = prompt_cache_key_for(mo, m);
    d.n_lora = static_cast<int32_t>(cfg.lora_paths.size());
    cfg.api.model_id =
        o.alias.empty() ? std::filesystem::path(o.model.model).filename().string() : o.alias;
    const ChatTemplateChoice chat =
        chat_template_choose(*m.file, o.chat_template, o.chat_template_file, o.jinja);
    if (!chat.note.empty()) fmt::print(stderr, "kvrun server: {}\n", chat.note);
    cfg.api.chat = chat_format_make(chat, *m.tokenizer);
    if (!chat.jinja && o.chat_template.empty())
        cfg.api.chat.tools_jinja = native_tools_template(chat_template_source(*m.file));
    cfg.api.reasoning = o.reasoning_format != "none";
    cfg.api.reasoning_keep_content = o.reasoning_format == "deepseek-legacy";
    if (!o.template_kwargs.empty()) {
        cfg.api.template_kwargs =
            nlohmann::ordered_json::parse(o.template_kwargs, nullptr, /*allow_exceptions=*/false);
        if (!cfg.api.template_kwargs.is_object())
            throw Error(
                "--chat-template-kwargs must be a JSON object (got: " + o.template_kwargs + ")",
                "e.g. --chat-template-kwargs '{\"enable_thinking\": false}'");
        if (!chat.jinja)
            fmt::print(stderr,
                       "kvrun server: --chat-template-kwargs applies to Jinja templates only; "
                       "the built-in format {} ignores it (add --jinja)\n",
                       chat.name());
    }
    if (o.reasoning_budget == 0) {  // llama.cpp's switch: the template's enable_thinking off
        if (cfg.api.template_kwargs.is_null())
            cfg.api.template_kwargs = nlohmann::ordered_json::object();
        if (!cfg.api.template_kwargs.contains("enable_thinking"))
            cfg.api.template_kwargs["enable_thinking"] = false;
        if (!chat.jinja || chat.jinja->source().find("enable_thinking") == std::string::npos)
            fmt::print(stderr,
                       "kvrun server: --reasoning-budget 0: the chat template ({}) has no "
                       "enable_thinking switch; a reasoning block the model opens is closed "
                       "at once\n",
                       chat.name());
    }
    d.reasoning_budget = o.reasoning_budget;
    d.reasoning_budget_message = o.reasoning_budget_message;
    cfg.api.n_ctx_seq = engine.n_ctx();
    cfg.api.spm_infill = o.spm_infill;

    ApiServer server(cfg, engine, *m.tokenizer);
    install_interrupt_handler();
    std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up is a failed write, not an exit
    const std::string host = o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host;
    fmt::print(stderr,
               "kvrun server: {} on {}, {} sequences at once, context {} tokens, chat template "
               "{} (tool calls: {}){}\n",
               cfg.api.model_id, m.device, o.parallel, engine.n_ctx(), chat.name(),
               tool_format_name(cfg.api.chat.tools_template()
                                    ? tool_format_detect(cfg.api.chat.tools_template()->source())
                                    : ToolFormat::Generic),
               engine.speculative() ? ", speculative decoding" : "");
    fmt::print(stderr, "kvrun server: listening on http://{}:{} (Ctrl-C stops)\n", host,
               server.port());
    std::fflush(stderr);
    server.serve(interrupt_flag());
    fmt::print(stderr, "kvrun server: stopped\n");
    return 0;
}

}  // namespace

void add_server_command(CLI::App& root, int& exit_code) {
    auto o = std::make_shared<ServerOptions>();
    CLI::App* cmd = root.add_subcommand(
        "server",
        "Serve the model over HTTP: OpenAI's /v1/completions and /v1/chat/completions (with "
        "streaming), /v1/responses, /v1/embeddings, /v1/rerank, Anthropic's /v1/messages, "
        "llama.cpp server's /completion, /infill, /tokenize, /detokenize, /health, /metrics");
    cmd->alias("serve");
    add_model_options(cmd, o->model);
    cmd->add_option("--host", o->host, "Address to listen on (0.0.0.0: every interface)")
        ->capture_default_str();
    cmd->add_option("--port", o->port, "Port to listen on (0: any free port, printed on stderr)")
        ->check(CLI::Range(0, 65535))
        ->capture_default_str();
    cmd->add_option("--parallel", o->parallel,
                    "Sequences generated at once (more requests wait for a place)")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
    cmd->add_option("-n,--n-predict", o->n_predict,
                    "Default tokens to generate per request (-1: until EOS or the context is full)")
        ->check(n_predict_check())
        ->capture_default_str();
    add_sampling_options(cmd, o->sampling);
    add_draft_options(cmd, o->draft);
    add_context_shift_options(cmd, o->shift);
    cmd->add_flag("--rerank,--reranking", o->rerank,
                  "Answer /rerank and /v1/rerank: score documents against a query with a "
                  "generative judge such as Qwen3-Reranker (P(\"yes\") against P(\"no\") "
                  "after its prompt)");
    add_rerank_template_option(cmd, o->rerank_template, "--rerank");
    cmd->add_option("--stop", o->stop, "Default stop text (repeatable)");
    cmd->add_option("--api-key", o->api_key,
                    "Require \"Authorization: Bearer KEY\" on every endpoint but /health");
    cmd->add_option("--chat-template", o->chat_template,
                    "Chat format of /v1/chat/completions: llama2, llama3, chatml, mistral, "
                    "zephyr, phi3, phi4, gemma, granite, deepseek3, deepseek2, mistral-v3, "
                    "mistral-v3-tekken, mistral-v7, mistral-v7-tekken, plain (default: detected "
                    "from the model)")
        ->check(parses_with([](const std::string& s) { chat_template_from_name(s); }, "TEMPLATE"));
    cmd->add_option("--chat-template-file", o->chat_template_file,
                    "A Jinja chat template to format chats with (instead of the model's)");
    cmd->add_flag("--jinja", o->jinja,
                  "Format chats with the model's own Jinja template through kvrun's interpreter "
                  "(default: a built-in format when the template is a known one)");
    cmd->add_option("--reasoning-format", o->reasoning_format,
                    "Chat replies of models that think (<think>...</think>): deepseek (or auto) "
                    "returns the reasoning apart as \"reasoning_content\"; none keeps it in "
                    "the content; deepseek-legacy does both (tool replies: as deepseek)")
        ->check(CLI::IsMember({"none", "deepseek", "deepseek-legacy", "auto"}))
        ->capture_default_str();
    add_reasoning_budget_options(cmd, o->reasoning_budget, o->reasoning_budget_message,
                                 " (and the template's enable_thinking is set to false, as "
                                 "llama.cpp); a request's reasoning_budget_tokens and "
                                 "reasoning_budget_message override them");
    cmd->add_option("--chat-template-kwargs", o->template_kwargs,
                    "More variables for the Jinja chat template, as a JSON object (e.g. "
                    "'{\"enable_thinking\": false}'); a request's chat_template_kwargs add to "
                    "them");
    cmd->add_option("--pooling", o->pooling,
                    "Pooling of /v1/embeddings: mean, cls or last (default: the model's, mean "
                    "when it has none)")
        ->check(CLI::IsMember({"mean", "cls", "last"}));
    // llama-server's switches for what kvrun always does: accepted so its scripts run.
    cmd->add_flag("--cont-batching")
        ->description(
            "Accepted for llama-server's scripts: batching is always "
            "continuous");
    cmd->add_flag("--metrics")
        ->description("Accepted for llama-server's scripts: GET /metrics always answers");
    cmd->add_flag("--embedding,--embeddings")
        ->description(
            "Accepted for llama-server's scripts: /v1/embeddings always "
            "answers, beside generation");
    cmd->add_flag("--no-webui", o->no_webui, "No chat page at GET /");
    cmd->add_flag("--no-slots", o->no_slots, "No GET /slots (the running sequences' state)");
    cmd->add_option("--slot-save-path", o->slot_save_path,
                    "Directory for POST /slots/{id}?action=save|restore (a slot's K/V in a "
                    "file, as llama-server's)");
    cmd->add_flag("--spm-infill", o->spm_infill,
                  "Fill in the middle (/infill, suffix) in suffix-prefix-middle order, for "
                  "models trained that way (default: prefix-suffix-middle)");
    cmd->add_option("-a,--alias", o->alias, "Model name in responses (default: the file name)");
    cmd->add_option("--timeout", o->timeout_s,
                    "Seconds an idle connection stays open without a complete request")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    cmd->callback([o, &exit_code] { exit_code = run_server(*o); });
}

}  // namespace kvrun
