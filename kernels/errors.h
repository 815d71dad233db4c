// Errors the kernels find in the data they read, defined once for both backends.
//
// A CPU kernel returns a KernelStatus. A CUDA kernel cannot fail a call (its caller does not wait for
// it), so it records the same site and numbers in a DeviceError (device_error.cuh) and the runtime
// turns that record into a KernelStatus at the next call. Either way, the words the user reads come
// from KernelStatus::message(), and the status code from KernelStatus::code().
#pragma once

#include <cstdint>
#include <string>

namespace gear {

// Where an error was found, and what the numbers of its record mean there.
enum class ErrorSite : int32_t {
  kNone = 0,
  kSampleEmpty = 1,              // no selectable row
  kSampleTooFew = 2,             // fifo/lifo/topk: value = selectable rows, limit = batch_size
  kGatherIndex = 3,              // element = pick, value = row id, limit = capacity
  kGatherStart = 4,              // element = pick, value = window start, limit = max_steps
  kScatterIndex = 5,             // element = entry, value = row id, limit = capacity
  kScatterPriority = 6,          // element = entry, value = bits of the float32 priority
  kSampleWeightOverflow = 7,     // prioritized: the sum of p^a is not finite
  kSampleMethod = 8,             // value = the method number
  kTotalWeightOverflow = 9,      // total_weight: the sum of p^a is not finite in float32
  kSampleAtWeightOverflow = 10,  // sample_at: the sum of p^a is not finite
  kInsertPriority = 11,          // insert: element = row of the batch, value = bits of the float32 priority
  kInsertLength = 12,            // insert: element = row of the batch, value = length, limit = steps
  kInsertFailed = 13,  // insert on the host for a GPU (out of memory, or a row taken from the writer)
  kSampleWeightUnderflow = 14,  // prioritized: rows are selectable, but every p^a is 0; value = their count
  kHostSampleMemory = 15,       // a GPU's sample made on the host (cuda_handlers.cu) found no host memory
  kHostSampleFailed = 16,       // a GPU's sample made on the host failed otherwise (an unexpected exception)
};

// The kind of an error, which the FFI layer maps to a status code.
enum class KernelCode : int32_t {
  kOk = 0,
  kEmpty = 1,
  kOutOfRange = 2,
  kInvalidArgument = 3,
  kTooFew = 4,
  kResourceExhausted = 5,
  kInternal = 6,
};

// The result of a kernel: success, or the site and numbers of the first error found.
struct KernelStatus {
  ErrorSite site = ErrorSite::kNone;
  int64_t element = 0;
  int64_t value = 0;
  int64_t limit = 0;

  bool ok() const { return site == ErrorSite::kNone; }
  KernelCode code() const;
  // The operation that reports the error: "sample", "gather", "update_priorities", "total_weight",
  // "sample_at" or "insert".
  const char* op() const;
  // What went wrong and what to do, for the user.
  std::string message() const;
};

inline KernelStatus KernelError(ErrorSite site, int64_t element = 0, int64_t value = 0, int64_t limit = 0) {
  return KernelStatus{site, element, value, limit};
}

}  // namespace gear
