// The rate limiter's admissions on behalf of Python calls (Table.insert, add, commit, reserve_inserts,
// await_samples): when each host path admits, what it admits, and the reservation that gives back what a
// failed insert did not publish. A wait is at once when the limiter admits the request now; otherwise it
// runs without the GIL, so that other Python threads run (a close() included), and is interruptible:
// every 100 ms it takes the GIL back briefly to run Python's signal handlers, so Ctrl-C ends a wait that
// has no timeout. Every function here is called with the GIL held, and throws as RateLimiter::Await
// does, and pybind11::error_already_set when a signal handler raised (KeyboardInterrupt).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "xla_ffi/open_table.h"

namespace gear {

// Admits and counts `n` inserts or samples on `table` (the SharedTable of `open`, kept alive by the
// caller), waiting up to `timeout` seconds (nullopt: no limit).
void AdmitFromPython(const OpenTable& open, SharedTable& table, RateOp op, int64_t n,
                     const std::optional<double>& timeout);

// SharedTable::Insert of `batch` rows (see there for the arguments), without the GIL. With `admit`, a
// table with a limiter admits the batch first (waiting up to `timeout`), before any row is claimed, and
// gives back what the insert did not publish; without, its rows count as they are published, without a
// wait (the insert custom call's way, which tests drive through here).
void InsertAdmitted(OpenTable& open, const std::vector<const uint8_t*>& field_data, int64_t batch,
                    int32_t steps, const int32_t* lengths, const float* priorities, int32_t* rows,
                    const std::optional<double>& timeout, bool admit);

// Inserts Python code admits before it claims rows and commits them one by one (CommitAdmitted with
// `reserved`), giving back what it did not commit (RateLimiter::ReturnInserts). Nothing is counted
// without a limiter. Throws std::invalid_argument for n < 1.
void ReserveInserts(OpenTable& open, int64_t n, const std::optional<double>& timeout);

// Publishes a row this process holds. `reserved`: the caller admitted it (ReserveInserts) and gives back
// what it does not commit. Otherwise, on a table with a rate limiter, waits (up to `timeout`, holding the
// row) until the limiter admits one insert: a timeout or a close leaves the row held.
void CommitAdmitted(OpenTable& open, int64_t row, int32_t length, float priority,
                    const std::optional<double>& timeout, bool reserved);

// The learner's declaration of `n` samples: waits until the limiter admits them and counts them.
// Throws std::invalid_argument for n < 1.
void AwaitSamples(OpenTable& open, int64_t n, const std::optional<double>& timeout);

}  // namespace gear
