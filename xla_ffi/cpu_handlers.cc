#include "xla_ffi/cpu_handlers.h"

#include <sys/mman.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "kernels/atomics.h"
#include "kernels/gather.h"
#include "kernels/priorities.h"
#include "kernels/priority_index.h"
#include "kernels/sample.h"
#include "kernels/sample_at.h"
#include "xla/ffi/api/ffi.h"
#include "xla_ffi/handler_checks.h"
#include "xla_ffi/xla_parallel.h"

namespace ffi = xla::ffi;

namespace gear {
namespace {

// XLA hands a large result a freshly mapped buffer, whose first touch costs a page fault per 4 KiB
// (16,384 faults for 64 MiB, more time than the copy). Ask for transparent huge pages on the 2 MiB
// aligned part of large results; where the kernel has them off, this changes nothing.
void AdviseHugePages(void* data, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (bytes < 2 * kHuge) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

// The CPU's priority index of `exponent` for `table`, refreshed and held for the call; an error naming
// `op` when there is no memory for it (a first use builds it: about 17 bytes per row).
ffi::Error HoldIndex(SharedTable& table, float exponent, const char* op, PriorityIndexes::Held* held) {
  try {
    *held = table.priority_indexes().ForCpu(table.view(), exponent);
  } catch (const std::bad_alloc&) {
    return OpError(ffi::ErrorCode::kResourceExhausted, op,
                   "cannot allocate memory for the priority index of table '" + table.name() +
                       "' (about 17 bytes per row, per exponent)");
  }
  return ffi::Error::Success();
}

// The index a sample request needs (prioritized picks: over p^a; uniform windows of a step ring: over
// lengths), held in *held; *tree points at it, or is null for the other methods.
ffi::Error HoldIndexToSample(SharedTable& table, const SampleRequest& request, const char* op,
                             PriorityIndexes::Held* held, const PriorityTreeView** tree) {
  *tree = nullptr;
  const float exponent = IndexExponent(request);
  if (std::isnan(exponent) || request.batch_size == 0) return ffi::Error::Success();
  if (ffi::Error error = HoldIndex(table, exponent, op, held); error.failure()) return error;
  *tree = &held->view();
  return ffi::Error::Success();
}

ffi::Error SampleImpl(ffi::Buffer<ffi::U32> seed, ffi::AnyBuffer /*after*/,
                      ffi::ResultBuffer<ffi::S32> indices, ffi::ResultBuffer<ffi::U32> generations,
                      ffi::ResultBuffer<ffi::F32> probabilities, ffi::ResultBuffer<ffi::S32> starts,
                      ffi::ResultBuffer<ffi::S32> selectable, ffi::ResultBuffer<ffi::S32> lengths,
                      ffi::ThreadPool pool, int64_t handle, int64_t spec_hash, int32_t method,
                      float priority_exponent, int32_t window) {
  std::shared_ptr<SharedTable> table;
  if (ffi::Error error = ResolveTable(handle, spec_hash, &table); error.failure()) return error;
  SampleRequest request;
  if (ffi::Error error = PrepareSample(seed.element_count(), method, priority_exponent, window,
                                       indices->element_count(), &request);
      error.failure()) {
    return error;
  }
  request.seed0 = seed.typed_data()[0];
  request.seed1 = seed.typed_data()[1];
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
  PriorityIndexes::Held index;
  const PriorityTreeView* tree;
  if (ffi::Error error = HoldIndexToSample(*table, request, "sample", &index, &tree); error.failure()) {
    return error;
  }
  return KernelFailure(SampleRowsCpu(table->view(), request, out, tree, XlaParallelFor(pool)));
}

ffi::Error OrderedCandidatesImpl(ffi::Buffer<ffi::U32> seed, ffi::AnyBuffer /*after*/,
                                 ffi::ResultBuffer<ffi::S32> indices, ffi::ResultBuffer<ffi::U32> generations,
                                 ffi::ResultBuffer<ffi::F32> probabilities,
                                 ffi::ResultBuffer<ffi::S32> starts, ffi::ResultBuffer<ffi::U32> order_keys,
                                 int64_t handle, int64_t spec_hash, int32_t method, int32_t window) {
  std::shared_ptr<SharedTable> table;
  if (ffi::Error error = ResolveTable(handle, spec_hash, &table); error.failure()) return error;
  SampleRequest request;
  if (ffi::Error error =
          PrepareOrderedCandidates(seed.element_count(), method, window, indices->element_count(),
                                   order_keys->element_count(), &request);
      error.failure()) {
    return error;
  }
  request.seed0 = seed.typed_data()[0];
  request.seed1 = seed.typed_data()[1];
  SampleResult out{indices->typed_data(), generations->typed_data(), probabilities->typed_data(),
                   starts->typed_data(), reinterpret_cast<uint64_t*>(order_keys->typed_data())};
  return KernelFailure(SampleRowsCpu(table->view(), request, out));
}

ffi::Error ShuffleImpl(ffi::Buffer<ffi::U32> seed, ffi::Buffer<ffi::U32> generations,
                       ffi::ResultBuffer<ffi::S32> order) {
  if (seed.element_count() != 2 || generations.element_count() != order->element_count()) {
    return ffi::Error::InvalidArgument(
        "gear_jax shuffle: expected uint32[2] seed words and as many "
        "generations as order entries");
  }
  ShufflePicks(seed.typed_data()[0], seed.typed_data()[1], generations.typed_data(),
               static_cast<int64_t>(generations.element_count()), order->typed_data());
  return ffi::Error::Success();
}

ffi::Error GatherImpl(ffi::Buffer<ffi::S32> indices, ffi::Buffer<ffi::U32> generations,
                      ffi::Buffer<ffi::S32> starts, ffi::ResultBuffer<ffi::PRED> valid,
                      ffi::RemainingRets fields_out, ffi::ThreadPool pool, int64_t handle, int64_t spec_hash,
                      ffi::Span<const int64_t> fields, int32_t window) {
  std::shared_ptr<SharedTable> table;
  if (ffi::Error error = ResolveTable(handle, spec_hash, &table); error.failure()) return error;
  const TableView& view = table->view();
  GatherRequest request;
  GatherOutputs out;
  if (ffi::Error error =
          PrepareGather(view, indices.element_count(), generations.element_count(), starts.element_count(),
                        valid, fields_out, fields, window, &request, &out);
      error.failure()) {
    return error;
  }
  for (int32_t f = 0; f < request.num_fields; ++f) {
    AdviseHugePages(out.fields[f], static_cast<size_t>(request.batch_size * window *
                                                       view.fields[request.field_ids[f]].step_bytes));
  }
  return KernelFailure(GatherRowsCpu(view, indices.typed_data(), generations.typed_data(),
                                     starts.typed_data(), request, out, XlaParallelFor(pool)));
}

// sample + gather in one call: SampleImpl's picks, then GatherImpl's copy of them (one table lookup, one
// custom call; the selection has just read every picked row's state).
ffi::Error SampleGatherImpl(ffi::Buffer<ffi::U32> seed, ffi::AnyBuffer /*after*/,
                            ffi::ResultBuffer<ffi::S32> indices, ffi::ResultBuffer<ffi::U32> generations,
                            ffi::ResultBuffer<ffi::F32> probabilities, ffi::ResultBuffer<ffi::S32> starts,
                            ffi::ResultBuffer<ffi::S32> selectable, ffi::ResultBuffer<ffi::S32> lengths,
                            ffi::ResultBuffer<ffi::PRED> valid, ffi::RemainingRets fields_out,
                            ffi::ThreadPool pool, int64_t handle, int64_t spec_hash, int32_t method,
                            float priority_exponent, int32_t window, ffi::Span<const int64_t> fields,
                            int32_t steps) {
  std::shared_ptr<SharedTable> table;
  if (ffi::Error error = ResolveTable(handle, spec_hash, &table); error.failure()) return error;
  const TableView& view = table->view();
  SampleRequest request;
  if (ffi::Error error = PrepareSample(seed.element_count(), method, priority_exponent, window,
                                       indices->element_count(), &request);
      error.failure()) {
    return error;
  }
  request.seed0 = seed.typed_data()[0];
  request.seed1 = seed.typed_data()[1];
  const size_t picks = indices->element_count();
  if (generations->element_count() != picks || probabilities->element_count() != picks ||
      starts->element_count() != picks || lengths->element_count() != picks) {
    return OpError(ffi::ErrorCode::kInvalidArgument, "sample_gather",
                   "indices, generations, probabilities, starts and lengths must have one entry per pick");
  }
  GatherRequest gather;
  GatherOutputs out;
  if (ffi::Error error =
          PrepareGather(view, picks, picks, picks, valid, fields_out, fields, steps, &gather, &out);
      error.failure()) {
    return error;
  }
  for (int32_t f = 0; f < gather.num_fields; ++f) {
    AdviseHugePages(out.fields[f], static_cast<size_t>(gather.batch_size * steps *
                                                       view.fields[gather.field_ids[f]].step_bytes));
  }
  SampleResult result{indices->typed_data(),
                      generations->typed_data(),
                      probabilities->typed_data(),
                      starts->typed_data(),
                      nullptr,
                      selectable->typed_data(),
                      lengths->typed_data()};
  PriorityIndexes::Held index;
  const PriorityTreeView* tree;
  if (ffi::Error error = HoldIndexToSample(*table, request, "sample_gather", &index, &tree);
      error.failure()) {
    return error;
  }
  return KernelFailure(SampleGatherCpu(view, request, result, gather, out, tree, XlaParallelFor(pool)));
}

ffi::Error UpdatePrioritiesImpl(ffi::Buffer<ffi::S32> indices, ffi::Buffer<ffi::U32> generations,
                                ffi::Buffer<ffi::F32> priorities, ffi::AnyBuffer /*after*/,
                                ffi::ResultBuffer<ffi::S32> updated, int64_t handle, int64_t spec_hash) {
  std::shared_ptr<SharedTable> table;
  if (ffi::Error error = ResolveTable(handle, spec_hash, &table); error.failure()) return error;
  if (ffi::Error error = CheckUpdatePriorities(indices.element_count(), generations.element_count(),
                                               priorities.element_count());
      error.failure()) {
    return error;
  }
  // In a counter window: an update that moves a row's priority to or from 0 changes `selectable`.
  CounterWindow window(*table);
  return KernelFailure(ScatterPrioritiesCpu(
      table->view(), indices.typed_data(), generations.typed_data(), priorities.typed_data(),
      static_cast<int64_t>(indices.element_count()), updated->typed_data()));
}

// A queue's consumption of gathered picks (SharedTable::Consume).
ffi::Error ConsumeImpl(ffi::Buffer<ffi::S32> indices, ffi::Buffer<ffi::U32> generations,
                       ffi::Buffer<ffi::PRED> delivered, ffi::ResultBuffer<ffi::PRED> consumed,
                       int64_t handle, int64_t spec_hash) {
  std::shared_ptr<SharedTable> table;
  if (ffi::Error error = ResolveTable(handle, spec_hash, &table); error.failure()) return error;
  if (ffi::Error error = CheckConsume(indices.element_count(), generations.element_count(),
                                      delivered.element_count(), consumed->element_count());
      error.failure()) {
    return error;
  }
  return KernelFailure(table->Consume(indices.typed_data(), generations.typed_data(), delivered.typed_data(),
                                      static_cast<int64_t>(indices.element_count()), consumed->typed_data()));
}

// The rows of an insert inside a jitted program: SharedTable::Insert, the host insert's claim, copy and
// publication, from the call's buffers.
ffi::Error InsertImpl(ffi::Buffer<ffi::F32> priorities, ffi::Buffer<ffi::S32> lengths,
                      ffi::AnyBuffer /*after*/, ffi::RemainingArgs fields, ffi::ResultBuffer<ffi::S32> rows,
                      int64_t handle, int64_t spec_hash, int32_t steps, int32_t priority_mode) {
  std::shared_ptr<SharedTable> table;
  if (ffi::Error error = ResolveTable(handle, spec_hash, &table); error.failure()) return error;
  InsertRequest request;
  if (ffi::Error error =
          PrepareInsert(table->view(), fields, priorities.element_count(), lengths.element_count(),
                        rows->element_count(), steps, priority_mode, &request);
      error.failure()) {
    return error;
  }
  if (request.batch == 0) return ffi::Error::Success();
  try {
    return KernelFailure(InsertRows(*table, request, request.field_data, priorities.typed_data(),
                                    lengths.typed_data(), rows->typed_data()));
  } catch (const std::bad_alloc&) {
    return OpError(ffi::ErrorCode::kResourceExhausted, "insert", "out of host memory");
  } catch (const std::exception& e) {
    return OpError(ffi::ErrorCode::kInternal, "insert", e.what());
  }
  return ffi::Error::Success();
}

ffi::Error TotalWeightImpl(ffi::AnyBuffer /*after*/, ffi::ResultBuffer<ffi::F32> total,
                           ffi::ResultBuffer<ffi::S32> count, int64_t handle, int64_t spec_hash,
                           float priority_exponent, int32_t window, int32_t window_law) {
  std::shared_ptr<SharedTable> table;
  if (ffi::Error error = ResolveTable(handle, spec_hash, &table); error.failure()) return error;
  if (ffi::Error error = CheckTotalWeight(priority_exponent, total->element_count(), count->element_count());
      error.failure()) {
    return error;
  }
  WindowLaw law;
  if (ffi::Error error = CheckWindowLaw(window, window_law, &law); error.failure()) return error;
  if (law.counts_windows()) {
    return KernelFailure(UniformWindowTotalCpu(table->view(), law, total->typed_data(), count->typed_data()));
  }
  if (priority_exponent == 0.0f) {  // the count alone (sample_at.h): the table's counter
    const int32_t selectable = SelectableCount(LoadRelaxed(table->view().selectable));
    *total->typed_data() = static_cast<float>(selectable);
    *count->typed_data() = selectable;
    return ffi::Error::Success();
  }
  PriorityIndexes::Held index;
  if (ffi::Error error = HoldIndex(*table, priority_exponent, "total_weight", &index); error.failure()) {
    return error;
  }
  return KernelFailure(TotalWeightIndexedCpu(index.view(), total->typed_data(), count->typed_data()));
}

ffi::Error SampleAtImpl(ffi::Buffer<ffi::U32> seed, ffi::Buffer<ffi::F32> targets, ffi::AnyBuffer /*after*/,
                        ffi::ResultBuffer<ffi::S32> indices, ffi::ResultBuffer<ffi::U32> generations,
                        ffi::ResultBuffer<ffi::F32> probabilities, ffi::ResultBuffer<ffi::S32> starts,
                        int64_t handle, int64_t spec_hash, float priority_exponent, int32_t window) {
  std::shared_ptr<SharedTable> table;
  if (ffi::Error error = ResolveTable(handle, spec_hash, &table); error.failure()) return error;
  SampleAtRequest request;
  if (ffi::Error error = PrepareSampleAt(seed.element_count(), targets.element_count(), priority_exponent,
                                         window, indices->element_count(), generations->element_count(),
                                         probabilities->element_count(), starts->element_count(), &request);
      error.failure()) {
    return error;
  }
  request.seed0 = seed.typed_data()[0];
  request.seed1 = seed.typed_data()[1];
  SampleResult out{indices->typed_data(), generations->typed_data(), probabilities->typed_data(),
                   starts->typed_data()};
  PriorityIndexes::Held index;
  if (ffi::Error error = HoldIndex(*table, priority_exponent, "sample_at", &index); error.failure())
    return error;
  return KernelFailure(SampleAtIndexedCpu(table->view(), index.view(), request, targets.typed_data(), out));
}

}  // namespace
}  // namespace gear

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    GearJaxSampleCpu, gear::SampleImpl,
    ffi::Ffi::Bind()
        .Arg<ffi::Buffer<ffi::U32>>()  // seed: uint32[2] from the key
        .Arg<ffi::AnyBuffer>()         // after: ordering only
        .Ret<ffi::Buffer<ffi::S32>>()  // indices: int32[B]
        .Ret<ffi::Buffer<ffi::U32>>()  // generations: uint32[B]
        .Ret<ffi::Buffer<ffi::F32>>()  // probabilities: float32[B]
        .Ret<ffi::Buffer<ffi::S32>>()  // starts: int32[B]
        .Ret<ffi::Buffer<ffi::S32>>()  // selectable: int32[] count N
        .Ret<ffi::Buffer<ffi::S32>>()  // lengths: int32[B]
        .Ctx<ffi::ThreadPool>()        // XLA's intra-op threads: large prioritized batches
        .Attr<int64_t>("handle")
        .Attr<int64_t>("spec_hash")
        .Attr<int32_t>("method")
        .Attr<float>("priority_exponent")
        .Attr<int32_t>("window"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxOrderedCandidatesCpu, gear::OrderedCandidatesImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U32>>()  // seed: uint32[2] from the key (windows)
                                  .Arg<ffi::AnyBuffer>()         // after: ordering only
                                  .Ret<ffi::Buffer<ffi::S32>>()  // indices: int32[B]
                                  .Ret<ffi::Buffer<ffi::U32>>()  // generations: uint32[B]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // probabilities: float32[B]
                                  .Ret<ffi::Buffer<ffi::S32>>()  // starts: int32[B]
                                  .Ret<ffi::Buffer<ffi::U32>>()  // order_keys: uint32[B, 2] (low, high)
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash")
                                  .Attr<int32_t>("method")
                                  .Attr<int32_t>("window"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxShuffleCpu, gear::ShuffleImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U32>>()    // seed: uint32[2] from the key
                                  .Arg<ffi::Buffer<ffi::U32>>()    // generations: uint32[n] of the picks
                                  .Ret<ffi::Buffer<ffi::S32>>());  // order: int32[n]

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxGatherCpu, gear::GatherImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()   // indices: int32[B]
                                  .Arg<ffi::Buffer<ffi::U32>>()   // generations: uint32[B]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // starts: int32[B]
                                  .Ret<ffi::Buffer<ffi::PRED>>()  // valid: bool[B, window]
                                  .RemainingRets()                // one [B, window, *shape] per field
                                  .Ctx<ffi::ThreadPool>()         // XLA's intra-op threads: large gathers
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash")
                                  .Attr<ffi::Span<const int64_t>>("fields")
                                  .Attr<int32_t>("window"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxConsumeCpu, gear::ConsumeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()   // indices: int32[B]
                                  .Arg<ffi::Buffer<ffi::U32>>()   // generations: uint32[B]
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // delivered: bool[B] (gathered, valid)
                                  .Ret<ffi::Buffer<ffi::PRED>>()  // consumed: bool[B]
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxUpdatePrioritiesCpu, gear::UpdatePrioritiesImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()  // indices: int32[B]
                                  .Arg<ffi::Buffer<ffi::U32>>()  // generations: uint32[B]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // priorities: float32[B]
                                  .Arg<ffi::AnyBuffer>()         // after: ordering only
                                  .Ret<ffi::Buffer<ffi::S32>>()  // updated: int32[] rows written
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxInsertCpu, gear::InsertImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // priorities: float32[B] (or [0]: largest)
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lengths: int32[B] (or [0]: steps each)
                                  .Arg<ffi::AnyBuffer>()         // after: ordering only
                                  .RemainingArgs()               // one [B, steps, *shape] per field, in order
                                  .Ret<ffi::Buffer<ffi::S32>>()  // rows: int32[B] row ids
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash")
                                  .Attr<int32_t>("steps")
                                  .Attr<int32_t>("priority_mode"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxTotalWeightCpu, gear::TotalWeightImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()         // after: ordering only
                                  .Ret<ffi::Buffer<ffi::F32>>()  // total: float32[] sum of p^a
                                  .Ret<ffi::Buffer<ffi::S32>>()  // count: int32[] selectable rows
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash")
                                  .Attr<float>("priority_exponent")
                                  .Attr<int32_t>("window")        // windows of uniform picks (0: none)
                                  .Attr<int32_t>("window_law"));  // their law's flags (sample.h)

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxSampleAtCpu, gear::SampleAtImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U32>>()  // seed: uint32[2] from the key (windows)
                                  .Arg<ffi::Buffer<ffi::F32>>()  // targets: float32[B]
                                  .Arg<ffi::AnyBuffer>()         // after: ordering only
                                  .Ret<ffi::Buffer<ffi::S32>>()  // indices: int32[B]
                                  .Ret<ffi::Buffer<ffi::U32>>()  // generations: uint32[B]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // probabilities: float32[B]
                                  .Ret<ffi::Buffer<ffi::S32>>()  // starts: int32[B]
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash")
                                  .Attr<float>("priority_exponent")
                                  .Attr<int32_t>("window"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxSampleGatherCpu, gear::SampleGatherImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U32>>()   // seed: uint32[2] from the key
                                  .Arg<ffi::AnyBuffer>()          // after: ordering only
                                  .Ret<ffi::Buffer<ffi::S32>>()   // indices: int32[B]
                                  .Ret<ffi::Buffer<ffi::U32>>()   // generations: uint32[B]
                                  .Ret<ffi::Buffer<ffi::F32>>()   // probabilities: float32[B]
                                  .Ret<ffi::Buffer<ffi::S32>>()   // starts: int32[B]
                                  .Ret<ffi::Buffer<ffi::S32>>()   // selectable: int32[] count N
                                  .Ret<ffi::Buffer<ffi::S32>>()   // lengths: int32[B]
                                  .Ret<ffi::Buffer<ffi::PRED>>()  // valid: bool[B, steps]
                                  .RemainingRets()                // one [B, steps, *shape] per field
                                  .Ctx<ffi::ThreadPool>()         // XLA's intra-op threads: large batches
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash")
                                  .Attr<int32_t>("method")
                                  .Attr<float>("priority_exponent")
                                  .Attr<int32_t>("window")
                                  .Attr<ffi::Span<const int64_t>>("fields")
                                  .Attr<int32_t>("steps"));
