#include "gather.cuh"

#include <cstdint>
#include <cstdlib>

#include "atomics.cuh"

namespace gear {
namespace {

// Tuning of the gather. Rows are read from host memory over PCIe, so what matters is many 16-byte
// requests in flight, each warp's requests covering whole 128-byte lines.
struct GatherPolicy {
  static constexpr int kBlockThreads = 256;
  static constexpr int kWarpThreads = 32;
  // Vector loads per thread before their stores. 8 gathered no faster than 4 on an H200 (rows of 4 and
  // 64 KiB, B = 32 to 1024, three runs; docs/BENCHMARKS.md, "third GPU round").
  static constexpr int kUnroll = 4;
  // From this many bytes a row gets a whole block, below it a warp. Measured on an H100 over PCIe
  // (scripts/gpu_gather_profile.py): a block per 4 KiB row ran two waves of blocks that each wait out
  // several host round trips; a warp per row keeps every row of a batch in flight at once. Rows of
  // 64 KiB too were gathered 6-10% faster by a warp than by a block (scripts/gpu_fixed_cost.py, two
  // runs, B = 32 and 256; docs/BENCHMARKS.md, "second GPU round"); rows of 1 MiB were measured with a
  // block only. GEAR_JAX_GATHER_BLOCK_ROW_BYTES overrides it, for such measurements.
  static constexpr int64_t kWholeBlockRowBytes = 131072;
};

// The threads that copy one output row: a warp (small rows, several rows per block) or the whole block.
template <int kThreads>
struct RowGroup {
  static_assert(kThreads == GatherPolicy::kWarpThreads || kThreads == GatherPolicy::kBlockThreads);
  static constexpr int kRowsPerBlock = GatherPolicy::kBlockThreads / kThreads;

  __device__ static int64_t Row() {
    return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreads;
  }
  __device__ static int Lane() { return static_cast<int>(threadIdx.x % kThreads); }

  // True when `p` holds on every thread of the group. Also a barrier: the group's stores before it are
  // ordered before its stores after it.
  __device__ static bool All(bool p) {
    if constexpr (kThreads == GatherPolicy::kBlockThreads) {
      return __syncthreads_and(p) != 0;
    } else {
      __syncwarp();
      return __all_sync(0xffffffffu, p) != 0;
    }
  }
};

// dst[0, n) = src[0, n), vector `V` at a time, spread over the group.
template <typename V, int kThreads>
__device__ void CopyVectors(const V* src, V* dst, int64_t n, int lane) {
  constexpr int kUnroll = GatherPolicy::kUnroll;
  int64_t i = lane;
  for (; i + (kUnroll - 1) * kThreads < n; i += kUnroll * kThreads) {
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = src[i + u * kThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * kThreads] = v[u];
  }
  for (; i < n; i += kThreads) dst[i] = src[i];
}

// Copies `bytes` when src and dst have the same offset within a V: single bytes up to the first V
// boundary, whole Vs, then the remaining bytes.
template <typename V, int kThreads>
__device__ void CopyAligned(const uint8_t* src, uint8_t* dst, int64_t bytes, int lane) {
  constexpr int64_t kSize = sizeof(V);
  const int64_t misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(src) % kSize);
  const int64_t head = misalign == 0 ? 0 : (kSize - misalign < bytes ? kSize - misalign : bytes);
  const int64_t body = (bytes - head) / kSize;
  const int64_t tail = head + body * kSize;
  CopyVectors<uint8_t, kThreads>(src, dst, head, lane);
  CopyVectors<V, kThreads>(reinterpret_cast<const V*>(src + head), reinterpret_cast<V*>(dst + head), body,
                           lane);
  CopyVectors<uint8_t, kThreads>(src + tail, dst + tail, bytes - tail, lane);
}

// 16-byte loads and stores where src and dst allow them, 4-byte ones next, single bytes otherwise.
template <int kThreads>
__device__ void CopyBytes(const uint8_t* src, uint8_t* dst, int64_t bytes, int lane) {
  const uintptr_t offsets = reinterpret_cast<uintptr_t>(src) ^ reinterpret_cast<uintptr_t>(dst);
  if (offsets % sizeof(uint4) == 0) {
    CopyAligned<uint4, kThreads>(src, dst, bytes, lane);
  } else if (offsets % sizeof(uint32_t) == 0) {
    CopyAligned<uint32_t, kThreads>(src, dst, bytes, lane);
  } else {
    CopyVectors<uint8_t, kThreads>(src, dst, bytes, lane);
  }
}

template <int kThreads>
__device__ void ZeroBytes(uint8_t* dst, int64_t bytes, int lane) {
  constexpr int64_t kSize = sizeof(uint4);
  const int64_t misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(dst) % kSize);
  const int64_t head = misalign == 0 ? 0 : (kSize - misalign < bytes ? kSize - misalign : bytes);
  const int64_t body = (bytes - head) / kSize;
  const int64_t tail = head + body * kSize;
  for (int64_t i = lane; i < head; i += kThreads) dst[i] = 0;
  uint4* vectors = reinterpret_cast<uint4*>(dst + head);
  for (int64_t i = lane; i < body; i += kThreads) vectors[i] = make_uint4(0, 0, 0, 0);
  for (int64_t i = tail + lane; i < bytes; i += kThreads) dst[i] = 0;
}

// One output row per group: check the generation (acquire), copy the window of every field and zero
// the rest, fence, read the generation again. With `sampled_lengths` (the sample of the same call, in
// the stream before this kernel, read each row's state and then its length) the first check and the
// length's read are the sample's: two dependent reads of host memory fewer (no faster within the spread
// of two runs on an H200). A row whose generation differs or is odd at either read, on any thread of
// the group, is zeroed and invalid. In a step ring the window starts at the row's first step (read after
// the generation, as gather.cc reads it) and comes in two pieces where it wraps the ring's end.
template <int kThreads>
__global__ void __launch_bounds__(GatherPolicy::kBlockThreads)
    GatherKernel(const __grid_constant__ TableView t, const int32_t* indices, const uint32_t* generations,
                 const int32_t* starts, const int32_t* sampled_lengths,
                 const __grid_constant__ GatherRequest r, const __grid_constant__ GatherOutputs out,
                 DeviceError* error) {
  using Group = RowGroup<kThreads>;
  const int64_t i = Group::Row();
  if (i >= r.batch_size) return;
  const int lane = Group::Lane();
  const int64_t window = r.window;
  const int64_t row = indices[i];
  const int64_t start = starts[i];
  const uint32_t generation = generations[i];
  const bool row_in_range = row >= 0 && row < t.capacity;
  const bool in_range = row_in_range && start >= 0 && start < t.max_steps;
  if (!in_range && lane == 0) {
    if (row_in_range) {
      ReportError(error, t.read_modify_write_atomics, ErrorSite::kGatherStart, i, start, t.max_steps);
    } else {
      ReportError(error, t.read_modify_write_atomics, ErrorSite::kGatherIndex, i, row, t.capacity);
    }
  }

  bool ok = false;
  int64_t steps = 0;
  uint64_t first_step = 0;  // a step ring: the row's first step, read inside the seqlock
  if (in_range) {
    if (sampled_lengths != nullptr) {
      // The sample enqueued before this kernel read the row's state (acquire: `generation`), then its
      // length: the first half of the seqlock read, which the copy and the re-read below complete.
      ok = (generation & 1u) == 0;
    } else {
      const uint64_t before = device::LoadAcquire(&t.state[row]);
      ok = StateGeneration(before) == generation && (generation & 1u) == 0;
    }
    if (ok) {
      const int32_t length =
          sampled_lengths != nullptr ? sampled_lengths[i] : device::LoadRelaxed(&t.length[row]);
      ok = LengthInRange(length, t.max_steps);  // else a damaged file: the row is invalid, nothing read
      const int64_t left = ok ? length - start : 0;
      steps = left < 0 ? 0 : (left > window ? window : left);
      if (t.step_capacity > 0) first_step = device::LoadRelaxed(&t.first_step[row]);
    }
  }
  for (int32_t f = 0; f < r.num_fields; ++f) {
    const FieldView& field = t.fields[r.field_ids[f]];
    uint8_t* dst = out.fields[f] + i * window * field.step_bytes;
    int64_t head = 0;  // the steps before the ring's end (all of them for padded rows)
    const uint8_t* src = steps > 0 ? StepSource(t, field, row, first_step, start, steps, &head) : nullptr;
    const int64_t copied = steps * field.step_bytes;
    if (head > 0) CopyBytes<kThreads>(src, dst, head * field.step_bytes, lane);
    if (steps > head) {  // the window wraps the ring's end: the rest from its first slot
      CopyBytes<kThreads>(field.data, dst + head * field.step_bytes, (steps - head) * field.step_bytes, lane);
    }
    ZeroBytes<kThreads>(dst + copied, window * field.step_bytes - copied, lane);
  }
  if (ok) {
    device::FenceAcquire();
    ok = StateGeneration(device::LoadRelaxed(&t.state[row])) == generation;
  }
  const bool valid = Group::All(ok);
  if (!valid) {
    for (int32_t f = 0; f < r.num_fields; ++f) {
      const int64_t step_bytes = t.fields[r.field_ids[f]].step_bytes;
      ZeroBytes<kThreads>(out.fields[f] + i * window * step_bytes, window * step_bytes, lane);
    }
  }
  for (int64_t s = lane; s < window; s += kThreads) out.valid[i * window + s] = valid && s < steps;
}

}  // namespace

cudaError_t GatherRowsCuda(const TableView& table, const int32_t* indices, const uint32_t* generations,
                           const int32_t* starts, const GatherRequest& request, GatherOutputs out,
                           DeviceError* error, cudaStream_t stream, const int32_t* sampled_lengths) {
  if (request.batch_size == 0) return cudaSuccess;
  int64_t row_bytes = 0;
  for (int32_t f = 0; f < request.num_fields; ++f) {
    row_bytes += request.window * table.fields[request.field_ids[f]].step_bytes;
  }
  constexpr int kBlock = GatherPolicy::kBlockThreads;
  int64_t whole_block_row_bytes = GatherPolicy::kWholeBlockRowBytes;
  if (const char* env = std::getenv("GEAR_JAX_GATHER_BLOCK_ROW_BYTES"); env != nullptr && *env != '\0') {
    whole_block_row_bytes = std::strtoll(env, nullptr, 10);
  }
  if (row_bytes >= whole_block_row_bytes) {
    GatherKernel<kBlock><<<static_cast<unsigned>(request.batch_size), kBlock, 0, stream>>>(
        table, indices, generations, starts, sampled_lengths, request, out, error);
  } else {
    constexpr int64_t kRowsPerBlock = RowGroup<GatherPolicy::kWarpThreads>::kRowsPerBlock;
    const int64_t blocks = (request.batch_size + kRowsPerBlock - 1) / kRowsPerBlock;
    GatherKernel<GatherPolicy::kWarpThreads><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(
        table, indices, generations, starts, sampled_lengths, request, out, error);
  }
  return cudaGetLastError();
}

}  // namespace gear
