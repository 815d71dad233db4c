// The building blocks of sharded prioritized sampling, one table at a time: the total weight of a
// table's selectable rows, and the selection of the row at a given point of its cumulative weight.
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
//    Through the priority index (priority_index.h), "in row order" holds up to the rounding of the
//    tree's partial sums; a row of a length outside [1, max_steps] (only a damaged or forged file has
//    one of positive priority) weighs nothing and does not count; a pick whose row changed since the
//    index's refresh gets the failed-pick marker. The scan of every row (sample_at.cu, for GPU
//    exponents past the index's limit) reads the state column alone: there, such a row still weighs
//    in, and a pick that lands on it gets the marker.
//  - total weight with exponent 0 (the count alone, which the sharded layer asks for) reads the table's
//    counter of selectable rows instead of the rows.
//  - total weight of uniform windows (a window and a law, WindowLaw): each selectable row of a length in
//    range weighs UniformWindowWeight (selection.h) instead of p^a: the number of its windows (step
//    rings) or 1 when it offers one (short_episodes="skip"); the count is of the rows of positive
//    weight. Always a scan of the claimed rows: a sharded draw weighs each shard by this total, then
//    the shard draws its picks by the one-table law (a shard's share of the draw times that law is the
//    law of one table holding every shard's rows).
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

// The window law a total weight counts by: none (window 0, or neither flag: rows weigh p^a), or the
// flags of SampleRequest (skip_short, uniform_starts) with the window's length.
struct WindowLaw {
  int32_t window = 0;
  bool skip_short = false;
  bool uniform_starts = false;
  GEAR_HD bool counts_windows() const { return window > 0 && (skip_short || uniform_starts); }
};

// The total weight of uniform windows (see the top of this file) on the CPU.
KernelStatus UniformWindowTotalCpu(const TableView& table, const WindowLaw& law, float* total,
                                   int32_t* count);

// Whether a target names a pick of this table: >= 0 and not NaN.
GEAR_HD bool TargetIsMine(float target) { return target >= 0.0f; }

// The CPU implementations go through the table's priority index (priority_index.h: TotalWeightIndexedCpu,
// SampleAtIndexedCpu); the CUDA ones are in sample_at.cu (the index's, and a scan of every row).

}  // namespace gear
