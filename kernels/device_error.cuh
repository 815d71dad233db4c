// Errors that CUDA kernels find in the data they read (a row id out of range, a table with no
// selectable row). A kernel cannot fail for bad data, and its caller does not wait for it, so the first
// thread that finds one fills a DeviceError that lives in mapped pinned host memory, and the kernel
// completes with defined outputs. The runtime reads and clears the record on the host later
// (xla_ffi/cuda_handlers.cu: at the next call on the same table and device).
#pragma once

#include <cstdint>

#include "atomics.cuh"
#include "errors.h"

namespace gear {

// One error record: an ErrorSite (errors.h) and its numbers.
struct DeviceError {
  int32_t claim;  // 0 while free; the first reporting thread sets 1 and owns the other fields
  int32_t site;   // ErrorSite, published after element, value and limit
  int64_t element;
  int64_t value;
  int64_t limit;
};

// Records an error unless one is already recorded (the first one wins until the host clears it). The
// claim is a compare-and-swap at system scope where the device has native host atomics
// (`system_scope`), else among the GPU's threads only.
__device__ inline void ReportError(DeviceError* error, bool system_scope, ErrorSite site, int64_t element,
                                   int64_t value, int64_t limit) {
  int32_t expected = 0;
  if (!device::CompareExchange<int32_t>(&error->claim, &expected, 1, system_scope)) return;
  error->element = element;
  error->value = value;
  error->limit = limit;
  device::SystemRef(&error->site).store(static_cast<int32_t>(site), cuda::memory_order_release);
}

// ReportError for work that runs on the host in a stream's order (a host callback) on the device's
// behalf, with the host address of the record. Where the device has no native host atomics, the CPU's
// claim and a kernel's are not atomic against each other: should a kernel and the host find an error at
// the same moment, the record may mix the two (it still reports an error).
inline void ReportErrorFromHost(DeviceError* error, ErrorSite site, int64_t element, int64_t value,
                                int64_t limit) {
  int32_t expected = 0;
  if (!__atomic_compare_exchange_n(&error->claim, &expected, 1, /*weak=*/false, __ATOMIC_RELAXED,
                                   __ATOMIC_RELAXED)) {
    return;
  }
  error->element = element;
  error->value = value;
  error->limit = limit;
  __atomic_store_n(&error->site, static_cast<int32_t>(site), __ATOMIC_RELEASE);
}

}  // namespace gear
