// The building blocks of sharded prioritized sampling, one table at a time: the total weight of a
// table's selectable rows, and the selection of the row at a given point of its cumulative weight.
// CPU implementation in sample_at.cc; the CUDA one (sample_at.cu) keeps the same semantics.
//
// Weights are those of prioritized sample (selection.h: PriorityWeight, w = p^a over selectable rows,
// in double), over the claimed rows [0, ClaimedRows(table)).
//  - total weight: float32(sum of w) (accumulated in double, rounded once) and the count of selectable
//    rows. An empty table gives (0, 0).
//  - sample at targets: pick j whose target is negative or NaN is not this table's: it gets the failed-
//    pick marker (row 0, odd generation 1, probability 0, start 0), as does every pick of a table with no
//    row of positive weight (no error). Otherwise the pick is the first row, in row order, whose inclusive
//    cumulative weight exceeds the target (a target >= the total takes the last row of positive weight),
//    with probability w / total and, with a window, a start drawn as sample draws it (WindowStart).
//    A pick whose row has a length outside [1, max_steps] (only a damaged or forged file has such a
//    row of positive weight) gets the failed-pick marker too: weights and totals read the state column
//    alone, so such a row still weighs in them.
#pragma once

#include <cstdint>

#include "errors.h"
#include "sample.h"
#include "table_view.h"

namespace gear {

struct SampleAtRequest {
  float priority_exponent = 1.0f;
  int32_t window = 0;
  uint32_t seed0 = 0, seed1 = 0;  // the window starts' seed words
  int64_t batch_size = 0;         // number of targets
};

// Whether a target names a pick of this table: >= 0 and not NaN.
GEAR_HD bool TargetIsMine(float target) { return target >= 0.0f; }

// *total = float32(sum of p^a over the selectable rows), *count = their number. Fails (nothing written)
// when the sum is not finite in float32.
KernelStatus TotalWeightCpu(const TableView& table, float priority_exponent, float* total, int32_t* count);

// One pick per target (see the top of this file). Fails (outputs undefined) when the sum of the weights
// is not finite.
KernelStatus SampleAtCpu(const TableView& table, const SampleAtRequest& request, const float* targets,
                         SampleResult out);

}  // namespace gear
