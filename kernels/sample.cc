#include "sample.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "atomics.h"
#include "philox.h"
#include "priority_index.h"
#include "sample_at.h"
#include "selection.h"

namespace gear {
namespace {

KernelStatus Empty() { return KernelError(ErrorSite::kSampleEmpty); }

// `start`: the window's start where the caller drew it (uniform picks), -1 to draw it here. False, with
// the pick failed, when a limited table's row has no sample left for the generation picked (TakeSample).
bool Record(const TableView& t, const SampleRequest& r, SampleResult out, int64_t pick, int64_t row,
            uint64_t state, float probability, int32_t start = -1) {
  if (!TakeSample(t, row, StateGeneration(state))) {
    RecordFailed(out, pick);
    return false;
  }
  out.indices[pick] = static_cast<int32_t>(row);
  out.generations[pick] = StateGeneration(state);
  out.probabilities[pick] = probability;
  if (start < 0) {
    start = r.window > 0 ? WindowStart(LoadRelaxed(&t.length[row]), r.window, r.seed0, r.seed1,
                                       static_cast<uint32_t>(pick))
                         : 0;
  }
  out.starts[pick] = start;
  if (out.lengths != nullptr) out.lengths[pick] = LoadRelaxed(&t.length[row]);
  return true;
}

// Whether a row is long enough for the request (skip_short: at least its window).
bool LongEnough(const TableView& t, const SampleRequest& r, int64_t row) {
  return !r.skip_short || LoadRelaxed(&t.length[row]) >= r.window;
}

// Uniform picks of a large batch are shared out over the threads in ranges of this many picks. A pick
// costs about 20 ns (1e5 rows, 2-core EPYC VM): 2,048 picks alone took 40-46 us, while waking a
// sleeping thread there costs tens of microseconds (1,024 picks took 36 us in two ranges of 512, 20 us
// in one).
constexpr int64_t kUniformGrain = 2048;

KernelStatus SampleUniform(const TableView& t, const SampleRequest& r, SampleResult out,
                           const PriorityTreeView* tree, const ParallelFor& parallel) {
  const int64_t claimed = ClaimedRows(t);
  if (claimed == 0) return Empty();
  const bool windowed = r.window > 0 && (r.skip_short || r.uniform_starts);
  // Uniform windows with the table's index over lengths: candidates drawn by length (kLengthWeights in
  // selection.h), each start kept with probability count / length. Without it: uniform candidates, each
  // start kept with probability count / longest.
  const bool by_length = windowed && r.uniform_starts && tree != nullptr && TreeTotal(*tree) > 0.0;
  const double length_total = by_length ? TreeTotal(*tree) : 0.0;
  // The longest row bounds every row's count of windows (a view without the word: max_steps does).
  const int32_t longest = t.longest != nullptr ? LoadRelaxed(t.longest) : t.max_steps;
  // Draw `attempt` of pick `pick`: a target in the index over lengths (its fraction of the total), or
  // a uniform candidate.
  auto uniform = [&](uint32_t pick, int attempt) {
    return UniformDouble(r.seed0, r.seed1, pick, static_cast<uint32_t>(attempt), Draw::kSelect);
  };
  auto candidate = [&](uint32_t pick, int attempt) -> int64_t {
    return std::min<int64_t>(static_cast<int64_t>(uniform(pick, attempt) * claimed), claimed - 1);
  };
  // Whether `attempt` of pick `i`, at candidate row `c` (-1: none), is kept, and then recorded.
  auto keep = [&](int64_t i, int attempt, int64_t c) -> bool {
    if (c < 0) return false;
    const uint64_t s = LoadAcquire(&t.state[c]);
    if (!StateSelectable(s) || !LengthUsable(t, c)) return false;
    if (!windowed) return Record(t, r, out, i, c, s, 0.0f);
    if (by_length && s != tree->seen[c]) return false;  // changed since the index weighed it
    const int32_t length = LoadRelaxed(&t.length[c]);
    int32_t start = 0;
    return KeepWindow(length, r.window, r.skip_short, r.uniform_starts, by_length ? length : longest, r.seed0,
                      r.seed1, static_cast<uint32_t>(i), static_cast<uint32_t>(attempt), &start) &&
           Record(t, r, out, i, c, s, 0.0f, start);
  };
  auto prefetch_row = [&](int64_t c) {
    __builtin_prefetch(&t.times_sampled[c]);
    if (r.prefetch_rows != nullptr && t.step_capacity == 0)
      __builtin_prefetch(r.prefetch_rows->data + c * r.prefetch_rows->row_stride);
  };
  // Rejection, range by range. A pick whose every attempt was rejected is left at row -1 (or at the
  // failed pick where its last recording failed).
  parallel.Run(r.batch_size, kUniformGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out.indices[i] = -1;
    if (by_length) {
      // Attempt by attempt, the picks still open walk the index together, kTreeLanes at a time (their
      // cache misses overlap), and each pick keeps its first kept attempt: the picks are those of one
      // pick after another, attempt after attempt, except in a limited table (max_times_sampled), where
      // a pick's first attempt now takes a row's last sample before an earlier pick's later attempt.
      std::vector<int64_t> open(static_cast<size_t>(end - begin));
      for (int64_t i = begin; i < end; ++i) open[static_cast<size_t>(i - begin)] = i;
      std::vector<int64_t> still_open;
      double target[kTreeLanes];
      int64_t node[kTreeLanes];
      for (int attempt = 0; attempt < kUniformAttempts && !open.empty(); ++attempt) {
        still_open.clear();
        for (size_t base = 0; base < open.size(); base += kTreeLanes) {
          const int lanes = static_cast<int>(std::min<size_t>(kTreeLanes, open.size() - base));
          for (int j = 0; j < lanes; ++j)
            target[j] = uniform(static_cast<uint32_t>(open[base + j]), attempt) * length_total;
          DescendTreeLanes(t, *tree, true, lanes, target, node);
          for (int j = 0; j < lanes; ++j) {
            if (node[j] >= 0) prefetch_row(node[j]);
          }
          for (int j = 0; j < lanes; ++j) {
            if (!keep(open[base + j], attempt, node[j])) still_open.push_back(open[base + j]);
          }
        }
        open.swap(still_open);
      }
      return;
    }
    // Uniform candidates: the first of every pick of the range fetched ahead so that the picks' cache
    // misses overlap.
    std::vector<int64_t> first(static_cast<size_t>(end - begin));
    for (int64_t i = begin; i < end; ++i) {
      const int64_t c = candidate(static_cast<uint32_t>(i), 0);
      first[i - begin] = c;
      if (c < 0) continue;
      __builtin_prefetch(&t.state[c]);
      __builtin_prefetch(&t.length[c]);
      prefetch_row(c);
    }
    for (int64_t i = begin; i < end; ++i) {
      for (int attempt = 0; attempt < kUniformAttempts; ++attempt) {
        if (keep(i, attempt, attempt == 0 ? first[i - begin] : candidate(static_cast<uint32_t>(i), attempt)))
          break;
      }
    }
  });
  // The exact fallback for the picks rejection did not place: one scan of the selectable rows, each
  // weighed by its count of windows (1 without a window, or without uniform_starts where it has any).
  struct Weighed {
    int64_t row;
    uint64_t state;
    int64_t before;  // the weights of the rows before it
  };
  std::vector<Weighed> selectable;
  int64_t total = 0;
  bool scanned = false;
  for (int64_t i = 0; i < r.batch_size; ++i) {
    if (out.indices[i] >= 0) continue;
    if (!scanned) {
      for (int64_t k = 0; k < claimed; ++k) {
        uint64_t s = LoadAcquire(&t.state[k]);
        if (!StateSelectable(s) || !LengthUsable(t, k)) continue;
        int64_t weight = 1;
        if (windowed) {
          weight = WindowCount(LoadRelaxed(&t.length[k]), r.window, r.skip_short);
          if (weight == 0) continue;
          if (!r.uniform_starts) weight = 1;
        }
        selectable.push_back({k, s, total});
        total += weight;
      }
      scanned = true;
    }
    if (selectable.empty()) {
      // A limited table's earlier picks of this batch may have used its rows up: the rest fail. With
      // no pick made at all, the table had nothing to sample.
      bool some_made = false;
      for (int64_t j = 0; j < r.batch_size && t.max_times_sampled > 0 && !some_made; ++j) {
        some_made = out.indices[j] >= 0 && (out.generations[j] & 1u) == 0;
      }
      if (!some_made) return Empty();
      RecordFailed(out, i);
      continue;
    }
    double u = UniformDouble(r.seed0, r.seed1, static_cast<uint32_t>(i), 0, Draw::kFallback);
    const int64_t rank = std::min(static_cast<int64_t>(u * static_cast<double>(total)), total - 1);
    // The last row whose weights begin at or before the rank.
    const auto it = std::upper_bound(selectable.begin(), selectable.end(), rank,
                                     [](int64_t value, const Weighed& w) { return value < w.before; });
    const Weighed& chosen = *(it - 1);
    Record(t, r, out, i, chosen.row, chosen.state, 0.0f,
           windowed && r.uniform_starts ? static_cast<int32_t>(rank - chosen.before) : -1);
  }
  int64_t count = scanned ? static_cast<int64_t>(selectable.size()) : LoadRelaxed(t.selectable);
  float probability = 1.0f / static_cast<float>(std::max<int64_t>(count, 1));
  for (int64_t i = 0; i < r.batch_size; ++i) out.probabilities[i] = probability;
  if (out.selectable != nullptr) *out.selectable = SelectableCount(count);
  return {};
}

struct Candidate {
  uint64_t key;  // OrderKey (selection.h): ascending in answer order
  int64_t row;
  uint64_t state;
};

KernelStatus SampleOrdered(const TableView& t, const SampleRequest& r, SampleResult out) {
  const int64_t claimed = ClaimedRows(t);
  const SampleMethod method = r.method;
  auto better = [](const Candidate& a, const Candidate& b) { return a.key < b.key; };
  // The best batch_size candidates in O(rows) time and O(batch_size) memory: collect up to 4 x
  // batch_size, then keep the best batch_size; the worst kept one becomes a threshold that most later
  // rows fail with a single comparison.
  // A limited table keeps twice the batch: a candidate another learner took the last sample of meanwhile
  // gives its place to the next one.
  const size_t keep = static_cast<size_t>(r.batch_size) * (t.max_times_sampled > 0 ? 2 : 1);
  std::vector<Candidate> best;
  best.reserve(4 * keep);
  Candidate threshold{};
  bool have_threshold = false;
  auto prune = [&] {
    std::nth_element(best.begin(), best.begin() + static_cast<int64_t>(keep) - 1, best.end(), better);
    best.resize(keep);
    threshold = best.back();
    have_threshold = true;
  };
  int64_t count = 0;
  for (int64_t k = 0; k < claimed; ++k) {
    uint64_t s = LoadAcquire(&t.state[k]);
    if (!StateSelectable(s)) continue;
    const uint64_t seq = method == SampleMethod::kTopK ? 0 : LoadRelaxed(&t.insert_seq[k]);
    Candidate c{OrderKey(method, seq, k, s), k, s};
    // Behind the threshold, `best` already holds batch_size rows: the count (which only decides the
    // errors) needs no length. A row that would enter `best` must have a length in range.
    if (have_threshold && !better(c, threshold)) {
      count += LongEnough(t, r, k);
      continue;
    }
    if (!LengthUsable(t, k) || !LongEnough(t, r, k)) continue;
    ++count;
    best.push_back(c);
    if (best.size() == 4 * keep) prune();
  }
  if (!r.partial) {
    if (count == 0) return Empty();
    if (count < r.batch_size) return KernelError(ErrorSite::kSampleTooFew, 0, count, r.batch_size);
  }
  if (best.size() > keep) prune();
  std::sort(best.begin(), best.end(), better);
  size_t next = 0;  // the best candidate not tried yet
  for (int64_t i = 0; i < r.batch_size; ++i) {
    uint64_t key = kNoCandidate;
    while (next < best.size() && key == kNoCandidate) {
      const Candidate& c = best[next++];
      if (Record(t, r, out, i, c.row, c.state, 1.0f)) key = c.key;
    }
    if (key == kNoCandidate) RecordFailed(out, i);
    if (out.order_keys != nullptr) out.order_keys[i] = key;
  }
  return {};
}

}  // namespace

KernelStatus SampleRowsCpu(const TableView& table, const SampleRequest& request, SampleResult out,
                           const PriorityTreeView* tree, const ParallelFor& parallel) {
  if (request.batch_size <= 0) return {};
  if (request.method == SampleMethod::kUniform) return SampleUniform(table, request, out, tree, parallel);
  if (out.selectable != nullptr) *out.selectable = SelectableCount(LoadRelaxed(table.selectable));
  switch (request.method) {
    case SampleMethod::kPrioritized:
      if (request.skip_short && request.window > 0) break;  // refused (gear_jax.sample says why)
      if (tree != nullptr) return SampleIndexedCpu(table, *tree, request, out, parallel);
      break;
    case SampleMethod::kFifo:
    case SampleMethod::kLifo:
    case SampleMethod::kTopK: return SampleOrdered(table, request, out);
    case SampleMethod::kUniform: break;
  }
  return KernelError(ErrorSite::kSampleMethod, 0, static_cast<int32_t>(request.method));
}

bool IsSampleMethod(int32_t method) {
  for (const SampleMethodName& m : kSampleMethods) {
    if (static_cast<int32_t>(m.method) == method) return true;
  }
  return false;
}

KernelStatus UniformWindowTotalCpu(const TableView& t, const WindowLaw& law, float* total, int32_t* count) {
  const int64_t claimed = ClaimedRows(t);
  int64_t weight = 0, rows = 0;
  for (int64_t row = 0; row < claimed; ++row) {
    if (!StateSelectable(LoadAcquire(&t.state[row])) || !LengthUsable(t, row)) continue;
    const int64_t w =
        UniformWindowWeight(LoadRelaxed(&t.length[row]), law.window, law.skip_short, law.uniform_starts);
    weight += w;
    rows += w > 0;
  }
  *total = static_cast<float>(weight);
  *count = static_cast<int32_t>(std::min<int64_t>(rows, INT32_MAX));
  return {};
}

int64_t ClaimedRows(const TableView& t) {
  const uint64_t next = LoadRelaxed(t.next_seq);
  return next < static_cast<uint64_t>(t.capacity) ? static_cast<int64_t>(next) : t.capacity;
}

void ShufflePicks(uint32_t seed0, uint32_t seed1, const uint32_t* generations, int64_t n, int32_t* order) {
  int64_t real = 0;
  for (int64_t i = 0; i < n; ++i) {
    if ((generations[i] & 1u) == 0) order[real++] = static_cast<int32_t>(i);
  }
  int64_t failed = real;
  for (int64_t i = 0; i < n; ++i) {
    if ((generations[i] & 1u) != 0) order[failed++] = static_cast<int32_t>(i);
  }
  for (int64_t i = real - 1; i > 0; --i) {  // position i takes a uniform one of [0, i]
    const double u = UniformDouble(seed0, seed1, static_cast<uint32_t>(i), 0, Draw::kShuffle);
    const int64_t j = std::min<int64_t>(static_cast<int64_t>(u * static_cast<double>(i + 1)), i);
    std::swap(order[i], order[j]);
  }
}

}  // namespace gear
