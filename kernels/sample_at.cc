#include "sample_at.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "atomics.h"
#include "selection.h"

namespace gear {
namespace {

struct PendingPick {
  float target;
  int64_t pick;
  int64_t row = -1;  // -1: not answered yet
  uint64_t state = 0;
  double weight = 0.0;
};

}  // namespace

KernelStatus TotalWeightCpu(const TableView& t, float priority_exponent, float* total, int32_t* count) {
  const int64_t claimed = ClaimedRows(t);
  double sum = 0.0;
  int64_t selectable = 0;
  for (int64_t k = 0; k < claimed; ++k) {
    const uint64_t s = LoadRelaxed(&t.state[k]);
    if (!StateSelectable(s)) continue;
    ++selectable;
    sum += PriorityWeight(s, priority_exponent);
  }
  const float rounded = static_cast<float>(sum);
  if (!std::isfinite(rounded)) return KernelError(ErrorSite::kTotalWeightOverflow);
  *total = rounded;
  *count = static_cast<int32_t>(selectable);
  return {};
}

KernelStatus SampleAtCpu(const TableView& t, const SampleAtRequest& r, const float* targets,
                         SampleResult out) {
  // The picks of this table in increasing target order; one pass over the rows answers them in turn.
  std::vector<PendingPick> picks;
  picks.reserve(static_cast<size_t>(r.batch_size));
  for (int64_t i = 0; i < r.batch_size; ++i) {
    if (TargetIsMine(targets[i])) {
      picks.push_back(PendingPick{targets[i], i});
    } else {
      RecordFailed(out, i);
    }
  }
  std::sort(picks.begin(), picks.end(), [](const PendingPick& a, const PendingPick& b) {
    return a.target < b.target || (a.target == b.target && a.pick < b.pick);
  });
  const int64_t claimed = ClaimedRows(t);
  double running = 0.0;
  size_t next = 0;
  int64_t last_row = -1;
  uint64_t last_state = 0;
  double last_weight = 0.0;
  for (int64_t k = 0; k < claimed; ++k) {
    const uint64_t s = LoadAcquire(&t.state[k]);
    const double w = PriorityWeight(s, r.priority_exponent);
    if (!(w > 0.0)) continue;
    running += w;
    for (; next < picks.size() && running > static_cast<double>(picks[next].target); ++next) {
      picks[next].row = k, picks[next].state = s, picks[next].weight = w;
    }
    last_row = k, last_state = s, last_weight = w;
  }
  if (std::isinf(running)) return KernelError(ErrorSite::kSampleAtWeightOverflow);
  for (; next < picks.size(); ++next) {  // targets at or past the total
    picks[next].row = last_row, picks[next].state = last_state, picks[next].weight = last_weight;
  }
  for (const PendingPick& p : picks) {
    // No row of positive weight, or the row's length is out of range (a damaged file: sample_at.h).
    if (p.row < 0 || !LengthInRange(LoadRelaxed(&t.length[p.row]), t.max_steps)) {
      RecordFailed(out, p.pick);
      continue;
    }
    out.indices[p.pick] = static_cast<int32_t>(p.row);
    out.generations[p.pick] = StateGeneration(p.state);
    out.probabilities[p.pick] = static_cast<float>(p.weight / running);
    out.starts[p.pick] = r.window > 0 ? WindowStart(LoadRelaxed(&t.length[p.row]), r.window, r.seed0, r.seed1,
                                                    static_cast<uint32_t>(p.pick))
                                      : 0;
    FetchAdd<uint32_t>(&t.times_sampled[p.row], 1u);
  }
  return {};
}

}  // namespace gear
