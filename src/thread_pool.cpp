// The CPU backend's persistent thread pool (see thread_pool.h).
#include "thread_pool.h"

#include <algorithm>
#include <memory>

namespace kvrun {
namespace {

thread_local bool t_in_pool_task = false;

struct TaskScope {
    bool saved = t_in_pool_task;
    TaskScope() { t_in_pool_task = true; }
    ~TaskScope() { t_in_pool_task = saved; }
};

int resolve_threads(int n_threads) {
    if (n_threads > 0) return n_threads;
    unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : static_cast<int>(hw);
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
    int n = resolve_threads(n_threads);
    active_ = n;
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

void ThreadPool::set_active(int n) {
    std::lock_guard<std::mutex> lock(mutex_);
    active_ = std::clamp(n, 1, n_threads());
}

int ThreadPool::n_active() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return active_;
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
}

void ThreadPool::run_chunks(uint64_t generation) {
    TaskScope scope;
    std::unique_lock<std::mutex> lock(mutex_);
    while (generation_ == generation && next_ < n_) {
        const int64_t begin = next_, end = std::min(n_, begin + chunk_);
        next_ = end;
        const auto* fn = fn_;
        ++in_flight_;
        lock.unlock();
        std::exception_ptr error;
        try {
            (*fn)(begin, end);
        } catch (...) {
            error = std::current_exception();
        }
        lock.lock();
        if (error && !error_) error_ = error;
        if (--in_flight_ == 0 && next_ >= n_) done_.notify_all();
    }
}

void ThreadPool::worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            if (index >= active_) continue;  // idle for this job
        }
        run_chunks(seen);
    }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    if (workers_.empty() || t_in_pool_task || n <= grain) {
        fn(0, n);
        return;
    }
    std::lock_guard<std::mutex> call_lock(call_mutex_);
    if (n_active() <= 1) {
        fn(0, n);
        return;
    }
    uint64_t generation;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        // About four chunks per thread balances uneven chunks without much claiming overhead.
        const int64_t per_thread = int64_t(active_) * 4;
        fn_ = &fn;
        n_ = n;
        chunk_ = std::max(grain, (n + per_thread - 1) / per_thread);
        next_ = 0;
        in_flight_ = 0;
        error_ = nullptr;
        generation = ++generation_;
    }
    wake_.notify_all();
    run_chunks(generation);
    std::exception_ptr error;
    {
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, [&] { return next_ >= n_ && in_flight_ == 0; });
        fn_ = nullptr;
        error = error_;
        error_ = nullptr;
    }
    if (error) std::rethrow_exception(error);
}

namespace {
std::mutex g_pool_mutex;
std::unique_ptr<ThreadPool> g_pool;
}  // namespace

ThreadPool& cpu_thread_pool() {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    if (!g_pool) g_pool = std::make_unique<ThreadPool>(0);
    return *g_pool;
}

void cpu_set_num_threads(int n_threads) {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    int n = resolve_threads(n_threads);
    if (g_pool && g_pool->n_threads() == n) return;
    g_pool.reset();
    g_pool = std::make_unique<ThreadPool>(n);
}

int cpu_resolve_threads(int n_threads) {
    return resolve_threads(n_threads);
}

}  // namespace kvrun
