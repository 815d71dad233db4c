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

}  // namespace gear
