#include "errors.h"

#include <cstring>

namespace gear {

KernelCode KernelStatus::code() const {
  switch (site) {
    case ErrorSite::kNone: return KernelCode::kOk;
    case ErrorSite::kSampleEmpty: return KernelCode::kEmpty;
    case ErrorSite::kSampleTooFew: return KernelCode::kTooFew;
    case ErrorSite::kGatherIndex:
    case ErrorSite::kGatherStart:
    case ErrorSite::kScatterIndex: return KernelCode::kOutOfRange;
    case ErrorSite::kScatterPriority:
    case ErrorSite::kSampleWeightOverflow:
    case ErrorSite::kSampleWeightUnderflow:
    case ErrorSite::kSampleMethod:
    case ErrorSite::kTotalWeightOverflow:
    case ErrorSite::kSampleAtWeightOverflow:
    case ErrorSite::kInsertPriority:
    case ErrorSite::kInsertLength:
    case ErrorSite::kInsertFailed: break;
    case ErrorSite::kHostSampleMemory: return KernelCode::kResourceExhausted;
    case ErrorSite::kHostSampleFailed: return KernelCode::kInternal;
  }
  return KernelCode::kInvalidArgument;
}

const char* KernelStatus::op() const {
  switch (site) {
    case ErrorSite::kGatherIndex:
    case ErrorSite::kGatherStart: return "gather";
    case ErrorSite::kScatterIndex:
    case ErrorSite::kScatterPriority: return "update_priorities";
    case ErrorSite::kTotalWeightOverflow: return "total_weight";
    case ErrorSite::kSampleAtWeightOverflow: return "sample_at";
    case ErrorSite::kInsertPriority:
    case ErrorSite::kInsertLength:
    case ErrorSite::kInsertFailed: return "insert";
    default: return "sample";
  }
}

std::string KernelStatus::message() const {
  const std::string e = std::to_string(element), v = std::to_string(value), l = std::to_string(limit);
  switch (site) {
    case ErrorSite::kNone: return "";
    case ErrorSite::kSampleEmpty:
      return "the table holds no selectable rows (every row is empty, being written, or has priority 0, or "
             "with short_episodes=\"skip\" is shorter than the window); insert rows before sampling, or "
             "sample shorter windows";
    case ErrorSite::kSampleTooFew:
      return "the table holds " + v + " selectable rows, fewer than batch_size " + l +
             "; fifo, lifo and topk return distinct rows: lower batch_size or insert more rows";
    case ErrorSite::kGatherIndex:
    case ErrorSite::kScatterIndex:
      return "indices[" + e + "] = " + v + " is outside [0, " + l + "); pass a Sample from this table";
    case ErrorSite::kGatherStart: return "starts[" + e + "] = " + v + " is outside [0, max_steps=" + l + ")";
    case ErrorSite::kScatterPriority: {
      const uint32_t bits = static_cast<uint32_t>(value);
      float priority;
      std::memcpy(&priority, &bits, sizeof(priority));
      return "priorities[" + e + "] = " + std::to_string(priority) +
             "; priorities must be finite and >= 0 (no row was updated)";
    }
    case ErrorSite::kSampleWeightOverflow:
      return "the sum of priority^priority_exponent overflows a double; lower priority_exponent or rescale "
             "the priorities";
    case ErrorSite::kSampleWeightUnderflow:
      return "the table holds " + v +
             " selectable rows, but every one's priority^priority_exponent underflows to 0 in a double; "
             "rescale the priorities (e.g. divide them by their largest) or lower priority_exponent";
    case ErrorSite::kSampleMethod: return "unknown sampling method " + v;
    case ErrorSite::kTotalWeightOverflow:
      return "the sum of priority^priority_exponent over the selectable rows overflows a float32; lower "
             "priority_exponent or rescale the priorities";
    case ErrorSite::kSampleAtWeightOverflow:
      return "the sum of priority^priority_exponent overflows a double; lower priority_exponent or rescale "
             "the priorities";
    case ErrorSite::kInsertPriority: {
      const uint32_t bits = static_cast<uint32_t>(value);
      float priority;
      std::memcpy(&priority, &bits, sizeof(priority));
      return "priorities[" + e + "] = " + std::to_string(priority) +
             "; priorities must be finite and >= 0 (no row of the batch was written)";
    }
    case ErrorSite::kInsertLength:
      return "lengths[" + e + "] = " + v + " is outside [1, " + l +
             "] (the batch's time axis; no row of the batch was written)";
    case ErrorSite::kInsertFailed:
      return "the host could not write the rows of an insert (out of host memory, or a row was taken from "
             "this writer before it was published); the call returned row ids -1";
    case ErrorSite::kHostSampleMemory:
      return "the host found no memory for a sample it made for a GPU program (a table with "
             "max_times_sampled, sampled on a GPU without native host atomics; its priority index takes "
             "about 17 bytes per row); the call returned failed picks";
    case ErrorSite::kHostSampleFailed:
      return "a sample the host made for a GPU program (a table with max_times_sampled, sampled on a GPU "
             "without native host atomics) failed unexpectedly; the call returned failed picks";
  }
  return "unknown error site " + std::to_string(static_cast<int32_t>(site));
}

}  // namespace gear
