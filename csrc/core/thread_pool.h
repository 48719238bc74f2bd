// thread_pool.h — the process-wide worker pool that batched table operations fan out on.
//
// parallel_for never deadlocks when many callers share the pool: the calling thread claims
// tasks itself, and workers only help; if every worker is busy the caller simply does it all.
#ifndef DUALEMB_THREAD_POOL_H_
#define DUALEMB_THREAD_POOL_H_

#include <cstdint>
#include <functional>

namespace dualemb {

// Runs fn(i) for i in [0, num_tasks), on at most `max_threads` threads (0 = all cores),
// including the caller. Returns when every task has finished. Exceptions in fn are rethrown
// in the caller (the first one).
void parallel_for(int64_t num_tasks, int max_threads, const std::function<void(int64_t)>& fn);

int hardware_threads();

// A scheduler of the calling thread's framework (de_set_thread_scheduler): when set, parallel_for
// called on this thread offers its helper tasks to it instead of to the core's pool.
struct ExternalScheduler {
  void (*fn)(void* context, void (*task)(void*), void* arg) = nullptr;
  void* context = nullptr;
};
// Sets this thread's scheduler ({} = the core's pool); returns the previous one.
ExternalScheduler set_thread_scheduler(ExternalScheduler s);

}  // namespace dualemb

#endif  // DUALEMB_THREAD_POOL_H_
