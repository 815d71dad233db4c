// CUDA selection of rows with the semantics of SampleRowsCpu (sample.h), enqueued on a stream.
//
//  - `table` is the device view of the table (its memory pinned and mapped). `rows` is its capacity: the
//    scratch memory and grids are sized for it, and the kernels look at the rows claimed when they run
//    (claimed_rows.cuh), as the CPU kernels look at the rows claimed when they run.
//  - The seed words are device memory (`seed`: uint32[2]); request.seed0 and request.seed1 are ignored.
//  - uniform, fifo, lifo and topk pick exactly the rows SampleRowsCpu picks for the same seed and table
//    contents, and draw the same window starts, under skip_short and uniform_starts too (uniform: the
//    same KeepWindow draws, and a fallback that weighs rows by their windows as sample.cc's does;
//    fifo/lifo/topk leave out rows shorter than the window under skip_short). Uniform windows with
//    uniform_starts draw their candidates through `lengths`, the table's index over lengths
//    (kLengthWeights, selection.h) as the device reads it, when the caller has one (see SampleRowsCuda).
//    Prioritized windows under skip_short fail every pick with the method error, as SampleRowsCpu refuses
//    them. prioritized normally goes through the priority index (priority_index.cuh: the CPU's picks
//    exactly); this scan (a prefix sum of p^a and one binary search per pick) serves exponents past the
//    index's limit, with the same law but not the same rows.
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
// `lengths`: for uniform windows with uniform_starts (IndexExponent(request) == kLengthWeights), the
// table's priority index of exponent kLengthWeights with its device addresses (PriorityIndex::DeviceView),
// refreshed by the host in the stream's order before the kernels run; its view is copied at the launch.
// The picks then follow sample.cc's SampleUniform with that index: candidates drawn by length, rejected
// when their state is not the one the index saw, starts kept by KeepWindow with the row's length as the
// bound. Null (or an index of total 0): uniform candidates and the longest row as the bound, as sample.cc
// without an index. The other methods ignore it.
cudaError_t SampleRowsCuda(const TableView& table, const SampleRequest& request, int64_t rows,
                           const uint32_t* seed, void* scratch, SampleResult out, DeviceError* error,
                           cudaStream_t stream, const PriorityTreeView* lengths = nullptr);

}  // namespace gear
