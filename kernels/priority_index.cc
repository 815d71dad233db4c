#include "priority_index.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "atomics.h"
#include "philox.h"
#include "selection.h"

namespace gear {
namespace {

size_t Align64(size_t n) { return (n + 63) & ~size_t{63}; }

class PlainMemory : public IndexMemory {
 public:
  void* Allocate(size_t bytes) override {
    void* data = std::calloc(1, bytes);
    if (data == nullptr) throw std::bad_alloc();
    return data;
  }
  void Free(void* data, size_t) override { std::free(data); }
};

bool LengthUsable(const TableView& t, int64_t row) {
  return LengthInRange(LoadRelaxed(&t.length[row]), t.max_steps);
}

}  // namespace

std::unique_ptr<IndexMemory> PlainIndexMemory() { return std::make_unique<PlainMemory>(); }

PriorityIndex::PriorityIndex(int64_t rows, float exponent, std::unique_ptr<IndexMemory> memory)
    : rows_(rows), exponent_(exponent), memory_(std::move(memory)) {
  view_.rows = rows;
  view_.levels = TreeLevels(rows);
  view_.level_nodes[0] = rows;
  int64_t total_nodes = 0;
  for (int level = 1; level <= view_.levels; ++level) {
    view_.level_nodes[level] = (view_.level_nodes[level - 1] + kTreeFanout - 1) / kTreeFanout;
    view_.level_start[level] = total_nodes;
    total_nodes += view_.level_nodes[level];
  }
  const size_t weights_at = 0;
  const size_t seen_at = Align64(weights_at + rows * sizeof(double));
  const size_t nodes_at = Align64(seen_at + rows * sizeof(uint64_t));
  const size_t selectable_at = Align64(nodes_at + total_nodes * sizeof(double));
  const size_t counters_at = Align64(selectable_at + sizeof(int64_t));
  bytes_ = Align64(counters_at + ChangeCounterCount(rows) * sizeof(uint32_t));
  data_ = static_cast<uint8_t*>(memory_->Allocate(bytes_));
  weights_ = reinterpret_cast<double*>(data_ + weights_at);
  seen_ = reinterpret_cast<uint64_t*>(data_ + seen_at);
  nodes_ = reinterpret_cast<double*>(data_ + nodes_at);
  selectable_ = reinterpret_cast<int64_t*>(data_ + selectable_at);
  counters_ = reinterpret_cast<uint32_t*>(data_ + counters_at);
  view_.weights = weights_;
  view_.seen = seen_;
  view_.nodes = nodes_;
  view_.selectable = selectable_;
}

PriorityIndex::~PriorityIndex() { memory_->Free(data_, bytes_); }

PriorityTreeView PriorityIndex::DeviceView() const {
  PriorityTreeView v = view_;
  v.weights = static_cast<const double*>(memory_->DeviceAddress(weights_));
  v.seen = static_cast<const uint64_t*>(memory_->DeviceAddress(seen_));
  v.nodes = static_cast<const double*>(memory_->DeviceAddress(nodes_));
  v.selectable = static_cast<const int64_t*>(memory_->DeviceAddress(selectable_));
  return v;
}

void PriorityIndex::SetLeafWeight(const TableView& t, int64_t row, uint64_t state) {
  // The length is read after the state: it is the one published with it, or a later writer's, whose
  // claim moves the change counters again. A selectable row of a length out of range (a damaged file)
  // weighs nothing and is seen with its generation's parity flipped: it never counts as selectable, and
  // every refresh that reaches its group looks at it again.
  const bool selectable = StateSelectable(state);
  const bool usable = selectable && LengthUsable(t, row);
  const uint64_t seen = usable || !selectable ? state : state ^ (uint64_t{1} << 32);
  *selectable_ +=
      static_cast<int64_t>(StateSelectable(seen)) - static_cast<int64_t>(StateSelectable(seen_[row]));
  seen_[row] = seen;
  weights_[row] = usable ? PriorityWeight(state, exponent_) : 0.0;
}

void PriorityIndex::RecomputeNode(int level, int64_t node) {
  const double* children = level == 1 ? weights_ : nodes_ + view_.level_start[level - 1];
  const int64_t first = node * kTreeFanout;
  const int64_t end = std::min<int64_t>(first + kTreeFanout, view_.level_nodes[level - 1]);
  double sum = 0.0;
  for (int64_t c = first; c < end; ++c) sum += children[c];
  nodes_[view_.level_start[level] + node] = sum;
}

void PriorityIndex::Refresh(const TableView& t) {
  uint32_t* counters[kChangeLevels];
  const uint32_t* shared[kChangeLevels];
  for (int level = 0; level < kChangeLevels; ++level) {
    counters[level] = counters_ + ChangeLevelStart(rows_, level);
    shared[level] = t.change_counts + ChangeLevelStart(rows_, level);
  }
  if (!built_) {
    // Counters first (top level first), then every row: a change after its counter was read is seen
    // as a moved counter by the next refresh.
    for (int level = kChangeLevels - 1; level >= 0; --level) {
      for (int64_t g = 0; g < ChangeGroups(rows_, level); ++g)
        counters[level][g] = LoadAcquire(&shared[level][g]);
    }
    for (int64_t row = 0; row < rows_; ++row) SetLeafWeight(t, row, LoadAcquire(&t.state[row]));
    for (int level = 1; level <= view_.levels; ++level) {
      for (int64_t node = 0; node < view_.level_nodes[level]; ++node) RecomputeNode(level, node);
    }
    built_ = true;
    return;
  }
  // The level-1 nodes over rows whose weight changed, in increasing order.
  std::vector<int64_t> dirty;
  const int top = kChangeLevels - 1;
  const int64_t fan = int64_t{1} << (ChangeShift(1) - ChangeShift(0));  // groups per group of the level above
  for (int64_t g2 = 0; g2 < ChangeGroups(rows_, top); ++g2) {
    const uint32_t v2 = LoadAcquire(&shared[top][g2]);
    if (v2 == counters[top][g2]) continue;
    counters[top][g2] = v2;
    const int64_t g1_end = std::min<int64_t>((g2 + 1) * fan, ChangeGroups(rows_, 1));
    for (int64_t g1 = g2 * fan; g1 < g1_end; ++g1) {
      const uint32_t v1 = LoadAcquire(&shared[1][g1]);
      if (v1 == counters[1][g1]) continue;
      counters[1][g1] = v1;
      const int64_t g0_end = std::min<int64_t>((g1 + 1) * fan, ChangeGroups(rows_, 0));
      for (int64_t g0 = g1 * fan; g0 < g0_end; ++g0) {
        const uint32_t v0 = LoadAcquire(&shared[0][g0]);
        if (v0 == counters[0][g0]) continue;
        counters[0][g0] = v0;
        const int64_t row_end = std::min<int64_t>((g0 + 1) << ChangeShift(0), rows_);
        for (int64_t row = g0 << ChangeShift(0); row < row_end; ++row) {
          const uint64_t s = LoadAcquire(&t.state[row]);
          if (s == seen_[row]) continue;
          const double before = weights_[row];
          SetLeafWeight(t, row, s);
          // Compared as bits: 0 and -0 never occur, and a NaN weight can not (PriorityWeight).
          if (weights_[row] != before && (dirty.empty() || dirty.back() != row / kTreeFanout)) {
            dirty.push_back(row / kTreeFanout);
          }
        }
      }
    }
  }
  // Every level above, recomputed from its children where one of them changed.
  for (int level = 1; level <= view_.levels && !dirty.empty(); ++level) {
    size_t parents = 0;
    for (size_t i = 0; i < dirty.size(); ++i) {
      RecomputeNode(level, dirty[i]);
      const int64_t parent = dirty[i] / kTreeFanout;
      if (parents == 0 || dirty[parents - 1] != parent) dirty[parents++] = parent;
    }
    dirty.resize(parents);
  }
}

namespace {

void RecordPick(const TableView& t, int32_t window, uint32_t seed0, uint32_t seed1, SampleResult out,
                int64_t pick, int64_t row, uint64_t state, float probability) {
  out.indices[pick] = static_cast<int32_t>(row);
  out.generations[pick] = StateGeneration(state);
  out.probabilities[pick] = probability;
  out.starts[pick] =
      window > 0 ? WindowStart(LoadRelaxed(&t.length[row]), window, seed0, seed1, static_cast<uint32_t>(pick))
                 : 0;
  FetchAdd<uint32_t>(&t.times_sampled[row], 1u);
}

// The row a walk ended at, if the table still holds it as the index saw it and its length is usable.
bool StillAsSeen(const TableView& t, const PriorityTreeView& tree, int64_t row, uint64_t* state) {
  if (row < 0) return false;
  *state = LoadAcquire(&t.state[row]);
  return *state == tree.seen[row] && LengthUsable(t, row);
}

}  // namespace

KernelStatus SampleIndexedCpu(const TableView& t, const PriorityTreeView& tree, const SampleRequest& r,
                              SampleResult out) {
  const double total = TreeTotal(tree);
  if (std::isinf(total)) return KernelError(ErrorSite::kSampleWeightOverflow);
  if (!(total > 0.0)) return KernelError(ErrorSite::kSampleEmpty);
  for (int64_t i = 0; i < r.batch_size; ++i) {
    const uint32_t pick = static_cast<uint32_t>(i);
    bool assigned = false;
    for (uint32_t attempt = 0; attempt < kIndexedAttempts && !assigned; ++attempt) {
      const double target = UniformDouble(r.seed0, r.seed1, pick, attempt, Draw::kSelect) * total;
      const int64_t row = DescendTree(tree, target);
      uint64_t state = 0;
      if (!StillAsSeen(t, tree, row, &state)) continue;
      RecordPick(t, r.window, r.seed0, r.seed1, out, i, row, state,
                 static_cast<float>(tree.weights[row] / total));
      assigned = true;
    }
    if (!assigned) RecordFailed(out, i);
  }
  return {};
}

KernelStatus TotalWeightIndexedCpu(const PriorityTreeView& tree, float* total, int32_t* count) {
  const float rounded = static_cast<float>(TreeTotal(tree));
  if (!std::isfinite(rounded)) return KernelError(ErrorSite::kTotalWeightOverflow);
  *total = rounded;
  *count = SelectableCount(*tree.selectable);
  return {};
}

KernelStatus SampleAtIndexedCpu(const TableView& t, const PriorityTreeView& tree, const SampleAtRequest& r,
                                const float* targets, SampleResult out) {
  const double total = TreeTotal(tree);
  if (std::isinf(total)) return KernelError(ErrorSite::kSampleAtWeightOverflow);
  for (int64_t i = 0; i < r.batch_size; ++i) {
    uint64_t state = 0;
    const int64_t row = TargetIsMine(targets[i]) && total > 0.0 ? DescendTree(tree, targets[i]) : -1;
    if (!StillAsSeen(t, tree, row, &state)) {
      RecordFailed(out, i);
      continue;
    }
    RecordPick(t, r.window, r.seed0, r.seed1, out, i, row, state,
               static_cast<float>(tree.weights[row] / total));
  }
  return {};
}

}  // namespace gear
