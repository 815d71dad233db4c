// Sequentially consistent atomics on table memory, for ownership, attach slots and counter windows:
// the argument of "Counters" (counter_window.cc) needs one total order of them. Row
// states and data use the weaker orders of kernels/atomics.h.
#pragma once

namespace gear {

template <typename T>
T Load(const T* p) {
  return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}
template <typename T>
void Store(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}
template <typename T>
T Add(T* p, T v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
template <typename T>
bool Cas(T* p, T* expected, T desired) {
  return __atomic_compare_exchange_n(p, expected, desired, /*weak=*/false, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST);
}

}  // namespace gear
