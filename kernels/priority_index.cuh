// CUDA selection through a priority index (priority_index.h) with the semantics of SampleIndexedCpu,
// TotalWeightIndexedCpu and SampleAtIndexedCpu, enqueued on a stream.
//
// `tree` is the index as the device reads it (PriorityIndex::DeviceView: pinned host memory mapped for
// the GPU), refreshed by the host in the stream's order before these kernels run (xla_ffi/
// cuda_handlers.cu). The kernels walk the same tree with the same code (DescendTree) and draw the same
// targets as the CPU, so a GPU and the CPU give the same picks for the same key and table. The seed
// words are device memory (`seed`: uint32[2]).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device_error.cuh"
#include "priority_index.h"
#include "sample.h"
#include "sample_at.h"
#include "table_view.h"

namespace gear {

// Prioritized sample: also writes out.selectable (the table's counter) where non-null. An infinite
// total records kSampleWeightOverflow, an empty one kSampleEmpty, in `error`.
cudaError_t SampleIndexedCuda(const TableView& table, const PriorityTreeView& tree,
                              const SampleRequest& request, const uint32_t* seed, SampleResult out,
                              DeviceError* error, cudaStream_t stream);

// total_weight: float32 *total and int32 *count (device addresses).
cudaError_t TotalWeightIndexedCuda(const TableView& table, const PriorityTreeView& tree, float* total,
                                   int32_t* count, DeviceError* error, cudaStream_t stream);

// total_weight with exponent 0 (sample_at.h): the table's counter of selectable rows, as total and count.
cudaError_t TotalFromCounterCuda(const TableView& table, float* total, int32_t* count, cudaStream_t stream);

// sample_at: one pick per target (`targets`: float32[batch_size], device memory).
cudaError_t SampleAtIndexedCuda(const TableView& table, const PriorityTreeView& tree,
                                const SampleAtRequest& request, const uint32_t* seed, const float* targets,
                                SampleResult out, DeviceError* error, cudaStream_t stream);

}  // namespace gear
