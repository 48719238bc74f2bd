#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif
#if defined(__linux__)
#include <pthread.h>
#endif

namespace dualemb {
namespace {

// Helpers compute in the floating-point mode of the thread that called parallel_for. Threads
// inherit the mode of the thread that created them, and frameworks run their own threads with
// denormals flushed (XLA's and TF's pools set FTZ/DAZ): without this, a worker created during a
// JAX call would flush subnormals forever while the caller's share of the same batch did not, so
// a row's result would depend on which thread happened to take its shard.
#if defined(__x86_64__) || defined(__i386__)
constexpr unsigned kDenormalBits = 0x8040;  // MXCSR flush-to-zero (bit 15) | denormals-are-zero (6)
unsigned denormal_mode() { return _mm_getcsr() & kDenormalBits; }
struct ScopedDenormalMode {
  explicit ScopedDenormalMode(unsigned mode) : saved(_mm_getcsr()) {
    _mm_setcsr((saved & ~kDenormalBits) | mode);
  }
  ~ScopedDenormalMode() { _mm_setcsr(saved); }
  unsigned saved;
};
#else
unsigned denormal_mode() { return 0; }
struct ScopedDenormalMode {
  explicit ScopedDenormalMode(unsigned) {}
};
#endif

// One parallel_for call: tasks are claimed from `next`; `done` counts finished tasks.
struct Job {
  const std::function<void(int64_t)>* fn;
  int64_t num_tasks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;
  unsigned fp_mode = 0;  // the caller's denormal mode (see ScopedDenormalMode)

  void run_tasks() {
    ScopedDenormalMode mode(fp_mode);
    for (;;) {
      int64_t i = next.fetch_add(1);
      if (i >= num_tasks) return;
      try {
        (*fn)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1) + 1 == num_tasks) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }
};

class Pool {
 public:
  Pool() {
    int n = std::max(1, hardware_threads() - 1);
    for (int i = 0; i < n; ++i)
      workers_.emplace_back([this] {
#if defined(__linux__)
        // Named so that a profile (or a test) tells the core's workers from the framework's.
        pthread_setname_np(pthread_self(), "dualemb-worker");
#endif
        loop();
      });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  // Offers the job to up to `helpers` idle workers.
  void offer(const std::shared_ptr<Job>& job, int helpers) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int i = 0; i < helpers; ++i) queue_.push_back(job);
    }
    if (helpers == 1) cv_.notify_one(); else cv_.notify_all();
  }

 private:
  void loop() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job->run_tasks();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
};

Pool& pool() {
  // Leaked on purpose: joining workers during static destruction at interpreter exit can hang.
  static Pool* p = new Pool();
  return *p;
}

thread_local ExternalScheduler t_scheduler;

// One helper scheduled on an external scheduler: owns a reference to the job until it ran.
void run_external_helper(void* arg) {
  auto* job = static_cast<std::shared_ptr<Job>*>(arg);
  (*job)->run_tasks();
  delete job;
}

}  // namespace

ExternalScheduler set_thread_scheduler(ExternalScheduler s) {
  ExternalScheduler prev = t_scheduler;
  t_scheduler = s;
  return prev;
}

int hardware_threads() {
  static const int n = std::max(1u, std::thread::hardware_concurrency());
  return n;
}

void parallel_for(int64_t num_tasks, int max_threads, const std::function<void(int64_t)>& fn) {
  if (num_tasks <= 0) return;
  int threads = max_threads <= 0 ? hardware_threads() : std::min(max_threads, hardware_threads());
  threads = static_cast<int>(std::min<int64_t>(threads, num_tasks));
  if (threads <= 1) {
    for (int64_t i = 0; i < num_tasks; ++i) fn(i);
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->num_tasks = num_tasks;
  job->fp_mode = denormal_mode();
  if (t_scheduler.fn) {
    for (int i = 0; i < threads - 1; ++i)
      t_scheduler.fn(t_scheduler.context, run_external_helper, new std::shared_ptr<Job>(job));
  } else {
    pool().offer(job, threads - 1);
  }
  job->run_tasks();
  {
    std::unique_lock<std::mutex> lock(job->mu);
    job->cv.wait(lock, [&] { return job->done.load() == num_tasks; });
  }
  if (job->error) std::rethrow_exception(job->error);
}

}  // namespace dualemb
