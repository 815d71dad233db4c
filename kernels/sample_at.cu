#include "sample_at.cuh"

#include <math.h>

#include <cub/block/block_reduce.cuh>
#include <cub/device/device_scan.cuh>

#include "atomics.cuh"
#include "claimed_rows.cuh"
#include "sample_budget.cuh"
#include "scratch.cuh"
#include "selection.h"

namespace gear {
namespace {

struct SampleAtPolicy {
  static constexpr int kSumThreads = 256;      // threads of a tile-sum block
  static constexpr int64_t kTileRows = 1024;   // rows per tile
  static constexpr int kFinishThreads = 1024;  // the single block that adds the tiles for total_weight
  static constexpr int kPickWarps = 8;         // picks (one warp each) per block of the pick kernel
};

constexpr unsigned kFullMask = 0xffffffffu;

int64_t Tiles(int64_t rows) { return (rows + SampleAtPolicy::kTileRows - 1) / SampleAtPolicy::kTileRows; }

// One block per tile: the sum of the tile's weights and (when `counts` is given) its selectable rows.
// A law that counts windows weighs rows by UniformWindowWeight and counts the rows of positive weight.
__global__ void __launch_bounds__(SampleAtPolicy::kSumThreads)
    TileSumsKernel(TableView t, float exponent, WindowLaw law, const int64_t* claimed, double* sums,
                   int32_t* counts) {
  constexpr int kThreads = SampleAtPolicy::kSumThreads;
  using SumReduce = cub::BlockReduce<double, kThreads>;
  using CountReduce = cub::BlockReduce<int32_t, kThreads>;
  __shared__ union {
    typename SumReduce::TempStorage sum;
    typename CountReduce::TempStorage count;
  } temp;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * SampleAtPolicy::kTileRows;
  const int64_t rows = *claimed;
  double weight = 0.0;
  int32_t selectable = 0;
  for (int64_t j = threadIdx.x; j < SampleAtPolicy::kTileRows; j += kThreads) {
    const int64_t row = first + j;
    if (row >= rows) break;
    const uint64_t s = device::LoadAcquire(&t.state[row]);
    if (!StateSelectable(s)) continue;
    if (law.counts_windows()) {
      const int32_t length = device::LoadRelaxed(&t.length[row]);
      if (!LengthInRange(length, t.max_steps)) continue;
      const int64_t w = UniformWindowWeight(length, law.window, law.skip_short, law.uniform_starts);
      selectable += w > 0;
      weight += static_cast<double>(w);
      continue;
    }
    ++selectable;
    weight += PriorityWeight(s, exponent);
  }
  const double tile_sum = SumReduce(temp.sum).Sum(weight);
  if (threadIdx.x == 0) sums[blockIdx.x] = tile_sum;
  if (counts == nullptr) return;
  __syncthreads();
  const int32_t tile_count = CountReduce(temp.count).Sum(selectable);
  if (threadIdx.x == 0) counts[blockIdx.x] = tile_count;
}

// One block: adds the tiles in a fixed order and writes the float32 total and the count.
__global__ void __launch_bounds__(SampleAtPolicy::kFinishThreads)
    TotalWeightFinishKernel(const double* sums, const int32_t* counts, int64_t tiles, float* total,
                            int32_t* count, DeviceError* error, bool system_scope) {
  constexpr int kThreads = SampleAtPolicy::kFinishThreads;
  using SumReduce = cub::BlockReduce<double, kThreads>;
  using CountReduce = cub::BlockReduce<long long, kThreads>;
  __shared__ union {
    typename SumReduce::TempStorage sum;
    typename CountReduce::TempStorage count;
  } temp;
  double weight = 0.0;
  long long selectable = 0;
  for (int64_t k = threadIdx.x; k < tiles; k += kThreads) {
    weight += sums[k];
    selectable += counts[k];
  }
  const double sum = SumReduce(temp.sum).Sum(weight);
  __syncthreads();
  const long long rows = CountReduce(temp.count).Sum(selectable);
  if (threadIdx.x != 0) return;
  const float rounded = static_cast<float>(sum);
  if (!isfinite(rounded)) ReportError(error, system_scope, ErrorSite::kTotalWeightOverflow, 0, 0, 0);
  *total = rounded;
  *count = static_cast<int32_t>(rows);
}

// A row found by a warp's scan of a tile; row -1: none.
struct Found {
  int64_t row = -1;
  uint64_t state = 0;
  double weight = 0.0;
};

// Broadcasts lane `src`'s row, state and weight to the warp.
__device__ Found FromLane(int64_t row, uint64_t state, double weight, int src) {
  Found f;
  f.row = __shfl_sync(kFullMask, static_cast<long long>(row), src);
  f.state = __shfl_sync(kFullMask, static_cast<unsigned long long>(state), src);
  f.weight = __shfl_sync(kFullMask, weight, src);
  return f;
}

// The whole warp scans the rows [first, end) in order: *hit is the first row at which `base` plus the
// inclusive sum of the weights exceeds `target` (none for target = +inf); *last the last row of positive
// weight before the hit (or in the whole range without one). Each row's state is read once, with acquire.
__device__ void ScanTile(const TableView& t, float exponent, int64_t first, int64_t end, double base,
                         double target, Found* hit, Found* last) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  double running = base;
  *hit = Found{};
  for (int64_t chunk = first; chunk < end; chunk += 32) {
    const int64_t row = chunk + lane;
    uint64_t s = 0;
    double w = 0.0;
    if (row < end) {
      s = device::LoadAcquire(&t.state[row]);
      w = PriorityWeight(s, exponent);
    }
    double sum = w;  // inclusive warp scan, lanes in row order
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const double other = __shfl_up_sync(kFullMask, sum, offset);
      if (lane >= offset) sum += other;
    }
    const unsigned hits = __ballot_sync(kFullMask, w > 0.0 && running + sum > target);
    if (hits != 0) {
      *hit = FromLane(row, s, w, __ffs(hits) - 1);
      return;
    }
    const unsigned positive = __ballot_sync(kFullMask, w > 0.0);
    if (positive != 0) *last = FromLane(row, s, w, 31 - __clz(positive));
    running += __shfl_sync(kFullMask, sum, 31);
  }
}

// The last row of positive weight in tile `tile` (the whole warp), read now.
__device__ Found LastInTile(const TableView& t, float exponent, int64_t rows, int64_t tile) {
  Found hit, last;
  const int64_t first = tile * SampleAtPolicy::kTileRows;
  const int64_t end = first + SampleAtPolicy::kTileRows < rows ? first + SampleAtPolicy::kTileRows : rows;
  ScanTile(t, exponent, first, end, 0.0, INFINITY, &hit, &last);
  return last;
}

// One warp per pick.
__global__ void __launch_bounds__(SampleAtPolicy::kPickWarps * 32)
    SampleAtPickKernel(TableView t, SampleAtRequest r, const uint32_t* seed, const float* targets,
                       const int64_t* claimed, int64_t tiles, const double* prefix, SampleResult out,
                       DeviceError* error) {
  const int64_t pick = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (pick >= r.batch_size) return;  // whole warps: every lane of a warp has the same pick
  const int64_t rows = *claimed;
  const bool leader = threadIdx.x % 32 == 0;
  const float target = targets[pick];
  const double total = tiles > 0 ? prefix[tiles - 1] : 0.0;
  Found found;
  if (TargetIsMine(target) && total > 0.0 && !isinf(total)) {
    const double goal = static_cast<double>(target);
    // The tile whose prefix interval holds the target; past the total, the last tile of positive sum.
    int64_t tile = goal < total ? FirstAbove(prefix, 0, tiles, goal) : tiles;
    if (tile == tiles) {
      tile = tiles - 1;
      while (tile > 0 && !(prefix[tile] > prefix[tile - 1])) --tile;
    }
    const int64_t first = tile * SampleAtPolicy::kTileRows;
    const int64_t end = first + SampleAtPolicy::kTileRows < rows ? first + SampleAtPolicy::kTileRows : rows;
    Found hit, last;
    ScanTile(t, r.priority_exponent, first, end, tile > 0 ? prefix[tile - 1] : 0.0,
             goal < total ? goal : INFINITY, &hit, &last);
    found = hit.row >= 0 ? hit : last;
    // Writers emptied the tile since the sums: the nearest tile with a row of positive weight, earlier
    // tiles first.
    for (int64_t k = tile - 1; found.row < 0 && k >= 0; --k) {
      if (prefix[k] > (k > 0 ? prefix[k - 1] : 0.0)) found = LastInTile(t, r.priority_exponent, rows, k);
    }
    for (int64_t k = tile + 1; found.row < 0 && k < tiles; ++k) {
      if (prefix[k] > prefix[k - 1]) found = LastInTile(t, r.priority_exponent, rows, k);
    }
  } else if (leader && TargetIsMine(target) && isinf(total)) {
    ReportError(error, t.read_modify_write_atomics, ErrorSite::kSampleAtWeightOverflow, 0, 0, 0);
  }
  if (!leader) return;
  // A row whose length is out of range gets the failed-pick marker (sample_at.h).
  if (found.row >= 0 && !LengthInRange(device::LoadRelaxed(&t.length[found.row]), t.max_steps))
    found.row = -1;
  if (found.row < 0) {  // not this table's, no row of positive weight, a damaged length, or an overflow
    out.indices[pick] = 0;
    out.generations[pick] = 1;
    out.probabilities[pick] = 0.0f;
    out.starts[pick] = 0;
    return;
  }
  if (!device::TakeSample(t, found.row, StateGeneration(found.state))) {  // a limited row used up meanwhile
    out.indices[pick] = 0;
    out.generations[pick] = 1;
    out.probabilities[pick] = 0.0f;
    out.starts[pick] = 0;
    return;
  }
  out.indices[pick] = static_cast<int32_t>(found.row);
  out.generations[pick] = StateGeneration(found.state);
  out.probabilities[pick] = static_cast<float>(found.weight / total);
  out.starts[pick] = r.window > 0 ? WindowStart(device::LoadRelaxed(&t.length[found.row]), r.window, seed[0],
                                                seed[1], static_cast<uint32_t>(pick))
                                  : 0;
}

// `rows` is the capacity (claimed_rows.cuh): tiles past the claimed rows sum to 0.
struct TotalWeightScratch {
  int64_t* claimed;
  double* sums;
  int32_t* counts;

  TotalWeightScratch(ScratchCarver& carver, int64_t rows)
      : claimed(carver.Take<int64_t>(1)),
        sums(carver.Take<double>(Tiles(rows))),
        counts(carver.Take<int32_t>(Tiles(rows))) {}
};

struct SampleAtScratch {
  int64_t tiles;
  int64_t* claimed;
  double* sums;
  double* prefix;
  void* scan_temp;
  size_t scan_bytes = 0;
  cudaError_t status = cudaSuccess;

  SampleAtScratch(ScratchCarver& carver, int64_t rows) : tiles(Tiles(rows)) {
    claimed = carver.Take<int64_t>(1);
    sums = carver.Take<double>(tiles);
    prefix = carver.Take<double>(tiles);
    if (tiles > 0) status = cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, sums, prefix, tiles);
    scan_temp = carver.Take<uint8_t>(scan_bytes);
  }
};

}  // namespace

size_t TotalWeightScratchBytes(int64_t rows) {
  ScratchCarver carver(nullptr);
  TotalWeightScratch memory(carver, rows);
  return carver.bytes();
}

cudaError_t TotalWeightCuda(const TableView& table, float priority_exponent, const WindowLaw& law,
                            int64_t rows, void* scratch, float* total, int32_t* count, DeviceError* error,
                            cudaStream_t stream) {
  ScratchCarver carver(scratch);
  TotalWeightScratch memory(carver, rows);
  const int64_t tiles = Tiles(rows);
  if (tiles > 0) {
    if (cudaError_t status = StoreClaimedRows(table, memory.claimed, stream); status != cudaSuccess)
      return status;
    TileSumsKernel<<<static_cast<unsigned>(tiles), SampleAtPolicy::kSumThreads, 0, stream>>>(
        table, priority_exponent, law, memory.claimed, memory.sums, memory.counts);
    if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  }
  TotalWeightFinishKernel<<<1, SampleAtPolicy::kFinishThreads, 0, stream>>>(
      memory.sums, memory.counts, tiles, total, count, error, table.read_modify_write_atomics);
  return cudaGetLastError();
}

size_t SampleAtScratchBytes(const SampleAtRequest& /*request*/, int64_t rows) {
  ScratchCarver carver(nullptr);
  SampleAtScratch memory(carver, rows);
  return carver.bytes();
}

cudaError_t SampleAtCuda(const TableView& table, const SampleAtRequest& request, int64_t rows,
                         const uint32_t* seed, const float* targets, void* scratch, SampleResult out,
                         DeviceError* error, cudaStream_t stream) {
  if (request.batch_size == 0) return cudaSuccess;
  ScratchCarver carver(scratch);
  SampleAtScratch memory(carver, rows);
  if (memory.status != cudaSuccess) return memory.status;
  if (cudaError_t status = StoreClaimedRows(table, memory.claimed, stream); status != cudaSuccess)
    return status;
  if (memory.tiles > 0) {
    TileSumsKernel<<<static_cast<unsigned>(memory.tiles), SampleAtPolicy::kSumThreads, 0, stream>>>(
        table, request.priority_exponent, WindowLaw{}, memory.claimed, memory.sums, nullptr);
    if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
    cudaError_t status = cub::DeviceScan::InclusiveSum(memory.scan_temp, memory.scan_bytes, memory.sums,
                                                       memory.prefix, memory.tiles, stream);
    if (status == cudaSuccess) status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  constexpr int kThreads = SampleAtPolicy::kPickWarps * 32;
  const unsigned blocks = static_cast<unsigned>((request.batch_size + SampleAtPolicy::kPickWarps - 1) /
                                                SampleAtPolicy::kPickWarps);
  SampleAtPickKernel<<<blocks, kThreads, 0, stream>>>(table, request, seed, targets, memory.claimed,
                                                      memory.tiles, memory.prefix, out, error);
  return cudaGetLastError();
}

}  // namespace gear
