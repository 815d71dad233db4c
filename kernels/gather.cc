#include "gather.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "atomics.h"

namespace gear {
namespace {

// Rows are copied one after another from random places, and each copy waits on DRAM: the picks' misses
// must overlap. Each pick's status line and the first line of its data are fetched kFirstLinesAhead
// picks ahead (hundreds of requests in flight, no wait), then the rest of the data of the row about
// kPrefetchBytesAhead bytes ahead (at least kMinPrefetchRows, at most kMaxPrefetchRows rows), so that its
// misses overlap with the copy of the current row. A standalone loop copying 1,024 random rows of 1 KiB
// (2-core EPYC, loaded; medians of 300): no prefetch 0.34-0.47 ms, 4 rows ahead 0.23-0.33 ms, 8 rows
// ahead 0.20-0.45 ms, first lines of all picks then 8 rows ahead 0.24-0.34 ms. The copy is bound by DRAM
// latency and, on /dev/shm's 4 KiB pages, by page walks (numpy's np.take of the same rows is 1.25-1.35x
// slower from a /dev/shm mapping than from its own huge-page memory).
constexpr int64_t kFirstLinesAhead = 256;
constexpr int64_t kPrefetchBytesAhead = 8192;
constexpr int64_t kMinPrefetchRows = 4;
constexpr int64_t kMaxPrefetchRows = 16;
constexpr int64_t kPrefetchBytes = 2048;  // per field and row; the hardware prefetcher streams the rest

// Where the window of `row` from step `start` begins in `field` (a step ring: as the row's first step
// reads now, a guess good enough for a prefetch).
const uint8_t* RowStart(const TableView& t, const FieldView& field, int64_t row, int64_t start) {
  int64_t head = 0;
  const uint64_t first = t.step_capacity > 0 ? LoadRelaxed(&t.first_step[row]) : 0;
  return StepSource(t, field, row, first, start, 1, &head);
}

void PrefetchFirstLines(const TableView& t, const GatherRequest& r, int64_t row, int64_t start) {
  __builtin_prefetch(&t.state[row]);
  __builtin_prefetch(&t.length[row]);
  if (t.step_capacity > 0) {  // the ring's steps wait on the row's first step: fetched in PrefetchRest
    __builtin_prefetch(&t.first_step[row]);
    return;
  }
  for (int32_t f = 0; f < r.num_fields; ++f)
    __builtin_prefetch(RowStart(t, t.fields[r.field_ids[f]], row, start));
}

void PrefetchRest(const TableView& t, const GatherRequest& r, int64_t row, int64_t start) {
  for (int32_t f = 0; f < r.num_fields; ++f) {
    const FieldView& field = t.fields[r.field_ids[f]];
    const int64_t bytes = std::min<int64_t>(r.window * field.step_bytes, kPrefetchBytes);
    // Padded rows: PrefetchFirstLines fetched the first line (a one-line field needs nothing more).
    // A ring's first line waits on the row's first step, fetched there, so it is fetched here.
    const int64_t from = t.step_capacity > 0 ? 0 : 64;
    if (bytes <= from) continue;
    const uint8_t* src = RowStart(t, field, row, start);
    for (int64_t offset = from; offset < bytes; offset += 64) __builtin_prefetch(src + offset);
  }
}

// Copies `bytes` bytes: small copies of fixed sizes inline (a call of the library's memcpy of a few
// bytes cost more than the copy; rows of small fields are mostly such copies).
inline void CopyBytes(uint8_t* dst, const uint8_t* src, int64_t bytes) {
  switch (bytes) {
    case 4: std::memcpy(dst, src, 4); return;
    case 8: std::memcpy(dst, src, 8); return;
    case 16: std::memcpy(dst, src, 16); return;
    default: std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
}

// Rows to prefetch ahead of the copy, for picks of `bytes` bytes each.
int64_t PrefetchRows(int64_t bytes) {
  return std::clamp<int64_t>(kPrefetchBytesAhead / std::max<int64_t>(bytes, 1), kMinPrefetchRows,
                             kMaxPrefetchRows);
}

// A gather of more than kParallelBytes is shared out over the pool's threads in ranges of about that
// many bytes (at least kMinParallelRows rows): the copy waits on DRAM and page walks, and two threads
// overlap twice as many misses. A standalone loop copying 1,024 random rows of 1 KiB out of /dev/shm
// (2-core EPYC): one thread 230-290 us, two threads 178-188 us.
constexpr int64_t kParallelBytes = 128 << 10;
constexpr int64_t kMinParallelRows = 16;

}  // namespace

KernelStatus CheckRowsInRange(const TableView& t, const int32_t* indices, int64_t n, ErrorSite site) {
  for (int64_t i = 0; i < n; ++i) {
    if (indices[i] < 0 || indices[i] >= t.capacity) return KernelError(site, i, indices[i], t.capacity);
  }
  return {};
}

namespace {

// Rows [begin, end) of a gather whose row ids and starts were checked.
void GatherRange(const TableView& t, const int32_t* indices, const uint32_t* generations,
                 const int32_t* starts, const GatherRequest& r, GatherOutputs out, int64_t ahead,
                 int64_t begin, int64_t end) {
  for (int64_t i = begin; i < std::min(end, begin + kFirstLinesAhead); ++i)
    PrefetchFirstLines(t, r, indices[i], starts[i]);
  for (int64_t i = begin; i < std::min(end, begin + ahead); ++i) PrefetchRest(t, r, indices[i], starts[i]);
  const int64_t window = r.window;
  for (int64_t i = begin; i < end; ++i) {
    if (const int64_t k = i + kFirstLinesAhead; k < end) PrefetchFirstLines(t, r, indices[k], starts[k]);
    if (const int64_t k = i + ahead; k < end) PrefetchRest(t, r, indices[k], starts[k]);
    const int64_t row = indices[i];
    const uint32_t generation = generations[i];
    const uint64_t before = LoadAcquire(&t.state[row]);
    bool ok = StateGeneration(before) == generation && (generation & 1u) == 0;
    int64_t steps = 0;
    uint64_t first_step = 0;
    if (ok) {
      const int32_t length = LoadRelaxed(&t.length[row]);
      ok = LengthInRange(length, t.max_steps);  // else a damaged file: the row is invalid, nothing read
      steps = ok ? std::clamp<int64_t>(length - starts[i], 0, window) : 0;
      if (t.step_capacity > 0) first_step = LoadRelaxed(&t.first_step[row]);
    }
    for (int32_t f = 0; f < r.num_fields; ++f) {
      const FieldView& field = t.fields[r.field_ids[f]];
      uint8_t* dst = out.fields[f] + i * window * field.step_bytes;
      int64_t head = 0;
      const uint8_t* src = StepSource(t, field, row, first_step, starts[i], steps, &head);
      const int64_t copied = steps * field.step_bytes;
      if (head > 0) CopyBytes(dst, src, head * field.step_bytes);
      if (steps > head) {  // the window wraps the ring's end
        std::memcpy(dst + head * field.step_bytes, field.data,
                    static_cast<size_t>((steps - head) * field.step_bytes));
      }
      if (copied < window * field.step_bytes)
        std::memset(dst + copied, 0, static_cast<size_t>(window * field.step_bytes - copied));
    }
    FenceAcquire();
    const uint64_t after = LoadRelaxed(&t.state[row]);
    if (ok && StateGeneration(after) != generation) {
      ok = false;
      for (int32_t f = 0; f < r.num_fields; ++f) {
        const FieldView& field = t.fields[r.field_ids[f]];
        std::memset(out.fields[f] + i * window * field.step_bytes, 0,
                    static_cast<size_t>(window * field.step_bytes));
      }
    }
    for (int64_t s = 0; s < window; ++s) out.valid[i * window + s] = ok && s < steps;
  }
}

}  // namespace

KernelStatus GatherRowsCpu(const TableView& t, const int32_t* indices, const uint32_t* generations,
                           const int32_t* starts, const GatherRequest& r, GatherOutputs out,
                           const ParallelFor& parallel) {
  if (KernelStatus s = CheckRowsInRange(t, indices, r.batch_size, ErrorSite::kGatherIndex); !s.ok()) return s;
  for (int64_t i = 0; i < r.batch_size; ++i) {
    if (starts[i] < 0 || starts[i] >= t.max_steps) {
      return KernelError(ErrorSite::kGatherStart, i, starts[i], t.max_steps);
    }
  }
  int64_t pick_bytes = 0;
  for (int32_t f = 0; f < r.num_fields; ++f) pick_bytes += r.window * t.fields[r.field_ids[f]].step_bytes;
  const int64_t ahead = PrefetchRows(pick_bytes);
  const int64_t grain =
      std::max<int64_t>(kParallelBytes / std::max<int64_t>(pick_bytes, 1), kMinParallelRows);
  parallel.Run(r.batch_size, grain, [&](int64_t begin, int64_t end) {
    GatherRange(t, indices, generations, starts, r, out, ahead, begin, end);
  });
  return {};
}

KernelStatus SampleGatherCpu(const TableView& t, const SampleRequest& sample, SampleResult picks,
                             const GatherRequest& gather, GatherOutputs out, const PriorityTreeView* tree,
                             const ParallelFor& parallel) {
  // The picks' status and their rows' page walks and first lines in flight together: measured with a
  // cache flush before each call (64 MiB written), 256 uniform picks of 1 KiB rows from 1e5 spent 45 of
  // 162 us selecting, misses on the status columns that the gather's own fetches waited behind.
  SampleRequest request = sample;
  if (request.window == 0 && gather.num_fields > 0) request.prefetch_rows = &t.fields[gather.field_ids[0]];
  if (KernelStatus s = SampleRowsCpu(t, request, picks, tree, parallel); !s.ok()) return s;
  return GatherRowsCpu(t, picks.indices, picks.generations, picks.starts, gather, out, parallel);
}

}  // namespace gear
