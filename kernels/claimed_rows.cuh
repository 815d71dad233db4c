// The rows a CUDA call looks at: [0, claimed), claimed = min(next_seq, capacity) read on the device when
// the call's kernels run. A handler runs when XLA enqueues its call, before the work already on the
// stream (an insert from the same program, or a call dispatched just before) has run: a count read then
// misses the rows those inserts claim. So the launchers size their scratch memory and grids for the
// table's capacity, and one thread stores the count in scratch memory first; the kernels read it there.
// A call that runs as one block (uniform picks of a small batch) reads it in that block instead.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "atomics.cuh"
#include "table_view.h"

namespace gear {
namespace {

// The claimed-row count as the device reads it now: min(next_seq, capacity).
__device__ inline int64_t LoadClaimedRows(const TableView& t) {
  const uint64_t next = device::LoadAcquire(t.next_seq);
  return next < static_cast<uint64_t>(t.capacity) ? static_cast<int64_t>(next) : t.capacity;
}

__global__ void StoreClaimedRowsKernel(TableView t, int64_t* claimed) { *claimed = LoadClaimedRows(t); }

// Enqueues the store of the claimed-row count into `claimed` (device memory).
inline cudaError_t StoreClaimedRows(const TableView& t, int64_t* claimed, cudaStream_t stream) {
  StoreClaimedRowsKernel<<<1, 1, 0, stream>>>(t, claimed);
  return cudaGetLastError();
}

}  // namespace
}  // namespace gear
