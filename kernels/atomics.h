// Atomic access to table memory shared between processes (and, on a CUDA machine, with the GPU).
// Lock-free 32/64-bit atomics are address-free, so they work in memory mapped by several processes.
#pragma once

#include <cstdint>

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

}  // namespace gear
