#include "priority_index.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "atomics.h"
#include "philox.h"
#include "selection.h"

namespace gear {
namespace {

size_t Align64(size_t n) { return (n + 63) & ~size_t{63}; }

// Private anonymous memory (zeroed), on transparent huge pages where the kernel gives them: a walk
// touches a few random lines of arrays of 8 bytes per row, and with 4 KiB pages each would also miss
// the TLB.
class PlainMemory : public IndexMemory {
 public:
  void* Allocate(size_t bytes) override {
    void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) throw std::bad_alloc();
    madvise(data, bytes, MADV_HUGEPAGE);
    return data;
  }
  void Free(void* data, size_t bytes) override { munmap(data, bytes); }
};

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
  const size_t prefix_at = Align64(nodes_at + total_nodes * sizeof(double));
  const size_t selectable_at = Align64(prefix_at + total_nodes * sizeof(double));
  const size_t counters_at = Align64(selectable_at + sizeof(int64_t));
  bytes_ = Align64(counters_at + ChangeCounterCount(rows) * sizeof(uint32_t));
  data_ = static_cast<uint8_t*>(memory_->Allocate(bytes_));
  weights_ = reinterpret_cast<double*>(data_ + weights_at);
  seen_ = reinterpret_cast<uint64_t*>(data_ + seen_at);
  nodes_ = reinterpret_cast<double*>(data_ + nodes_at);
  prefix_ = reinterpret_cast<double*>(data_ + prefix_at);
  selectable_ = reinterpret_cast<int64_t*>(data_ + selectable_at);
  counters_ = reinterpret_cast<uint32_t*>(data_ + counters_at);
  view_.weights = weights_;
  view_.seen = seen_;
  view_.nodes = nodes_;
  view_.prefix = prefix_;
  view_.selectable = selectable_;
}

PriorityIndex::~PriorityIndex() { memory_->Free(data_, bytes_); }

PriorityTreeView PriorityIndex::DeviceView() const {
  PriorityTreeView v = view_;
  v.weights = static_cast<const double*>(memory_->DeviceAddress(weights_));
  v.seen = static_cast<const uint64_t*>(memory_->DeviceAddress(seen_));
  v.nodes = static_cast<const double*>(memory_->DeviceAddress(nodes_));
  v.prefix = static_cast<const double*>(memory_->DeviceAddress(prefix_));
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
  if (!usable) {
    weights_[row] = 0.0;
  } else {
    weights_[row] = exponent_ == kLengthWeights ? static_cast<double>(LoadRelaxed(&t.length[row]))
                                                : PriorityWeight(state, exponent_);
  }
}

void PriorityIndex::RecomputeNode(int level, int64_t node) {
  const double* children = level == 1 ? weights_ : nodes_ + view_.level_start[level - 1];
  const int64_t first = node * kTreeFanout;
  const int64_t end = std::min<int64_t>(first + kTreeFanout, view_.level_nodes[level - 1]);
  double sum = 0.0;
  for (int64_t c = first; c < end; ++c) sum += children[c];
  nodes_[view_.level_start[level] + node] = sum;
}

void PriorityIndex::RecomputeRunningSums(int level, int64_t group) {
  const int64_t first = view_.level_start[level] + group * kTreeFanout;
  const int64_t end =
      view_.level_start[level] + std::min<int64_t>((group + 1) * kTreeFanout, view_.level_nodes[level]);
  double running = 0.0;
  for (int64_t k = first; k < end; ++k) {
    running += nodes_[k];
    prefix_[k] = running;
  }
}

void PriorityIndex::Refresh(const TableView& t) {
  try {
    RefreshOrThrow(t);
  } catch (...) {
    built_ = false;  // counters may have moved past rows not yet read: the next refresh reads every row
    throw;
  }
}

// How far ahead a refresh fetches the lines it will read: level-1 change groups (eight lines each: their
// 64 level-0 counters in the table and in the index), level-0 groups (their rows' state, seen, weight and
// length lines) and tree nodes (a node's sibling group and its running sums). Measured (1,024 priorities
// set, then a prioritized sample of 1,024 from the host, 2-core EPYC VM, medians of six runs each): 1e7
// rows 512 us before (no counter prefetch, rows 4 groups ahead, nothing else), 411 us after; 1e6 rows
// 293 and 306 us (within the runs' spread: there the index and counters mostly sit in L3).
constexpr size_t kCounterGroupsAhead = 8;
constexpr size_t kGroupsAhead = 8;

void PriorityIndex::RefreshOrThrow(const TableView& t) {
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
      for (int64_t group = 0; group * kTreeFanout < view_.level_nodes[level]; ++group) {
        RecomputeRunningSums(level, group);
      }
    }
    built_ = true;
    return;
  }
  // Pass 1, the counters alone: the level-0 groups whose counter moved, in increasing order. First the
  // level-2 and level-1 counters (small, read in order), then the level-0 counters under the level-1
  // groups that moved: 64 counters (four lines) each in the table and in this index, at places far
  // apart, fetched kCounterGroupsAhead groups ahead so that their misses overlap.
  static_assert(kTreeFanout == 16, "a level-0 change group is one node of level 1");
  std::vector<int64_t>& moved = moved_level1_;
  std::vector<int64_t>& groups = changed_groups_;
  moved.clear();
  groups.clear();
  const int top = kChangeLevels - 1;
  const int64_t fan = int64_t{1} << (ChangeShift(1) - ChangeShift(0));  // groups per group of the level above
  // Whether the table's counter `g` of `level` moved since this index last looked (then noted as seen).
  auto counter_moved = [&](int level, int64_t g) {
    const uint32_t v = LoadAcquire(&shared[level][g]);
    if (v == counters[level][g]) return false;
    counters[level][g] = v;
    return true;
  };
  for (int64_t g2 = 0; g2 < ChangeGroups(rows_, top); ++g2) {
    if (!counter_moved(top, g2)) continue;
    const int64_t g1_end = std::min<int64_t>((g2 + 1) * fan, ChangeGroups(rows_, 1));
    for (int64_t g1 = g2 * fan; g1 < g1_end; ++g1) {
      if (counter_moved(1, g1)) moved.push_back(g1);
    }
  }
  for (size_t k = 0; k < moved.size(); ++k) {
    if (k + kCounterGroupsAhead < moved.size()) {
      const int64_t first = moved[k + kCounterGroupsAhead] * fan;
      const int64_t count = std::min<int64_t>(fan, ChangeGroups(rows_, 0) - first);  // the last is partial
      for (int64_t line = 0; line < count; line += 16) {
        __builtin_prefetch(&shared[0][first + line]);
        __builtin_prefetch(&counters[0][first + line]);
      }
    }
    const int64_t g1 = moved[k];
    const int64_t g0_end = std::min<int64_t>((g1 + 1) * fan, ChangeGroups(rows_, 0));
    for (int64_t g0 = g1 * fan; g0 < g0_end; ++g0) {
      if (counter_moved(0, g0)) groups.push_back(g0);
    }
  }
  // Pass 2, the rows of those groups (a few groups ahead prefetched, the lengths too: a changed row's
  // weight reads its length): the level-1 nodes whose rows' weights changed, in increasing order.
  std::vector<int64_t>& dirty = dirty_;
  dirty.clear();
  for (size_t k = 0; k < groups.size(); ++k) {
    if (k + kGroupsAhead < groups.size()) {
      const int64_t ahead = groups[k + kGroupsAhead] << ChangeShift(0);
      __builtin_prefetch(&t.state[ahead]);
      __builtin_prefetch(&seen_[ahead]);
      __builtin_prefetch(&weights_[ahead]);
      __builtin_prefetch(&t.length[ahead]);
      if (ahead + 8 < rows_) {  // the group's second line, where it has one
        __builtin_prefetch(&t.state[ahead + 8]);
        __builtin_prefetch(&seen_[ahead + 8]);
        __builtin_prefetch(&weights_[ahead + 8]);
      }
    }
    const int64_t g0 = groups[k];
    const int64_t row_end = std::min<int64_t>((g0 + 1) << ChangeShift(0), rows_);
    bool changed = false;
    for (int64_t row = g0 << ChangeShift(0); row < row_end; ++row) {
      const uint64_t s = LoadAcquire(&t.state[row]);
      if (s == seen_[row]) continue;
      const double before = weights_[row];
      SetLeafWeight(t, row, s);
      changed |= weights_[row] != before;  // weights are never NaN (PriorityWeight)
    }
    if (changed) dirty.push_back(g0);
  }
  // Every level above, recomputed from its children where one of them changed.
  for (int level = 1; level <= view_.levels && !dirty.empty(); ++level) {
    size_t parents = 0;
    for (size_t i = 0; i < dirty.size(); ++i) {
      if (i + 4 < dirty.size()) {
        const double* ahead = TreeChildren(view_, level, dirty[i + 4]);
        __builtin_prefetch(ahead);
        __builtin_prefetch(ahead + 8);
      }
      if (i + kGroupsAhead < dirty.size()) {  // the node's sibling group, and its running sums
        const int64_t first =
            view_.level_start[level] + (dirty[i + kGroupsAhead] & ~int64_t{kTreeFanout - 1});
        __builtin_prefetch(nodes_ + first, 1);
        __builtin_prefetch(nodes_ + first + 8, 1);
        __builtin_prefetch(prefix_ + first, 1);
        __builtin_prefetch(prefix_ + first + 8, 1);
      }
      RecomputeNode(level, dirty[i]);
      const int64_t parent = dirty[i] / kTreeFanout;
      if (parents == 0 || dirty[parents - 1] != parent) dirty[parents++] = parent;
    }
    dirty.resize(parents);
    for (int64_t group : dirty) RecomputeRunningSums(level, group);  // the parents are the sibling groups
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
  if (out.lengths != nullptr) out.lengths[pick] = LoadRelaxed(&t.length[row]);
}

// times_sampled of every picked row (not the failed picks: odd generation), after the picks (TakeSample:
// a limited table's pick of a row with no sample left fails). An atomic
// add is a full barrier on x86 that waits for its cache line: one per pick inside the walks serializes
// the picks' misses (measured: 1e7 rows, 1,024 picks, 1.5 ms with, 0.42 ms without). Plain loads of the
// lines first, whose misses overlap, then the adds on lines in cache.
void CountSamples(const TableView& t, SampleResult out, int64_t begin, int64_t end) {
  uint32_t touched = 0;  // plain loads first: independent, their misses overlap
  for (int64_t i = begin; i < end; ++i) touched += LoadRelaxed(&t.times_sampled[out.indices[i]]);
  asm volatile("" : : "r"(touched));
  for (int64_t i = begin; i < end; ++i) {
    if ((out.generations[i] & 1u) == 0 && !TakeSample(t, out.indices[i], out.generations[i])) {
      RecordFailed(out, i);
    }
  }
}

// The row a walk ended at, if the table still holds it as the index saw it and its length is usable.
// The length was in range for the state the index saw (a row of another length weighs nothing), and a
// writer changes a length only while it holds the row (another state): where the state is the one seen,
// only a damaged file can have changed the length, which gather checks. A window start reads the length,
// so with a window it is checked here too.
bool StillAsSeen(const TableView& t, const PriorityTreeView& tree, int64_t row, int32_t window,
                 uint64_t* state) {
  if (row < 0) return false;
  *state = LoadAcquire(&t.state[row]);
  return *state == tree.seen[row] && (window == 0 || LengthUsable(t, row));
}

void RedrawPick(const TableView& t, const PriorityTreeView& tree, const SampleRequest& r, double total,
                SampleResult out, int64_t i);

constexpr int kIndexedLanes = kTreeLanes;  // also the smallest range given to a thread

// Picks [begin, end): the first attempt of kIndexedLanes picks at a time, walked together
// (DescendTreeLanes). Then the redraws, and the counts of the range's picks.
void SamplePicksIndexed(const TableView& t, const PriorityTreeView& tree, const SampleRequest& r,
                        double total, SampleResult out, int64_t begin, int64_t end) {
  for (int64_t base = begin; base < end; base += kIndexedLanes) {
    const int lanes = static_cast<int>(std::min<int64_t>(kIndexedLanes, end - base));
    double target[kIndexedLanes];
    int64_t node[kIndexedLanes];
    for (int j = 0; j < lanes; ++j)
      target[j] = UniformDouble(r.seed0, r.seed1, static_cast<uint32_t>(base + j), 0, Draw::kSelect) * total;
    DescendTreeLanes(t, tree, r.window > 0, lanes, target, node);
    for (int j = 0; j < lanes; ++j) {
      uint64_t state = 0;
      if (!StillAsSeen(t, tree, node[j], r.window, &state)) {
        node[j] = -1;  // drawn again below
        continue;
      }
      RecordPick(t, r.window, r.seed0, r.seed1, out, base + j, node[j], state,
                 static_cast<float>(tree.weights[node[j]] / total));
    }
    for (int j = 0; j < lanes; ++j) {
      if (node[j] < 0) RedrawPick(t, tree, r, total, out, base + j);
    }
  }
  CountSamples(t, out, begin, end);
}

}  // namespace

void DescendTreeLanes(const TableView& t, const PriorityTreeView& tree, bool read_length, int lanes,
                      double* target, int64_t* node) {
  for (int j = 0; j < lanes; ++j) node[j] = 0;
  for (int level = tree.levels; level >= 1; --level) {
    for (int j = 0; j < lanes; ++j) {
      if (node[j] < 0) continue;
      node[j] = DescendStep(tree, level, node[j], &target[j]);
      if (node[j] < 0) continue;
      // What the next step reads: the running sums of the node's children above level 1 (not their
      // sums, which a step reads only when the running sums fall short), the rows' weights at level 1,
      // the row's seen state after the last step.
      const void* next;
      if (level > 2) {
        next = tree.prefix + tree.level_start[level - 2] + node[j] * kTreeFanout;
      } else {
        next = level == 2 ? static_cast<const void*>(TreeChildren(tree, 1, node[j]))
                          : static_cast<const void*>(&tree.seen[node[j]]);
      }
      __builtin_prefetch(next);
      __builtin_prefetch(static_cast<const char*>(next) + 64);
      if (level == 1) {
        __builtin_prefetch(&t.state[node[j]]);
        if (read_length) __builtin_prefetch(&t.length[node[j]]);
      }
    }
  }
}

KernelStatus SampleIndexedCpu(const TableView& t, const PriorityTreeView& tree, const SampleRequest& r,
                              SampleResult out, const ParallelFor& parallel) {
  const double total = TreeTotal(tree);
  if (std::isinf(total)) return KernelError(ErrorSite::kSampleWeightOverflow);
  if (!(total > 0.0)) return WeightlessIndex(tree);
  // Each pick's draws depend on its index alone, so any split of the picks gives the same sample.
  parallel.Run(r.batch_size, kIndexedLanes,
               [&](int64_t begin, int64_t end) { SamplePicksIndexed(t, tree, r, total, out, begin, end); });
  return {};
}

namespace {

// A pick whose first walk ended at a row that changed since the refresh: attempts 1, 2, ...
void RedrawPick(const TableView& t, const PriorityTreeView& tree, const SampleRequest& r, double total,
                SampleResult out, int64_t i) {
  for (uint32_t attempt = 1; attempt < kIndexedAttempts; ++attempt) {
    const double target =
        UniformDouble(r.seed0, r.seed1, static_cast<uint32_t>(i), attempt, Draw::kSelect) * total;
    const int64_t row = DescendTree(tree, target);
    uint64_t state = 0;
    if (!StillAsSeen(t, tree, row, r.window, &state)) continue;
    RecordPick(t, r.window, r.seed0, r.seed1, out, i, row, state,
               static_cast<float>(tree.weights[row] / total));
    return;
  }
  RecordFailed(out, i);
}

}  // namespace

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
    if (!StillAsSeen(t, tree, row, r.window, &state)) {
      RecordFailed(out, i);
      continue;
    }
    RecordPick(t, r.window, r.seed0, r.seed1, out, i, row, state,
               static_cast<float>(tree.weights[row] / total));
  }
  CountSamples(t, out, 0, r.batch_size);
  return {};
}

}  // namespace gear
