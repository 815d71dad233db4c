// CUDA selection of rows with the semantics of SampleRowsCpu (sample.h), enqueued on a stream.
//
//  - `table` is the device view of the table (its memory pinned and mapped). `rows` is its capacity: the
//    scratch memory and grids are sized for it, and the kernels look at the rows claimed when they run
//    (claimed_rows.cuh), as the CPU kernels look at the rows claimed when they run.
//  - The seed words are device memory (`seed`: uint32[2]); request.seed0 and request.seed1 are ignored.
//  - uniform, fifo, lifo and topk pick exactly the rows SampleRowsCpu picks for the same seed and table
//    contents, and draw the same window starts, under skip_short and uniform_starts too (uniform: the
//    same KeepWindow draws, and a fallback that weighs rows by their windows as sample.cc's does;
//    fifo/lifo/topk leave out rows shorter than the window under skip_short). Prioritized windows under
//    skip_short fail every pick with the method error, as SampleRowsCpu refuses them. prioritized normally
//    goes through the priority index (priority_index.cuh: the CPU's picks exactly); this scan (a prefix sum
//    of p^a and one binary search per pick) serves exponents past the index's limit, with the same law but
//    not the same rows.
//  - Data errors are recorded in `error` (device address of a DeviceError): no selectable row, or fewer
//    selectable rows than batch_size for fifo/lifo/topk. A pick that could not be made (every pick, for
//    too few rows) holds row 0 with the odd generation 1, which gather marks invalid and
//    update_priorities skips.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "device_error.cuh"
#include "sample.h"
#include "table_view.h"

namespace gear {

// Bytes of device scratch memory SampleRowsCuda needs (0: pass nullptr).
size_t SampleScratchBytes(const SampleRequest& request, int64_t rows);

// Returns the first failing launch's status (cudaGetLastError after each launch), or cudaSuccess.
cudaError_t SampleRowsCuda(const TableView& table, const SampleRequest& request, int64_t rows,
                           const uint32_t* seed, void* scratch, SampleResult out, DeviceError* error,
                           cudaStream_t stream);

}  // namespace gear
