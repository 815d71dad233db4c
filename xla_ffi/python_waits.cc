#include "xla_ffi/python_waits.h"

#include <pybind11/pybind11.h>

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

}  // namespace gear
