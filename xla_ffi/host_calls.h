// Sampling, gathering and priority updates called from Python on numpy arrays, outside any XLA program
// (gear_jax/host.py). They run the CPU kernels the custom calls run (kernels/sample.h, gather.h,
// priorities.h) with the same checks, without the GIL (large batches shared out over a pool of host
// threads, as XLA's intra-op pool shares out the custom calls), so a key's seed words
// give the same picks and the same bytes here as in a jitted call on the CPU. What they save is the
// cost of a jitted call: JAX's dispatch, XLA's result allocation and the table lookup by handle.
#pragma once

#include <sys/types.h>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/gather.h"
#include "kernels/sample.h"
#include "xla_ffi/native_errors.h"
#include "xla_ffi/open_table.h"

namespace gear {

// Selects `batch_size` rows (the sample custom call's kernel) and, when `outputs` is not empty, gathers
// them (sample_gather's): outputs holds the valid mask (bool[B, steps]) then one C-contiguous, writable
// array of B x steps x step bytes per field of `field_ids`. Returns (indices int32[B], generations
// uint32[B], probabilities float32[B], starts int32[B], selectable).
pybind11::tuple HostSample(OpenTable& self, uint32_t seed0, uint32_t seed1, int64_t batch_size,
                           int32_t method, float priority_exponent, int32_t window,
                           const std::vector<int64_t>& field_ids, int32_t steps,
                           const std::vector<pybind11::array>& outputs);

// One draw (sample then gather) made again and again into the same arrays: its arguments checked once,
// its picks written into arrays it makes (picks()) and its rows into `outputs` (as HostSample's), so a
// call is the kernels' work and little more (gear_jax.host.Sampler). Holds `table` (a NativeTable);
// Run raises TableClosedError once the table is closed, and InvalidArgumentError when another thread
// is running a draw of the same HostDraw.
class HostDraw {
 public:
  HostDraw(pybind11::object table, int64_t batch_size, int32_t method, float priority_exponent,
           int32_t window, const std::vector<int64_t>& field_ids, int32_t steps,
           std::vector<pybind11::array> outputs);

  // Draws with the seed words; returns the count N of selectable rows.
  int32_t Run(uint32_t seed0, uint32_t seed1);

  // (indices int32[B], generations uint32[B], probabilities float32[B], starts int32[B], lengths
  // int32[B]): the arrays every Run writes.
  pybind11::tuple picks() const;

 private:
  pybind11::object table_object_;  // keeps table_ alive
  OpenTable& table_;
  std::vector<pybind11::array> outputs_;  // out_ points into them
  pybind11::array_t<int32_t> indices_, starts_;
  pybind11::array_t<uint32_t> generations_;
  pybind11::array_t<float> probabilities_;
  pybind11::array_t<int32_t> lengths_;  // declared after probabilities_: the constructor's order
  SampleRequest request_;
  GatherRequest gather_;
  GatherOutputs out_{};
  SampleResult picks_{};
  std::atomic<pid_t> running_pid_{0};  // the process whose thread is running a draw, 0 when none
};

// Gathers the picks (indices int32[B], generations uint32[B], starts int32[B]) into `outputs`, laid out
// as HostSample's.
void HostGather(OpenTable& self, const pybind11::array_t<int32_t, pybind11::array::c_style>& indices,
                const pybind11::array_t<uint32_t, pybind11::array::c_style>& generations,
                const pybind11::array_t<int32_t, pybind11::array::c_style>& starts,
                const std::vector<int64_t>& field_ids, int32_t steps,
                const std::vector<pybind11::array>& outputs);

// A queue's consumption of the picks `delivered` marks (SharedTable::Consume); returns consumed[i].
pybind11::array_t<bool> HostConsume(OpenTable& self,
                                    const pybind11::array_t<int32_t, pybind11::array::c_style>& indices,
                                    const pybind11::array_t<uint32_t, pybind11::array::c_style>& generations,
                                    const pybind11::array_t<bool, pybind11::array::c_style>& delivered);

// Sets the priorities of the picked rows not overwritten since; returns the entries applied.
int32_t HostUpdatePriorities(OpenTable& self,
                             const pybind11::array_t<int32_t, pybind11::array::c_style>& indices,
                             const pybind11::array_t<uint32_t, pybind11::array::c_style>& generations,
                             const pybind11::array_t<float, pybind11::array::c_style>& priorities);

}  // namespace gear
