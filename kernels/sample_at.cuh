// CUDA total weight and sample-at-targets with the semantics of TotalWeightCpu and SampleAtCpu
// (sample_at.h), enqueued on a stream.
//
//  - `table` is the device view of the table (its memory pinned and mapped); `rows` is its capacity: the
//    scratch memory and grids are sized for it, and the kernels look at the rows claimed when they run
//    (claimed_rows.cuh).
//  - The rows are cut into tiles: one block sums each tile's weights (in double), a CUB scan over the
//    tiles gives their prefix sums, and each pick (one warp) finds its tile by binary search, then scans
//    inside it. Writers may change rows between the two passes: a pick then takes the nearest row of
//    positive weight, in its tile first, else in an earlier tile, else in a later one.
//  - The seed words (window starts) are device memory (`seed`: uint32[2]); request.seed0 and
//    request.seed1 are ignored.
//  - A sum that is not finite is recorded in `error` (device address of a DeviceError), and the outputs
//    are still defined (total_weight: the float32 total as rounded; sample_at: every pick the failed
//    marker).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "device_error.cuh"
#include "sample_at.h"
#include "table_view.h"

namespace gear {

// Bytes of device scratch memory TotalWeightCuda needs (0: pass nullptr).
size_t TotalWeightScratchBytes(int64_t rows);

// Writes float32 *total and int32 *count (device addresses). Returns the first failing launch's status.
// With a law that counts windows (WindowLaw), rows weigh UniformWindowWeight instead of p^a.
cudaError_t TotalWeightCuda(const TableView& table, float priority_exponent, const WindowLaw& law,
                            int64_t rows, void* scratch, float* total, int32_t* count, DeviceError* error,
                            cudaStream_t stream);

// Bytes of device scratch memory SampleAtCuda needs (0: pass nullptr).
size_t SampleAtScratchBytes(const SampleAtRequest& request, int64_t rows);

// One pick per target (`targets`: float32[batch_size], device memory).
cudaError_t SampleAtCuda(const TableView& table, const SampleAtRequest& request, int64_t rows,
                         const uint32_t* seed, const float* targets, void* scratch, SampleResult out,
                         DeviceError* error, cudaStream_t stream);

}  // namespace gear
