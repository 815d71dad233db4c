#include "priorities.cuh"

#include <cub/device/device_radix_sort.cuh>
#include <cub/util_type.cuh>

#include "atomics.cuh"
#include "sample_budget.cuh"
#include "scratch.cuh"

namespace gear {
namespace {

struct ScatterPolicy {
  static constexpr int kCheckThreads = 1024;   // the single block that checks the whole batch first
  static constexpr int kScatterThreads = 256;  // threads per block of the scatter, one per entry
};

int BitWidth(uint64_t v) { return v == 0 ? 0 : 64 - __builtin_clzll(v); }

// Sort keys of the entries: the row id in the high bits, the entry's batch position in the low bits, so
// that sorting groups each row's entries and keeps them in batch order.
struct EntryKeys {
  int entry_bits;
  int end_bit;

  EntryKeys(const TableView& t, int64_t n)
      : entry_bits(BitWidth(static_cast<uint64_t>(n - 1))),
        end_bit(entry_bits + BitWidth(static_cast<uint64_t>(t.capacity - 1))) {}

  __device__ uint64_t Make(int64_t row, int64_t entry) const {
    return (static_cast<uint64_t>(row) << entry_bits) | static_cast<uint64_t>(entry);
  }
  __device__ int64_t Row(uint64_t key) const { return static_cast<int64_t>(key >> entry_bits); }
  __device__ int64_t Entry(uint64_t key) const {
    return static_cast<int64_t>(key & ((uint64_t{1} << entry_bits) - 1));
  }
};

// The compare-and-swap loop of priorities.cc: retries only while the generation is still the sampled one.
__device__ bool SetPriority(const TableView& t, int64_t row, uint32_t generation, float priority) {
  uint64_t* word = &t.state[row];
  uint64_t current = device::LoadAcquire(word);
  while (StateGeneration(current) == generation && (generation & 1u) == 0 && generation != 0) {
    // Never makes a row of a length out of range selectable (priorities.cc).
    if (priority > 0.0f && !LengthInRange(device::LoadRelaxed(&t.length[row]), t.max_steps)) return false;
    // Nor a limited table's row whose samples are used up (priorities.cc).
    if (priority > 0.0f && device::SamplesUsedUp(t, row, generation)) return false;
    const float old_priority = StatePriority(current);
    if (device::CompareExchange(word, &current, MakeState(generation, priority),
                                t.read_modify_write_atomics)) {
      const bool was = old_priority > 0.0f, is = priority > 0.0f;
      if (was != is) device::FetchAdd<int64_t>(t.selectable, is ? 1 : -1, t.read_modify_write_atomics);
      if (is && t.max_priority_bits != nullptr) {  // priority bits >= 0 order as the values
        device::FetchMax<uint32_t>(t.max_priority_bits, __float_as_uint(priority),
                                   t.read_modify_write_atomics);
      }
      // The change counters (table_view.h), level by level after the state change.
      for (int level = 0; level < kChangeLevels; ++level) {
        device::FetchAdd<uint32_t>(
            &t.change_counts[ChangeLevelStart(t.capacity, level) + (row >> ChangeShift(level))], 1u,
            t.read_modify_write_atomics);
      }
      return true;
    }
  }
  return false;
}

// One block: finds the first bad row id and the first bad priority (a bad row id is reported first, as
// on the CPU), sets *failed when there is one, zeroes *updated and writes each entry's sort key.
__global__ void __launch_bounds__(ScatterPolicy::kCheckThreads)
    CheckKernel(TableView t, const int32_t* indices, const float* priorities, int64_t n, EntryKeys keys,
                uint64_t* entry_keys, int32_t* failed, int32_t* updated, DeviceError* error) {
  __shared__ unsigned long long first_bad_row, first_bad_priority;
  if (threadIdx.x == 0) first_bad_row = first_bad_priority = static_cast<unsigned long long>(n);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t row = indices[i];
    const float priority = priorities[i];
    const bool in_range = row >= 0 && row < t.capacity;
    if (!in_range) atomicMin(&first_bad_row, static_cast<unsigned long long>(i));
    entry_keys[i] = in_range ? keys.Make(row, i) : 0;
    if (!isfinite(priority) || priority < 0.0f)
      atomicMin(&first_bad_priority, static_cast<unsigned long long>(i));
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const int64_t bad_row = static_cast<int64_t>(first_bad_row),
                bad_priority = static_cast<int64_t>(first_bad_priority);
  *failed = bad_row < n || bad_priority < n;
  *updated = 0;
  if (bad_row < n) {
    ReportError(error, t.read_modify_write_atomics, ErrorSite::kScatterIndex, bad_row, indices[bad_row],
                t.capacity);
  } else if (bad_priority < n) {
    ReportError(error, t.read_modify_write_atomics, ErrorSite::kScatterPriority, bad_priority,
                __float_as_uint(priorities[bad_priority]), 0);
  }
}

// One thread per sorted entry; the first entry of each row applies that row's entries in batch order.
__global__ void ScatterKernel(TableView t, const uint32_t* generations, const float* priorities, int64_t n,
                              EntryKeys keys, const uint64_t* sorted, const int32_t* failed,
                              int32_t* updated) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= n || *failed) return;
  const int64_t row = keys.Row(sorted[p]);
  if (p > 0 && keys.Row(sorted[p - 1]) == row) return;
  int32_t written = 0;
  for (int64_t q = p; q < n && keys.Row(sorted[q]) == row; ++q) {
    const int64_t i = keys.Entry(sorted[q]);
    written += SetPriority(t, row, generations[i], priorities[i]) ? 1 : 0;
  }
  if (written > 0) atomicAdd(updated, written);
}

struct ScatterScratch {
  EntryKeys keys;
  uint64_t* entry_keys[2];
  int32_t* failed;
  void* sort_temp;
  size_t sort_bytes = 0;
  cudaError_t status = cudaSuccess;

  ScatterScratch(ScratchCarver& carver, const TableView& t, int64_t n) : keys(t, n) {
    entry_keys[0] = carver.Take<uint64_t>(n);
    entry_keys[1] = carver.Take<uint64_t>(n);
    failed = carver.Take<int32_t>(1);
    if (n > 1) {
      cub::DoubleBuffer<uint64_t> buffers(entry_keys[0], entry_keys[1]);
      status = cub::DeviceRadixSort::SortKeys(nullptr, sort_bytes, buffers, n, 0, keys.end_bit);
    }
    sort_temp = carver.Take<uint8_t>(sort_bytes);
  }
};

}  // namespace

size_t ScatterPrioritiesScratchBytes(const TableView& table, int64_t n) {
  if (n == 0) return 0;
  ScratchCarver carver(nullptr);
  ScatterScratch memory(carver, table, n);
  return carver.bytes();
}

cudaError_t ScatterPrioritiesCuda(const TableView& table, const int32_t* indices, const uint32_t* generations,
                                  const float* priorities, int64_t n, void* scratch, int32_t* updated,
                                  DeviceError* error, cudaStream_t stream) {
  if (n == 0) return cudaMemsetAsync(updated, 0, sizeof(int32_t), stream);
  ScratchCarver carver(scratch);
  ScatterScratch memory(carver, table, n);
  if (memory.status != cudaSuccess) return memory.status;
  CheckKernel<<<1, ScatterPolicy::kCheckThreads, 0, stream>>>(
      table, indices, priorities, n, memory.keys, memory.entry_keys[0], memory.failed, updated, error);
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  const uint64_t* sorted = memory.entry_keys[0];
  if (n > 1) {
    cub::DoubleBuffer<uint64_t> buffers(memory.entry_keys[0], memory.entry_keys[1]);
    status = cub::DeviceRadixSort::SortKeys(memory.sort_temp, memory.sort_bytes, buffers, n, 0,
                                            memory.keys.end_bit, stream);
    if (status == cudaSuccess) status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    sorted = buffers.Current();
  }
  constexpr int kThreads = ScatterPolicy::kScatterThreads;
  ScatterKernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      table, generations, priorities, n, memory.keys, sorted, memory.failed, updated);
  return cudaGetLastError();
}

}  // namespace gear
