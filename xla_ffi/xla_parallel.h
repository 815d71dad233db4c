// ParallelFor (kernels/parallel.h) over XLA's intra-op thread pool, for the CPU handlers.
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/parallel.h"
#include "xla/ffi/api/ffi.h"

namespace gear {

// The calling thread takes ranges too, and waits only for ranges a pool thread has started, never for
// a task still queued: a call made from one of the pool's own threads cannot wait on itself. A task that
// starts after the call returned finds every range taken and touches nothing of the call. The
// handler's outputs are written before Run returns (release by each range, acquire by the caller).
class XlaParallelFor : public ParallelFor {
 public:
  explicit XlaParallelFor(xla::ffi::ThreadPool pool) : pool_(pool) {}
  void Run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) const override;

 private:
  mutable xla::ffi::ThreadPool pool_;  // Schedule is not const
};

}  // namespace gear
