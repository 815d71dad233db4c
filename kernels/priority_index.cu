#include "priority_index.cuh"

#include "atomics.cuh"
#include "philox.h"
#include "sample_budget.cuh"
#include "selection.h"

namespace gear {
namespace {

constexpr int kPickThreads = 256;

unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + kPickThreads - 1) / kPickThreads); }

__device__ int64_t ThreadIndex() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }

// The row a walk ended at, if the table still holds it as the index saw it and its length is usable.
// As in priority_index.cc: the length is checked where a window start reads it.
__device__ bool StillAsSeen(const TableView& t, const PriorityTreeView& tree, int64_t row, int32_t window,
                            uint64_t* state) {
  if (row < 0) return false;
  *state = device::LoadAcquire(&t.state[row]);
  return *state == tree.seen[row] &&
         (window == 0 || LengthInRange(device::LoadRelaxed(&t.length[row]), t.max_steps));
}

__device__ void RecordPick(const TableView& t, int32_t window, uint32_t seed0, uint32_t seed1,
                           SampleResult out, int64_t pick, int64_t row, uint64_t state, float probability) {
  if (!device::TakeSample(t, row, StateGeneration(state))) {  // a limited table's row used up meanwhile
    RecordFailed(out, pick);
    return;
  }
  out.indices[pick] = static_cast<int32_t>(row);
  out.generations[pick] = StateGeneration(state);
  out.probabilities[pick] = probability;
  const bool read_length = window > 0 || out.lengths != nullptr;
  const int32_t length = read_length ? device::LoadRelaxed(&t.length[row]) : 0;  // one round trip
  out.starts[pick] = window > 0 ? WindowStart(length, window, seed0, seed1, static_cast<uint32_t>(pick)) : 0;
  if (out.lengths != nullptr) out.lengths[pick] = length;
}

__global__ void SampleIndexedKernel(TableView t, PriorityTreeView tree, SampleRequest r, const uint32_t* seed,
                                    SampleResult out, DeviceError* error) {
  const int64_t i = ThreadIndex();
  if (i == 0 && out.selectable != nullptr) {
    *out.selectable = SelectableCount(device::LoadRelaxed(t.selectable));
  }
  if (i >= r.batch_size) return;
  const uint32_t seed0 = seed[0], seed1 = seed[1];
  const double total = TreeTotal(tree);
  if (isinf(total) || !(total > 0.0)) {
    RecordFailed(out, i);
    if (i == 0) {
      ReportError(error, t.read_modify_write_atomics,
                  isinf(total) ? ErrorSite::kSampleWeightOverflow : WeightlessSite(tree), 0, *tree.selectable,
                  0);
    }
    return;
  }
  const uint32_t pick = static_cast<uint32_t>(i);
  for (uint32_t attempt = 0; attempt < kIndexedAttempts; ++attempt) {
    const double target = UniformDouble(seed0, seed1, pick, attempt, Draw::kSelect) * total;
    const int64_t row = DescendTree(tree, target);
    uint64_t state = 0;
    if (!StillAsSeen(t, tree, row, r.window, &state)) continue;
    RecordPick(t, r.window, seed0, seed1, out, i, row, state, static_cast<float>(tree.weights[row] / total));
    return;
  }
  RecordFailed(out, i);
}

__global__ void TotalWeightIndexedKernel(TableView t, PriorityTreeView tree, float* total, int32_t* count,
                                         DeviceError* error) {
  const float rounded = static_cast<float>(TreeTotal(tree));
  *total = rounded;
  *count = SelectableCount(*tree.selectable);
  if (!isfinite(rounded))
    ReportError(error, t.read_modify_write_atomics, ErrorSite::kTotalWeightOverflow, 0, 0, 0);
}

__global__ void TotalFromCounterKernel(TableView t, float* total, int32_t* count) {
  const int32_t selectable = SelectableCount(device::LoadRelaxed(t.selectable));
  *total = static_cast<float>(selectable);
  *count = selectable;
}

__global__ void SampleAtIndexedKernel(TableView t, PriorityTreeView tree, SampleAtRequest r,
                                      const uint32_t* seed, const float* targets, SampleResult out,
                                      DeviceError* error) {
  const int64_t i = ThreadIndex();
  if (i >= r.batch_size) return;
  const double total = TreeTotal(tree);
  if (isinf(total)) {
    RecordFailed(out, i);
    if (i == 0) ReportError(error, t.read_modify_write_atomics, ErrorSite::kSampleAtWeightOverflow, 0, 0, 0);
    return;
  }
  uint64_t state = 0;
  const int64_t row = TargetIsMine(targets[i]) && total > 0.0 ? DescendTree(tree, targets[i]) : -1;
  if (!StillAsSeen(t, tree, row, r.window, &state)) {
    RecordFailed(out, i);
    return;
  }
  RecordPick(t, r.window, seed[0], seed[1], out, i, row, state,
             static_cast<float>(tree.weights[row] / total));
}

}  // namespace

cudaError_t SampleIndexedCuda(const TableView& table, const PriorityTreeView& tree,
                              const SampleRequest& request, const uint32_t* seed, SampleResult out,
                              DeviceError* error, cudaStream_t stream) {
  if (request.batch_size == 0) return cudaSuccess;
  SampleIndexedKernel<<<Blocks(request.batch_size), kPickThreads, 0, stream>>>(table, tree, request, seed,
                                                                               out, error);
  return cudaGetLastError();
}

cudaError_t TotalWeightIndexedCuda(const TableView& table, const PriorityTreeView& tree, float* total,
                                   int32_t* count, DeviceError* error, cudaStream_t stream) {
  TotalWeightIndexedKernel<<<1, 1, 0, stream>>>(table, tree, total, count, error);
  return cudaGetLastError();
}

cudaError_t TotalFromCounterCuda(const TableView& table, float* total, int32_t* count, cudaStream_t stream) {
  TotalFromCounterKernel<<<1, 1, 0, stream>>>(table, total, count);
  return cudaGetLastError();
}

cudaError_t SampleAtIndexedCuda(const TableView& table, const PriorityTreeView& tree,
                                const SampleAtRequest& request, const uint32_t* seed, const float* targets,
                                SampleResult out, DeviceError* error, cudaStream_t stream) {
  if (request.batch_size == 0) return cudaSuccess;
  SampleAtIndexedKernel<<<Blocks(request.batch_size), kPickThreads, 0, stream>>>(table, tree, request, seed,
                                                                                 targets, out, error);
  return cudaGetLastError();
}

}  // namespace gear
