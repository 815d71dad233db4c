// Draws made by the CPU kernels on a table's host view, as a CPU custom call makes them: for gear_jax.host
// (host_calls.cc), and for the GPU programs whose samples must run on the host (a table with
// max_times_sampled on a GPU without native host atomics: cuda_handlers.cu). The same request and key
// give the same picks in all three, with one exception: a limited table's picks of a batch large enough
// to be shared over threads (more than one range: kernels/sample.cc, priority_index.cc) race for a row's
// last sample, which the GPU's draws, made on one thread, do not; a CPU range that finds a row used up
// by another may draw again where the one-thread draw records a failed pick (the GPU tests' batches
// are one range).
#pragma once

#include "kernels/errors.h"
#include "kernels/gather.h"
#include "kernels/parallel.h"
#include "kernels/sample.h"
#include "kernels/sample_at.h"
#include "xla_ffi/shared_table.h"

namespace gear {

// A sample (or, with `gather`, a sample + gather into `out`): the repair of counters a dead writer left
// off, the priority index the request needs (prioritized picks; uniform windows by length), then the
// kernels over `threads`. Throws std::bad_alloc when there is no memory for a first use of the index.
KernelStatus DrawOnHost(SharedTable& table, const SampleRequest& request, const SampleResult& picks,
                        const GatherRequest* gather, const GatherOutputs& out, const ParallelFor& threads);

// sample_at's picks (sample_at.h) through the CPU's priority index of the request's exponent. Throws
// std::bad_alloc as DrawOnHost does.
KernelStatus DrawAtOnHost(SharedTable& table, const SampleAtRequest& request, const float* targets,
                          const SampleResult& picks);

}  // namespace gear
