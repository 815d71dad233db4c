#include "xla_ffi/handler_checks.h"

#include <cmath>
#include <cstring>

#include "xla_ffi/registry.h"

namespace gear {

ffi::Error OpError(ffi::ErrorCode code, const char* op, const std::string& message) {
  return ffi::Error(code, std::string("gear_jax.") + op + ": " + message);
}

ffi::Error KernelFailure(const KernelStatus& status, const std::string& suffix, const char* scope) {
  if (status.ok()) return ffi::Error::Success();
  ffi::ErrorCode code = ffi::ErrorCode::kInvalidArgument;
  switch (status.code()) {
    case KernelCode::kEmpty:
    case KernelCode::kTooFew: code = ffi::ErrorCode::kFailedPrecondition; break;
    case KernelCode::kOutOfRange: code = ffi::ErrorCode::kOutOfRange; break;
    case KernelCode::kResourceExhausted: code = ffi::ErrorCode::kResourceExhausted; break;
    case KernelCode::kInternal: code = ffi::ErrorCode::kInternal; break;
    case KernelCode::kOk:
    case KernelCode::kInvalidArgument: break;
  }
  return OpError(code, (std::string(scope) + status.op()).c_str(), status.message() + suffix);
}

ffi::Error ResolveTable(int64_t handle, int64_t spec_hash, std::shared_ptr<SharedTable>* table) {
  std::string error;
  *table = LookupTable(handle, static_cast<uint64_t>(spec_hash), &error);
  if (!*table) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, error);
  (*table)->CheckCounts(/*force=*/false);  // a clock read, unless a repair of the counters is due
  return ffi::Error::Success();
}

namespace {

// The checks sample and sample_at share, in the words of `op`.
ffi::Error CheckSeedExponentWindow(const char* op, size_t seed_words, float priority_exponent,
                                   int32_t window) {
  if (seed_words != 2) {
    return OpError(ffi::ErrorCode::kInvalidArgument, op,
                   "the seed must hold 2 uint32 words, got " + std::to_string(seed_words));
  }
  if (!std::isfinite(priority_exponent) || priority_exponent < 0.0f) {
    return OpError(ffi::ErrorCode::kInvalidArgument, op,
                   "priority_exponent = " + std::to_string(priority_exponent) + " must be finite and >= 0");
  }
  if (window < 0) {
    return OpError(ffi::ErrorCode::kInvalidArgument, op,
                   "window = " + std::to_string(window) + " must be >= 0 (0: no window)");
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error CheckSelection(const char* op, int32_t method, float priority_exponent, int32_t window,
                          SampleRequest* request) {
  const int32_t flags = method & ~kMethodMask;
  if (!IsSampleMethod(method & kMethodMask) || (flags & ~(kSkipShortFlag | kUniformStartsFlag)) != 0) {
    return OpError(ffi::ErrorCode::kInvalidArgument, op, "unknown sampling method " + std::to_string(method));
  }
  if (ffi::Error error = CheckSeedExponentWindow(op, 2, priority_exponent, window); error.failure()) {
    return error;
  }
  request->method = static_cast<SampleMethod>(method & kMethodMask);
  request->skip_short = (flags & kSkipShortFlag) != 0;
  request->uniform_starts = (flags & kUniformStartsFlag) != 0;
  if (request->skip_short && window > 0 && request->method == SampleMethod::kPrioritized) {
    return OpError(ffi::ErrorCode::kInvalidArgument, op,
                   "prioritized windows pad short episodes (give episodes shorter than the window priority 0 "
                   "to leave them out)");
  }
  request->priority_exponent = priority_exponent;
  request->window = window;
  return ffi::Error::Success();
}

ffi::Error PrepareSample(size_t seed_words, int32_t method, float priority_exponent, int32_t window,
                         size_t batch_size, SampleRequest* request) {
  if (seed_words != 2) return CheckSeedExponentWindow("sample", seed_words, priority_exponent, window);
  if (ffi::Error error = CheckSelection("sample", method, priority_exponent, window, request);
      error.failure()) {
    return error;
  }
  request->batch_size = static_cast<int64_t>(batch_size);
  return ffi::Error::Success();
}

ffi::Error PrepareOrderedCandidates(size_t seed_words, int32_t method, int32_t window, size_t batch_size,
                                    size_t order_key_words, SampleRequest* request) {
  constexpr const char* kOp = "ordered_candidates";
  if (method != static_cast<int32_t>(SampleMethod::kFifo) &&
      method != static_cast<int32_t>(SampleMethod::kLifo) &&
      method != static_cast<int32_t>(SampleMethod::kTopK)) {
    return OpError(ffi::ErrorCode::kInvalidArgument, kOp,
                   "method " + std::to_string(method) + " is not fifo, lifo or topk");
  }
  if (ffi::Error error = CheckSeedExponentWindow(kOp, seed_words, 1.0f, window); error.failure())
    return error;
  if (order_key_words != 2 * batch_size) {
    return OpError(ffi::ErrorCode::kInvalidArgument, kOp,
                   "the order keys must hold 2 uint32 words per pick (" + std::to_string(2 * batch_size) +
                       "), got " + std::to_string(order_key_words));
  }
  request->method = static_cast<SampleMethod>(method);
  request->window = window;
  request->batch_size = static_cast<int64_t>(batch_size);
  request->partial = true;
  return ffi::Error::Success();
}

ffi::Error CheckTotalWeight(float priority_exponent, size_t total, size_t count) {
  if (!std::isfinite(priority_exponent) || priority_exponent < 0.0f) {
    return OpError(ffi::ErrorCode::kInvalidArgument, "total_weight",
                   "priority_exponent = " + std::to_string(priority_exponent) + " must be finite and >= 0");
  }
  if (total != 1 || count != 1) {
    return OpError(ffi::ErrorCode::kInvalidArgument, "total_weight",
                   "the total and the count must be scalars, got " + std::to_string(total) + " and " +
                       std::to_string(count) + " entries");
  }
  return ffi::Error::Success();
}

ffi::Error CheckWindowLaw(int32_t window, int32_t window_law, WindowLaw* law) {
  if (window < 0 || (window_law & ~(kSkipShortFlag | kUniformStartsFlag)) != 0) {
    return OpError(ffi::ErrorCode::kInvalidArgument, "total_weight",
                   "window = " + std::to_string(window) + " and window_law = " + std::to_string(window_law) +
                       " must be >= 0 and a combination of the skip_short and uniform_starts flags");
  }
  law->window = window;
  law->skip_short = (window_law & kSkipShortFlag) != 0;
  law->uniform_starts = (window_law & kUniformStartsFlag) != 0;
  return ffi::Error::Success();
}

ffi::Error PrepareSampleAt(size_t seed_words, size_t targets, float priority_exponent, int32_t window,
                           size_t indices, size_t generations, size_t probabilities, size_t starts,
                           SampleAtRequest* request) {
  if (ffi::Error error = CheckSeedExponentWindow("sample_at", seed_words, priority_exponent, window);
      error.failure()) {
    return error;
  }
  if (indices != targets || generations != targets || probabilities != targets || starts != targets) {
    return OpError(ffi::ErrorCode::kInvalidArgument, "sample_at",
                   "indices, generations, probabilities and starts must have one entry per target (" +
                       std::to_string(targets) + ")");
  }
  request->priority_exponent = priority_exponent;
  request->window = window;
  request->batch_size = static_cast<int64_t>(targets);
  return ffi::Error::Success();
}

ffi::Error PrepareGather(const TableView& view, size_t indices, size_t generations, size_t starts,
                         ffi::ResultBuffer<ffi::PRED> valid, ffi::RemainingRets fields_out,
                         ffi::Span<const int64_t> fields, int32_t window, GatherRequest* request,
                         GatherOutputs* out) {
  constexpr const char* kOp = "gather";
  if (fields.size() != fields_out.size() || fields.size() > static_cast<size_t>(kMaxFields)) {
    return OpError(ffi::ErrorCode::kInvalidArgument, kOp,
                   std::to_string(fields.size()) + " fields and " + std::to_string(fields_out.size()) +
                       " field results: one result per field is expected, at most " +
                       std::to_string(kMaxFields));
  }
  const int64_t batch = static_cast<int64_t>(indices);
  if (window < 1 || generations != indices || starts != indices ||
      static_cast<int64_t>(valid->element_count()) != batch * window) {
    return OpError(ffi::ErrorCode::kInvalidArgument, kOp,
                   "indices, generations and starts must have one entry per pick, and valid batch x window "
                   "entries (window >= 1)");
  }
  int64_t result_bytes[kMaxFields];
  for (size_t f = 0; f < fields.size(); ++f) {
    auto result = fields_out.get<ffi::AnyBuffer>(f);
    if (!result.has_value()) return result.error();
    result_bytes[f] = static_cast<int64_t>((*result)->size_bytes());
    out->fields[f] = static_cast<uint8_t*>((*result)->untyped_data());
  }
  out->valid = valid->typed_data();
  return CheckGatherFields(kOp, "result", view, batch, window, fields.begin(), result_bytes, fields.size(),
                           request);
}

ffi::Error CheckGatherFields(const char* op, const char* results, const TableView& view, int64_t batch,
                             int32_t window, const int64_t* field_ids, const int64_t* result_bytes,
                             size_t num_fields, GatherRequest* request) {
  request->batch_size = batch;
  request->window = window;
  request->num_fields = static_cast<int32_t>(num_fields);
  for (size_t f = 0; f < num_fields; ++f) {
    const int64_t field = field_ids[f];
    if (field < 0 || field >= view.num_fields) {
      return OpError(
          ffi::ErrorCode::kInvalidArgument, op,
          "field id " + std::to_string(field) + " is outside [0, " + std::to_string(view.num_fields) + ")");
    }
    const int64_t expected = batch * window * view.fields[field].step_bytes;
    if (result_bytes[f] != expected) {
      return OpError(ffi::ErrorCode::kInvalidArgument, op,
                     std::string("the ") + results + " of field " + std::to_string(field) + " holds " +
                         std::to_string(result_bytes[f]) + " bytes, expected " + std::to_string(expected));
    }
    request->field_ids[f] = static_cast<int32_t>(field);
  }
  return ffi::Error::Success();
}

ffi::Error PrepareInsert(const TableView& view, ffi::RemainingArgs fields, size_t priorities, size_t lengths,
                         size_t rows, int32_t steps, int32_t priority_mode, InsertRequest* request) {
  constexpr const char* kOp = "insert";
  if (steps < 1 || steps > view.max_steps) {
    return OpError(ffi::ErrorCode::kInvalidArgument, kOp,
                   "steps = " + std::to_string(steps) +
                       " is outside [1, max_steps=" + std::to_string(view.max_steps) + "]");
  }
  if (priority_mode != static_cast<int32_t>(InsertPriorities::kGiven) &&
      priority_mode != static_cast<int32_t>(InsertPriorities::kLargest)) {
    return OpError(ffi::ErrorCode::kInvalidArgument, kOp,
                   "unknown priority_mode " + std::to_string(priority_mode));
  }
  if (fields.size() != static_cast<size_t>(view.num_fields)) {
    return OpError(ffi::ErrorCode::kInvalidArgument, kOp,
                   std::to_string(fields.size()) + " field buffers for a table of " +
                       std::to_string(view.num_fields) + " fields: every insert writes every field");
  }
  const int64_t batch = static_cast<int64_t>(rows);
  request->batch = batch;
  request->steps = steps;
  request->priorities = static_cast<InsertPriorities>(priority_mode);
  const bool given = request->priorities == InsertPriorities::kGiven;
  if ((given && priorities != rows) || (!given && priorities != 0) || (lengths != 0 && lengths != rows)) {
    return OpError(ffi::ErrorCode::kInvalidArgument, kOp,
                   "priorities (unless the table's largest is asked for) and lengths (when given) must have "
                   "one entry per row");
  }
  request->lengths = lengths != 0;
  request->field_data.assign(view.num_fields, nullptr);
  request->field_bytes.assign(view.num_fields, 0);
  for (int32_t f = 0; f < view.num_fields; ++f) {
    auto buffer = fields.get<ffi::AnyBuffer>(f);
    if (!buffer.has_value()) return buffer.error();
    const int64_t expected = batch * steps * view.fields[f].step_bytes;
    if (static_cast<int64_t>(buffer->size_bytes()) != expected) {
      return OpError(ffi::ErrorCode::kInvalidArgument, kOp,
                     "the buffer of field " + std::to_string(f) + " holds " +
                         std::to_string(buffer->size_bytes()) + " bytes, expected " +
                         std::to_string(expected) + " (rows x steps x the field's bytes per step)");
    }
    request->field_data[f] = static_cast<const uint8_t*>(buffer->untyped_data());
    request->field_bytes[f] = expected;
  }
  return ffi::Error::Success();
}

namespace {

KernelStatus CheckInsertValues(const float* priorities, const int32_t* lengths, int64_t batch,
                               int32_t steps) {
  for (int64_t b = 0; b < batch; ++b) {
    if (priorities != nullptr && (!std::isfinite(priorities[b]) || priorities[b] < 0.0f)) {
      uint32_t bits;
      std::memcpy(&bits, &priorities[b], sizeof(bits));
      return KernelError(ErrorSite::kInsertPriority, b, bits);
    }
    if (lengths != nullptr && (lengths[b] < 1 || lengths[b] > steps)) {
      return KernelError(ErrorSite::kInsertLength, b, lengths[b], steps);
    }
  }
  return {};
}

float LargestPrioritySoFar(const TableView& view) {
  const uint32_t bits = __atomic_load_n(view.max_priority_bits, __ATOMIC_RELAXED);
  if (bits == 0) return 1.0f;
  float priority;
  std::memcpy(&priority, &bits, sizeof(priority));
  return priority;
}

}  // namespace

KernelStatus InsertRows(SharedTable& table, const InsertRequest& request,
                        const std::vector<const uint8_t*>& field_data, const float* priorities,
                        const int32_t* lengths, int32_t* rows) {
  std::vector<float> largest;
  if (request.priorities == InsertPriorities::kLargest) {
    largest.assign(static_cast<size_t>(request.batch), LargestPrioritySoFar(table.view()));
    priorities = largest.data();
  }
  if (!request.lengths) lengths = nullptr;
  if (KernelStatus status = CheckInsertValues(priorities, lengths, request.batch, request.steps);
      !status.ok())
    return status;
  table.Insert(field_data, request.batch, request.steps, lengths, priorities, rows);
  return {};
}

ffi::Error CheckUpdatePriorities(size_t indices, size_t generations, size_t priorities) {
  if (generations != indices || priorities != indices) {
    return OpError(ffi::ErrorCode::kInvalidArgument, "update_priorities",
                   "indices, generations and priorities must have one entry per pick");
  }
  return ffi::Error::Success();
}

ffi::Error CheckConsume(size_t indices, size_t generations, size_t delivered, size_t consumed) {
  if (generations != indices || delivered != indices || consumed != indices) {
    return OpError(ffi::ErrorCode::kInvalidArgument, "consume",
                   "indices, generations, delivered and consumed must have one entry per pick");
  }
  return ffi::Error::Success();
}

}  // namespace gear
