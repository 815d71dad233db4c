// Every exception of the native runtime that Python sees as a type of its own, in one place; module.cc
// (RegisterNativeErrors) raises each as its gear_jax.errors class, in one table. Others take pybind11's
// mapping (std::invalid_argument: ValueError, std::out_of_range: IndexError, std::bad_alloc: MemoryError,
// ...).
#pragma once

#include <stdexcept>
#include <string>

namespace gear {

// No table of that name (or it was closed or removed): gear_jax.TableNotFoundError.
struct NotFoundError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A file that is not a table of this format, or a damaged one: gear_jax.TableMismatchError.
struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// /dev/shm cannot hold the table: gear_jax.OutOfSpaceError.
struct OutOfSpaceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A pooled table's name vanished from /dev/shm. Never reaches Python: the pool drops the entry.
struct PoolEntryLost : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A wait for the rate limiter ran out of time: gear_jax.RateLimiterTimeout.
struct RateLimiterTimeoutError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A value of the caller's that only the native layer can judge (a queue row's priority of 0, say):
// gear_jax.InvalidArgumentError.
struct InvalidArgument : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
// A request the limiter can never admit (a batch larger than its tolerance): gear_jax.InvalidArgumentError.
struct RateLimiterRefusal : InvalidArgument {
  using InvalidArgument::InvalidArgument;
};
// Every row is held by a writer: nothing can be claimed: gear_jax.AllRowsHeldError.
struct AllRowsHeldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The table was closed (before a call, or while it waited): gear_jax.TableClosedError.
struct TableClosedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A refusal of a host call (host_calls.h), raised as the gear_jax exception `python_type`
// (gear_jax/errors.py): "NotEnoughRowsError" (no selectable row; fewer than B for fifo, lifo, topk) or
// "InvalidArgumentError".
class HostCallError : public std::runtime_error {
 public:
  HostCallError(const char* python_type, const std::string& message)
      : std::runtime_error(message), python_type_(python_type) {}
  const char* python_type() const { return python_type_; }

 private:
  const char* python_type_;
};

}  // namespace gear
