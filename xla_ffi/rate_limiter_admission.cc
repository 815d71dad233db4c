#include "xla_ffi/rate_limiter_admission.h"

#include <pybind11/pybind11.h>

#include <memory>
#include <stdexcept>

#include "xla_ffi/clock.h"

namespace py = pybind11;

namespace gear {
namespace {

constexpr int64_t kSignalCheckNs = 100'000'000;  // Python's signal handlers run every 100 ms of a wait

}  // namespace

void AdmitFromPython(const OpenTable& open, SharedTable& table, RateOp op, int64_t n,
                     const std::optional<double>& timeout) {
  if (table.rate_limiter().TryAdmit(op, n)) return;
  int64_t next_check = MonotonicNs() + kSignalCheckNs;
  py::gil_scoped_release release;
  open.AwaitAdmission(table, op, n, timeout ? *timeout : -1.0, [&] {
    if (MonotonicNs() < next_check) return;
    next_check = MonotonicNs() + kSignalCheckNs;
    py::gil_scoped_acquire acquire;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  });
}

void InsertAdmitted(OpenTable& open, const std::vector<const uint8_t*>& field_data, int64_t batch,
                    int32_t steps, const int32_t* lengths, const float* priorities, int32_t* rows,
                    const std::optional<double>& timeout, bool admit) {
  const std::shared_ptr<SharedTable> held = open.ref();  // kept while the GIL is released
  SharedTable& table = *held;
  RateLimiter& limiter = table.rate_limiter();
  std::optional<InsertReservation> reservation;  // gives back what a failed insert did not publish
  if (limiter.enabled() && admit && batch > 0) {
    AdmitFromPython(open, table, RateOp::kInsert, batch, timeout);
    reservation.emplace(limiter, batch);
  }
  py::gil_scoped_release release;
  table.Insert(field_data, batch, steps, lengths, priorities, rows, reservation ? &*reservation : nullptr);
}

void ReserveInserts(OpenTable& open, int64_t n, const std::optional<double>& timeout) {
  const std::shared_ptr<SharedTable> held = open.ref();  // kept while the GIL is released
  if (n < 1) throw std::invalid_argument("reserve_inserts needs n >= 1");
  if (held->rate_limiter().enabled()) AdmitFromPython(open, *held, RateOp::kInsert, n, timeout);
}

void CommitAdmitted(OpenTable& open, int64_t row, int32_t length, float priority,
                    const std::optional<double>& timeout, bool reserved) {
  RateLimiter& limiter = open.table().rate_limiter();
  if (!limiter.enabled()) return open.Commit(row, length, priority);
  if (!reserved) {
    const std::shared_ptr<SharedTable> held = open.ref();  // kept while the GIL is released
    AdmitFromPython(open, *held, RateOp::kInsert, 1, timeout);
  }
  InsertReservation reservation(limiter, 1);  // gives the insert back if the row is not published
  if (reserved) reservation.Keep();           // the Python caller settles its own reservation
  open.Commit(row, length, priority, &reservation);
}

void AwaitSamples(OpenTable& open, int64_t n, const std::optional<double>& timeout) {
  const std::shared_ptr<SharedTable> held = open.ref();  // kept while the GIL is released
  if (n < 1) throw std::invalid_argument("await_samples needs n >= 1");
  AdmitFromPython(open, *held, RateOp::kSample, n, timeout);
}

}  // namespace gear
