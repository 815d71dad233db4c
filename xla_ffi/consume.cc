// A queue's consumption (SharedTable::Consume, shared_table.h): the kernel's compare-and-swaps in a counter
// window, then the rate limiter's count. Apart from row_protocol.cc because it needs the CPU kernels
// (kernels/priorities.cc), which the native unit tests of the row protocol do not link.
#include "kernels/priorities.h"
#include "xla_ffi/shared_table.h"

namespace gear {

KernelStatus SharedTable::Consume(const int32_t* indices, const uint32_t* generations, const bool* delivered,
                                  int64_t n, bool* consumed) {
  int64_t count = 0;
  KernelStatus status;
  {
    CounterWindow window(*this);  // consumption moves rows out of `selectable`
    status = ConsumePicksCpu(view_, indices, generations, delivered, n, consumed, &count);
  }
  // After the rows' state words: an insert the count admits finds their room free.
  if (count > 0 && header()->rate_limiter.queue != 0) {
    __atomic_fetch_add(&header()->rate_limiter.samples, static_cast<uint64_t>(count), __ATOMIC_SEQ_CST);
  }
  return status;
}

}  // namespace gear
