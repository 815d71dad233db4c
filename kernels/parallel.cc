#include "parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

namespace gear {
namespace {

// One call's ranges, shared with the pool's tasks (which may outlive the call: they hold it by
// shared_ptr, and read `body` only after taking a range, which no late task can).
struct Ranges {
  int64_t n = 0, grain = 1, count = 0;
  const std::function<void(int64_t, int64_t)>* body = nullptr;
  std::atomic<int64_t> next{0};  // the next range to take
  std::atomic<int64_t> done{0};  // ranges finished (or failed)
  std::mutex failure_mutex;
  std::exception_ptr failure;  // the first range's exception (bad_alloc), rethrown by the caller

  void Drain() noexcept {
    for (;;) {
      const int64_t k = next.fetch_add(1, std::memory_order_relaxed);
      if (k >= count) return;
      const int64_t begin = k * grain;
      try {
        (*body)(begin, std::min(n, begin + grain));
      } catch (...) {  // kept for the caller: a pool thread must not end the process, nor the caller
                       // leave while other ranges still use its stack
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

class Serial : public ParallelFor {
 public:
  void Run(int64_t n, int64_t /*grain*/, const std::function<void(int64_t, int64_t)>& body) const override {
    if (n > 0) body(0, n);
  }
};

}  // namespace

const ParallelFor& SerialFor() {
  static const Serial serial;
  return serial;
}

void RunOverPool(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body, int64_t helpers,
                 const std::function<void(std::function<void()>)>& schedule) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t count = (n + grain - 1) / grain;
  helpers = count >= kMinPooledRanges ? std::min<int64_t>(helpers, count - 1) : 0;
  if (helpers <= 0) {
    body(0, n);
    return;
  }
  auto ranges = std::make_shared<Ranges>();
  ranges->n = n;
  ranges->grain = grain;
  ranges->count = count;
  ranges->body = &body;
  for (int64_t h = 0; h < helpers; ++h) schedule([ranges] { ranges->Drain(); });
  ranges->Drain();
  // Every range is taken; wait for the ones pool threads are running (a few microseconds of copying).
  for (int spins = 0; ranges->done.load(std::memory_order_acquire) < count; ++spins) {
    if (spins > 64) std::this_thread::yield();
  }
  std::lock_guard<std::mutex> lock(ranges->failure_mutex);
  if (ranges->failure) std::rethrow_exception(ranges->failure);
}

}  // namespace gear
