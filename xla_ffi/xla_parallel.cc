#include "xla_ffi/xla_parallel.h"

namespace gear {

void XlaParallelFor::Run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) const {
  RunOverPool(n, grain, body, pool_.num_threads(),
              [this](std::function<void()> task) { pool_.Schedule(std::move(task)); });
}

}  // namespace gear
