// The engine on its own thread, for callers on other threads (the HTTP server's connections).
// The Engine is single-threaded: only the worker thread touches it. Callers submit requests
// and get a Job, a queue of that request's events (each generated token, then one result per
// sample) that they drain at their own pace; the worker steps the engine whenever anything
// runs and sleeps otherwise. Cancelling a job (its client went away) ends its sequences and
// frees their KV blocks at the next step boundary. Functions that need a consistent look at
// the engine (statistics) run on the worker thread through call().
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "engine.h"

namespace kvrun {

class EngineWorker {
  public:
    struct Event {
        enum class Kind { Token, Finished } kind = Kind::Token;
        int32_t sample = 0;
        TokenId token = -1;                     // Token
        std::optional<TokenLogprobs> logprobs;  // Token, when the request asked for them
        GenerationResult result;                // Finished
    };

    // One submitted request's events, in the order the engine produced them.
    class Job {
      public:
        // Waits up to `timeout` for the next event. nullopt: none yet.
        std::optional<Event> next(std::chrono::milliseconds timeout);
        bool done() const;  // every sample finished and every event was taken
        int32_t n_samples() const { return n_samples_; }

      private:
        friend class EngineWorker;
        bool push(Event e);  // returns whether every sample has finished now
        mutable std::mutex mu_;
        std::condition_variable cv_;
        std::deque<Event> events_;
        int32_t n_samples_ = 1;
        int32_t n_finished_ = 0;
        int32_t request_ = -1;
        bool answered_ = false;  // the worker took the submission (request_ or error_ set)
        std::string error_;      // Engine::submit refused the request
    };

    explicit EngineWorker(Engine& engine);
    ~EngineWorker();  // stop()
    EngineWorker(const EngineWorker&) = delete;
    EngineWorker& operator=(const EngineWorker&) = delete;

    // Queues the request on the worker and waits until the engine took it. Throws Error with
    // Engine::submit's message when it refuses the request (e.g. a prompt longer than the
    // context), or when the worker stopped.
    std::shared_ptr<Job> submit(GenerationRequest request);
    // Ends the job's sequences with StopReason::Cancelled (their Finished events still come).
    void cancel(const Job& job);
    // Runs fn on the worker thread between steps and returns when it ran; what fn throws is
    // rethrown here.
    void call(const std::function<void(Engine&)>& fn);
    // Cancels everything running or waiting, then ends the thread. Later submits throw.
    void stop();

    int32_t n_jobs() const;  // submitted jobs whose samples have not all finished

  private:
    void loop();
    struct Pending {
        std::shared_ptr<Job> job;
        GenerationRequest request;
    };
    struct Call {
        const std::function<void(Engine&)>* fn = nullptr;
        std::exception_ptr error;  // what fn threw, for the caller
        bool done = false;
        void run(Engine& e) {
            try {
                (*fn)(e);
            } catch (...) {
                error = std::current_exception();
            }
        }
    };

    Engine& engine_;
    mutable std::mutex mu_;
    std::condition_variable wake_;  // the worker: something to do
    std::condition_variable ran_;   // callers of call(): a call ran
    std::deque<Pending> pending_;
    std::vector<int32_t> cancels_;
    std::deque<Call*> calls_;
    bool stopping_ = false;
    bool stopped_ = false;  // the thread ended (call() then runs on the caller's thread)
    std::map<int32_t, std::shared_ptr<Job>> jobs_;  // engine request id -> job (worker only)
    std::string step_error_;  // while a failed step cancels everything: its message
    std::atomic<int32_t> n_jobs_{0};
    std::thread thread_;
};

}  // namespace kvrun
