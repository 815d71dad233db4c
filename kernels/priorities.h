// Priority scatter: set the priority of sampled rows whose generation is still the sampled one. A row
// overwritten since it was sampled keeps the priority its new writer gave it.
// CPU implementation in priorities.cc; the CUDA one (priorities.cu) keeps the same semantics.
#pragma once

#include <cstdint>

#include "sample.h"
#include "table_view.h"

namespace gear {

// Fails, changing nothing, when a row id is out of range or a priority is NaN, infinite or negative.
// Otherwise sets *updated to the number of rows whose priority was written.
KernelStatus ScatterPrioritiesCpu(const TableView& table, const int32_t* indices, const uint32_t* generations,
                                  const float* priorities, int64_t n, int32_t* updated);

// Queues: consumes the picks `delivered` marks (their rows gathered, valid): a compare-and-swap of each
// row's state from the picked generation with a priority > 0 to priority 0, so that of all the consumers
// that gathered a row, exactly one takes it, and a writer may then reuse its slot. consumed[i]: pick i
// took its row in this call. Fails, changing nothing, when a row id is out of range. Sets *count to the
// rows consumed.
KernelStatus ConsumePicksCpu(const TableView& table, const int32_t* indices, const uint32_t* generations,
                             const bool* delivered, int64_t n, bool* consumed, int64_t* count);

}  // namespace gear
