// ParallelFor (kernels/parallel.h) over XLA's intra-op thread pool, for the CPU handlers.
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/parallel.h"
#include "xla/ffi/api/ffi.h"

namespace gear {

// RunOverPool (kernels/parallel.h) with XLA's pool: the calling thread takes ranges too.
class XlaParallelFor : public ParallelFor {
 public:
  explicit XlaParallelFor(xla::ffi::ThreadPool pool) : pool_(pool) {}
  void Run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) const override;

 private:
  mutable xla::ffi::ThreadPool pool_;  // Schedule is not const
};

}  // namespace gear
