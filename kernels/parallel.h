// Splitting one kernel call over several CPU threads.
//
// The kernels are plain C++: they do not know where threads come from. A runtime that has a pool (XLA's
// intra-op pool on the CPU, xla_ffi/xla_parallel.h) passes a ParallelFor; without one a kernel runs its
// ranges one after another on the calling thread (SerialFor). Every range of one call writes its own
// part of the outputs, so the result does not depend on how the ranges were shared out.
#pragma once

#include <cstdint>
#include <functional>

namespace gear {

class ParallelFor {
 public:
  virtual ~ParallelFor() = default;
  // Runs body(begin, end) over consecutive ranges that cover [0, n), each of `grain` items (the last
  // one may be shorter), on the calling thread and on the pool's threads; returns when every range has
  // run. `grain` is the smallest piece worth handing to another thread.
  virtual void Run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) const = 0;
};

// The calling thread alone: body(0, n).
const ParallelFor& SerialFor();

}  // namespace gear
