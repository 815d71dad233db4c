#include "sample.cuh"

#include <climits>
#include <cstdlib>

#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/util_type.cuh>

#include "atomics.cuh"
#include "claimed_rows.cuh"
#include "philox.h"
#include "priority_index.h"
#include "sample_budget.cuh"
#include "scratch.cuh"
#include "selection.h"

namespace gear {
namespace {

struct SamplePolicy {
  static constexpr int kPickThreads = 256;       // threads per block of the one-thread-per-pick kernels
  static constexpr int kFallbackThreads = 1024;  // the single block of the uniform fallback scan
  static constexpr int kOrderedThreads = 256;    // fifo/lifo/topk: threads of a candidate block
  static constexpr int kOrderedItems = 8;        // rows per thread of a candidate block
  static constexpr int64_t kOrderedTile = int64_t{kOrderedThreads} * kOrderedItems;
};

unsigned Blocks(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

__device__ int64_t ThreadIndex() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }

__device__ SampleRequest Seeded(SampleRequest r, const uint32_t* seed) {
  r.seed0 = seed[0];
  r.seed1 = seed[1];
  return r;
}

// Whether uniform picks place their windows by KeepWindow (selection.h), as sample.cc's `windowed`.
__host__ __device__ bool Windowed(const SampleRequest& r) {
  return r.window > 0 && (r.skip_short || r.uniform_starts);
}

// Record's `length` when the caller has not read the row's length: Record reads it.
constexpr int32_t kReadLength = INT32_MIN;

// `start`: the window's start where the caller drew it (uniform picks), -1 to draw it here (sample.cc).
// `length`: the row's length as the caller read it after the state it picked the row by (each read of
// table memory is a round trip over PCIe), or kReadLength.
// A limited table's pick of a row with no sample left fails (device::TakeSample): false.
__device__ bool Record(const TableView& t, const SampleRequest& r, SampleResult out, int64_t pick,
                       int64_t row, uint32_t generation, float probability, int32_t start = -1,
                       int32_t length = kReadLength) {
  if (!device::TakeSample(t, row, generation)) {
    RecordFailed(out, pick);
    return false;
  }
  out.indices[pick] = static_cast<int32_t>(row);
  out.generations[pick] = generation;
  out.probabilities[pick] = probability;
  if (length == kReadLength && (out.lengths != nullptr || (start < 0 && r.window > 0))) {
    length = device::LoadRelaxed(&t.length[row]);
  }
  if (start < 0) {
    start = r.window > 0 ? WindowStart(length, r.window, r.seed0, r.seed1, static_cast<uint32_t>(pick)) : 0;
  }
  out.starts[pick] = start;
  if (out.lengths != nullptr) out.lengths[pick] = length;
  return true;
}

// ---- uniform ---------------------------------------------------------------------------------------

// One thread per pick: the rejection draws of sample.cc's SampleUniform, windows kept or rejected by
// KeepWindow with the same draws. A pick that finds no row in kUniformAttempts draws is marked with index
// -1 for the fallback.
// Uniform windows with uniform_starts and the table's index over lengths (`lengths`, when `by_index`; the
// host refreshed it in the stream's order): each attempt's candidate is the row the index's walk ends at
// for u * total (DescendTree, as sample.cc), rejected when its state is not the one the index weighed
// (tree.seen), and its start is kept by KeepWindow with the row's own length as the bound. With no index,
// or one of total 0, candidates are uniform over the claimed rows and the longest row is the bound. The
// CPU samples through its own index, built by the same SetLeafWeight from the same state words and so the
// same bit for bit: the picks match the CPU's only while this device index exists (a table keeps at most
// PriorityIndexes::kMaxDeviceIndexes; past them the handler passes none and the picks keep the law, not
// the CPU's rows), as for prioritized picks.
// `r` is seeded (Seeded); `rows` is the claimed-row count.
__device__ void PickUniform(const TableView& t, const SampleRequest& r, int64_t i, int64_t rows,
                            const PriorityTreeView& lengths, bool by_index, SampleResult out) {
  const uint32_t pick = static_cast<uint32_t>(i);
  const bool windowed = Windowed(r);
  const bool by_length = windowed && r.uniform_starts && by_index && TreeTotal(lengths) > 0.0;
  const double length_total = by_length ? TreeTotal(lengths) : 0.0;
  // The longest row bounds every row's count of windows (a view without the word: max_steps does). Only
  // uniform starts without the index read it (KeepWindow), so only they load it.
  int32_t longest = t.max_steps;
  if (windowed && r.uniform_starts && !by_length && t.longest != nullptr) {
    longest = device::LoadRelaxed(t.longest);
  }
  for (int attempt = 0; rows > 0 && attempt < kUniformAttempts; ++attempt) {
    const double u = UniformDouble(r.seed0, r.seed1, pick, static_cast<uint32_t>(attempt), Draw::kSelect);
    int64_t candidate;
    if (by_length) {
      candidate = DescendTree(lengths, u * length_total);
      if (candidate < 0) continue;  // no row of positive weight
    } else {
      const int64_t drawn = static_cast<int64_t>(u * rows);
      candidate = drawn < rows - 1 ? drawn : rows - 1;
    }
    const uint64_t s = device::LoadAcquire(&t.state[candidate]);
    // A row may be picked when selectable with its length in [1, max_steps] (sample.h); the length, read
    // once, serves the window and the record too.
    if (!StateSelectable(s)) continue;
    const int32_t length = device::LoadRelaxed(&t.length[candidate]);
    if (!LengthInRange(length, t.max_steps)) continue;
    if (!windowed) {
      Record(t, r, out, i, candidate, StateGeneration(s), 0.0f, -1, length);
      return;
    }
    if (by_length && s != lengths.seen[candidate]) continue;  // changed since the index weighed it
    int32_t start = 0;
    if (KeepWindow(length, r.window, r.skip_short, r.uniform_starts, by_length ? length : longest, r.seed0,
                   r.seed1, pick, static_cast<uint32_t>(attempt), &start)) {
      Record(t, r, out, i, candidate, StateGeneration(s), 0.0f, start, length);
      return;
    }
  }
  out.indices[i] = -1;
}

// One thread per pick, the claimed rows read by StoreClaimedRows before it.
__global__ void UniformPickKernel(TableView t, SampleRequest r, const uint32_t* seed, const int64_t* claimed,
                                  PriorityTreeView lengths, bool by_index, SampleResult out) {
  const int64_t i = ThreadIndex();
  if (i >= r.batch_size) return;
  PickUniform(t, Seeded(r, seed), i, *claimed, lengths, by_index, out);
}

// A row's weight in the exact fallback, as sample.cc weighs it: 0 where it cannot be picked (not
// selectable, a length out of range, or no window under skip_short); else its count of windows
// (WindowCount) under uniform_starts, and 1 otherwise.
__device__ int64_t FallbackWeight(const TableView& t, const SampleRequest& r, int64_t row, uint64_t s) {
  if (!StateSelectable(s)) return 0;
  const int32_t length = device::LoadRelaxed(&t.length[row]);
  if (!LengthInRange(length, t.max_steps)) return 0;
  if (!Windowed(r)) return 1;
  const int64_t count = WindowCount(length, r.window, r.skip_short);
  return count > 0 && !r.uniform_starts ? 1 : count;
}

// One block. Without marked picks: every pick's probability is 1 / the table's selectable count. With
// some: the exact fallback of sample.cc. Pass 1 counts the rows of positive weight V (FallbackWeight)
// and adds their weights W; each marked pick draws its rank k = floor(u W) among the weights. Pass 2
// walks the rows tile by tile (a scan of the weights) and hands the row whose weights [before, before +
// weight) hold k to the picks of rank k (sample.cc: std::upper_bound over the same sums), with the
// window start k - before under uniform_starts.
// Run by every thread of one block of kFallbackThreads; `r` is seeded, `rows` the claimed-row count,
// `selectable` the table's count of selectable rows where the caller read it, else -1.
__device__ void FinishUniform(const TableView& t, const SampleRequest& r, int64_t rows, int64_t selectable,
                              int64_t* ranks, SampleResult out, DeviceError* error) {
  constexpr int kThreads = SamplePolicy::kFallbackThreads;
  using Reduce = cub::BlockReduce<int64_t, kThreads>;
  using IndexScan = cub::BlockScan<int32_t, kThreads>;
  using WeightScan = cub::BlockScan<int64_t, kThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename IndexScan::TempStorage index_scan;
    typename WeightScan::TempStorage weight_scan;
  } temp;
  __shared__ int32_t tile_rows[kThreads];     // the tile's rows of positive weight, in row order
  __shared__ uint64_t tile_states[kThreads];  // the states they were weighed with
  __shared__ int64_t tile_before[kThreads];   // the weights of the tile's rows before each of them
  __shared__ int64_t selectable_rows, total_weight;
  const int tid = static_cast<int>(threadIdx.x);
  const bool starts_by_rank = Windowed(r) && r.uniform_starts;

  bool marked = false;
  for (int64_t i = tid; i < r.batch_size; i += kThreads) marked = marked || out.indices[i] < 0;
  if (!__syncthreads_or(marked)) {
    if (tid == 0) selectable_rows = selectable >= 0 ? selectable : device::LoadRelaxed(t.selectable);
    __syncthreads();
  } else {
    int64_t mine = 0, mine_weight = 0;
    for (int64_t k = tid; k < rows; k += kThreads) {
      const int64_t weight = FallbackWeight(t, r, k, device::LoadAcquire(&t.state[k]));
      mine += weight > 0 ? 1 : 0;
      mine_weight += weight;
    }
    const int64_t counted = Reduce(temp.reduce).Sum(mine);
    __syncthreads();
    const int64_t weighed = Reduce(temp.reduce).Sum(mine_weight);
    if (tid == 0) {
      selectable_rows = counted;
      total_weight = weighed;
    }
    __syncthreads();
    const int64_t count = selectable_rows;
    const int64_t total = total_weight;
    if (count == 0) {
      for (int64_t i = tid; i < r.batch_size; i += kThreads) {
        if (out.indices[i] < 0) RecordFailed(out, i);
      }
      if (tid == 0) ReportError(error, t.read_modify_write_atomics, ErrorSite::kSampleEmpty, 0, 0, 0);
      if (tid == 0 && out.selectable != nullptr) *out.selectable = 0;
      return;
    }
    for (int64_t i = tid; i < r.batch_size; i += kThreads) {
      if (out.indices[i] >= 0) continue;
      const double u = UniformDouble(r.seed0, r.seed1, static_cast<uint32_t>(i), 0, Draw::kFallback);
      const int64_t rank = static_cast<int64_t>(u * static_cast<double>(total));
      ranks[i] = rank < total - 1 ? rank : total - 1;
    }

    int64_t before = 0;  // the weights of earlier tiles
    int32_t last_row = -1;
    uint64_t last_state = 0;
    for (int64_t first = 0; first < rows; first += kThreads) {
      const int64_t k = first + tid;
      const uint64_t s = k < rows ? device::LoadAcquire(&t.state[k]) : 0;
      const int64_t weight = k < rows ? FallbackWeight(t, r, k, s) : 0;
      int32_t index, tile_count;
      IndexScan(temp.index_scan).ExclusiveSum(weight > 0 ? 1 : 0, index, tile_count);
      __syncthreads();
      int64_t offset, tile_weight;
      WeightScan(temp.weight_scan).ExclusiveSum(weight, offset, tile_weight);
      if (weight > 0) {
        tile_rows[index] = static_cast<int32_t>(k);
        tile_states[index] = s;
        tile_before[index] = offset;
      }
      __syncthreads();
      for (int64_t i = tid; i < r.batch_size; i += kThreads) {
        if (out.indices[i] >= 0) continue;
        const int64_t at = ranks[i] - before;
        if (at < 0 || at >= tile_weight) continue;
        // The last of the tile's rows whose weights begin at or before `at` (tile_before[0] = 0 <= at).
        int32_t low = 0, high = tile_count;  // the first row beginning after `at`: [low, high) narrows to it
        while (low < high) {
          const int32_t mid = low + (high - low) / 2;
          if (tile_before[mid] > at) {
            high = mid;
          } else {
            low = mid + 1;
          }
        }
        const int32_t j = low - 1;
        Record(t, r, out, i, tile_rows[j], StateGeneration(tile_states[j]), 0.0f,
               starts_by_rank ? static_cast<int32_t>(at - tile_before[j]) : -1);
      }
      if (tile_count > 0) {
        last_row = tile_rows[tile_count - 1];
        last_state = tile_states[tile_count - 1];
      }
      before += tile_weight;
      __syncthreads();
    }
    // Writers emptied rows between the passes: the ranks past the end take the last row of positive
    // weight, with a start drawn for it (WindowStart: one of its windows).
    for (int64_t i = tid; i < r.batch_size; i += kThreads) {
      if (out.indices[i] >= 0) continue;
      if (last_row >= 0) {
        Record(t, r, out, i, last_row, StateGeneration(last_state), 0.0f);
      } else {
        RecordFailed(out, i);
      }
    }
    if (last_row < 0) {
      if (tid == 0) ReportError(error, t.read_modify_write_atomics, ErrorSite::kSampleEmpty, 0, 0, 0);
      if (tid == 0 && out.selectable != nullptr) *out.selectable = 0;
      return;
    }
  }
  const int64_t count = selectable_rows;
  const float probability = 1.0f / static_cast<float>(count > 1 ? count : 1);
  for (int64_t i = tid; i < r.batch_size; i += kThreads) out.probabilities[i] = probability;
  if (tid == 0 && out.selectable != nullptr) *out.selectable = SelectableCount(count);
}

__global__ void __launch_bounds__(SamplePolicy::kFallbackThreads)
    UniformFinishKernel(TableView t, SampleRequest r, const uint32_t* seed, const int64_t* claimed,
                        int64_t* ranks, SampleResult out, DeviceError* error) {
  FinishUniform(t, Seeded(r, seed), *claimed, -1, ranks, out, error);
}

// A small batch in one block, one launch: the block reads the claimed rows and the selectable count (two
// warps, the two round trips over PCIe at once), makes the picks (a thread per pick), then finishes them
// as UniformFinishKernel does. The same picks as the three launches of larger batches (the claimed rows,
// UniformPickKernel, UniformFinishKernel).
__global__ void __launch_bounds__(SamplePolicy::kFallbackThreads)
    UniformOneBlockKernel(TableView t, SampleRequest r, const uint32_t* seed, PriorityTreeView lengths,
                          bool by_index, int64_t* ranks, SampleResult out, DeviceError* error) {
  __shared__ int64_t rows, selectable;
  if (threadIdx.x == 0) rows = LoadClaimedRows(t);
  if (threadIdx.x == 32) selectable = device::LoadRelaxed(t.selectable);
  r = Seeded(r, seed);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < r.batch_size; i += blockDim.x) {
    PickUniform(t, r, i, rows, lengths, by_index, out);
  }
  __syncthreads();  // every pick is in `out` before the finish reads them
  FinishUniform(t, r, rows, selectable, ranks, out, error);
}

// prioritized, fifo, lifo, topk: the table's count of selectable rows into the result.
__global__ void StoreSelectableKernel(TableView t, int32_t* selectable) {
  *selectable = SelectableCount(device::LoadRelaxed(t.selectable));
}

// A request SampleRowsCpu refuses with the method error (prioritized windows under skip_short): every
// pick fails, and the error is recorded in the CPU's words.
__global__ void RefuseMethodKernel(TableView t, SampleRequest r, SampleResult out, DeviceError* error) {
  const int64_t i = ThreadIndex();
  if (i >= r.batch_size) return;
  RecordFailed(out, i);
  if (i == 0) {
    ReportError(error, t.read_modify_write_atomics, ErrorSite::kSampleMethod, 0,
                static_cast<int32_t>(r.method), 0);
  }
}

struct UniformScratch {
  int64_t* ranks;

  UniformScratch(ScratchCarver& carver, const SampleRequest& r) : ranks(carver.Take<int64_t>(r.batch_size)) {}
};

// Batches of at most this many picks are sampled by one block in one launch (UniformOneBlockKernel),
// larger ones by three launches. GEAR_JAX_SAMPLE_ONE_BLOCK_PICKS overrides it (0: never one block), for
// measurements (scripts/gpu_fixed_cost.py).
int64_t OneBlockPicks() {
  if (const char* env = std::getenv("GEAR_JAX_SAMPLE_ONE_BLOCK_PICKS"); env != nullptr && *env != '\0') {
    return std::strtoll(env, nullptr, 10);
  }
  return SamplePolicy::kFallbackThreads;
}

// `lengths`: the index over lengths, or null (SampleRowsCuda).
cudaError_t SampleUniform(const TableView& t, const SampleRequest& r, int64_t* claimed, const uint32_t* seed,
                          const PriorityTreeView* lengths, const UniformScratch& scratch, SampleResult out,
                          DeviceError* error, cudaStream_t stream) {
  const bool by_index = lengths != nullptr && IndexExponent(r) == kLengthWeights;
  const PriorityTreeView index = by_index ? *lengths : PriorityTreeView{};
  if (r.batch_size <= OneBlockPicks()) {
    UniformOneBlockKernel<<<1, SamplePolicy::kFallbackThreads, 0, stream>>>(t, r, seed, index, by_index,
                                                                            scratch.ranks, out, error);
    return cudaGetLastError();
  }
  if (cudaError_t status = StoreClaimedRows(t, claimed, stream); status != cudaSuccess) return status;
  UniformPickKernel<<<Blocks(r.batch_size, SamplePolicy::kPickThreads), SamplePolicy::kPickThreads, 0,
                      stream>>>(t, r, seed, claimed, index, by_index, out);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  UniformFinishKernel<<<1, SamplePolicy::kFallbackThreads, 0, stream>>>(t, r, seed, claimed, scratch.ranks,
                                                                        out, error);
  return cudaGetLastError();
}

// ---- prioritized -----------------------------------------------------------------------------------

// Rows past the claimed ones weigh 0 (the scan runs over the capacity: claimed_rows.cuh).
struct WeightOfRow {
  const uint64_t* state;
  const int64_t* claimed;
  float exponent;
  __device__ double operator()(int64_t row) const {
    return row < *claimed ? PriorityWeight(device::LoadRelaxed(&state[row]), exponent) : 0.0;
  }
};
using WeightIterator = thrust::transform_iterator<WeightOfRow, thrust::counting_iterator<int64_t>>;

WeightIterator Weights(const TableView& t, const int64_t* claimed, float exponent) {
  return WeightIterator(thrust::counting_iterator<int64_t>(0), WeightOfRow{t.state, claimed, exponent});
}

// prefix[k] = sum of the weights of rows 0..k: nondecreasing, and rising exactly at rows of positive
// weight (at the time of the scan). FirstAbove (selection.h) searches it.

// First index in [0, last) whose prefix is at least `value`.
__device__ int64_t FirstAtLeast(const double* prefix, int64_t last, double value) {
  int64_t first = 0;
  while (first < last) {
    const int64_t mid = first + (last - first) / 2;
    if (prefix[mid] >= value) {
      last = mid;
    } else {
      first = mid + 1;
    }
  }
  return first;
}

// The nearest row after `row` that had positive weight, or `rows`.
__device__ int64_t NextWeighted(const double* prefix, int64_t rows, int64_t row) {
  return FirstAbove(prefix, row + 1, rows, prefix[row]);
}

// The nearest row before `row` that had positive weight, or -1.
__device__ int64_t PreviousWeighted(const double* prefix, int64_t row) {
  if (row == 0 || !(prefix[row - 1] > 0.0)) return -1;
  return FirstAtLeast(prefix, row, prefix[row - 1]);
}

// One thread per pick: the row whose prefix interval holds u * total. Writers may have changed rows
// since the scan, so the pick takes the nearest row, forward first, that is selectable now, with
// probability (its weight now) / total, as the walk of sample.cc does.
__global__ void PrioritizedPickKernel(TableView t, SampleRequest r, const uint32_t* seed,
                                      const int64_t* claimed, const double* prefix, SampleResult out,
                                      DeviceError* error) {
  const int64_t i = ThreadIndex();
  if (i >= r.batch_size) return;
  r = Seeded(r, seed);
  const int64_t rows = *claimed;
  const double total = rows > 0 ? prefix[rows - 1] : 0.0;
  auto try_record = [&](int64_t row) {
    const uint64_t s = device::LoadAcquire(&t.state[row]);
    double w = PriorityWeight(s, r.priority_exponent);
    if (w > 0.0 && !LengthInRange(device::LoadRelaxed(&t.length[row]), t.max_steps)) w = 0.0;  // sample.h
    if (w > 0.0) Record(t, r, out, i, row, StateGeneration(s), static_cast<float>(w / total));
    return w > 0.0;
  };
  if (total > 0.0) {
    const double target = UniformDouble(r.seed0, r.seed1, static_cast<uint32_t>(i), 0, Draw::kSelect) * total;
    int64_t found = FirstAbove(prefix, 0, rows, target);
    if (found == rows) found = PreviousWeighted(prefix, rows);  // rounding put the target at the total
    for (int64_t k = found; k < rows; k = NextWeighted(prefix, rows, k)) {
      if (try_record(k)) return;
    }
    for (int64_t k = PreviousWeighted(prefix, found); k >= 0; k = PreviousWeighted(prefix, k)) {
      if (try_record(k)) return;
    }
  }
  RecordFailed(out, i);
  ReportError(error, t.read_modify_write_atomics, ErrorSite::kSampleEmpty, 0, 0, 0);
}

struct PrioritizedScratch {
  double* prefix;
  void* scan_temp;
  size_t scan_bytes = 0;
  cudaError_t status = cudaSuccess;

  PrioritizedScratch(ScratchCarver& carver, const TableView& t, const SampleRequest& r, int64_t rows) {
    prefix = carver.Take<double>(rows);
    if (rows > 0) {
      status = cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, Weights(t, nullptr, r.priority_exponent),
                                             prefix, rows);
    }
    scan_temp = carver.Take<uint8_t>(scan_bytes);
  }
};

// `rows`: the capacity (the scan's length); `claimed`: the rows the kernels look at.
cudaError_t SamplePrioritized(const TableView& t, const SampleRequest& r, int64_t rows,
                              const int64_t* claimed, const uint32_t* seed, PrioritizedScratch& scratch,
                              SampleResult out, DeviceError* error, cudaStream_t stream) {
  if (scratch.status != cudaSuccess) return scratch.status;
  if (rows > 0) {
    cudaError_t status =
        cub::DeviceScan::InclusiveSum(scratch.scan_temp, scratch.scan_bytes,
                                      Weights(t, claimed, r.priority_exponent), scratch.prefix, rows, stream);
    if (status == cudaSuccess) status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  PrioritizedPickKernel<<<Blocks(r.batch_size, SamplePolicy::kPickThreads), SamplePolicy::kPickThreads, 0,
                          stream>>>(t, r, seed, claimed, scratch.prefix, out, error);
  return cudaGetLastError();
}

// ---- fifo, lifo, topk ------------------------------------------------------------------------------

// A key per selectable row (selection.h OrderKey); topk needs no insert order.
__device__ uint64_t RowOrderKey(const TableView& t, SampleMethod method, int64_t row, uint64_t state) {
  const uint64_t seq = method == SampleMethod::kTopK ? 0 : device::LoadRelaxed(&t.insert_seq[row]);
  return OrderKey(method, seq, row, state);
}

// One block per tile of rows: counts the tile's selectable rows of at least `min_length` steps (skip_short:
// the window, as sample.cc's LongEnough; else 0), sorts the tile by key and keeps its `keep` =
// min(batch_size, tile) best such rows as (key, row << 32 | generation) candidates. The answer's rows are
// among the candidates.
__global__ void __launch_bounds__(SamplePolicy::kOrderedThreads)
    OrderedCandidatesKernel(TableView t, SampleMethod method, const int64_t* claimed, int32_t min_length,
                            int64_t keep, uint64_t* keys, uint64_t* values,
                            unsigned long long* selectable_rows) {
  constexpr int kThreads = SamplePolicy::kOrderedThreads, kItems = SamplePolicy::kOrderedItems;
  using Sort = cub::BlockRadixSort<uint64_t, kThreads, kItems, uint64_t>;
  using Reduce = cub::BlockReduce<int, kThreads>;
  __shared__ union {
    typename Sort::TempStorage sort;
    typename Reduce::TempStorage reduce;
  } temp;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * SamplePolicy::kOrderedTile;
  const int64_t rows = *claimed;
  uint64_t key[kItems], value[kItems];
  int selectable = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int64_t row = first + j * kThreads + threadIdx.x;
    const uint64_t s = row < rows ? device::LoadAcquire(&t.state[row]) : 0;
    const int32_t length = row < rows && StateSelectable(s) ? device::LoadRelaxed(&t.length[row]) : 0;
    key[j] = kNoCandidate;
    value[j] = 0;
    if (LengthInRange(length, t.max_steps) && length >= min_length) {  // 0 for rows not selectable
      ++selectable;
      key[j] = RowOrderKey(t, method, row, s);
      value[j] = (static_cast<uint64_t>(row) << 32) | StateGeneration(s);
    }
  }
  const int tile_selectable = Reduce(temp.reduce).Sum(selectable);
  if (threadIdx.x == 0 && tile_selectable > 0) atomicAdd(selectable_rows, tile_selectable);
  __syncthreads();
  Sort(temp.sort).Sort(key, value);
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int64_t rank = static_cast<int64_t>(threadIdx.x) * kItems + j;
    if (rank < keep) {
      keys[blockIdx.x * keep + rank] = key[j];
      values[blockIdx.x * keep + rank] = value[j];
    }
  }
}

// One thread per pick: the pick-th best candidate. With fewer selectable rows than batch_size, every
// pick fails and the error is recorded; a partial request instead fails only the picks past them.
__global__ void OrderedRecordKernel(TableView t, SampleRequest r, const uint32_t* seed, const uint64_t* keys,
                                    const uint64_t* values, const unsigned long long* selectable_rows,
                                    SampleResult out, DeviceError* error) {
  const int64_t i = ThreadIndex();
  if (i >= r.batch_size) return;
  const int64_t count = static_cast<int64_t>(*selectable_rows);
  if (count < r.batch_size && !r.partial) {
    RecordFailed(out, i);
    if (out.order_keys != nullptr) out.order_keys[i] = kNoCandidate;
    if (i == 0) {
      ReportError(error, t.read_modify_write_atomics,
                  count == 0 ? ErrorSite::kSampleEmpty : ErrorSite::kSampleTooFew, 0, count, r.batch_size);
    }
    return;
  }
  if (i >= count) {  // partial: past the selectable rows (the candidates may end before batch_size)
    RecordFailed(out, i);
    if (out.order_keys != nullptr) out.order_keys[i] = kNoCandidate;
    return;
  }
  r = Seeded(r, seed);
  const uint64_t v = values[i];
  Record(t, r, out, i, static_cast<int64_t>(v >> 32), static_cast<uint32_t>(v), 1.0f);
  if (out.order_keys != nullptr) out.order_keys[i] = keys[i];
}

struct OrderedScratch {
  int64_t tiles, keep, candidates;
  uint64_t* keys[2];
  uint64_t* values[2];
  unsigned long long* selectable_rows;
  void* sort_temp;
  size_t sort_bytes = 0;
  cudaError_t status = cudaSuccess;

  OrderedScratch(ScratchCarver& carver, const SampleRequest& r, int64_t rows)
      : tiles((rows + SamplePolicy::kOrderedTile - 1) / SamplePolicy::kOrderedTile),
        keep(r.batch_size < SamplePolicy::kOrderedTile ? r.batch_size : SamplePolicy::kOrderedTile),
        candidates(tiles * keep) {
    for (int b = 0; b < 2; ++b) {
      keys[b] = carver.Take<uint64_t>(candidates);
      values[b] = carver.Take<uint64_t>(candidates);
    }
    selectable_rows = carver.Take<unsigned long long>(1);
    if (tiles > 1) {
      cub::DoubleBuffer<uint64_t> k(keys[0], keys[1]), v(values[0], values[1]);
      status = cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, k, v, candidates);
    }
    sort_temp = carver.Take<uint8_t>(sort_bytes);
  }
};

cudaError_t SampleOrdered(const TableView& t, const SampleRequest& r, const int64_t* claimed,
                          const uint32_t* seed, OrderedScratch& scratch, SampleResult out, DeviceError* error,
                          cudaStream_t stream) {
  if (scratch.status != cudaSuccess) return scratch.status;
  cudaError_t status = cudaMemsetAsync(scratch.selectable_rows, 0, sizeof(unsigned long long), stream);
  if (status != cudaSuccess) return status;
  // One tile: the block sort is the answer's order already.
  const uint64_t *sorted_keys = scratch.keys[0], *sorted = scratch.values[0];
  if (scratch.tiles > 0) {
    OrderedCandidatesKernel<<<static_cast<unsigned>(scratch.tiles), SamplePolicy::kOrderedThreads, 0,
                              stream>>>(t, r.method, claimed, r.skip_short ? r.window : 0, scratch.keep,
                                        scratch.keys[0], scratch.values[0], scratch.selectable_rows);
    if (status = cudaGetLastError(); status != cudaSuccess) return status;
  }
  if (scratch.tiles > 1) {
    cub::DoubleBuffer<uint64_t> keys(scratch.keys[0], scratch.keys[1]),
        values(scratch.values[0], scratch.values[1]);
    status = cub::DeviceRadixSort::SortPairs(scratch.sort_temp, scratch.sort_bytes, keys, values,
                                             scratch.candidates, 0, 64, stream);
    if (status == cudaSuccess) status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    sorted_keys = keys.Current();
    sorted = values.Current();
  }
  OrderedRecordKernel<<<Blocks(r.batch_size, SamplePolicy::kPickThreads), SamplePolicy::kPickThreads, 0,
                        stream>>>(t, r, seed, sorted_keys, sorted, scratch.selectable_rows, out, error);
  return cudaGetLastError();
}

}  // namespace

size_t SampleScratchBytes(const SampleRequest& request, int64_t rows) {
  ScratchCarver carver(nullptr);
  carver.Take<int64_t>(1);  // the claimed rows
  switch (request.method) {
    case SampleMethod::kUniform: {
      UniformScratch memory(carver, request);
      break;
    }
    case SampleMethod::kPrioritized: {
      PrioritizedScratch memory(carver, TableView{}, request, rows);
      break;
    }
    case SampleMethod::kFifo:
    case SampleMethod::kLifo:
    case SampleMethod::kTopK: {
      OrderedScratch memory(carver, request, rows);
      break;
    }
  }
  return carver.bytes();
}

cudaError_t SampleRowsCuda(const TableView& table, const SampleRequest& request, int64_t rows,
                           const uint32_t* seed, void* scratch, SampleResult out, DeviceError* error,
                           cudaStream_t stream, const PriorityTreeView* lengths) {
  if (request.batch_size == 0) return cudaSuccess;
  if (request.method != SampleMethod::kUniform && out.selectable != nullptr) {
    StoreSelectableKernel<<<1, 1, 0, stream>>>(table, out.selectable);
    if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  }
  if (request.method == SampleMethod::kPrioritized && request.skip_short && request.window > 0) {
    // Refused (the handlers' CheckSelection refuses it before any launch): as SampleRowsCpu.
    RefuseMethodKernel<<<Blocks(request.batch_size, SamplePolicy::kPickThreads), SamplePolicy::kPickThreads,
                         0, stream>>>(table, request, out, error);
    return cudaGetLastError();
  }
  ScratchCarver carver(scratch);
  int64_t* claimed = carver.Take<int64_t>(1);
  if (request.method == SampleMethod::kUniform) {  // stores the claimed rows itself, where it needs them
    UniformScratch memory(carver, request);
    return SampleUniform(table, request, claimed, seed, lengths, memory, out, error, stream);
  }
  if (cudaError_t status = StoreClaimedRows(table, claimed, stream); status != cudaSuccess) return status;
  switch (request.method) {
    case SampleMethod::kUniform: break;  // above
    case SampleMethod::kPrioritized: {
      PrioritizedScratch memory(carver, table, request, rows);
      return SamplePrioritized(table, request, rows, claimed, seed, memory, out, error, stream);
    }
    case SampleMethod::kFifo:
    case SampleMethod::kLifo:
    case SampleMethod::kTopK: {
      OrderedScratch memory(carver, request, rows);
      return SampleOrdered(table, request, claimed, seed, memory, out, error, stream);
    }
  }
  return cudaErrorInvalidValue;
}

}  // namespace gear
