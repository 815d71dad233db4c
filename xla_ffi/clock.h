// The clock every wait and throttle of the native runtime reads.
#pragma once

#include <time.h>

#include <cstdint>

namespace gear {

// CLOCK_MONOTONIC in nanoseconds.
inline int64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace gear
