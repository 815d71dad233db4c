// Limited tables (TableView::max_times_sampled) on the GPU: the device counterparts of atomics.h's
// RetireRow, TakeSample and SamplesUsedUp, the same compare-and-swaps at the scope the table allows
// (read_modify_write_atomics: exact against the CPU's and other processes' only with native host
// atomics; over PCIe, exact among this GPU's own kernels).
#pragma once

#include <cstdint>

#include "atomics.cuh"
#include "table_view.h"

namespace gear::device {

__device__ inline void RetireRow(const TableView& t, int64_t row, uint32_t generation) {
  uint64_t current = LoadAcquire(&t.state[row]);
  while (StateGeneration(current) == generation && StatePriority(current) > 0.0f) {
    if (CompareExchange(&t.state[row], &current, MakeState(generation, 0.0f), t.read_modify_write_atomics)) {
      FetchAdd<int64_t>(t.selectable, -1, t.read_modify_write_atomics);
      for (int level = 0; level < kChangeLevels; ++level) {
        FetchAdd<uint32_t>(
            &t.change_counts[ChangeLevelStart(t.capacity, level) + (row >> ChangeShift(level))], 1u,
            t.read_modify_write_atomics);
      }
      return;
    }
  }
}

// A count without a limit (relaxed, its result unused: a reduction, not a round trip); a reservation in
// a limited table, false when the contents of `generation` have no sample left.
__device__ inline bool TakeSample(const TableView& t, int64_t row, uint32_t generation) {
  uint32_t* word = &t.times_sampled[row];
  if (t.max_times_sampled == 0) {
    AddToCount<uint32_t>(word, 1u, t.read_modify_write_atomics);
    return true;
  }
  uint32_t seen = LoadRelaxed(word);
  do {
    if (!SampleBudgetOf(seen, generation) || SampleBudgetCount(seen) >= t.max_times_sampled) return false;
  } while (!CompareExchange(word, &seen, seen + 1, t.read_modify_write_atomics));
  if (SampleBudgetCount(seen) + 1 == t.max_times_sampled) RetireRow(t, row, generation);
  return true;
}

__device__ inline bool SamplesUsedUp(const TableView& t, int64_t row, uint32_t generation) {
  if (t.max_times_sampled == 0) return false;
  const uint32_t seen = LoadRelaxed(&t.times_sampled[row]);
  return SampleBudgetOf(seen, generation) && SampleBudgetCount(seen) >= t.max_times_sampled;
}

}  // namespace gear::device
