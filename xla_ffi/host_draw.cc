#include "xla_ffi/host_draw.h"

#include <cmath>

#include "kernels/priority_index.h"
#include "xla_ffi/priority_indexes.h"

namespace gear {

KernelStatus DrawOnHost(SharedTable& table, const SampleRequest& request, const SampleResult& picks,
                        const GatherRequest* gather, const GatherOutputs& out, const ParallelFor& threads) {
  const TableView& view = table.view();
  table.CheckCounts(/*force=*/false);
  PriorityIndexes::Held index;
  const PriorityTreeView* tree = nullptr;
  if (const float exponent = IndexExponent(request); !std::isnan(exponent) && request.batch_size > 0) {
    index = table.priority_indexes().ForCpu(view, exponent);
    tree = &index.view();
  }
  return gather == nullptr ? SampleRowsCpu(view, request, picks, tree, threads)
                           : SampleGatherCpu(view, request, picks, *gather, out, tree, threads);
}

KernelStatus DrawAtOnHost(SharedTable& table, const SampleAtRequest& request, const float* targets,
                          const SampleResult& picks) {
  PriorityIndexes::Held index = table.priority_indexes().ForCpu(table.view(), request.priority_exponent);
  return SampleAtIndexedCpu(table.view(), index.view(), request, targets, picks);
}

}  // namespace gear
