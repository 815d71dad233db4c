// What every FFI handler and host call does before it runs a kernel, written once for the CPU and CUDA
// handlers and the host calls (host_calls.h): the table lookup, the argument checks, and the mapping of
// kernel errors to status codes. Every entry point therefore refuses the same bad input with the same
// code and the same words, "gear_jax.<op>: ..." (a host call's op is "host.<op>", and host_calls.h
// raises the error as a gear_jax exception). The handler files keep only what differs: their XLA
// bindings (contexts), where the kernels run, and (CUDA) how errors found by a kernel reach the next
// call; the host calls keep the checks of numpy arrays.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/errors.h"
#include "kernels/gather.h"
#include "kernels/sample.h"
#include "kernels/sample_at.h"
#include "xla/ffi/api/ffi.h"
#include "xla_ffi/shared_table.h"

namespace gear {

namespace ffi = xla::ffi;

// "gear_jax.<op>: <message>" with `code`.
ffi::Error OpError(ffi::ErrorCode code, const char* op, const std::string& message);

// Success, or the kernel's error with its code and words (the operation named by the error site, after
// `scope`: "host." for a host call).
ffi::Error KernelFailure(const KernelStatus& status, const std::string& suffix = "", const char* scope = "");

// The open table of (handle, spec_hash), held for the call; FAILED_PRECONDITION when it was closed or
// the function was compiled for another spec. Repairs the table's counters when a writer died while
// changing them (SharedTable::CheckCounts, throttled).
ffi::Error ResolveTable(int64_t handle, int64_t spec_hash, std::shared_ptr<SharedTable>* table);

// A selection's method, exponent and window (>= 0), in the words of `op`; fills the request's method,
// exponent and window.
ffi::Error CheckSelection(const char* op, int32_t method, float priority_exponent, int32_t window,
                          SampleRequest* request);

// sample: checks the seed, the method and the window, and fills *request (all but the seed words).
ffi::Error PrepareSample(size_t seed_words, int32_t method, float priority_exponent, int32_t window,
                         size_t batch_size, SampleRequest* request);

// ordered_candidates: sample's checks, a fifo, lifo or topk method and two uint32 words of order key
// per pick; fills *request as a partial sample (markers past the selectable rows, no error).
ffi::Error PrepareOrderedCandidates(size_t seed_words, int32_t method, int32_t window, size_t batch_size,
                                    size_t order_key_words, SampleRequest* request);

// total_weight: checks the exponent and that both results are scalars.
ffi::Error CheckTotalWeight(float priority_exponent, size_t total, size_t count);

// total_weight: the window law of its attributes (window >= 0; window_law: the kSkipShortFlag and
// kUniformStartsFlag bits of a sample's method word, nothing else).
ffi::Error CheckWindowLaw(int32_t window, int32_t window_law, WindowLaw* law);

// sample_at: checks the seed, the exponent, the window and one result entry per target, and fills
// *request (all but the seed words).
ffi::Error PrepareSampleAt(size_t seed_words, size_t targets, float priority_exponent, int32_t window,
                           size_t indices, size_t generations, size_t probabilities, size_t starts,
                           SampleAtRequest* request);

// gather: checks the picks, the window and one result per field of the right size, and fills *request
// and *out (the valid mask and the field results' addresses).
ffi::Error PrepareGather(const TableView& view, size_t indices, size_t generations, size_t starts,
                         ffi::ResultBuffer<ffi::PRED> valid, ffi::RemainingRets fields_out,
                         ffi::Span<const int64_t> fields, int32_t window, GatherRequest* request,
                         GatherOutputs* out);

// A gather's fields, in the words of `op`: each id a field of the table, and its result (`results`
// names them: "result" in a custom call, "output" in a host call) result_bytes[f] = batch x window x the
// field's step bytes. Fills the request's batch, window and field ids.
ffi::Error CheckGatherFields(const char* op, const char* results, const TableView& view, int64_t batch,
                             int32_t window, const int64_t* field_ids, const int64_t* result_bytes,
                             size_t num_fields, GatherRequest* request);

// How an insert gives its rows their priorities (the attribute `priority_mode`).
enum class InsertPriorities : int32_t {
  kGiven = 0,    // one per row, in the priorities argument
  kLargest = 1,  // every row the table's largest priority so far (1 while no row had one above 0)
};

// insert: what a handler writes, checked against the table's layout (field_data are the call's
// buffers: device memory in a CUDA handler).
struct InsertRequest {
  int64_t batch = 0;
  int32_t steps = 0;
  InsertPriorities priorities = InsertPriorities::kGiven;
  bool lengths = false;  // one length per row in the lengths argument (otherwise `steps` each)
  std::vector<const uint8_t*> field_data;
  std::vector<int64_t> field_bytes;  // bytes of each field buffer
};

// insert: checks the buffers of every field (batch x steps x the field's step bytes, in the table's
// field order), one priority (kGiven) and one length (when any) per row, one row id result per row,
// and `steps` in [1, max_steps], and fills *request.
ffi::Error PrepareInsert(const TableView& view, ffi::RemainingArgs fields, size_t priorities, size_t lengths,
                         size_t rows, int32_t steps, int32_t priority_mode, InsertRequest* request);

// insert: writes the rows of a prepared request with the host insert (SharedTable::Insert, CPU atomics),
// from host memory: field_data[f] (the request's own, or a staging copy of them), priorities (kGiven: one
// per row; kLargest: ignored, every row gets the table's largest priority so far, 1 while no row had
// one) and lengths (when the request has them). The values only the data holds (priorities finite and
// >= 0, lengths in [1, steps]) are checked before any row is claimed, so a refused batch writes nothing
// and comes back as the error. Exceptions of the insert itself (out of memory, a row taken from this
// writer) pass through.
KernelStatus InsertRows(SharedTable& table, const InsertRequest& request,
                        const std::vector<const uint8_t*>& field_data, const float* priorities,
                        const int32_t* lengths, int32_t* rows);

// update_priorities: one generation and one priority per row id.
ffi::Error CheckUpdatePriorities(size_t indices, size_t generations, size_t priorities);
// consume: one entry of generations, delivered and consumed per pick.
ffi::Error CheckConsume(size_t indices, size_t generations, size_t delivered, size_t consumed);

}  // namespace gear
