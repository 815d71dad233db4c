// Gather of sampled rows (or time windows of trajectory rows) into dense outputs, with the seqlock
// check of the consistency model: a row is copied, then its generation is read again; a row whose
// generation is not the sampled one (before or after the copy) comes back zeroed and invalid.
// CPU implementation in gather.cc; the CUDA one (gather.cu) keeps the same semantics.
#pragma once

#include <cstdint>

#include "parallel.h"
#include "sample.h"
#include "table_view.h"

namespace gear {

struct PriorityTreeView;  // priority_index.h

struct GatherRequest {
  int64_t batch_size = 0;
  int32_t window = 1;  // steps per output row (1 for transition tables)
  int32_t num_fields = 0;
  int32_t field_ids[kMaxFields];
};

struct GatherOutputs {
  uint8_t* fields[kMaxFields];  // [batch, window, *field shape], in request order
  bool* valid;                  // [batch, window]: row valid and step inside the row's length
};

// Fails unless every row id lies in [0, capacity).
// The first of indices[0, n) outside the table, reported at `site` (kGatherIndex or kScatterIndex).
KernelStatus CheckRowsInRange(const TableView& table, const int32_t* indices, int64_t n, ErrorSite site);

// indices: int32[B] rows; generations: uint32[B] as sampled; starts: int32[B] first step of each window.
// Large gathers are shared out over `parallel`'s threads.
KernelStatus GatherRowsCpu(const TableView& table, const int32_t* indices, const uint32_t* generations,
                           const int32_t* starts, const GatherRequest& request, GatherOutputs out,
                           const ParallelFor& parallel = SerialFor());

// Sample + gather in one call, the common learner step: selects `sample.batch_size` rows with
// SampleRowsCpu (prioritized: through `tree`, the table's index refreshed for the request's exponent)
// into `picks`, then gathers them into `out` (the caller makes `gather.batch_size`
// equal it).
// The result equals SampleRowsCpu followed by GatherRowsCpu on its picks; the selection has just read every
// picked row's state, so the gather's reads of it hit the cache.
KernelStatus SampleGatherCpu(const TableView& table, const SampleRequest& sample, SampleResult picks,
                             const GatherRequest& gather, GatherOutputs out,
                             const PriorityTreeView* tree = nullptr,
                             const ParallelFor& parallel = SerialFor());

}  // namespace gear
