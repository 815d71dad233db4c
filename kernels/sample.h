// Selection of rows: uniform, prioritized, fifo, lifo and top-k, plus the start of a time window.
// CPU implementation in sample.cc; the CUDA one (sample.cu) keeps the same semantics.
//
// Every method selects only selectable rows (even generation, priority > 0) and records the generation
// it saw, so that gather and update_priorities can tell when the row was overwritten since. A row whose
// length is outside [1, max_steps] (LengthInRange; only a damaged or forged file has one of priority
// > 0) is never picked; the table's counter `selectable` and prioritized weights still count it.
//  - uniform: each selectable row with probability 1/V (rejection over the claimed rows, then an exact
//    fallback scan after kUniformAttempts rejections, so the distribution is exactly uniform);
//  - prioritized: row i with probability p_i^a / sum_j p_j^a, through an index over the priorities
//    (priority_index.h: SampleIndexedCpu, which SampleRowsCpu calls with the index it is given);
//  - fifo / lifo: the batch_size oldest / newest committed rows, oldest / newest first;
//  - topk: the batch_size highest priorities, highest first, ties to the lower row id.
// With fewer selectable rows than batch_size, fifo/lifo/topk fail (kSampleTooFew), unless the request
// is `partial`: then the selectable rows come first and the other picks get the failed-pick marker.
// Where `order_keys` is given, each pick's OrderKey (selection.h) is written there, kNoCandidate for a
// failed pick: the sharded layer merges the shards' candidates by these keys.
// `window` > 0 places a window of that many steps inside each picked row, its start uniform over the
// max(length - window, 0) + 1 possible starts. `skip_short` leaves rows shorter than the window out of
// every method (prioritized: refused); `uniform_starts` makes uniform picks uniform over every valid
// (row, start) pair (KeepWindow in selection.h; the fallback scan weighs rows by WindowCount).
#pragma once

#include <cstdint>
#include <limits>

#include "errors.h"
#include "parallel.h"
#include "selection.h"
#include "table_view.h"

namespace gear {

struct PriorityTreeView;  // priority_index.h

// Every method by its user-facing name (gear_jax.sample's `method`).
struct SampleMethodName {
  SampleMethod method;
  const char* name;
};
inline constexpr SampleMethodName kSampleMethods[] = {{SampleMethod::kUniform, "uniform"},
                                                      {SampleMethod::kPrioritized, "prioritized"},
                                                      {SampleMethod::kFifo, "fifo"},
                                                      {SampleMethod::kLifo, "lifo"},
                                                      {SampleMethod::kTopK, "topk"}};
bool IsSampleMethod(int32_t method);

// The `method` word of the selection calls: the SampleMethod in its low byte, and the window law's
// flags (SampleRequest::skip_short, uniform_starts) above it. Python learns them from the native module.
inline constexpr int32_t kMethodMask = 0xff;
inline constexpr int32_t kSkipShortFlag = 1 << 8;
inline constexpr int32_t kUniformStartsFlag = 1 << 9;

// Rows [0, ClaimedRows(table)) had been claimed by a writer at the time of the call: the range every
// selection looks at (rows claimed later hold no committed data yet).
int64_t ClaimedRows(const TableView& table);

struct SampleRequest {
  SampleMethod method = SampleMethod::kUniform;
  float priority_exponent = 1.0f;
  int32_t window = 0;
  uint32_t seed0 = 0, seed1 = 0;
  int64_t batch_size = 0;
  bool partial = false;  // fifo/lifo/topk: markers for the picks past the selectable rows, no error
  // With a window: rows shorter than it are never picked (else they are, padded); and uniform picks
  // take every valid window of the table with the same probability (rows weighted by their count of
  // window starts, WindowCount in selection.h) rather than every row. Step rings sample this way.
  bool skip_short = false;
  bool uniform_starts = false;
  // CPU, uniform: where not null, the first line of each first candidate's row in this field is fetched
  // with the candidate's status, so that a gather of the picks that follows finds its rows coming
  // (sample_gather of rows without windows).
  const FieldView* prefetch_rows = nullptr;
};

struct SampleResult {
  int32_t* indices;
  uint32_t* generations;
  float* probabilities;
  int32_t* starts;
  uint64_t* order_keys = nullptr;  // fifo/lifo/topk: [batch_size] each pick's OrderKey, where non-null
  int32_t* selectable = nullptr;   // where non-null: the count N of selectable rows (uniform: the N of
                                   // its probabilities 1/N; the others: the table's counter)
  int32_t* lengths = nullptr;      // where non-null: [batch_size] each picked row's length (episode
                                   // length), as read with its generation; 0 for a failed pick
};

// A count of rows as the int32 that `selectable` holds (clamped; tables have < 2^31 rows).
GEAR_HD int32_t SelectableCount(int64_t rows) {
  return static_cast<int32_t>(rows < 0 ? 0 : (rows > 0x7fffffff ? 0x7fffffff : rows));
}

// A pick that could not be made: row 0 with the odd generation 1, which no gather or update accepts,
// probability 0 and start 0.
GEAR_HD void RecordFailed(SampleResult out, int64_t pick) {
  out.indices[pick] = 0;
  out.generations[pick] = 1;
  out.probabilities[pick] = 0.0f;
  out.starts[pick] = 0;
  if (out.lengths != nullptr) out.lengths[pick] = 0;
}

// The exponent of the priority index a request samples through (priority_index.h): the request's for
// prioritized picks, kLengthWeights (selection.h) for uniform windows with uniform_starts, NaN for none.
inline float IndexExponent(const SampleRequest& r) {
  if (r.method == SampleMethod::kPrioritized) return r.priority_exponent;
  if (r.method == SampleMethod::kUniform && r.uniform_starts && r.window > 0) return kLengthWeights;
  return std::numeric_limits<float>::quiet_NaN();
}

// Prioritized sampling needs `tree`, the table's priority index refreshed for the request's exponent
// (without it the method is refused); uniform windows with uniform_starts draw their candidates through
// `tree` when it is the index over lengths (else by rejection against the longest row); the other
// methods ignore it. Uniform and prioritized picks of a
// large batch are shared out over `parallel`'s threads (fifo, lifo and top-k run on the calling thread).
KernelStatus SampleRowsCpu(const TableView& table, const SampleRequest& request, SampleResult out,
                           const PriorityTreeView* tree = nullptr, const ParallelFor& parallel = SerialFor());

// An epoch's order of `n` picks (gear_jax.epoch): the picks of even generation (real ones) first, in a
// uniformly random order drawn from the seed words (a Fisher-Yates shuffle, draw i from the Philox
// counter (i, 0, Draw::kShuffle)), then the failed ones (odd generation) in their own order.
// order[k] is the pick that goes to position k. O(n), on the calling thread.
void ShufflePicks(uint32_t seed0, uint32_t seed1, const uint32_t* generations, int64_t n, int32_t* order);

}  // namespace gear
