// XLA FFI handlers for the CUDA platform: the targets of cpu_handlers.cc with the same arguments, results
// and attributes, running the kernels of kernels/*.cu on XLA's stream for the call.
//
// How errors are reported. A handler never waits for its stream.
//  - What the host can check, it checks before enqueuing anything, and fails the call at once: a closed
//    table or one of another spec, bad attributes or result shapes (these checks are handler_checks.h,
//    shared with the CPU handlers: same code, same words), a table whose memory is not registered with
//    CUDA, no scratch memory, a failed launch.
//  - Errors in the data are known only to the kernels (or to the host callback of update_priorities,
//    see below): a sample of a table with no selectable row or with fewer than batch_size rows for
//    fifo/lifo/topk, a row id or window start out of range, a NaN, infinite or negative priority. The
//    first one is written to a small record in pinned host memory, one record per table and CUDA
//    device, and the call completes with defined outputs: a pick that could not be made holds row 0
//    with the odd generation 1 (gather returns it zeroed and invalid, update_priorities skips it), a
//    row out of range is gathered as zeros and invalid, and an update with a bad entry changes nothing
//    and counts 0 rows.
//  - Errors surface at the next call: every handler first looks at the record of its table and device,
//    and when an earlier call left an error there, clears it and fails with that error's code and
//    message (kernels/errors.h: the CPU kernels' very words), noting that an earlier call found it. "Next"
//    means the first call whose handler runs after the failing kernel did: the handlers of one jitted program
//    all run before its kernels, so an error in a learner step shows at a later step. A record still set when
//    the table is closed is dropped.
//
// Where update_priorities runs. A priority update and a writer's claim of a row (SharedTable::Claim) are
// each a compare-and-swap of the row's 64-bit state word in pinned host memory. A kernel's atomics on
// host memory are atomic against the CPU's only where the device reports
// cudaDevAttrHostNativeAtomicSupported (NVLink-C2C hosts such as Grace Hopper). Over PCIe, on every x86
// host, the GPU's compare-and-swap could overwrite a writer's concurrent claim and publish a torn row.
//  - With native host atomics, the kernel of kernels/priorities.cu scatters on XLA's stream.
//  - Without them, or when the environment sets GEAR_JAX_HOST_SCATTER=1 (read at every call, for
//    tests; =0 forces the kernel, which tests without concurrent writers use to cover it on any GPU),
//    the scatter runs on the host in stream order: the inputs are copied into pinned staging
//    memory, a host callback on the stream runs ScatterPrioritiesCpu on the table's host view (the CPU
//    atomics the writers use) and records bad data as the kernel would, and the count is copied into
//    the result after it. The handler still never waits for the stream.
// The sample kernel's increments of times_sampled are GPU atomics on host memory as well, so on hosts
// without native host atomics the counts are approximate: an increment that races with one from the
// CPU or from another GPU can be lost. Nothing in the consistency model depends on them.
#include "xla_ffi/cuda_handlers.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/atomics.h"
#include "kernels/device_error.cuh"
#include "kernels/gather.cuh"
#include "kernels/priorities.cuh"
#include "kernels/priority_index.cuh"
#include "kernels/sample.cuh"
#include "kernels/sample_at.cuh"
#include "kernels/scratch.cuh"
#include "xla/ffi/api/ffi.h"
#include "xla_ffi/cuda_runtime.h"
#include "xla_ffi/handler_checks.h"
#include "xla_ffi/host_draw.h"
#include "xla_ffi/host_staging.h"
#include "xla_ffi/registry.h"

namespace ffi = xla::ffi;

namespace gear {
namespace {

// The error an earlier call on this table and device recorded, in the words and with the code the CPU
// handler uses for it (KernelFailure); the record is cleared. Success when there is none.
ffi::Error TakeEarlierError(DeviceError* record, int32_t device) {
  const auto site = static_cast<ErrorSite>(__atomic_load_n(&record->site, __ATOMIC_ACQUIRE));
  if (site == ErrorSite::kNone) return ffi::Error::Success();
  const KernelStatus status = KernelError(site, record->element, record->value, record->limit);
  __atomic_store_n(&record->site, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&record->claim, 0, __ATOMIC_RELEASE);
  return KernelFailure(status, " [found on CUDA device " + std::to_string(device) +
                                   " by an earlier call: CUDA calls report bad data at the next call on the "
                                   "table]");
}

ffi::Error CudaFailure(const char* op, const char* what, cudaError_t status) {
  return OpError(ffi::ErrorCode::kInternal, op, std::string(what) + ": " + cudaGetErrorString(status));
}

// Makes `device` the calling thread's current CUDA device while it lives. XLA calls the handler with
// the stream's device current already; this guards a thread that has another one current.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    status_ = cudaGetDevice(&previous_);
    if (status_ == cudaSuccess && previous_ != device) {
      status_ = cudaSetDevice(device);
      restore_ = status_ == cudaSuccess;
    }
  }
  ~ScopedDevice() {
    if (restore_) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  cudaError_t status() const { return status_; }

 private:
  int previous_ = 0;
  bool restore_ = false;
  cudaError_t status_;
};

// A table resolved for one call on one device.
struct CudaTable {
  std::shared_ptr<SharedTable> table;  // keeps the mapping while the handler enqueues work on it
  const CudaPinning::DeviceSide* side = nullptr;
  TableView view;  // what the kernels read: side->view, every pointer into the mapping (DeviceView)
};

// The same byte of the mapping as `host` (an address in the table's host view), seen from the device
// whose view moved the state column from `host_state` to `device_state`; null stays null.
template <typename T>
T* OnDevice(T* host, const void* host_state, const void* device_state) {
  if (host == nullptr) return nullptr;
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(host) - reinterpret_cast<uintptr_t>(host_state) +
                              reinterpret_cast<uintptr_t>(device_state));
}

// The device's view of the table with the addresses CudaPinning::ForDevice does not move yet (the change
// counters, the step ring's first steps and the longest-episode word) moved as it moves the others, by
// the offset of the device's mapping. Where the device reads registered memory at its host address (UVA
// systems with cudaDevAttrCanUseHostPointerForRegisteredMem) the offset is 0 and this changes nothing;
// once ForDevice moves them itself, it still changes nothing.
TableView DeviceView(const TableView& host, const TableView& device) {
  TableView view = device;
  view.change_counts = OnDevice(host.change_counts, host.state, device.state);
  view.first_step = OnDevice(host.first_step, host.state, device.state);
  view.longest = OnDevice(host.longest, host.state, device.state);
  return view;
}

ffi::Error EnqueueIndexRefresh(cudaStream_t stream, const CudaTable& t, int64_t handle, float exponent,
                               const char* op, std::shared_ptr<IndexSlot>* slot);

// Resolves (handle, spec hash) on `device`, then fails with the error an earlier call left, if any.
ffi::Error Open(int64_t handle, int64_t spec_hash, int32_t device, const char* op, CudaTable* out) {
  if (ffi::Error error = ResolveTable(handle, spec_hash, &out->table); error.failure()) return error;
  std::string error;
  out->side = out->table->cuda()->ForDevice(device, out->table->view(), &error);
  if (out->side == nullptr) {
    return OpError(ffi::ErrorCode::kFailedPrecondition, op,
                   "table '" + out->table->name() + "' cannot be read on CUDA device " +
                       std::to_string(device) + ": " + error);
  }
  out->view = DeviceView(out->table->view(), out->side->view);
  return TakeEarlierError(out->side->error_host, device);
}

// Samples of a table with max_times_sampled take each pick's sample by a compare-and-swap of the row's
// count, and retire the row at its last; atomic against other processes' samples and the writers' claims
// only as the CPU makes them, or a GPU with native host atomics (see "Where update_priorities runs"
// above). On every other GPU such a sample runs on the host (EnqueueHostSample, below).
bool SamplesOnHost(const CudaTable& t) {
  return t.view.max_times_sampled > 0 && !t.view.read_modify_write_atomics;
}

// The picks of `request` (or of `at_request`, sample_at's, with its `targets`) made on the host in the
// order of `stream` and copied into `out` (device memory), `picks` of them (defined below).
ffi::Error EnqueueHostSample(cudaStream_t stream, int32_t device, const CudaTable& t, int64_t handle,
                             const SampleRequest* request, const SampleAtRequest* at_request,
                             const uint32_t* seed, const float* targets, const SampleResult& out,
                             int64_t picks, const char* op);

// Device scratch memory for this call (nullptr for 0 bytes), aligned to ScratchCarver::kAlign. XLA's
// allocator refuses alignments above 16 bytes ("Unsupported alignment"), so the block is asked for with
// none and kAlign bytes more, and its start is rounded up here.
ffi::Error AllocateScratch(ffi::ScratchAllocator& scratch, size_t bytes, const char* op, void** memory) {
  *memory = nullptr;
  if (bytes == 0) return ffi::Error::Success();
  std::optional<void*> block = scratch.Allocate(bytes + ScratchCarver::kAlign);
  if (!block.has_value()) {
    return OpError(ffi::ErrorCode::kResourceExhausted, op,
                   "cannot allocate " + std::to_string(bytes) + " bytes of GPU scratch memory");
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(*block);
  *memory = reinterpret_cast<void*>((start + ScratchCarver::kAlign - 1) / ScratchCarver::kAlign *
                                    ScratchCarver::kAlign);
  return ffi::Error::Success();
}

ffi::Error Launched(cudaError_t status, const char* op) {
  return status == cudaSuccess ? ffi::Error::Success() : CudaFailure(op, "kernel launch failed", status);
}

// Enqueues the selection of a prepared `request` (PrepareSample) from `t` into `out`: SampleImpl's work
// after its checks, shared with SampleGatherImpl. `op` names the call in errors.
ffi::Error EnqueueSample(cudaStream_t stream, ffi::ScratchAllocator& scratch, const CudaTable& t,
                         int64_t handle, const SampleRequest& request, float priority_exponent,
                         const uint32_t* seed, SampleResult out, const char* op) {
  // Prioritized windows under skip_short (refused by PrepareSample already) reach SampleRowsCuda, which
  // fails them with the method error as SampleRowsCpu does.
  const bool refused = request.skip_short && request.window > 0;
  if (request.method == SampleMethod::kPrioritized && request.batch_size > 0 && !refused) {
    std::shared_ptr<IndexSlot> slot;
    if (ffi::Error error = EnqueueIndexRefresh(stream, t, handle, priority_exponent, op, &slot);
        error.failure()) {
      return error;
    }
    if (slot != nullptr) {
      return Launched(SampleIndexedCuda(t.view, slot->index->DeviceView(), request, seed, out,
                                        t.side->error_device, stream),
                      op);
    }
  }
  // Uniform windows of a step ring (uniform_starts) draw their candidates through the index over lengths
  // (IndexExponent: kLengthWeights), refreshed in the stream's order as the prioritized one is, as the CPU
  // handlers draw them through theirs. Without it (the table keeps kMaxDeviceIndexes others) the kernel
  // falls back to uniform candidates: the same law, but no longer the CPU's picks, which still go
  // through the CPU's index.
  std::shared_ptr<IndexSlot> length_index;
  PriorityTreeView lengths_view;
  if (request.method == SampleMethod::kUniform && request.batch_size > 0 &&
      IndexExponent(request) == kLengthWeights) {
    if (ffi::Error error = EnqueueIndexRefresh(stream, t, handle, kLengthWeights, op, &length_index);
        error.failure()) {
      return error;
    }
    if (length_index != nullptr) lengths_view = length_index->index->DeviceView();
  }
  const int64_t rows = t.table->view().capacity;  // the kernels read the claimed rows (claimed_rows.cuh)
  void* memory;
  if (ffi::Error error = AllocateScratch(scratch, SampleScratchBytes(request, rows), op, &memory);
      error.failure()) {
    return error;
  }
  return Launched(SampleRowsCuda(t.view, request, rows, seed, memory, out, t.side->error_device, stream,
                                 length_index != nullptr ? &lengths_view : nullptr),
                  op);
}

ffi::Error SampleImpl(cudaStream_t stream, int32_t device, ffi::ScratchAllocator scratch,
                      ffi::Buffer<ffi::U32> seed, ffi::AnyBuffer /*after*/,
                      ffi::ResultBuffer<ffi::S32> indices, ffi::ResultBuffer<ffi::U32> generations,
                      ffi::ResultBuffer<ffi::F32> probabilities, ffi::ResultBuffer<ffi::S32> starts,
                      ffi::ResultBuffer<ffi::S32> selectable, ffi::ResultBuffer<ffi::S32> lengths,
                      int64_t handle, int64_t spec_hash, int32_t method, float priority_exponent,
                      int32_t window) {
  ScopedDevice scope(device);
  if (scope.status() != cudaSuccess)
    return CudaFailure("sample", "cannot select the CUDA device", scope.status());
  CudaTable t;
  if (ffi::Error error = Open(handle, spec_hash, device, "sample", &t); error.failure()) return error;
  SampleRequest request;
  if (ffi::Error error = PrepareSample(seed.element_count(), method, priority_exponent, window,
                                       indices->element_count(), &request);
      error.failure()) {
    return error;
  }
  if (lengths->element_count() != indices->element_count()) {
    return OpError(ffi::ErrorCode::kInvalidArgument, "sample", "lengths must have one entry per pick");
  }
  SampleResult out{indices->typed_data(),
                   generations->typed_data(),
                   probabilities->typed_data(),
                   starts->typed_data(),
                   nullptr,
                   selectable->typed_data(),
                   lengths->typed_data()};
  if (SamplesOnHost(t)) {
    return EnqueueHostSample(stream, device, t, handle, &request, nullptr, seed.typed_data(), nullptr, out,
                             static_cast<int64_t>(indices->element_count()), "sample");
  }
  return EnqueueSample(stream, scratch, t, handle, request, priority_exponent, seed.typed_data(), out,
                       "sample");
}

ffi::Error OrderedCandidatesImpl(cudaStream_t stream, int32_t device, ffi::ScratchAllocator scratch,
                                 ffi::Buffer<ffi::U32> seed, ffi::AnyBuffer /*after*/,
                                 ffi::ResultBuffer<ffi::S32> indices, ffi::ResultBuffer<ffi::U32> generations,
                                 ffi::ResultBuffer<ffi::F32> probabilities,
                                 ffi::ResultBuffer<ffi::S32> starts, ffi::ResultBuffer<ffi::U32> order_keys,
                                 int64_t handle, int64_t spec_hash, int32_t method, int32_t window) {
  constexpr const char* kOp = "ordered_candidates";
  ScopedDevice scope(device);
  if (scope.status() != cudaSuccess) return CudaFailure(kOp, "cannot select the CUDA device", scope.status());
  CudaTable t;
  if (ffi::Error error = Open(handle, spec_hash, device, kOp, &t); error.failure()) return error;
  SampleRequest request;
  if (ffi::Error error =
          PrepareOrderedCandidates(seed.element_count(), method, window, indices->element_count(),
                                   order_keys->element_count(), &request);
      error.failure()) {
    return error;
  }
  SampleResult out{indices->typed_data(), generations->typed_data(), probabilities->typed_data(),
                   starts->typed_data(), reinterpret_cast<uint64_t*>(order_keys->typed_data())};
  if (SamplesOnHost(t)) {  // before the scratch, which only the kernels use
    return EnqueueHostSample(stream, device, t, handle, &request, nullptr, seed.typed_data(), nullptr, out,
                             static_cast<int64_t>(indices->element_count()), kOp);
  }
  const int64_t rows = t.table->view().capacity;  // the kernels read the claimed rows (claimed_rows.cuh)
  void* memory;
  if (ffi::Error error = AllocateScratch(scratch, SampleScratchBytes(request, rows), kOp, &memory);
      error.failure()) {
    return error;
  }
  return Launched(
      SampleRowsCuda(t.view, request, rows, seed.typed_data(), memory, out, t.side->error_device, stream),
      kOp);
}

ffi::Error GatherImpl(cudaStream_t stream, int32_t device, ffi::Buffer<ffi::S32> indices,
                      ffi::Buffer<ffi::U32> generations, ffi::Buffer<ffi::S32> starts,
                      ffi::ResultBuffer<ffi::PRED> valid, ffi::RemainingRets fields_out, int64_t handle,
                      int64_t spec_hash, ffi::Span<const int64_t> fields, int32_t window) {
  ScopedDevice scope(device);
  if (scope.status() != cudaSuccess)
    return CudaFailure("gather", "cannot select the CUDA device", scope.status());
  CudaTable t;
  if (ffi::Error error = Open(handle, spec_hash, device, "gather", &t); error.failure()) return error;
  GatherRequest request;
  GatherOutputs out;
  if (ffi::Error error =
          PrepareGather(t.view, indices.element_count(), generations.element_count(), starts.element_count(),
                        valid, fields_out, fields, window, &request, &out);
      error.failure()) {
    return error;
  }
  return Launched(GatherRowsCuda(t.view, indices.typed_data(), generations.typed_data(), starts.typed_data(),
                                 request, out, t.side->error_device, stream),
                  "gather");
}

// sample + gather in one call (one handler, one table lookup): EnqueueSample's kernels, then the gather's
// of their picks, in the stream's order, which takes each row's generation and length as the sample read
// them (GatherRowsCuda's sampled_lengths). The same picks and data as the two calls.
ffi::Error SampleGatherImpl(cudaStream_t stream, int32_t device, ffi::ScratchAllocator scratch,
                            ffi::Buffer<ffi::U32> seed, ffi::AnyBuffer /*after*/,
                            ffi::ResultBuffer<ffi::S32> indices, ffi::ResultBuffer<ffi::U32> generations,
                            ffi::ResultBuffer<ffi::F32> probabilities, ffi::ResultBuffer<ffi::S32> starts,
                            ffi::ResultBuffer<ffi::S32> selectable, ffi::ResultBuffer<ffi::S32> lengths,
                            ffi::ResultBuffer<ffi::PRED> valid, ffi::RemainingRets fields_out, int64_t handle,
                            int64_t spec_hash, int32_t method, float priority_exponent, int32_t window,
                            ffi::Span<const int64_t> fields, int32_t steps) {
  constexpr const char* kOp = "sample_gather";
  ScopedDevice scope(device);
  if (scope.status() != cudaSuccess) return CudaFailure(kOp, "cannot select the CUDA device", scope.status());
  CudaTable t;
  if (ffi::Error error = Open(handle, spec_hash, device, kOp, &t); error.failure()) return error;
  SampleRequest request;
  if (ffi::Error error = PrepareSample(seed.element_count(), method, priority_exponent, window,
                                       indices->element_count(), &request);
      error.failure()) {
    return error;
  }
  const size_t picks = indices->element_count();
  if (generations->element_count() != picks || probabilities->element_count() != picks ||
      starts->element_count() != picks || lengths->element_count() != picks) {
    return OpError(ffi::ErrorCode::kInvalidArgument, kOp,
                   "indices, generations, probabilities, starts and lengths must have one entry per pick");
  }
  GatherRequest gather;
  GatherOutputs out;
  if (ffi::Error error =
          PrepareGather(t.view, picks, picks, picks, valid, fields_out, fields, steps, &gather, &out);
      error.failure()) {
    return error;
  }
  SampleResult result{indices->typed_data(),
                      generations->typed_data(),
                      probabilities->typed_data(),
                      starts->typed_data(),
                      nullptr,
                      selectable->typed_data(),
                      lengths->typed_data()};
  if (ffi::Error error = SamplesOnHost(t) ? EnqueueHostSample(stream, device, t, handle, &request, nullptr,
                                                              seed.typed_data(), nullptr, result,
                                                              static_cast<int64_t>(picks), kOp)
                                          : EnqueueSample(stream, scratch, t, handle, request,
                                                          priority_exponent, seed.typed_data(), result, kOp);
      error.failure()) {
    return error;
  }
  return Launched(GatherRowsCuda(t.view, result.indices, result.generations, result.starts, gather, out,
                                 t.side->error_device, stream, result.lengths),
                  kOp);
}

// Whether update_priorities scatters on the host on `device` (see the top of this file).
bool ScatterOnHost(int32_t device) {
  const char* forced = std::getenv("GEAR_JAX_HOST_SCATTER");
  if (forced != nullptr && std::strcmp(forced, "1") == 0) return true;
  if (forced != nullptr && std::strcmp(forced, "0") == 0) return false;  // tests: no concurrent writer
  return !HostNativeAtomics(device);
}

// Table references that host callbacks held when the table had been closed in the meantime. A callback
// must not drop what may be the last reference: ~SharedTable unregisters the memory and waits for the
// devices, CUDA calls that a host callback may not make. So it parks the reference here, and the next
// create or close of a table in this process drops it (from Python's thread, not from inside an XLA
// execution): a table closed while an update was in flight stays mapped until then.
class RetiredTables {
 public:
  static RetiredTables& Get() {
    static RetiredTables* retired = new RetiredTables();  // never destroyed: callbacks may run during exit
    return *retired;
  }

  void Park(std::shared_ptr<SharedTable> table) {
    std::lock_guard<std::mutex> lock(mutex_);
    tables_.push_back(std::move(table));
  }

  // On a thread that may make CUDA calls, outside any XLA execution.
  void DropAll() {
    std::vector<std::shared_ptr<SharedTable>> dropped;  // released outside the lock
    std::lock_guard<std::mutex> lock(mutex_);
    dropped.swap(tables_);
  }

 private:
  std::mutex mutex_;
  std::vector<std::shared_ptr<SharedTable>> tables_;
};

// A refresh of a GPU's priority index (xla_ffi/priority_indexes.h), owned by its host callback.
struct IndexRefresh {
  std::shared_ptr<SharedTable> table;  // keeps the mapping and its host view until the callback ran
  int64_t handle;
  std::shared_ptr<IndexSlot> slot;  // the table's index list keeps it too: never the last reference here
};

// The host callback (cudaHostFn_t): brings the index up to the rows before the stream's next kernel
// reads it. Makes no CUDA call.
void RunIndexRefresh(void* arg) {
  std::unique_ptr<IndexRefresh> call(static_cast<IndexRefresh*>(arg));
  {
    std::lock_guard<std::mutex> lock(call->slot->busy);
    try {
      call->slot->index->Refresh(call->table->view());
    } catch (const std::exception&) {
      // Out of host memory for the refresh's list: the walk reads the tree as it was, and every pick
      // still checks that its row is as the index saw it.
    }
  }
  call->slot.reset();
  if (!ReleaseWhileRegistered(call->handle, &call->table)) RetiredTables::Get().Park(std::move(call->table));
}

// The index of `exponent` for this call's stream, with its refresh enqueued ahead of the kernel that
// reads it; *slot stays null when the table keeps PriorityIndexes::kMaxDeviceIndexes others (the call
// then scans every row, as before the index).
ffi::Error EnqueueIndexRefresh(cudaStream_t stream, const CudaTable& t, int64_t handle, float exponent,
                               const char* op, std::shared_ptr<IndexSlot>* slot) {
  try {
    *slot = t.table->priority_indexes().ForDevice(reinterpret_cast<uintptr_t>(stream),
                                                  t.table->view().capacity, exponent, MappedIndexMemory);
  } catch (const std::bad_alloc&) {
    return OpError(ffi::ErrorCode::kResourceExhausted, op,
                   "cannot allocate pinned host memory for the priority index of table '" + t.table->name() +
                       "' (about 16 bytes per row)");
  }
  if (*slot == nullptr) return ffi::Error::Success();
  auto call = std::unique_ptr<IndexRefresh>(new IndexRefresh{t.table, handle, *slot});
  const cudaError_t status = cudaLaunchHostFunc(stream, RunIndexRefresh, call.get());
  if (status != cudaSuccess) {
    cudaGetLastError();
    return CudaFailure(op, "cannot enqueue the priority index's refresh", status);
  }
  call.release();  // the callback owns it now
  return ffi::Error::Success();
}

// The end of a handler that staged its inputs in `chunk` and enqueued work on `stream`: gives the chunk
// back once the stream is past that work (whatever was enqueued), and fails with `what` when an
// enqueue failed (`status`), or when the release could not be recorded.
ffi::Error FinishStagedCall(HostStaging* pool, HostStaging::Chunk* chunk, cudaStream_t stream,
                            cudaError_t status, const char* op, const char* what) {
  if (status != cudaSuccess) cudaGetLastError();  // reported here, not by a later launch check
  const cudaError_t released = pool->Release(chunk, stream);
  if (status != cudaSuccess) return CudaFailure(op, what, status);
  if (released != cudaSuccess) return CudaFailure(op, "cannot record the staging memory's release", released);
  return ffi::Error::Success();
}

// Where the arrays of a host scatter lie in its staging chunk.
struct ScatterStaging {
  int32_t* count;
  int32_t* indices;
  uint32_t* generations;
  float* priorities;

  ScatterStaging(ScratchCarver& carver, int64_t n)
      : count(carver.Take<int32_t>(1)),
        indices(carver.Take<int32_t>(n)),
        generations(carver.Take<uint32_t>(n)),
        priorities(carver.Take<float>(n)) {}
};

// One host scatter in flight, owned by its host callback.
struct HostScatter {
  std::shared_ptr<SharedTable> table;  // keeps the mapping and its host view until the callback ran
  int64_t handle;                      // the table's registry handle
  DeviceError* error;                  // host address of the table's error record for the device
  ScatterStaging staging;
  int64_t n;
};

// The host callback (cudaHostFn_t): runs after the inputs reached the staging and before the count is
// copied out of it. Makes no CUDA call.
void RunHostScatter(void* arg) {
  std::unique_ptr<HostScatter> call(static_cast<HostScatter*>(arg));
  const ScatterStaging& s = call->staging;
  KernelStatus status;
  {
    CounterWindow window(*call->table);  // as on the CPU (counter_window.h)
    status =
        ScatterPrioritiesCpu(call->table->view(), s.indices, s.generations, s.priorities, call->n, s.count);
  }
  if (!status.ok()) {  // the record CheckKernel (kernels/priorities.cu) would leave
    *s.count = 0;
    ReportErrorFromHost(call->error, status.site, status.element, status.value, status.limit);
  }
  if (!ReleaseWhileRegistered(call->handle, &call->table)) RetiredTables::Get().Park(std::move(call->table));
}

// Enqueues the scatter of `n` > 0 entries on the host, in the order of `stream`, without waiting for it.
ffi::Error EnqueueHostScatter(cudaStream_t stream, int32_t device, const CudaTable& t, int64_t handle,
                              const int32_t* indices, const uint32_t* generations, const float* priorities,
                              int64_t n, int32_t* updated) {
  constexpr const char* kOp = "update_priorities";
  HostStaging* pool = HostStaging::ForDevice(device);  // Open checked the device is one a table supports
  ScratchCarver sizer(nullptr);
  const ScatterStaging layout(sizer, n);
  HostStaging::Chunk* chunk;
  if (cudaError_t status = pool->Acquire(sizer.bytes(), &chunk); status != cudaSuccess) {
    return CudaFailure(kOp, "cannot allocate pinned host staging memory", status);
  }
  ScratchCarver carver(chunk->data);
  auto call = std::unique_ptr<HostScatter>(
      new HostScatter{t.table, handle, t.side->error_host, ScatterStaging(carver, n), n});
  const ScatterStaging s = call->staging;  // a copy: the callback may free `call` before the last copy
  const char* what = "cannot copy the update to the host";
  cudaError_t status =
      cudaMemcpyAsync(s.indices, indices, n * sizeof(int32_t), cudaMemcpyDeviceToHost, stream);
  if (status == cudaSuccess) {
    status =
        cudaMemcpyAsync(s.generations, generations, n * sizeof(uint32_t), cudaMemcpyDeviceToHost, stream);
  }
  if (status == cudaSuccess) {
    status = cudaMemcpyAsync(s.priorities, priorities, n * sizeof(float), cudaMemcpyDeviceToHost, stream);
  }
  if (status == cudaSuccess) {
    what = "cannot enqueue the host scatter";
    status = cudaLaunchHostFunc(stream, RunHostScatter, call.get());
    if (status == cudaSuccess) call.release();  // the callback owns it now
  }
  if (status == cudaSuccess) {
    what = "cannot copy the updated count to the device";
    status = cudaMemcpyAsync(updated, s.count, sizeof(int32_t), cudaMemcpyHostToDevice, stream);
  }
  return FinishStagedCall(pool, chunk, stream, status, kOp, what);
}

// Where the arrays of a queue's host consumption lie in its staging chunk.
struct ConsumeStaging {
  int32_t* indices;
  uint32_t* generations;
  bool* delivered;
  bool* consumed;

  ConsumeStaging(ScratchCarver& carver, int64_t n)
      : indices(carver.Take<int32_t>(n)),
        generations(carver.Take<uint32_t>(n)),
        delivered(carver.Take<bool>(n)),
        consumed(carver.Take<bool>(n)) {}
};

// One host consumption in flight, owned by its host callback.
struct HostConsume {
  std::shared_ptr<SharedTable> table;  // keeps the mapping and its host view until the callback ran
  int64_t handle;
  DeviceError* error;
  ConsumeStaging staging;
  int64_t n;
};

// The host callback of a queue's consumption: ConsumePicksCpu on the table's host view (the compare-and-
// swaps of the state words must be atomic against the CPU writers' claims, which a GPU over PCIe cannot
// make), between the copies of its inputs in and of `consumed` out. Makes no CUDA call.
void RunHostConsume(void* arg) {
  std::unique_ptr<HostConsume> call(static_cast<HostConsume*>(arg));
  const ConsumeStaging& s = call->staging;
  const KernelStatus status =
      call->table->Consume(s.indices, s.generations, s.delivered, call->n, s.consumed);
  if (!status.ok()) {
    for (int64_t i = 0; i < call->n; ++i) s.consumed[i] = false;
    ReportErrorFromHost(call->error, status.site, status.element, status.value, status.limit);
  }
  if (!ReleaseWhileRegistered(call->handle, &call->table)) RetiredTables::Get().Park(std::move(call->table));
}

// A queue's consumption (cpu_handlers.cc, ConsumeImpl) in a GPU program: always on the host, in the order
// of the stream (the picks' copies come first), without waiting for it.
ffi::Error ConsumeImpl(cudaStream_t stream, int32_t device, ffi::Buffer<ffi::S32> indices,
                       ffi::Buffer<ffi::U32> generations, ffi::Buffer<ffi::PRED> delivered,
                       ffi::ResultBuffer<ffi::PRED> consumed, int64_t handle, int64_t spec_hash) {
  constexpr const char* kOp = "consume";
  ScopedDevice scope(device);
  if (scope.status() != cudaSuccess) return CudaFailure(kOp, "cannot select the CUDA device", scope.status());
  CudaTable t;
  if (ffi::Error error = Open(handle, spec_hash, device, kOp, &t); error.failure()) return error;
  if (ffi::Error error = CheckConsume(indices.element_count(), generations.element_count(),
                                      delivered.element_count(), consumed->element_count());
      error.failure()) {
    return error;
  }
  const int64_t n = static_cast<int64_t>(indices.element_count());
  if (n == 0) return ffi::Error::Success();
  HostStaging* pool = HostStaging::ForDevice(device);
  ScratchCarver sizer(nullptr);
  const ConsumeStaging layout(sizer, n);
  HostStaging::Chunk* chunk;
  if (cudaError_t status = pool->Acquire(sizer.bytes(), &chunk); status != cudaSuccess) {
    return CudaFailure(kOp, "cannot allocate pinned host staging memory", status);
  }
  ScratchCarver carver(chunk->data);
  auto call = std::unique_ptr<HostConsume>(
      new HostConsume{t.table, handle, t.side->error_host, ConsumeStaging(carver, n), n});
  const ConsumeStaging s = call->staging;  // a copy: the callback may free `call` before the last copy
  const char* what = "cannot copy the picks to the host";
  cudaError_t status =
      cudaMemcpyAsync(s.indices, indices.typed_data(), n * sizeof(int32_t), cudaMemcpyDeviceToHost, stream);
  if (status == cudaSuccess) {
    status = cudaMemcpyAsync(s.generations, generations.typed_data(), n * sizeof(uint32_t),
                             cudaMemcpyDeviceToHost, stream);
  }
  if (status == cudaSuccess) {
    status = cudaMemcpyAsync(s.delivered, delivered.typed_data(), n * sizeof(bool), cudaMemcpyDeviceToHost,
                             stream);
  }
  if (status == cudaSuccess) {
    what = "cannot enqueue the host consumption";
    status = cudaLaunchHostFunc(stream, RunHostConsume, call.get());
    if (status == cudaSuccess) call.release();  // the callback owns it now
  }
  if (status == cudaSuccess) {
    what = "cannot copy the consumed picks to the device";
    status =
        cudaMemcpyAsync(consumed->typed_data(), s.consumed, n * sizeof(bool), cudaMemcpyHostToDevice, stream);
  }
  return FinishStagedCall(pool, chunk, stream, status, kOp, what);
}

// Where the arrays of a sample made on the host lie in its staging chunk: the key (and sample_at's
// targets) copied in, the picks copied out (the optional ones where the call has them).
struct SampleStaging {
  uint32_t* seed;
  float* targets;
  int32_t* indices;
  uint32_t* generations;
  float* probabilities;
  int32_t* starts;
  uint64_t* order_keys;
  int32_t* selectable;
  int32_t* lengths;

  SampleStaging(ScratchCarver& carver, int64_t n, bool with_targets, const SampleResult& out)
      : seed(carver.Take<uint32_t>(2)),
        targets(with_targets ? carver.Take<float>(n) : nullptr),
        indices(carver.Take<int32_t>(n)),
        generations(carver.Take<uint32_t>(n)),
        probabilities(carver.Take<float>(n)),
        starts(carver.Take<int32_t>(n)),
        order_keys(out.order_keys != nullptr ? carver.Take<uint64_t>(n) : nullptr),
        selectable(out.selectable != nullptr ? carver.Take<int32_t>(1) : nullptr),
        lengths(out.lengths != nullptr ? carver.Take<int32_t>(n) : nullptr) {}

  SampleResult picks() const {
    return {indices, generations, probabilities, starts, order_keys, selectable, lengths};
  }
};

// One sample on the host in flight, owned by its host callback.
struct HostSample {
  std::shared_ptr<SharedTable> table;  // keeps the mapping and its host view until the callback ran
  int64_t handle;
  DeviceError* error;
  SampleStaging staging;
  int64_t n;
  bool at;                     // sample_at's picks, of `at_request`; else `request`'s
  SampleRequest request;       // without its seed words: the callback reads them from the staging
  SampleAtRequest at_request;  // likewise
};

// The host callback of a sample made on the host: the CPU kernels on the table's host view (host_draw.h:
// the picks a CPU program makes for the key, with the CPU's atomics), between the copies of the key in
// and of the picks out. On an error, every pick is a failed one and the error is recorded for the next
// call, as the kernels do. Makes no CUDA call.
void RunHostSample(void* arg) {
  std::unique_ptr<HostSample> call(static_cast<HostSample*>(arg));
  const SampleStaging& s = call->staging;
  const SampleResult picks = s.picks();
  KernelStatus status;
  try {
    if (call->at) {
      SampleAtRequest request = call->at_request;
      request.seed0 = s.seed[0];
      request.seed1 = s.seed[1];
      status = DrawAtOnHost(*call->table, request, s.targets, picks);
    } else {
      SampleRequest request = call->request;
      request.seed0 = s.seed[0];
      request.seed1 = s.seed[1];
      status = DrawOnHost(*call->table, request, picks, nullptr, GatherOutputs{}, SerialFor());
    }
  } catch (const std::bad_alloc&) {
    status = KernelError(ErrorSite::kHostSampleMemory);
  } catch (const std::exception&) {  // none may leave a host callback
    status = KernelError(ErrorSite::kHostSampleFailed);
  }
  if (!status.ok()) {  // what the kernels leave on an error
    for (int64_t i = 0; i < call->n; ++i) {
      RecordFailed(picks, i);
      if (picks.order_keys != nullptr) picks.order_keys[i] = kNoCandidate;
    }
    if (picks.selectable != nullptr) *picks.selectable = 0;
    ReportErrorFromHost(call->error, status.site, status.element, status.value, status.limit);
  }
  if (!ReleaseWhileRegistered(call->handle, &call->table)) RetiredTables::Get().Park(std::move(call->table));
}

ffi::Error EnqueueHostSample(cudaStream_t stream, int32_t device, const CudaTable& t, int64_t handle,
                             const SampleRequest* request, const SampleAtRequest* at_request,
                             const uint32_t* seed, const float* targets, const SampleResult& out,
                             int64_t picks, const char* op) {
  if (picks == 0) return ffi::Error::Success();
  HostStaging* pool = HostStaging::ForDevice(device);  // Open checked the device is one a table supports
  ScratchCarver sizer(nullptr);
  const SampleStaging layout(sizer, picks, targets != nullptr, out);
  HostStaging::Chunk* chunk;
  if (cudaError_t status = pool->Acquire(sizer.bytes(), &chunk); status != cudaSuccess) {
    return CudaFailure(op, "cannot allocate pinned host staging memory", status);
  }
  ScratchCarver carver(chunk->data);
  auto call = std::unique_ptr<HostSample>(
      new HostSample{t.table, handle, t.side->error_host,
                     SampleStaging(carver, picks, targets != nullptr, out), picks, at_request != nullptr,
                     request ? *request : SampleRequest{}, at_request ? *at_request : SampleAtRequest{}});
  const SampleStaging s = call->staging;  // a copy: the callback may free `call` before the last copy
  const char* what = "cannot copy the key to the host";
  cudaError_t status = cudaMemcpyAsync(s.seed, seed, 2 * sizeof(uint32_t), cudaMemcpyDeviceToHost, stream);
  if (status == cudaSuccess && s.targets != nullptr) {
    what = "cannot copy the targets to the host";
    status = cudaMemcpyAsync(s.targets, targets, picks * sizeof(float), cudaMemcpyDeviceToHost, stream);
  }
  if (status == cudaSuccess) {
    what = "cannot enqueue the sample on the host";
    status = cudaLaunchHostFunc(stream, RunHostSample, call.get());
    if (status == cudaSuccess) call.release();  // the callback owns it now
  }
  // The picks, out: each array the call has.
  if (status == cudaSuccess) what = "cannot copy the picks to the device";
  auto copy_out = [&](void* to, const void* from, size_t bytes) {
    if (status == cudaSuccess && to != nullptr) {
      status = cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, stream);
    }
  };
  copy_out(out.indices, s.indices, picks * sizeof(int32_t));
  copy_out(out.generations, s.generations, picks * sizeof(uint32_t));
  copy_out(out.probabilities, s.probabilities, picks * sizeof(float));
  copy_out(out.starts, s.starts, picks * sizeof(int32_t));
  copy_out(out.order_keys, s.order_keys, picks * sizeof(uint64_t));
  copy_out(out.selectable, s.selectable, sizeof(int32_t));
  copy_out(out.lengths, s.lengths, picks * sizeof(int32_t));
  return FinishStagedCall(pool, chunk, stream, status, op, what);
}

// A counter window that stays open while a priority kernel may run: opened by the handler before the
// launch, closed by a host callback enqueued after the kernel (a process killed meanwhile leaves the
// window open in its writer slot, and the counters are recounted; counter_window.h). Deleting it
// closes the window: a launch that fails closes it at once.
struct WindowAfterKernel {
  std::shared_ptr<SharedTable> table;  // keeps the mapping until the callback ran
  int64_t handle;
  CounterWindow window;
};

// The host callback (cudaHostFn_t) that closes the window. Makes no CUDA call.
void CloseWindowAfterKernel(void* arg) {
  std::unique_ptr<WindowAfterKernel> after(static_cast<WindowAfterKernel*>(arg));
  after->window.Close();  // before the table may go
  if (!ReleaseWhileRegistered(after->handle, &after->table))
    RetiredTables::Get().Park(std::move(after->table));
}

ffi::Error UpdatePrioritiesImpl(cudaStream_t stream, int32_t device, ffi::ScratchAllocator scratch,
                                ffi::Buffer<ffi::S32> indices, ffi::Buffer<ffi::U32> generations,
                                ffi::Buffer<ffi::F32> priorities, ffi::AnyBuffer /*after*/,
                                ffi::ResultBuffer<ffi::S32> updated, int64_t handle, int64_t spec_hash) {
  constexpr const char* kOp = "update_priorities";
  ScopedDevice scope(device);
  if (scope.status() != cudaSuccess) return CudaFailure(kOp, "cannot select the CUDA device", scope.status());
  CudaTable t;
  if (ffi::Error error = Open(handle, spec_hash, device, kOp, &t); error.failure()) return error;
  if (ffi::Error error = CheckUpdatePriorities(indices.element_count(), generations.element_count(),
                                               priorities.element_count());
      error.failure()) {
    return error;
  }
  const int64_t n = static_cast<int64_t>(indices.element_count());
  // An empty update only zeroes the count: the kernel path does that without a kernel.
  if (n > 0 && ScatterOnHost(device)) {
    return EnqueueHostScatter(stream, device, t, handle, indices.typed_data(), generations.typed_data(),
                              priorities.typed_data(), n, updated->typed_data());
  }
  const TableView& view = t.view;
  void* memory;
  if (ffi::Error error = AllocateScratch(scratch, ScatterPrioritiesScratchBytes(view, n), kOp, &memory);
      error.failure()) {
    return error;
  }
  auto window =
      std::unique_ptr<WindowAfterKernel>(new WindowAfterKernel{t.table, handle, CounterWindow(*t.table)});
  const cudaError_t launched =
      ScatterPrioritiesCuda(view, indices.typed_data(), generations.typed_data(), priorities.typed_data(), n,
                            memory, updated->typed_data(), t.side->error_device, stream);
  const cudaError_t enqueued =
      launched == cudaSuccess ? cudaLaunchHostFunc(stream, CloseWindowAfterKernel, window.get()) : launched;
  if (enqueued == cudaSuccess) {
    window.release();  // the callback owns it now
    return ffi::Error::Success();
  }
  // Not launched, or no callback: nothing will close the window later. Close it now (a kernel that
  // was launched then runs outside a window, as before windows existed).
  window.reset();
  if (launched != cudaSuccess) return Launched(launched, kOp);
  cudaGetLastError();  // reported here, not by a later launch check
  return CudaFailure(kOp, "cannot enqueue the end of the update's counter window", enqueued);
}

// Where the arrays of an insert lie in its staging chunk: the row ids the host writes, the priorities and
// lengths when the call has them, and every field's bytes.
struct InsertStaging {
  int32_t* rows;
  float* priorities;
  int32_t* lengths;
  std::vector<const uint8_t*> fields;

  InsertStaging(ScratchCarver& carver, const InsertRequest& request)
      : rows(carver.Take<int32_t>(request.batch)),
        priorities(request.priorities == InsertPriorities::kGiven ? carver.Take<float>(request.batch)
                                                                  : nullptr),
        lengths(request.lengths ? carver.Take<int32_t>(request.batch) : nullptr) {
    for (int64_t bytes : request.field_bytes) fields.push_back(carver.Take<uint8_t>(bytes));
  }
};

// One insert in flight, owned by its host callback.
struct HostInsert {
  std::shared_ptr<SharedTable> table;  // keeps the mapping and its host view until the callback ran
  int64_t handle;
  DeviceError* error;  // host address of the table's error record for the device
  InsertStaging staging;
  InsertRequest request;  // its field_data are the device's; the callback reads the staging's
};

// The host callback (cudaHostFn_t): runs after the batch reached the staging and before the row ids are
// copied out of it. The claim, copy and publication are the host insert's (SharedTable::Insert, CPU
// atomics), so that they stay atomic against writers on the CPU over PCIe. Makes no CUDA call.
void RunHostInsert(void* arg) {
  std::unique_ptr<HostInsert> call(static_cast<HostInsert*>(arg));
  const InsertStaging& s = call->staging;
  KernelStatus status;
  try {
    status = InsertRows(*call->table, call->request, s.fields, s.priorities, s.lengths, s.rows);
  } catch (const std::exception&) {
    status = KernelError(ErrorSite::kInsertFailed);
  }
  if (!status.ok()) {  // no row written: the ids say so, and the next call on the table reports why
    for (int64_t b = 0; b < call->request.batch; ++b) s.rows[b] = -1;
    ReportErrorFromHost(call->error, status.site, status.element, status.value, status.limit);
  }
  if (!ReleaseWhileRegistered(call->handle, &call->table)) RetiredTables::Get().Park(std::move(call->table));
}

// An insert inside a jitted program on a GPU: the batch is copied into pinned staging memory in the
// stream's order, a host callback inserts it (RunHostInsert), and the row ids are copied back. The
// handler never waits for the stream.
ffi::Error InsertImpl(cudaStream_t stream, int32_t device, ffi::Buffer<ffi::F32> priorities,
                      ffi::Buffer<ffi::S32> lengths, ffi::AnyBuffer /*after*/, ffi::RemainingArgs fields,
                      ffi::ResultBuffer<ffi::S32> rows, int64_t handle, int64_t spec_hash, int32_t steps,
                      int32_t priority_mode) {
  constexpr const char* kOp = "insert";
  ScopedDevice scope(device);
  if (scope.status() != cudaSuccess) return CudaFailure(kOp, "cannot select the CUDA device", scope.status());
  CudaTable t;
  if (ffi::Error error = Open(handle, spec_hash, device, kOp, &t); error.failure()) return error;
  InsertRequest request;
  if (ffi::Error error =
          PrepareInsert(t.table->view(), fields, priorities.element_count(), lengths.element_count(),
                        rows->element_count(), steps, priority_mode, &request);
      error.failure()) {
    return error;
  }
  if (request.batch == 0) return ffi::Error::Success();
  HostStaging* pool = HostStaging::ForDevice(device);  // Open checked the device is one a table supports
  ScratchCarver sizer(nullptr);
  const InsertStaging layout(sizer, request);
  HostStaging::Chunk* chunk;
  if (cudaError_t status = pool->Acquire(sizer.bytes(), &chunk); status != cudaSuccess) {
    return CudaFailure(kOp, "cannot allocate pinned host staging memory", status);
  }
  ScratchCarver carver(chunk->data);
  auto call = std::unique_ptr<HostInsert>(
      new HostInsert{t.table, handle, t.side->error_host, InsertStaging(carver, request), request});
  const InsertStaging& s = call->staging;
  int32_t* const staged_rows = s.rows;  // read after the launch, when the callback may have freed `call`
  const char* what = "cannot copy the batch to the host";
  const size_t row_bytes = static_cast<size_t>(request.batch) * sizeof(int32_t);
  cudaError_t status = cudaSuccess;
  if (s.priorities != nullptr) {
    status = cudaMemcpyAsync(s.priorities, priorities.typed_data(), static_cast<size_t>(request.batch) * 4,
                             cudaMemcpyDeviceToHost, stream);
  }
  if (status == cudaSuccess && s.lengths != nullptr) {
    status = cudaMemcpyAsync(s.lengths, lengths.typed_data(), row_bytes, cudaMemcpyDeviceToHost, stream);
  }
  for (size_t f = 0; f < s.fields.size() && status == cudaSuccess; ++f) {
    status = cudaMemcpyAsync(const_cast<uint8_t*>(s.fields[f]), request.field_data[f],
                             static_cast<size_t>(request.field_bytes[f]), cudaMemcpyDeviceToHost, stream);
  }
  if (status == cudaSuccess) {
    what = "cannot enqueue the host insert";
    status = cudaLaunchHostFunc(stream, RunHostInsert, call.get());
    if (status == cudaSuccess) call.release();  // the callback owns it now
  }
  if (status == cudaSuccess) {
    what = "cannot copy the row ids to the device";
    status = cudaMemcpyAsync(rows->typed_data(), staged_rows, row_bytes, cudaMemcpyHostToDevice, stream);
  }
  return FinishStagedCall(pool, chunk, stream, status, kOp, what);
}

ffi::Error TotalWeightImpl(cudaStream_t stream, int32_t device, ffi::ScratchAllocator scratch,
                           ffi::AnyBuffer /*after*/, ffi::ResultBuffer<ffi::F32> total,
                           ffi::ResultBuffer<ffi::S32> count, int64_t handle, int64_t spec_hash,
                           float priority_exponent, int32_t window, int32_t window_law) {
  constexpr const char* kOp = "total_weight";
  ScopedDevice scope(device);
  if (scope.status() != cudaSuccess) return CudaFailure(kOp, "cannot select the CUDA device", scope.status());
  CudaTable t;
  if (ffi::Error error = Open(handle, spec_hash, device, kOp, &t); error.failure()) return error;
  if (ffi::Error error = CheckTotalWeight(priority_exponent, total->element_count(), count->element_count());
      error.failure()) {
    return error;
  }
  WindowLaw law;
  if (ffi::Error error = CheckWindowLaw(window, window_law, &law); error.failure()) return error;
  if (priority_exponent == 0.0f && !law.counts_windows()) {  // the count alone (sample_at.h): the counter
    return Launched(TotalFromCounterCuda(t.view, total->typed_data(), count->typed_data(), stream), kOp);
  }
  std::shared_ptr<IndexSlot> slot;
  if (!law.counts_windows()) {  // windows are counted by the scan below
    if (ffi::Error error = EnqueueIndexRefresh(stream, t, handle, priority_exponent, kOp, &slot);
        error.failure()) {
      return error;
    }
  }
  if (slot != nullptr) {
    return Launched(TotalWeightIndexedCuda(t.view, slot->index->DeviceView(), total->typed_data(),
                                           count->typed_data(), t.side->error_device, stream),
                    kOp);
  }
  const int64_t rows = t.table->view().capacity;  // the kernels read the claimed rows (claimed_rows.cuh)
  void* memory;
  if (ffi::Error error = AllocateScratch(scratch, TotalWeightScratchBytes(rows), kOp, &memory);
      error.failure()) {
    return error;
  }
  return Launched(TotalWeightCuda(t.view, priority_exponent, law, rows, memory, total->typed_data(),
                                  count->typed_data(), t.side->error_device, stream),
                  kOp);
}

ffi::Error SampleAtImpl(cudaStream_t stream, int32_t device, ffi::ScratchAllocator scratch,
                        ffi::Buffer<ffi::U32> seed, ffi::Buffer<ffi::F32> targets, ffi::AnyBuffer /*after*/,
                        ffi::ResultBuffer<ffi::S32> indices, ffi::ResultBuffer<ffi::U32> generations,
                        ffi::ResultBuffer<ffi::F32> probabilities, ffi::ResultBuffer<ffi::S32> starts,
                        int64_t handle, int64_t spec_hash, float priority_exponent, int32_t window) {
  constexpr const char* kOp = "sample_at";
  ScopedDevice scope(device);
  if (scope.status() != cudaSuccess) return CudaFailure(kOp, "cannot select the CUDA device", scope.status());
  CudaTable t;
  if (ffi::Error error = Open(handle, spec_hash, device, kOp, &t); error.failure()) return error;
  SampleAtRequest request;
  if (ffi::Error error = PrepareSampleAt(seed.element_count(), targets.element_count(), priority_exponent,
                                         window, indices->element_count(), generations->element_count(),
                                         probabilities->element_count(), starts->element_count(), &request);
      error.failure()) {
    return error;
  }
  SampleResult out{indices->typed_data(), generations->typed_data(), probabilities->typed_data(),
                   starts->typed_data()};
  if (SamplesOnHost(t)) {
    return EnqueueHostSample(stream, device, t, handle, nullptr, &request, seed.typed_data(),
                             targets.typed_data(), out, request.batch_size, kOp);
  }
  if (request.batch_size > 0) {
    std::shared_ptr<IndexSlot> slot;
    if (ffi::Error error = EnqueueIndexRefresh(stream, t, handle, priority_exponent, kOp, &slot);
        error.failure()) {
      return error;
    }
    if (slot != nullptr) {
      return Launched(SampleAtIndexedCuda(t.view, slot->index->DeviceView(), request, seed.typed_data(),
                                          targets.typed_data(), out, t.side->error_device, stream),
                      kOp);
    }
  }
  const int64_t rows = t.table->view().capacity;  // the kernels read the claimed rows (claimed_rows.cuh)
  void* memory;
  if (ffi::Error error = AllocateScratch(scratch, SampleAtScratchBytes(request, rows), kOp, &memory);
      error.failure()) {
    return error;
  }
  return Launched(SampleAtCuda(t.view, request, rows, seed.typed_data(), targets.typed_data(), memory, out,
                               t.side->error_device, stream),
                  kOp);
}

}  // namespace

void DropTablesLeftByHostCallbacks() { RetiredTables::Get().DropAll(); }

}  // namespace gear

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxSampleCuda, gear::SampleImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream: XLA's, for this call
                                  .Ctx<ffi::DeviceOrdinal>()                 // device: its CUDA device
                                  .Ctx<ffi::ScratchAllocator>()              // scratch: device memory
                                  .Arg<ffi::Buffer<ffi::U32>>()              // seed: uint32[2] from the key
                                  .Arg<ffi::AnyBuffer>()                     // after: ordering only
                                  .Ret<ffi::Buffer<ffi::S32>>()              // indices: int32[B]
                                  .Ret<ffi::Buffer<ffi::U32>>()              // generations: uint32[B]
                                  .Ret<ffi::Buffer<ffi::F32>>()              // probabilities: float32[B]
                                  .Ret<ffi::Buffer<ffi::S32>>()              // starts: int32[B]
                                  .Ret<ffi::Buffer<ffi::S32>>()              // selectable: int32[] count N
                                  .Ret<ffi::Buffer<ffi::S32>>()              // lengths: int32[B]
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash")
                                  .Attr<int32_t>("method")
                                  .Attr<float>("priority_exponent")
                                  .Attr<int32_t>("window"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxOrderedCandidatesCuda, gear::OrderedCandidatesImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream: XLA's, for this call
                                  .Ctx<ffi::DeviceOrdinal>()                 // device: its CUDA device
                                  .Ctx<ffi::ScratchAllocator>()              // scratch: device memory
                                  .Arg<ffi::Buffer<ffi::U32>>()              // seed: uint32[2] (windows)
                                  .Arg<ffi::AnyBuffer>()                     // after: ordering only
                                  .Ret<ffi::Buffer<ffi::S32>>()              // indices: int32[B]
                                  .Ret<ffi::Buffer<ffi::U32>>()              // generations: uint32[B]
                                  .Ret<ffi::Buffer<ffi::F32>>()              // probabilities: float32[B]
                                  .Ret<ffi::Buffer<ffi::S32>>()              // starts: int32[B]
                                  .Ret<ffi::Buffer<ffi::U32>>()              // order_keys: uint32[B, 2]
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash")
                                  .Attr<int32_t>("method")
                                  .Attr<int32_t>("window"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxGatherCuda, gear::GatherImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream: XLA's, for this call
                                  .Ctx<ffi::DeviceOrdinal>()                 // device: its CUDA device
                                  .Arg<ffi::Buffer<ffi::S32>>()              // indices: int32[B]
                                  .Arg<ffi::Buffer<ffi::U32>>()              // generations: uint32[B]
                                  .Arg<ffi::Buffer<ffi::S32>>()              // starts: int32[B]
                                  .Ret<ffi::Buffer<ffi::PRED>>()             // valid: bool[B, window]
                                  .RemainingRets()  // one [B, window, *shape] per field
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash")
                                  .Attr<ffi::Span<const int64_t>>("fields")
                                  .Attr<int32_t>("window"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxSampleGatherCuda, gear::SampleGatherImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream: XLA's, for this call
                                  .Ctx<ffi::DeviceOrdinal>()                 // device: its CUDA device
                                  .Ctx<ffi::ScratchAllocator>()              // scratch: device memory
                                  .Arg<ffi::Buffer<ffi::U32>>()              // seed: uint32[2] from the key
                                  .Arg<ffi::AnyBuffer>()                     // after: ordering only
                                  .Ret<ffi::Buffer<ffi::S32>>()              // indices: int32[B]
                                  .Ret<ffi::Buffer<ffi::U32>>()              // generations: uint32[B]
                                  .Ret<ffi::Buffer<ffi::F32>>()              // probabilities: float32[B]
                                  .Ret<ffi::Buffer<ffi::S32>>()              // starts: int32[B]
                                  .Ret<ffi::Buffer<ffi::S32>>()              // selectable: int32[] count N
                                  .Ret<ffi::Buffer<ffi::S32>>()              // lengths: int32[B]
                                  .Ret<ffi::Buffer<ffi::PRED>>()             // valid: bool[B, steps]
                                  .RemainingRets()  // one [B, steps, *shape] per field
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash")
                                  .Attr<int32_t>("method")
                                  .Attr<float>("priority_exponent")
                                  .Attr<int32_t>("window")
                                  .Attr<ffi::Span<const int64_t>>("fields")
                                  .Attr<int32_t>("steps"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxConsumeCuda, gear::ConsumeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::Buffer<ffi::S32>>()   // indices: int32[B]
                                  .Arg<ffi::Buffer<ffi::U32>>()   // generations: uint32[B]
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // delivered: bool[B]
                                  .Ret<ffi::Buffer<ffi::PRED>>()  // consumed: bool[B]
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxUpdatePrioritiesCuda, gear::UpdatePrioritiesImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream: XLA's, for this call
                                  .Ctx<ffi::DeviceOrdinal>()                 // device: its CUDA device
                                  .Ctx<ffi::ScratchAllocator>()              // scratch: device memory
                                  .Arg<ffi::Buffer<ffi::S32>>()              // indices: int32[B]
                                  .Arg<ffi::Buffer<ffi::U32>>()              // generations: uint32[B]
                                  .Arg<ffi::Buffer<ffi::F32>>()              // priorities: float32[B]
                                  .Arg<ffi::AnyBuffer>()                     // after: ordering only
                                  .Ret<ffi::Buffer<ffi::S32>>()              // updated: int32[] rows written
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxInsertCuda, gear::InsertImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream: XLA's, for this call
                                  .Ctx<ffi::DeviceOrdinal>()                 // device: its CUDA device
                                  .Arg<ffi::Buffer<ffi::F32>>()  // priorities: float32[B] ([0]: largest)
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lengths: int32[B] ([0]: steps each)
                                  .Arg<ffi::AnyBuffer>()         // after: ordering only
                                  .RemainingArgs()               // one [B, steps, *shape] per field, in order
                                  .Ret<ffi::Buffer<ffi::S32>>()  // rows: int32[B] row ids
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash")
                                  .Attr<int32_t>("steps")
                                  .Attr<int32_t>("priority_mode"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxTotalWeightCuda, gear::TotalWeightImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream: XLA's, for this call
                                  .Ctx<ffi::DeviceOrdinal>()                 // device: its CUDA device
                                  .Ctx<ffi::ScratchAllocator>()              // scratch: device memory
                                  .Arg<ffi::AnyBuffer>()                     // after: ordering only
                                  .Ret<ffi::Buffer<ffi::F32>>()              // total: float32[] sum of p^a
                                  .Ret<ffi::Buffer<ffi::S32>>()              // count: int32[] selectable rows
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash")
                                  .Attr<float>("priority_exponent")
                                  .Attr<int32_t>("window")        // windows of uniform picks (0: none)
                                  .Attr<int32_t>("window_law"));  // their law's flags (sample.h)

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxSampleAtCuda, gear::SampleAtImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream: XLA's, for this call
                                  .Ctx<ffi::DeviceOrdinal>()                 // device: its CUDA device
                                  .Ctx<ffi::ScratchAllocator>()              // scratch: device memory
                                  .Arg<ffi::Buffer<ffi::U32>>()              // seed: uint32[2] (windows)
                                  .Arg<ffi::Buffer<ffi::F32>>()              // targets: float32[B]
                                  .Arg<ffi::AnyBuffer>()                     // after: ordering only
                                  .Ret<ffi::Buffer<ffi::S32>>()              // indices: int32[B]
                                  .Ret<ffi::Buffer<ffi::U32>>()              // generations: uint32[B]
                                  .Ret<ffi::Buffer<ffi::F32>>()              // probabilities: float32[B]
                                  .Ret<ffi::Buffer<ffi::S32>>()              // starts: int32[B]
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash")
                                  .Attr<float>("priority_exponent")
                                  .Attr<int32_t>("window"));
