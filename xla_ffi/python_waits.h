// Waits for a table's rate limiter on behalf of a Python call (insert, add, commit, await_samples): at
// once when the limiter admits the request now; otherwise without the GIL, so that other Python threads
// run (a close() included), and interruptible: every 100 ms the wait takes the GIL back briefly to run
// Python's signal handlers, so Ctrl-C ends a wait that has no timeout.
#pragma once

#include <cstdint>
#include <optional>

#include "xla_ffi/open_table.h"

namespace gear {

// Admits and counts `n` inserts or samples on `table` (the SharedTable of `open`, kept alive by the
// caller), waiting up to `timeout` seconds (nullopt: no limit). Throws as RateLimiter::Await does, and
// pybind11::error_already_set when a signal handler raised (KeyboardInterrupt). Call with the GIL held.
void AdmitFromPython(const OpenTable& open, SharedTable& table, RateOp op, int64_t n,
                     const std::optional<double>& timeout);

}  // namespace gear
