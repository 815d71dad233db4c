#include "xla_ffi/cpu_handlers.h"

#include <sys/mman.h>

#include <cstdint>
#include <string>

#include "kernels/gather.h"
#include "kernels/priorities.h"
#include "kernels/sample.h"
#include "xla/ffi/api/ffi.h"
#include "xla_ffi/registry.h"

namespace ffi = xla::ffi;

namespace gear {
namespace {

ffi::Error ToError(const KernelStatus& status, const char* op) {
  if (status.ok()) return ffi::Error::Success();
  ffi::ErrorCode code = ffi::ErrorCode::kInvalidArgument;
  switch (status.code) {
    case KernelCode::kEmpty:
    case KernelCode::kTooFew: code = ffi::ErrorCode::kFailedPrecondition; break;
    case KernelCode::kOutOfRange: code = ffi::ErrorCode::kOutOfRange; break;
    default: break;
  }
  return ffi::Error(code, std::string("gear_jax.") + op + ": " + status.message);
}

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

ffi::Error SampleImpl(ffi::Buffer<ffi::U32> seed, ffi::AnyBuffer /*after*/,
                      ffi::ResultBuffer<ffi::S32> indices, ffi::ResultBuffer<ffi::U32> generations,
                      ffi::ResultBuffer<ffi::F32> probabilities, ffi::ResultBuffer<ffi::S32> starts,
                      int64_t handle, int64_t spec_hash, int32_t method, float priority_exponent,
                      int32_t window) {
  std::string error;
  auto table = LookupTable(handle, static_cast<uint64_t>(spec_hash), &error);
  if (!table) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, error);
  if (seed.element_count() != 2) return ffi::Error::InvalidArgument("seed must hold 2 uint32 words");
  SampleRequest request;
  request.method = static_cast<SampleMethod>(method);
  request.priority_exponent = priority_exponent;
  request.window = window;
  request.seed0 = seed.typed_data()[0];
  request.seed1 = seed.typed_data()[1];
  request.batch_size = static_cast<int64_t>(indices->element_count());
  SampleResult out{indices->typed_data(), generations->typed_data(), probabilities->typed_data(),
                   starts->typed_data()};
  return ToError(SampleRowsCpu(table->view(), request, out), "sample");
}

ffi::Error GatherImpl(ffi::Buffer<ffi::S32> indices, ffi::Buffer<ffi::U32> generations,
                      ffi::Buffer<ffi::S32> starts, ffi::ResultBuffer<ffi::PRED> valid,
                      ffi::RemainingRets fields_out, int64_t handle, int64_t spec_hash,
                      ffi::Span<const int64_t> fields, int32_t window) {
  std::string error;
  auto table = LookupTable(handle, static_cast<uint64_t>(spec_hash), &error);
  if (!table) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, error);
  const TableView& view = table->view();
  if (fields.size() != fields_out.size() || fields.size() > static_cast<size_t>(kMaxFields)) {
    return ffi::Error::InvalidArgument("gear_jax.gather: one result per field is expected");
  }
  GatherRequest request;
  request.batch_size = static_cast<int64_t>(indices.element_count());
  request.window = window;
  if (window < 1 || generations.element_count() != indices.element_count() ||
      starts.element_count() != indices.element_count() ||
      static_cast<int64_t>(valid->element_count()) != request.batch_size * window) {
    return ffi::Error::InvalidArgument(
        "gear_jax.gather: indices, generations and starts must have one entry per pick, and valid "
        "batch x window entries");
  }
  request.num_fields = static_cast<int32_t>(fields.size());
  GatherOutputs out;
  out.valid = valid->typed_data();
  for (size_t f = 0; f < fields.size(); ++f) {
    if (fields[f] < 0 || fields[f] >= view.num_fields) {
      return ffi::Error::InvalidArgument("gear_jax.gather: field id out of range");
    }
    auto result = fields_out.get<ffi::AnyBuffer>(f);
    if (!result.has_value()) return result.error();
    const int64_t expected = request.batch_size * window * view.fields[fields[f]].step_bytes;
    if (static_cast<int64_t>((*result)->size_bytes()) != expected) {
      return ffi::Error::InvalidArgument("gear_jax.gather: result buffer has the wrong size");
    }
    request.field_ids[f] = static_cast<int32_t>(fields[f]);
    out.fields[f] = static_cast<uint8_t*>((*result)->untyped_data());
    AdviseHugePages(out.fields[f], static_cast<size_t>(expected));
  }
  return ToError(GatherRowsCpu(view, indices.typed_data(), generations.typed_data(), starts.typed_data(),
                               request, out),
                 "gather");
}

ffi::Error UpdatePrioritiesImpl(ffi::Buffer<ffi::S32> indices, ffi::Buffer<ffi::U32> generations,
                                ffi::Buffer<ffi::F32> priorities, ffi::AnyBuffer /*after*/,
                                ffi::ResultBuffer<ffi::S32> updated, int64_t handle,
                                int64_t spec_hash) {
  std::string error;
  auto table = LookupTable(handle, static_cast<uint64_t>(spec_hash), &error);
  if (!table) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, error);
  if (generations.element_count() != indices.element_count() ||
      priorities.element_count() != indices.element_count()) {
    return ffi::Error::InvalidArgument(
        "gear_jax.update_priorities: indices, generations and priorities must have one entry per pick");
  }
  return ToError(ScatterPrioritiesCpu(table->view(), indices.typed_data(), generations.typed_data(),
                                     priorities.typed_data(),
                                     static_cast<int64_t>(indices.element_count()),
                                     updated->typed_data()),
                 "update_priorities");
}

}  // namespace
}  // namespace gear

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxSampleCpu, gear::SampleImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U32>>()     // seed: uint32[2] from the key
                                  .Arg<ffi::AnyBuffer>()            // after: ordering only
                                  .Ret<ffi::Buffer<ffi::S32>>()     // indices: int32[B]
                                  .Ret<ffi::Buffer<ffi::U32>>()     // generations: uint32[B]
                                  .Ret<ffi::Buffer<ffi::F32>>()     // probabilities: float32[B]
                                  .Ret<ffi::Buffer<ffi::S32>>()     // starts: int32[B]
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash")
                                  .Attr<int32_t>("method")
                                  .Attr<float>("priority_exponent")
                                  .Attr<int32_t>("window"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxGatherCpu, gear::GatherImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()     // indices: int32[B]
                                  .Arg<ffi::Buffer<ffi::U32>>()     // generations: uint32[B]
                                  .Arg<ffi::Buffer<ffi::S32>>()     // starts: int32[B]
                                  .Ret<ffi::Buffer<ffi::PRED>>()    // valid: bool[B, window]
                                  .RemainingRets()                  // one [B, window, *shape] per field
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash")
                                  .Attr<ffi::Span<const int64_t>>("fields")
                                  .Attr<int32_t>("window"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GearJaxUpdatePrioritiesCpu, gear::UpdatePrioritiesImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()     // indices: int32[B]
                                  .Arg<ffi::Buffer<ffi::U32>>()     // generations: uint32[B]
                                  .Arg<ffi::Buffer<ffi::F32>>()     // priorities: float32[B]
                                  .Arg<ffi::AnyBuffer>()            // after: ordering only
                                  .Ret<ffi::Buffer<ffi::S32>>()     // updated: int32[] rows written
                                  .Attr<int64_t>("handle")
                                  .Attr<int64_t>("spec_hash"));
