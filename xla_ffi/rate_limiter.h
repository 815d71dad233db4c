// Flow control between the processes that insert into a table and those that sample it: the shared
// state of a table's rate limiter, in the table's header so that every process attached to it sees the
// same settings and counts.
#pragma once

#include <cstdint>

namespace gear {

struct RateLimiterState {
  // Settings, written by the creator before the header's magic and never changed after.
  uint32_t enabled;  // 0: no limiter (inserts and samples never wait)
  uint32_t reserved;
  int64_t min_size_to_sample;  // samples wait until the table holds this many rows
  double samples_per_insert;   // 0: no ratio between samples and inserts
  double min_diff, max_diff;   // bounds of inserts * samples_per_insert - samples
  // Counts since the table was made, raised by every process.
  alignas(64) uint64_t inserts;  // rows inserted
  alignas(64) uint64_t samples;  // samples taken
};

}  // namespace gear
