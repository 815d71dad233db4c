#include "sample.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "atomics.h"
#include "philox.h"
#include "priority_index.h"
#include "selection.h"

namespace gear {
namespace {

KernelStatus Empty() { return KernelError(ErrorSite::kSampleEmpty); }

void Record(const TableView& t, const SampleRequest& r, SampleResult out, int64_t pick, int64_t row,
            uint64_t state, float probability) {
  out.indices[pick] = static_cast<int32_t>(row);
  out.generations[pick] = StateGeneration(state);
  out.probabilities[pick] = probability;
  out.starts[pick] = r.window > 0 ? WindowStart(LoadRelaxed(&t.length[row]), r.window, r.seed0, r.seed1,
                                                static_cast<uint32_t>(pick))
                                  : 0;
  FetchAdd<uint32_t>(&t.times_sampled[row], 1u);
}

// Uniform picks of a large batch are shared out over the threads in ranges of this many picks. A pick
// costs about 20 ns (1e5 rows, 2-core EPYC VM): 2,048 picks alone took 40-46 us, while waking a
// sleeping thread there costs tens of microseconds (1,024 picks took 36 us in two ranges of 512, 20 us
// in one).
constexpr int64_t kUniformGrain = 2048;

KernelStatus SampleUniform(const TableView& t, const SampleRequest& r, SampleResult out,
                           const ParallelFor& parallel) {
  const int64_t claimed = ClaimedRows(t);
  if (claimed == 0) return Empty();
  auto candidate = [&](uint32_t pick, int attempt) {
    double u = UniformDouble(r.seed0, r.seed1, pick, static_cast<uint32_t>(attempt), Draw::kSelect);
    return std::min<int64_t>(static_cast<int64_t>(u * claimed), claimed - 1);
  };
  // Rejection, range by range: the first candidate of every pick of the range fetched ahead so that
  // the picks' cache misses overlap. A pick whose every attempt was rejected is left at row -1.
  parallel.Run(r.batch_size, kUniformGrain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> first(static_cast<size_t>(end - begin));
    for (int64_t i = begin; i < end; ++i) {
      const int64_t c = first[i - begin] = candidate(static_cast<uint32_t>(i), 0);
      __builtin_prefetch(&t.state[c]);
      __builtin_prefetch(&t.length[c]);
      __builtin_prefetch(&t.times_sampled[c]);
      if (r.prefetch_rows != nullptr)
        __builtin_prefetch(r.prefetch_rows->data + c * r.prefetch_rows->row_stride);
    }
    for (int64_t i = begin; i < end; ++i) {
      out.indices[i] = -1;
      for (int attempt = 0; attempt < kUniformAttempts; ++attempt) {
        const int64_t c = attempt == 0 ? first[i - begin] : candidate(static_cast<uint32_t>(i), attempt);
        const uint64_t s = LoadAcquire(&t.state[c]);
        if (StateSelectable(s) && LengthUsable(t, c)) {
          Record(t, r, out, i, c, s, 0.0f);
          break;
        }
      }
    }
  });
  // The exact fallback for the picks rejection did not place: one scan of the selectable rows.
  std::vector<std::pair<int64_t, uint64_t>> selectable;
  bool scanned = false;
  for (int64_t i = 0; i < r.batch_size; ++i) {
    if (out.indices[i] >= 0) continue;
    if (!scanned) {
      for (int64_t k = 0; k < claimed; ++k) {
        uint64_t s = LoadAcquire(&t.state[k]);
        if (StateSelectable(s) && LengthUsable(t, k)) selectable.emplace_back(k, s);
      }
      scanned = true;
    }
    if (selectable.empty()) return Empty();
    double u = UniformDouble(r.seed0, r.seed1, static_cast<uint32_t>(i), 0, Draw::kFallback);
    size_t k = std::min(static_cast<size_t>(u * selectable.size()), selectable.size() - 1);
    Record(t, r, out, i, selectable[k].first, selectable[k].second, 0.0f);
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
  const size_t keep = static_cast<size_t>(r.batch_size);
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
      ++count;
      continue;
    }
    if (!LengthUsable(t, k)) continue;
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
  for (int64_t i = 0; i < r.batch_size; ++i) {
    const bool found = i < static_cast<int64_t>(best.size());
    if (found) {
      Record(t, r, out, i, best[i].row, best[i].state, 1.0f);
    } else {
      RecordFailed(out, i);
    }
    if (out.order_keys != nullptr) out.order_keys[i] = found ? best[i].key : kNoCandidate;
  }
  return {};
}

}  // namespace

KernelStatus SampleRowsCpu(const TableView& table, const SampleRequest& request, SampleResult out,
                           const PriorityTreeView* tree, const ParallelFor& parallel) {
  if (request.batch_size <= 0) return {};
  if (request.method == SampleMethod::kUniform) return SampleUniform(table, request, out, parallel);
  if (out.selectable != nullptr) *out.selectable = SelectableCount(LoadRelaxed(table.selectable));
  switch (request.method) {
    case SampleMethod::kPrioritized:
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

int64_t ClaimedRows(const TableView& t) {
  const uint64_t next = LoadRelaxed(t.next_seq);
  return next < static_cast<uint64_t>(t.capacity) ? static_cast<int64_t>(next) : t.capacity;
}

}  // namespace gear
