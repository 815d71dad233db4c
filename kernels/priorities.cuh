// CUDA priority scatter with the semantics of ScatterPrioritiesCpu (priorities.h), enqueued on a stream:
// a compare-and-swap of each row's state word that keeps the sampled generation, entries of the same row
// applied in batch order (the later entry wins), the table's selectable count kept up to date.
//
// `table` is the device view of the table; indices, generations, priorities and `updated` (int32[], the
// number of rows written) are device memory. A row id out of range or a NaN, infinite or negative
// priority is recorded in `error` (device address of a DeviceError); nothing is written then and
// `updated` is 0, as on the CPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "device_error.cuh"
#include "priorities.h"
#include "table_view.h"

namespace gear {

// Bytes of device scratch memory ScatterPrioritiesCuda needs for n entries.
size_t ScatterPrioritiesScratchBytes(const TableView& table, int64_t n);

// Returns the first failing launch's status (cudaGetLastError after each launch), or cudaSuccess.
cudaError_t ScatterPrioritiesCuda(const TableView& table, const int32_t* indices, const uint32_t* generations,
                                  const float* priorities, int64_t n, void* scratch, int32_t* updated,
                                  DeviceError* error, cudaStream_t stream);

}  // namespace gear
