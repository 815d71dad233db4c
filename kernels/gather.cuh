// CUDA gather of sampled rows (or time windows of them), with the semantics of GatherRowsCpu
// (gather.h): the same seqlock check, outputs and valid mask, enqueued on a stream.
//
// `table` is the device view of the table (its memory pinned and mapped); indices, generations, starts
// and the outputs are device memory. A row id or window start out of range is recorded in `error`
// (device address of a DeviceError) and that row comes back zeroed and invalid, where the CPU version
// fails the whole call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device_error.cuh"
#include "gather.h"
#include "table_view.h"

namespace gear {

// Returns the launch status (cudaGetLastError after the launch). `sampled_lengths`: where the picks come
// from a sample enqueued on the same stream just before (sample_gather), its `lengths` output; the gather
// then takes each row's generation and length as that sample read them (after its acquire of the state)
// instead of reading them again, and still re-reads the state after the copy. Null for picks of unknown
// age (gather).
cudaError_t GatherRowsCuda(const TableView& table, const int32_t* indices, const uint32_t* generations,
                           const int32_t* starts, const GatherRequest& request, GatherOutputs out,
                           DeviceError* error, cudaStream_t stream, const int32_t* sampled_lengths = nullptr);

}  // namespace gear
