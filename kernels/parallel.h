// Splitting one kernel call over several CPU threads.
//
// The kernels are plain C++: they do not know where threads come from. A runtime that has a pool (XLA's
// intra-op pool on the CPU, xla_ffi/xla_parallel.h) passes a ParallelFor; without one a kernel runs its
// ranges one after another on the calling thread (SerialFor). Every range of one call writes its own
// part of the outputs, so the result does not depend on how the ranges were shared out (but for a
// limited table's picks, whose ranges race for a row's last sample: kernels/atomics.h, TakeSample).
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

// A ParallelFor over a pool of threads, given as `schedule` (hands a task to a pool thread) and the
// number of tasks worth scheduling (`helpers`, the pool's threads). The calling thread takes ranges
// too, and waits only for ranges a pool thread has started, never for a task still queued: a call made
// from one of the pool's own threads cannot wait on itself. A task that starts after the call returned
// finds every range taken and touches nothing of the call. Outputs are written before it returns
// (release by each range, acquire by the caller). A call of fewer than kMinPooledRanges ranges runs on
// the calling thread alone.
//
// Why: a pool thread that sleeps takes tens of microseconds to wake on a VM (a wake-up IPI through the
// hypervisor), more than two or three ranges save. On the 2-core EPYC VM, over the host pool: 1,024
// uniform picks (two ranges) took 36 us against 20 us on the caller, 256 rows of 1 KiB gathered (two
// ranges) 57-68 us against 46-52 us, while eight ranges were faster (1,024 rows of 1 KiB: 145 us against
// 195-210 us). Over XLA's pool, whose idle threads spin a while before they sleep, a jitted
// sample_gather of 256 rows of 1 KiB took 64-118 us on the caller against 70-171 us split (medians of
// 2,000 calls, seven alternating runs each; medians of those 71 and 96 us); 1,024 rows unchanged.
inline constexpr int64_t kMinPooledRanges = 4;
void RunOverPool(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body, int64_t helpers,
                 const std::function<void(std::function<void()>)>& schedule);

}  // namespace gear
