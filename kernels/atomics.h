// Atomic access to table memory shared between processes (and, on a CUDA machine, with the GPU).
// Lock-free 32/64-bit atomics are address-free, so they work in memory mapped by several processes.
#pragma once

#include <cstdint>
#include <cstring>

#include "table_view.h"

namespace gear {

inline uint64_t LoadAcquire(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline uint64_t LoadRelaxed(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline int32_t LoadRelaxed(const int32_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline int64_t LoadRelaxed(const int64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline void StoreRelease(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline void StoreRelaxed(int32_t* p, int32_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
inline void StoreRelaxed(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
inline void FenceAcquire() { __atomic_thread_fence(__ATOMIC_ACQUIRE); }
inline bool CompareExchange(uint64_t* p, uint64_t* expected, uint64_t desired) {
  return __atomic_compare_exchange_n(p, expected, desired, /*weak=*/false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE);
}
inline bool CompareExchange(int32_t* p, int32_t* expected, int32_t desired) {
  return __atomic_compare_exchange_n(p, expected, desired, /*weak=*/false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE);
}
inline void FenceRelease() { __atomic_thread_fence(__ATOMIC_RELEASE); }
template <typename T>
inline T FetchAdd(T* p, T v) {
  return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
}

inline uint32_t LoadAcquire(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline uint32_t LoadRelaxed(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

// Whether row `row`'s length, as stored now, is one a writer can publish (LengthInRange).
inline bool LengthUsable(const TableView& t, int64_t row) {
  return LengthInRange(LoadRelaxed(&t.length[row]), t.max_steps);
}

// Raises the change counters (table_view.h) of `row`, after its state word changed.
inline void NoteRowChanged(const TableView& t, int64_t row) {
  for (int level = 0; level < kChangeLevels; ++level) {
    FetchAdd<uint32_t>(&t.change_counts[ChangeLevelStart(t.capacity, level) + (row >> ChangeShift(level))],
                       1u);
  }
}

// NoteRowChanged for `n` rows whose state words changed: all of level 0 first, then level 1, then level
// 2, each after every change it covers. A run of rows in one group raises its counter once (the counters
// above level 0 are few and stay in cache: an add per row costs less than sorting the groups).
inline void NoteRowsChanged(const TableView& t, const int32_t* rows, int64_t n) {
  // Every level-0 counter's line first: an atomic add waits for its line and holds back the loads after
  // it, so adds on lines not yet fetched would take their misses one after another. (The levels above
  // are few counters, in cache.)
  for (int64_t i = 0; i < n; ++i) __builtin_prefetch(&t.change_counts[rows[i] >> ChangeShift(0)], 1);
  for (int level = 0; level < kChangeLevels; ++level) {
    uint32_t* counters = t.change_counts + ChangeLevelStart(t.capacity, level);
    int64_t last = -1;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t group = rows[i] >> ChangeShift(level);
      if (group != last) FetchAdd<uint32_t>(&counters[group], 1u);
      last = group;
    }
  }
}

// Raises the table's largest priority so far to `priority` (>= 0) if it is larger: a load, and a
// compare-and-swap only when it is (rare after the first rows, so writers do not contend on the line).
inline void RaiseMaxPriority(const TableView& t, float priority) {
  if (t.max_priority_bits == nullptr || !(priority > 0.0f)) return;
  uint32_t bits;
  std::memcpy(&bits, &priority, sizeof(bits));
  uint32_t current = __atomic_load_n(t.max_priority_bits, __ATOMIC_RELAXED);
  while (bits > current && !__atomic_compare_exchange_n(t.max_priority_bits, &current, bits, true,
                                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

// Raises the table's longest published row so far to `length` if it is longer (as RaiseMaxPriority).
inline void RaiseLongest(const TableView& t, int32_t length) {
  if (t.longest == nullptr) return;
  int32_t current = __atomic_load_n(t.longest, __ATOMIC_RELAXED);
  while (length > current && !__atomic_compare_exchange_n(t.longest, &current, length, true, __ATOMIC_RELAXED,
                                                          __ATOMIC_RELAXED)) {
  }
}

// Limited tables (TableView::max_times_sampled): takes the priority of `row`'s contents of `generation`
// to 0 (unselectable; a writer may reuse the slot) unless it changed generation or is 0 already, and
// counts the row out of `selectable`.
inline void RetireRow(const TableView& t, int64_t row, uint32_t generation) {
  uint64_t current = LoadAcquire(&t.state[row]);
  while (StateGeneration(current) == generation && StatePriority(current) > 0.0f) {
    if (CompareExchange(&t.state[row], &current, MakeState(generation, 0.0f))) {
      FetchAdd<int64_t>(t.selectable, -1);
      NoteRowChanged(t, row);
      return;
    }
  }
}

// Counts one sample of `row`, picked with `generation`, in times_sampled. In a limited table the count
// is a reservation, taken only while the contents of that generation have samples left (one
// compare-and-swap of the tagged word: exact however many processes sample at once): false means the
// pick must fail. The sample that takes the last one retires the row (RetireRow).
inline bool TakeSample(const TableView& t, int64_t row, uint32_t generation) {
  uint32_t* word = &t.times_sampled[row];
  if (t.max_times_sampled == 0) {
    FetchAdd<uint32_t>(word, 1u);
    return true;
  }
  uint32_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
  do {
    if (!SampleBudgetOf(seen, generation) || SampleBudgetCount(seen) >= t.max_times_sampled) return false;
  } while (!__atomic_compare_exchange_n(word, &seen, seen + 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
  if (SampleBudgetCount(seen) + 1 == t.max_times_sampled) RetireRow(t, row, generation);
  return true;
}

// Whether a limited table's `row`, sampled with `generation`, has used up its samples (a priority update
// must not make it selectable again). Read after the row's state.
inline bool SamplesUsedUp(const TableView& t, int64_t row, uint32_t generation) {
  if (t.max_times_sampled == 0) return false;
  const uint32_t seen = __atomic_load_n(&t.times_sampled[row], __ATOMIC_ACQUIRE);
  return SampleBudgetOf(seen, generation) && SampleBudgetCount(seen) >= t.max_times_sampled;
}

}  // namespace gear
