// A small persistent thread pool for the CPU backend: parallel_for over an index range,
// split into contiguous chunks that the calling thread and the workers claim in turn.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvrun {

class ThreadPool {
  public:
    // n_threads counts the calling thread: n_threads - 1 workers are started (0 = hardware).
    explicit ThreadPool(int n_threads = 0);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int n_threads() const { return static_cast<int>(workers_.size()) + 1; }
    // Threads a parallel_for uses (1 .. n_threads(), the caller included; default all): the
    // others stay idle (-t for decode steps, -tb for prefill). Not during a parallel_for.
    void set_active(int n);
    int n_active() const;

    // Calls fn(begin, end) on disjoint chunks covering [0, n), each at least `grain` long
    // (except the last), on all threads; returns when every chunk is done. Runs inline
    // when there is one chunk, one thread, or when called from inside a pool task.
    // Concurrent callers from different threads are serialized. An exception thrown by fn
    // is rethrown here (the first one; the remaining chunks still run).
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  private:
    void worker_loop(int index);  // index 1 .. n_threads() - 1 (the caller is 0)
    // Claims and runs chunks of job `generation` until none is left (or a newer job began).
    void run_chunks(uint64_t generation);

    std::vector<std::thread> workers_;
    std::mutex call_mutex_;     // one parallel_for at a time
    mutable std::mutex mutex_;  // guards everything below
    std::condition_variable wake_;
    std::condition_variable done_;
    uint64_t generation_ = 0;
    bool stop_ = false;
    int active_ = 1;  // set_active

    // The current job. The caller waits for its chunks, not for the workers: a worker that
    // wakes late (a busy machine) finds nothing left to claim and costs nothing.
    const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
    int64_t n_ = 0, chunk_ = 1, next_ = 0;
    int in_flight_ = 0;  // chunks claimed but not finished
    std::exception_ptr error_;
};

// Items per parallel_for chunk so that a chunk holds at least ~32k multiply-adds: a thread
// wake-up costs a few microseconds, about as much as that work. work_per_item: multiply-adds.
inline int64_t parallel_grain(int64_t work_per_item) {
    constexpr int64_t kMinParallelWork = 32 * 1024;
    return std::max<int64_t>(1, kMinParallelWork / std::max<int64_t>(1, work_per_item));
}

// The process-wide pool the CPU ops use (created on first use with hardware threads).
ThreadPool& cpu_thread_pool();
// Replaces the process-wide pool with one of n_threads (0 = hardware); not thread-safe
// against a running parallel_for.
void cpu_set_num_threads(int n_threads);
// The number of hardware threads, or n_threads when it is > 0.
int cpu_resolve_threads(int n_threads);

}  // namespace kvrun
