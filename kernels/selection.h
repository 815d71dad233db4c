// Arithmetic of selection shared by the CPU (sample.cc) and CUDA (sample.cu) kernels, so that both
// compute the same weights and draw the same window starts.
#pragma once

#include <math.h>

#include <cstdint>

#include "philox.h"
#include "table_view.h"

namespace gear {

// Uniform sampling draws up to this many candidates per pick (Philox attempts 0..kUniformAttempts-1)
// before the exact fallback scan. CPU and CUDA pick the same rows only while they agree on it.
inline constexpr int kUniformAttempts = 64;

// p^a of a selectable row; 0 for a row that is empty, being written or of priority 0.
GEAR_HD double PriorityWeight(uint64_t state, float exponent) {
  if (!StateSelectable(state)) return 0.0;
  const double p = StatePriority(state);
  if (exponent == 1.0f) return p;
  if (exponent == 0.0f) return 1.0;
  return pow(p, static_cast<double>(exponent));
}

// First index in [first, last) of a nondecreasing prefix sum that exceeds `value`; `last` if none.
GEAR_HD int64_t FirstAbove(const double* prefix, int64_t first, int64_t last, double value) {
  while (first < last) {
    const int64_t mid = first + (last - first) / 2;
    if (prefix[mid] > value) {
      last = mid;
    } else {
      first = mid + 1;
    }
  }
  return first;
}

// Sort key of fifo, lifo and topk, unique among a table's selectable rows and ascending in answer
// order: fifo the commit order, lifo its reverse, topk priority descending then row ascending (the
// float32 bits of positive priorities order as the priorities do).
GEAR_HD uint64_t OrderKey(SampleMethod method, uint64_t insert_seq, int64_t row, uint64_t state) {
  switch (method) {
    case SampleMethod::kFifo: return insert_seq;
    case SampleMethod::kLifo: return ~insert_seq;
    default: {
      const uint32_t priority_bits = static_cast<uint32_t>(state);
      return (static_cast<uint64_t>(~priority_bits) << 32) | static_cast<uint64_t>(row);
    }
  }
}

// Sort key of a row that is not selectable, or of a failed pick: after every real key.
inline constexpr uint64_t kNoCandidate = ~uint64_t{0};

// First step of a window of `window` steps (0: none) in a row of `length` steps, uniform over the
// max(length - window, 0) + 1 possible starts.
GEAR_HD int32_t WindowStart(int32_t length, int32_t window, uint32_t seed0, uint32_t seed1, uint32_t pick) {
  if (window <= 0) return 0;
  const int64_t choices = (length - window > 0 ? length - window : 0) + int64_t{1};
  const double u = UniformDouble(seed0, seed1, pick, 0, Draw::kWindowStart);
  const int64_t start = static_cast<int64_t>(u * static_cast<double>(choices));
  return static_cast<int32_t>(start < choices - 1 ? start : choices - 1);
}

// The exponent under which a priority index (priority_index.h) weighs each selectable row by its length
// instead of p^a: the proposal of uniform windows (SampleRequest::uniform_starts), which draws a row by
// length, then a start uniform in [0, length), and keeps it when it is a valid start (KeepWindow with the
// row's length as the bound): each (row, start) pair is then kept with the same probability. Never a
// user's exponent (those are >= 0).
inline constexpr float kLengthWeights = -1.0f;

// Windows of step-ring tables (and of any trajectory table under short_episodes="skip"): how many
// windows of `window` steps a row of `length` steps offers. Rows shorter than the window offer none
// when they are skipped, one (padded and masked) otherwise.
GEAR_HD int64_t WindowCount(int32_t length, int32_t window, bool skip_short) {
  if (window <= 0) return 1;
  const int64_t starts = int64_t{length} - window + 1;
  return starts > 0 ? starts : (skip_short ? 0 : 1);
}

// What a selectable row of `length` steps weighs in uniform picks of windows under a sample's law
// (SampleRequest::skip_short, uniform_starts): its count of windows with uniform_starts (every valid
// window equally likely), else 1 when it offers a window (rows uniform). The total of these weights over
// a table is what a draw across tables (sharded tables) weighs that table by.
GEAR_HD int64_t UniformWindowWeight(int32_t length, int32_t window, bool skip_short, bool uniform_starts) {
  const int64_t count = WindowCount(length, window, skip_short);
  return uniform_starts ? count : (count > 0 ? 1 : 0);
}

// Rejection step of uniform picks with a window: whether candidate draw `attempt` of pick `pick`, a
// selectable row of `length` steps, is kept, and its window's start. With `uniform_starts` (every valid
// window of the table equally likely, rows weighted by WindowCount) the start is drawn uniform in
// [0, longest) and kept when it is a valid start of the row: for `longest` >= every row's count, each
// (row, start) pair is kept with the same probability. Otherwise the row is kept when it offers a window
// and the start is WindowStart's.
GEAR_HD bool KeepWindow(int32_t length, int32_t window, bool skip_short, bool uniform_starts, int32_t longest,
                        uint32_t seed0, uint32_t seed1, uint32_t pick, uint32_t attempt, int32_t* start) {
  const int64_t count = WindowCount(length, window, skip_short);
  if (count == 0) return false;
  if (!uniform_starts || window <= 0) {
    *start = WindowStart(length, window, seed0, seed1, pick);
    return true;
  }
  const int64_t bound = longest > count ? longest : count;
  const double u = UniformDouble(seed0, seed1, pick, attempt, Draw::kWindowStart);
  int64_t drawn = static_cast<int64_t>(u * static_cast<double>(bound));
  if (drawn > bound - 1) drawn = bound - 1;
  if (drawn >= count) return false;
  *start = static_cast<int32_t>(drawn);
  return true;
}

}  // namespace gear
