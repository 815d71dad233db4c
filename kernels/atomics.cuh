// Atomic access to table memory from CUDA kernels: the device counterpart of atomics.h.
//
// The table is pinned host memory that CPU writers change while kernels read it, so every access that
// takes part in the seqlock or in a read-modify-write is an atomic at system scope (ld.acquire.sys,
// fence.acq.sys, atom.sys). Plain loads (never the read-only ld.global.nc path) copy row data between
// an acquire and the fence that precedes the generation's re-read.
#pragma once

#include <cstdint>
#include <cuda/atomic>

namespace gear::device {

template <typename T>
__device__ __forceinline__ cuda::atomic_ref<T, cuda::thread_scope_system> SystemRef(const T* p) {
  return cuda::atomic_ref<T, cuda::thread_scope_system>(*const_cast<T*>(p));
}

__device__ __forceinline__ uint64_t LoadAcquire(const uint64_t* p) {
  return SystemRef(p).load(cuda::memory_order_acquire);
}

template <typename T>
__device__ __forceinline__ T LoadRelaxed(const T* p) {
  return SystemRef(p).load(cuda::memory_order_relaxed);
}

__device__ __forceinline__ void FenceAcquire() {
  cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_system);
}

// Read-modify-write atomics on table memory take `system_scope`: TableView::read_modify_write_atomics.
// At system scope they are atomic against the CPU's (native host atomics); otherwise they are atomic
// among the GPU's threads only (device scope: what a GPU over PCIe can do on host memory).
template <typename T>
__device__ __forceinline__ cuda::atomic_ref<T, cuda::thread_scope_device> DeviceRef(const T* p) {
  return cuda::atomic_ref<T, cuda::thread_scope_device>(*const_cast<T*>(p));
}

template <typename T>
__device__ __forceinline__ bool CompareExchange(T* p, T* expected, T desired, bool system_scope) {
  return system_scope ? SystemRef(p).compare_exchange_strong(*expected, desired, cuda::memory_order_acq_rel,
                                                             cuda::memory_order_acquire)
                      : DeviceRef(p).compare_exchange_strong(*expected, desired, cuda::memory_order_acq_rel,
                                                             cuda::memory_order_acquire);
}

template <typename T>
__device__ __forceinline__ T FetchAdd(T* p, T v, bool system_scope) {
  return system_scope ? SystemRef(p).fetch_add(v, cuda::memory_order_acq_rel)
                      : DeviceRef(p).fetch_add(v, cuda::memory_order_acq_rel);
}

// Adds `v` to a count that takes no part in the consistency model (times_sampled): relaxed, its result
// unused, so the thread does not wait for the round trip to the table's memory (a reduction, not an
// exchange).
template <typename T>
__device__ __forceinline__ void AddToCount(T* p, T v, bool system_scope) {
  if (system_scope) {
    SystemRef(p).fetch_add(v, cuda::memory_order_relaxed);
  } else {
    DeviceRef(p).fetch_add(v, cuda::memory_order_relaxed);
  }
}

template <typename T>
__device__ __forceinline__ T FetchMax(T* p, T v, bool system_scope) {
  return system_scope ? SystemRef(p).fetch_max(v, cuda::memory_order_relaxed)
                      : DeviceRef(p).fetch_max(v, cuda::memory_order_relaxed);
}

}  // namespace gear::device
