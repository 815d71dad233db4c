#include "priorities.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "atomics.h"
#include "gather.h"

namespace gear {

KernelStatus ScatterPrioritiesCpu(const TableView& t, const int32_t* indices, const uint32_t* generations,
                                  const float* priorities, int64_t n, int32_t* updated) {
  if (KernelStatus s = CheckRowsInRange(t, indices, n, ErrorSite::kScatterIndex); !s.ok()) return s;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(priorities[i]) || priorities[i] < 0.0f) {
      uint32_t bits;
      std::memcpy(&bits, &priorities[i], sizeof(bits));
      return KernelError(ErrorSite::kScatterPriority, i, bits);
    }
  }
  int32_t count = 0;
  std::vector<int32_t> changed;  // rows whose state word this call changed
  changed.reserve(static_cast<size_t>(n));
  // The rows' state and length lines first, their misses overlapping: a compare-and-swap waits for its
  // line and holds back the loads after it. (1,024 priorities set: 1e7 rows 72 -> 60 us, 1e6 rows 59 ->
  // 55 us, medians of six runs, 2-core EPYC VM.)
  for (int64_t i = 0; i < n; ++i) {
    __builtin_prefetch(&t.state[indices[i]], 1);
    __builtin_prefetch(&t.length[indices[i]]);
  }
  for (int64_t i = 0; i < n; ++i) {
    uint64_t* word = &t.state[indices[i]];
    const uint32_t generation = generations[i];
    uint64_t current = LoadAcquire(word);
    // Retry only while the generation still matches: a failed exchange reloads `current`.
    while (StateGeneration(current) == generation && (generation & 1u) == 0 && generation != 0) {
      // A row whose length is out of range (abandoned: 0; or a damaged file) never becomes selectable,
      // whatever generation a Sample carries. Read after the state: it is the length published with it.
      if (priorities[i] > 0.0f && !LengthInRange(LoadRelaxed(&t.length[indices[i]]), t.max_steps)) break;
      // Nor a limited table's row whose samples are used up (read after the state: a retirement takes
      // the last sample before it changes the state, so an exchange from the state read here fails).
      if (priorities[i] > 0.0f && SamplesUsedUp(t, indices[i], generation)) break;
      const float old_priority = StatePriority(current);
      if (CompareExchange(word, &current, MakeState(generation, priorities[i]))) {
        const bool was = old_priority > 0.0f, is = priorities[i] > 0.0f;
        if (was != is) FetchAdd<int64_t>(t.selectable, is ? 1 : -1);
        changed.push_back(indices[i]);
        RaiseMaxPriority(t, priorities[i]);
        ++count;
        break;
      }
    }
  }
  NoteRowsChanged(t, changed.data(), static_cast<int64_t>(changed.size()));
  *updated = count;
  return {};
}

KernelStatus ConsumePicksCpu(const TableView& t, const int32_t* indices, const uint32_t* generations,
                             const bool* delivered, int64_t n, bool* consumed, int64_t* count) {
  if (KernelStatus s = CheckRowsInRange(t, indices, n, ErrorSite::kScatterIndex); !s.ok()) return s;
  std::vector<int32_t> changed;
  changed.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    consumed[i] = false;
    const uint32_t generation = generations[i];
    if (!delivered[i] || (generation & 1u) != 0) continue;
    uint64_t* word = &t.state[indices[i]];
    uint64_t current = LoadAcquire(word);
    while (StateGeneration(current) == generation && StatePriority(current) > 0.0f) {
      if (CompareExchange(word, &current, MakeState(generation, 0.0f))) {
        consumed[i] = true;
        changed.push_back(indices[i]);
        break;
      }
    }
  }
  if (!changed.empty()) FetchAdd<int64_t>(t.selectable, -static_cast<int64_t>(changed.size()));
  NoteRowsChanged(t, changed.data(), static_cast<int64_t>(changed.size()));
  *count = static_cast<int64_t>(changed.size());
  return {};
}

}  // namespace gear
