// An index over a table's priorities that makes prioritized selection cost about B log N instead of N.
//
// Each process that samples keeps its own index per priority exponent (xla_ffi/priority_indexes.h): the
// weight w = p^a of every row (PriorityWeight, in double) with the state word it was computed from, and
// a tree of sums above them, kTreeFanout children per node, whose top node is the total weight. The
// index follows the table through its change counters (table_view.h): a refresh reads the counters top
// down, recomputes the weights of the rows whose state changed in the groups whose counters moved, and
// recomputes the sums above them. Every node is always the sum of its children recomputed in child order
// (never adjusted by differences), so the tree holds no rounding drift, and a tree built from the same
// state words is the same, bit for bit, whoever builds it. That is what gives the CPU and the GPU the
// same sample for the same key: the GPU reads a tree the host builds (in pinned, mapped memory).
//
// Selection walks from the top: at each node, the first child, in row order, whose inclusive running
// sum exceeds the target takes the walk (the target then loses the sums before it). A target at or past
// a node's sum (only by rounding, or by a target past the total) takes the last child of positive sum,
// so that the walk ends at the last row of positive weight under that node. This is the same rule as a
// prefix sum over the rows in row order, up to the rounding of the partial sums.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "errors.h"
#include "parallel.h"
#include "sample.h"
#include "sample_at.h"
#include "table_view.h"

namespace gear {

inline constexpr int kTreeFanout = 16;
inline constexpr int kMaxTreeLevels = 8;  // 16^8 > 2^31 rows

// The index as plain pointers, for the CPU and the CUDA kernels.
struct PriorityTreeView {
  int64_t rows = 0;                 // the table's capacity: weights and seen have one entry per row
  int32_t levels = 0;               // node levels above the rows (>= 1); the top one has a single node
  const double* weights = nullptr;  // [rows] p^a of each row's seen state (0: not selectable)
  const uint64_t* seen = nullptr;   // [rows] the state word each weight comes from (see SetLeafWeight)
  const double* nodes = nullptr;    // every level of sums, level 1 (sums of rows) first
  // The same levels as running sums within each group of kTreeFanout siblings (the walk's form):
  // prefix[k] = nodes[group's first] + ... + nodes[k], added in that order.
  const double* prefix = nullptr;
  int64_t level_start[kMaxTreeLevels + 1] = {};  // level k's first node in `nodes` and `prefix` (k >= 1)
  int64_t level_nodes[kMaxTreeLevels + 1] = {};  // level k's node count (level 0: rows)
  const int64_t* selectable = nullptr;           // rows whose seen state is selectable (one int64)
};

GEAR_HD double TreeTotal(const PriorityTreeView& v) { return v.nodes[v.level_start[v.levels]]; }

// Why a prioritized sample from an index whose total is 0 finds nothing: no row is selectable, or the
// selectable rows' weights p^a all underflow to 0 (priorities far below 1 under a large exponent).
GEAR_HD ErrorSite WeightlessSite(const PriorityTreeView& v) {
  return *v.selectable > 0 ? ErrorSite::kSampleWeightUnderflow : ErrorSite::kSampleEmpty;
}

// Where a level's children of a node lie: level 1's children are the rows' weights.
GEAR_HD const double* TreeChildren(const PriorityTreeView& v, int level, int64_t node) {
  return (level == 1 ? v.weights : v.nodes + v.level_start[level - 1]) + node * kTreeFanout;
}

// One step of the walk: from `node` at `level` to its child that holds `*target` (which loses the sums
// before that child), or -1 when no child has a positive sum. Children that are nodes are chosen from
// their running sums (the first one above the target: no branch per child); rows from their weights,
// added in the same order, so both give what a running sum over the children gives.
GEAR_HD int64_t DescendStep(const PriorityTreeView& v, int level, int64_t node, double* target) {
  const double* children = TreeChildren(v, level, node);
  const int64_t first = node * kTreeFanout;
  const int64_t count =
      first + kTreeFanout < v.level_nodes[level - 1] ? kTreeFanout : v.level_nodes[level - 1] - first;
  int64_t last_positive = -1;
  if (level > 1) {
    const double* running = v.prefix + v.level_start[level - 1] + first;
    int64_t below = 0;  // children whose running sum is at most the target (running sums never fall)
    for (int64_t c = 0; c < count; ++c) below += running[c] <= *target;
    if (below < count) {  // that child's sum is > 0: its running sum rose above the one before
      *target -= below > 0 ? running[below - 1] : 0.0;
      return first + below;
    }
    for (int64_t c = 0; c < count; ++c) {
      if (children[c] > 0.0) last_positive = c;
    }
  } else {
    double running = 0.0;
    for (int64_t c = 0; c < count; ++c) {
      const double w = children[c];
      if (!(w > 0.0)) continue;
      if (running + w > *target) {
        *target -= running;
        return first + c;
      }
      last_positive = c;
      running += w;
    }
  }
  if (last_positive < 0) return -1;
  *target = INFINITY;  // the last row of positive weight under this child
  return first + last_positive;
}

// The row the walk for `target` ends at (see the top of this file), or -1 when no row has a positive
// weight. A target of +infinity takes the last row of positive weight.
GEAR_HD int64_t DescendTree(const PriorityTreeView& v, double target) {
  int64_t node = 0;
  for (int level = v.levels; level >= 1 && node >= 0; --level) node = DescendStep(v, level, node, &target);
  return node;
}

inline KernelStatus WeightlessIndex(const PriorityTreeView& v) {
  return KernelError(WeightlessSite(v), 0, *v.selectable);
}

// How many node levels a tree over `rows` rows has, and how many nodes in all.
GEAR_HD int32_t TreeLevels(int64_t rows) {
  int32_t levels = 0;
  int64_t n = rows;
  do {
    n = (n + kTreeFanout - 1) / kTreeFanout;
    ++levels;
  } while (n > 1);
  return levels;
}

// ---- the host side (priority_index.cc) ---------------------------------------------------------------

// Where an index keeps its memory: plain memory for the CPU, or pinned memory mapped for a GPU.
class IndexMemory {
 public:
  virtual ~IndexMemory() = default;
  virtual void* Allocate(size_t bytes) = 0;  // zeroed; throws std::bad_alloc
  virtual void Free(void* data, size_t bytes) = 0;
  // The address a device reads `host` at (the same address for the CPU).
  virtual const void* DeviceAddress(const void* host) const { return host; }
};
std::unique_ptr<IndexMemory> PlainIndexMemory();

class PriorityIndex {
 public:
  PriorityIndex(int64_t rows, float exponent, std::unique_ptr<IndexMemory> memory);
  ~PriorityIndex();
  PriorityIndex(const PriorityIndex&) = delete;
  PriorityIndex& operator=(const PriorityIndex&) = delete;

  // Brings the index up to the rows' state words: the first call reads every row, later ones the rows
  // in groups whose change counters moved since the last call. Not thread-safe: one refresh or read of
  // an index at a time (xla_ffi/priority_indexes.h serializes them). Throws std::bad_alloc when its
  // lists cannot grow; the next refresh then reads every row.
  void Refresh(const TableView& table);
  float exponent() const { return exponent_; }
  int64_t bytes() const { return static_cast<int64_t>(bytes_); }
  const PriorityTreeView& view() const { return view_; }
  // The same index with the addresses a device reads it at.
  PriorityTreeView DeviceView() const;

 private:
  void RefreshOrThrow(const TableView& table);
  void SetLeafWeight(const TableView& table, int64_t row, uint64_t state);
  void RecomputeNode(int level, int64_t node);
  void RecomputeRunningSums(int level, int64_t group);

  int64_t rows_;
  float exponent_;
  std::unique_ptr<IndexMemory> memory_;
  size_t bytes_ = 0;
  uint8_t* data_ = nullptr;
  double* weights_;
  uint64_t* seen_;
  double* nodes_;
  double* prefix_;
  int64_t* selectable_;
  uint32_t* counters_;  // the change counters as of the last refresh
  bool built_ = false;
  PriorityTreeView view_;
  std::vector<int64_t> moved_level1_, changed_groups_, dirty_;  // a refresh's lists, kept for their capacity
};

// Targets walked down the tree together, kTreeLanes at most: node[j] gets the row target[j] ends at
// (-1 when no row has a positive weight; DescendTree's answer) and target[j] what is left of it in that
// row. The lanes go level by level and each step prefetches what the lane's next step reads, so that the
// lanes' cache misses overlap instead of following one another (a prefetch has the other lanes' steps to
// arrive: TLB misses in a virtual machine take long); the last step prefetches the row's state word
// (and its length with `read_length`).
inline constexpr int kTreeLanes = 256;
void DescendTreeLanes(const TableView& table, const PriorityTreeView& tree, bool read_length, int lanes,
                      double* target, int64_t* node);

// Prioritized sample (sample.h) through an index refreshed for the request's exponent. Each pick draws
// the target u * total (u as sample draws it, attempt 0 first) and walks the tree; a walk that ends at a
// row whose state changed since the refresh (a writer or an update since), or whose length is out of
// range, draws again with the next attempt, up to kIndexedAttempts; then the pick gets the failed-pick
// marker. The law of a pick is w / total over the rows that stay as the refresh saw them.
inline constexpr int kIndexedAttempts = 16;
// Batches of more than 256 picks are shared out over `parallel`'s threads.
KernelStatus SampleIndexedCpu(const TableView& table, const PriorityTreeView& tree,
                              const SampleRequest& request, SampleResult out,
                              const ParallelFor& parallel = SerialFor());
// total_weight (sample_at.h) from an index: float32 of its total, and its count of selectable rows.
KernelStatus TotalWeightIndexedCpu(const PriorityTreeView& tree, float* total, int32_t* count);
// sample_at (sample_at.h) through an index: each target of this table walks the tree; a walk that ends
// at a row whose state changed since the refresh, or whose length is out of range, gets the failed-pick
// marker.
KernelStatus SampleAtIndexedCpu(const TableView& table, const PriorityTreeView& tree,
                                const SampleAtRequest& request, const float* targets, SampleResult out);

}  // namespace gear
