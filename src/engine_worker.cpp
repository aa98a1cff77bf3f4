// The engine on its own thread (see engine_worker.h).
#include "engine_worker.h"

#include "common.h"

namespace kvrun {

std::optional<EngineWorker::Event> EngineWorker::Job::next(std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    if (!cv_.wait_for(lk, timeout, [&] { return !events_.empty(); })) return std::nullopt;
    Event e = std::move(events_.front());
    events_.pop_front();
    return e;
}

bool EngineWorker::Job::done() const {
    std::lock_guard lk(mu_);
    return n_finished_ == n_samples_ && events_.empty();
}

bool EngineWorker::Job::push(Event e) {
    bool all;
    {
        std::lock_guard lk(mu_);
        if (e.kind == Event::Kind::Finished) ++n_finished_;
        all = n_finished_ == n_samples_;
        events_.push_back(std::move(e));
    }
    cv_.notify_all();
    return all;
}

EngineWorker::EngineWorker(Engine& engine) : engine_(engine) {
    engine_.on_token(
        [this](int32_t request, int32_t sample, TokenId token, const TokenLogprobs* logprobs) {
            auto it = jobs_.find(request);
            if (it == jobs_.end()) return;
            Event e;
            e.sample = sample;
            e.token = token;
            if (logprobs) e.logprobs = *logprobs;
            it->second->push(std::move(e));
        });
    engine_.on_finish([this](const GenerationResult& r) {
        auto it = jobs_.find(r.request);
        if (it == jobs_.end()) return;
        Event e;
        e.kind = Event::Kind::Finished;
        e.sample = r.sample;
        e.result = r;
        if (r.stop == StopReason::Cancelled && !step_error_.empty()) {
            e.result.stop = StopReason::Error;
            e.result.error = step_error_;
        }
        if (it->second->push(std::move(e))) {
            jobs_.erase(it);
            --n_jobs_;
        }
    });
    thread_ = std::thread([this] { loop(); });
}

EngineWorker::~EngineWorker() {
    stop();
    engine_.on_token(nullptr);
    engine_.on_finish(nullptr);
}

std::shared_ptr<EngineWorker::Job> EngineWorker::submit(GenerationRequest request) {
    auto job = std::make_shared<Job>();
    job->n_samples_ = request.n_samples;
    {
        std::lock_guard lk(mu_);
        if (stopping_) fail("the server is shutting down");
        pending_.push_back({job, std::move(request)});
    }
    wake_.notify_one();
    std::unique_lock lk(job->mu_);
    job->cv_.wait(lk, [&] { return job->answered_; });
    if (!job->error_.empty()) throw Error(job->error_);
    return job;
}

void EngineWorker::cancel(const Job& job) {
    int32_t request;
    {
        std::lock_guard lk(job.mu_);
        request = job.request_;
    }
    if (request < 0) return;
    {
        std::lock_guard lk(mu_);
        cancels_.push_back(request);
    }
    wake_.notify_one();
}

void EngineWorker::call(const std::function<void(Engine&)>& fn) {
    Call c;
    c.fn = &fn;
    std::unique_lock lk(mu_);
    if (stopped_) {  // no worker thread any more: the engine is the caller's
        lk.unlock();
        fn(engine_);
        return;
    }
    calls_.push_back(&c);
    wake_.notify_one();
    ran_.wait(lk, [&] { return c.done; });
    if (c.error) std::rethrow_exception(c.error);
}

void EngineWorker::stop() {
    {
        std::lock_guard lk(mu_);
        stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
}

int32_t EngineWorker::n_jobs() const {
    return n_jobs_.load();
}

void EngineWorker::loop() {
    for (;;) {
        std::deque<Pending> pending;
        std::vector<int32_t> cancels;
        std::deque<Call*> calls;
        bool stopping;
        {
            std::unique_lock lk(mu_);
            wake_.wait(lk, [&] {
                return stopping_ || !pending_.empty() || !cancels_.empty() || !calls_.empty() ||
                       !engine_.idle();
            });
            pending.swap(pending_);
            cancels.swap(cancels_);
            calls.swap(calls_);
            stopping = stopping_;
        }
        for (Pending& p : pending) {
            Job& job = *p.job;
            int32_t id = -1;
            std::string error = stopping ? "the server is shutting down" : "";
            if (!stopping) {
                try {
                    id = engine_.submit(std::move(p.request));
                    jobs_[id] = p.job;
                    ++n_jobs_;
                } catch (const std::exception& e) {
                    error = e.what();
                }
            }
            {
                std::lock_guard lk(job.mu_);
                job.request_ = id;
                job.error_ = error;
                job.answered_ = true;
            }
            job.cv_.notify_all();
        }
        for (int32_t id : cancels) engine_.cancel(id);
        for (Call* c : calls) {
            c->run(engine_);
            std::lock_guard lk(mu_);
            c->done = true;
        }
        if (!calls.empty()) ran_.notify_all();
        if (stopping) {
            engine_.cancel_all();
            std::lock_guard lk(mu_);
            stopped_ = true;
            for (Call* c : calls_) {  // came after the swap above
                c->run(engine_);
                c->done = true;
            }
            calls_.clear();
            ran_.notify_all();
            return;
        }
        if (engine_.idle()) continue;
        try {
            engine_.step();
        } catch (const std::exception& e) {
            // A failed pass (e.g. a device error) ends every request with its message rather
            // than the server.
            step_error_ = e.what();
            engine_.cancel_all();
            step_error_.clear();
        }
    }
}

}  // namespace kvrun
