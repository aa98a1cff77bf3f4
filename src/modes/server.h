// `kvrun server`: an HTTP server with OpenAI's and llama.cpp server's generation API on the
// engine's continuous batching (see server.cpp). ApiServer is the part without the command
// line, so tests run it in-process on a loaded model.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "embedding.h"
#include "engine.h"
#include "engine_worker.h"
#include "http_server.h"
#include "modes/context_shift.h"
#include "modes/server_api.h"
#include "prompt_cache.h"
#include "rerank.h"
#include "tokenizer.h"

namespace kvrun {

struct ServerConfig {
    HttpServerOptions http;
    std::string api_key;  // non-empty: requests need "Authorization: Bearer KEY" (not /health)
    ApiContext api;
    std::string model_path;           // shown by /props
    int32_t parallel = 4;             // sequences generated at once
    Pooling pooling = Pooling::Mean;  // /v1/embeddings (never None or Rank)
    int32_t n_batch = 512;            // tokens per embedding pass
    bool web_ui = true;               // GET / answers with a chat page (server_ui_html)
    bool slots_endpoint = true;       // GET /slots answers (--no-slots: 501)
    // --context-shift / --keep: a single-sample request whose context fills before its
    // max_tokens goes on after dropping older tokens (ContextShiftRun), as llama-server's.
    ContextShiftOptions context_shift;
    // --rerank: /rerank and /v1/rerank score documents with this judge (null: they answer 501).
    std::shared_ptr<const RerankJudge> rerank;
    // The loaded LoRA adapters' files in id order, for GET /lora-adapters.
    std::vector<std::string> lora_paths;
    // --slot-save-path: POST /slots/{id}?action=save|restore|erase files go there (empty:
    // those answer 501); slot_key says which model and KV format the files hold.
    std::string slot_save_path;
    PromptCacheKey slot_key;
};

// The chat page of GET / (server_ui.cpp).
const char* server_ui_html();

class ApiServer {
  public:
    // Binds the listening socket (throws Error when it cannot) and starts the engine's worker
    // thread; the engine and tokenizer must outlive the server.
    ApiServer(ServerConfig config, Engine& engine, const Tokenizer& tok);
    ~ApiServer();
    int port() const;
    // Serves until `stop` becomes true: then running generations end (streams close, whole
    // responses answer 503), and it returns once every connection is done.
    void serve(const std::atomic<bool>& stop);
    EngineWorker& worker() { return *worker_; }

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::unique_ptr<EngineWorker> worker_;
};

}  // namespace kvrun
