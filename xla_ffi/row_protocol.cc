// The row protocol of SharedTable (shared_table.h): how writers claim rows, copy into them and publish
// them, so that a reader (the seqlock read side, kernels/gather.*) never takes a row rewritten while it
// copied it, and a writer killed at any instant leaves nothing another writer cannot take over.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kernels/atomics.h"
#include "xla_ffi/native_errors.h"
#include "xla_ffi/seq_cst.h"
#include "xla_ffi/shared_table.h"

namespace gear {

// Ownership: what a process killed at any instant leaves behind of the rows it wrote.
//
// Ownership is one word per row, the owner word (the writer_pid column): 0, or the pid of the process
// that owns the row. A writer takes it by compare-and-swap (from 0, or from the pid of a process that is
// gone) BEFORE it changes the row's state, and gives it back (stores 0) only AFTER the CAS that publishes
// the row:
//   Claim:   owner CAS 0/dead -> me | state CAS g -> g + 1 (g + 2 from a dead holder's odd g) | counters
//   Commit:  insert_seq, length | state CAS -> g + 1, priority | counters | owner = 0 (release)
//   Abandon: length = 0 | state CAS -> g + 1, priority 0 | owner = 0 (release)
// So a row is odd only while its owner word names the process holding it, and wherever a process dies,
// each row it touched is either unchanged (owner word not taken) or owned by a pid that is gone, which
// the next writer to reach the row takes over whatever its generation (odd: abandoned mid-write; even:
// published, the owner word not yet given back). Rows owned by a live process are skipped. Besides
// the owner, only priority updates change a state word: the priority of an even row, by a CAS that keeps
// its generation; a claim retries its state CAS when one lands in between.
//
// The counters size and selectable follow the rows inside counter windows (counter_window.cc,
// "Counters").

int64_t SharedTable::Claim() {
  if (step_ring()) {
    throw std::invalid_argument(
        "table '" + name_ + "' is a step ring: it takes whole episodes (insert, or a writer's end_episode)");
  }
  bool reclaimed = false;
  int32_t row = 0;
  uint64_t held = 0;
  {
    CounterWindow window(*this);
    CountedOut out;
    ClaimRows(1, &row, &held, &reclaimed, &out);
    // The row stays held after the window closes: count it out now.
    if (out.selectable != 0) Add<int64_t>(&header()->selectable, -out.selectable);
    if (out.size != 0) Add<int64_t>(&header()->size, -out.size);
  }
  AfterWrites(reclaimed);
  return row;
}

// Inserts. A batch is claimed, copied and published a chunk (up to kInsertChunk rows) at a time, so that
// the shared words change once per chunk rather than once per row, and the copies of its rows run back
// to back, with no atomic instruction between them to wait for their stores:
//   claim:   next_seq += n (one reservation; more when rows are held by others) | per row: owner CAS,
//            state CAS | change counters | lengths = 0
//   copy:    the field bytes of every row
//   publish: commit_seq += n | per row: insert_seq, length, state CAS | change counters | size and
//            selectable += the rows published - the rows the claims counted out | per row: owner = 0
//            (release)
// Every row goes through the same states as one claimed and committed alone, in the same order, inside
// the one counter window of the batch; a writer killed at any instant holds its chunk's rows under a
// pid that is gone (reclaimed by the next writer that reaches them) and leaves its window open (the
// counters are recounted), as it would with one row. Between claim and publish, size and selectable
// still count the chunk's rows that were counted before (they are exact again when the window closes,
// which is all a recount needs). The change counters of a group are raised once
// per chunk and phase, after every state change of the phase (level 0, then 1, then 2).
bool SharedTable::TryClaimRow(int64_t row, uint64_t* before, uint64_t* claimed, bool* reclaimed) {
  TableHeader* h = header();
  int32_t* owner = owners();
  int32_t previous = Load(&owner[row]);
  if (previous != 0 && PidMayBeAlive(h, previous))
    return false;                                                // held, or being published, by a live writer
  if (!Cas(&owner[row], &previous, CurrentPid())) return false;  // another writer took it first
  uint64_t state = Load(&view_.state[row]);
  uint64_t next = 0;
  do {  // fails only when a priority update (or a queue's consumption) lands in between
    // A queue's writer never takes an unconsumed row: the owner word goes back (the row is published,
    // so 0 is its owner even where a dead writer's pid was left in it).
    if (h->rate_limiter.queue != 0 && StateSelectable(state)) {
      Store(&owner[row], 0);
      return false;
    }
    const uint32_t generation = StateGeneration(state);
    next = MakeState(generation + ((generation & 1u) ? 2u : 1u), 0.0f);
  } while (!Cas(&view_.state[row], &state, next));
  if (previous != 0) *reclaimed = true;
  *before = state;
  *claimed = next;
  return true;
}

int64_t SharedTable::ClaimRows(int64_t want, int32_t* rows, uint64_t* held, bool* reclaimed,
                               CountedOut* counted) {
  TableHeader* h = header();
  const int64_t capacity = view_.capacity;
  const uint64_t limit = 2 * static_cast<uint64_t>(capacity) + 64;
  int64_t got = 0;
  uint64_t tried = 0;
  while (got < want) {
    // A lap of the ring found rows held by others: publish what this writer holds rather than wait.
    if (got > 0 && tried >= static_cast<uint64_t>(capacity)) break;
    if (tried >= limit) {
      throw AllRowsHeldError("every row of table '" + name_ +
                             "' is being written; raise capacity or end episodes sooner");
    }
    const uint64_t ask = static_cast<uint64_t>(want - got);
    const uint64_t first = FetchAdd<uint64_t>(&h->next_seq, ask);
    tried += ask;
    for (uint64_t k = 0; k < ask; ++k) {
      const int64_t row = static_cast<int64_t>((first + k) % static_cast<uint64_t>(capacity));
      uint64_t before = 0;
      if (!TryClaimRow(row, &before, &held[got], reclaimed)) continue;
      if ((StateGeneration(before) & 1u) == 0) {  // the row was counted: the caller counts it out
        counted->selectable += StatePriority(before) > 0.0f;
        counted->size += LoadRelaxed(&view_.length[row]) > 0;
      }
      rows[got++] = static_cast<int32_t>(row);
    }
  }
  NoteRowsChanged(view_, rows, got);
  FenceRelease();  // the odd generations become visible before any data this writer stores
  for (int64_t i = 0; i < got; ++i) StoreRelaxed(&view_.length[rows[i]], 0);
  // A limited table's count of samples starts at 0 for the generation the row will be published with
  // (table_view.h, SampleBudgetWord): a sampler of the old contents can no longer take one.
  if (view_.max_times_sampled > 0) {
    for (int64_t i = 0; i < got; ++i) {
      __atomic_store_n(&view_.times_sampled[rows[i]], SampleBudgetWord(StateGeneration(held[i]) + 1, 0),
                       __ATOMIC_RELAXED);
    }
  }
  return got;
}

void SharedTable::PublishRows(int64_t n, const int32_t* rows, const uint64_t* held, const int32_t* lengths,
                              int32_t length, const float* priorities, CountedOut counted,
                              InsertReservation* reserved) {
  TableHeader* h = header();
  const uint64_t first_seq = FetchAdd<uint64_t>(&h->commit_seq, static_cast<uint64_t>(n)) + 1;
  int32_t published[kInsertChunk];
  int64_t done = 0, selectable = 0, lost = -1;
  float max_priority = 0.0f;
  int32_t longest = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = rows[i];
    const float priority = priorities != nullptr ? priorities[i] : 1.0f;
    const int32_t row_length = lengths != nullptr ? lengths[i] : length;
    StoreRelaxed(&view_.insert_seq[row], first_seq + static_cast<uint64_t>(i));
    StoreRelaxed(&view_.length[row], row_length);
    // Publish (release: every byte of the row before the even generation), only if the row is still the
    // one this writer claimed.
    uint64_t expected = held[i];
    if (!Cas(&view_.state[row], &expected, MakeState(StateGeneration(held[i]) + 1, priority))) {
      if (lost < 0) lost = row;
      continue;
    }
    // Counted as published row by row: a writer killed in this loop leaves its admitted_inserts entry
    // short of the rows it published by none (rate_limiter.h, "Killed inserters").
    if (reserved != nullptr) reserved->Use(1);
    longest = std::max(longest, row_length);
    published[done++] = static_cast<int32_t>(row);
    selectable += priority > 0.0f;
    max_priority = std::max(max_priority, priority);
  }
  NoteRowsChanged(view_, published, done);
  RaiseMaxPriority(view_, max_priority);
  // The rows' claims' counts and the publications' in one add each (none when they cancel out, as
  // they do when a full ring is overwritten).
  if (done != counted.size) Add<int64_t>(&h->size, done - counted.size);
  if (selectable != counted.selectable) Add<int64_t>(&h->selectable, selectable - counted.selectable);
  if (reserved == nullptr && rate_limiter_.enabled()) rate_limiter_.CountInserts(done);
  // Given back only now (release: a claimer that reads 0 sees the publication): until here, a death
  // leaves the row to a reclaimer.
  for (int64_t i = 0; i < done; ++i) __atomic_store_n(&owners()[published[i]], 0, __ATOMIC_RELEASE);
  RaiseLongest(view_, longest);
  if (lost >= 0) throw std::runtime_error(NotHeld(lost));
}

void SharedTable::Populate(const uint8_t* from, const uint8_t* to) {
  const uint64_t first = static_cast<uint64_t>(from - base_) >> kPopulateShift;
  const uint64_t last = static_cast<uint64_t>(to - 1 - base_) >> kPopulateShift;
  for (uint64_t block = first; block <= last; ++block) {
    std::atomic<uint64_t>& word = populated_[block >> 6];
    const uint64_t bit = uint64_t{1} << (block & 63);
    if (word.load(std::memory_order_relaxed) & bit) continue;
    // A read every 64 KiB: the kernel maps the pages around a read fault (the 64 KiB around it, by
    // default) in one go, and maps shared memory writable, so the copies that follow take no fault
    // (pages it left out fault one by one, as they would have).
    const volatile uint8_t* page = base_ + (block << kPopulateShift);
    const volatile uint8_t* end = base_ + std::min<uint64_t>((block + 1) << kPopulateShift, total_bytes());
    uint8_t sink = 0;
    for (; page < end; page += 65536) sink ^= *page;
    (void)sink;
    word.fetch_or(bit, std::memory_order_relaxed);
  }
}

void SharedTable::AfterWrites(bool reclaimed) {
  TableHeader* h = header();
  // A reclaimed row means a writer died, perhaps inside a window: look now rather than in 10 ms.
  if (reclaimed) SweepWriterSlots();
  if (Load(&h->counts_dirty) != 0) CheckCounts(false);
}

void SharedTable::CheckRowInRange(int64_t row) const {
  if (row < 0 || row >= view_.capacity)
    throw std::out_of_range("row " + std::to_string(row) + " is outside the table");
}

uint64_t SharedTable::CheckOwned(int64_t row) const {
  CheckRowInRange(row);
  const uint64_t state = LoadAcquire(&view_.state[row]);
  if ((StateGeneration(state) & 1u) == 0 || LoadRelaxed(&owners()[row]) != CurrentPid()) {
    throw std::runtime_error(NotHeld(row));
  }
  return state;
}

std::string SharedTable::NotHeld(int64_t row) const {
  return "row " + std::to_string(row) + " of table '" + name_ +
         "' is not held by this writer (it was reclaimed or already committed)";
}

void SharedTable::Commit(int64_t row, int32_t length, float priority, InsertReservation* reserved) {
  if (length < 1 || length > view_.max_steps) {
    throw std::invalid_argument("length " + std::to_string(length) +
                                " is outside [1, max_steps=" + std::to_string(view_.max_steps) + "]");
  }
  CheckPriority(priority, "priority");
  const uint64_t held = CheckOwned(row);
  {
    CounterWindow window(*this);
    const int32_t claimed = static_cast<int32_t>(row);
    PublishRows(1, &claimed, &held, nullptr, length, &priority, CountedOut{}, reserved);
  }
  AfterWrites(false);
}

void SharedTable::CheckPriority(float priority, const std::string& what) const {
  if (!std::isfinite(priority) || priority < 0.0f) {
    throw std::invalid_argument(what + " = " + std::to_string(priority) + " must be finite and >= 0");
  }
  if (priority == 0.0f && queue()) {
    throw InvalidArgument(what + " = 0 in table '" + name_ +
                          "', a queue: a row of priority 0 is never dequeued, and the queue would "
                          "keep its room for good; give queue rows a priority > 0 (any: the queue "
                          "is consumed in commit order)");
  }
}

void SharedTable::Abandon(int64_t row) {
  uint64_t held = CheckOwned(row);
  // No window: a held row counts in neither counter, nor does an empty row of priority 0.
  StoreRelaxed(&view_.length[row], 0);
  if (!Cas(&view_.state[row], &held, MakeState(StateGeneration(held) + 1, 0.0f))) {
    throw std::runtime_error(NotHeld(row));
  }
  NoteRowChanged(view_, row);
  __atomic_store_n(&owners()[row], 0, __ATOMIC_RELEASE);
}

void SharedTable::CopyRows(const std::vector<const uint8_t*>& field_data, int64_t first, int64_t n,
                           const int32_t* rows, int32_t steps, const int32_t* lengths) {
  for (int32_t f = 0; f < view_.num_fields; ++f) {
    const FieldView& field = view_.fields[f];
    const int64_t source_stride = steps * field.step_bytes;
    // Rows that follow each other in the ring follow each other in the column when a row is exactly
    // `steps` steps long: a run of them, each copied whole, is one copy.
    const bool runs = field.row_stride == source_stride;
    const uint8_t* source = field_data[f] + first * source_stride;
    for (int64_t i = 0; i < n;) {
      const int64_t used = lengths != nullptr ? lengths[first + i] : steps;
      int64_t j = i + 1;
      if (runs && used == steps) {
        while (j < n && rows[j] == rows[j - 1] + 1 && (lengths == nullptr || lengths[first + j] == steps))
          ++j;
      }
      uint8_t* target = field.data + rows[i] * field.row_stride;
      const size_t bytes = j - i > 1 ? static_cast<size_t>((j - i) * source_stride)
                                     : static_cast<size_t>(used * field.step_bytes);
      Populate(target, target + bytes);
      std::memcpy(target, source + i * source_stride, bytes);
      i = j;
    }
  }
}

void SharedTable::Insert(const std::vector<const uint8_t*>& field_data, int64_t batch, int32_t steps,
                         const int32_t* lengths, const float* priorities, int32_t* rows,
                         InsertReservation* reserved) {
  if (step_ring() && steps > view_.max_steps && lengths == nullptr) {
    throw std::invalid_argument("episodes of " + std::to_string(steps) + " steps are longer than max_steps=" +
                                std::to_string(view_.max_steps) + " of table '" + name_ + "'");
  }
  for (int64_t b = 0; b < batch; ++b) {  // validate everything before claiming anything
    if (lengths != nullptr && step_ring() && lengths[b] > view_.max_steps) {
      throw std::invalid_argument("lengths[" + std::to_string(b) + "] = " + std::to_string(lengths[b]) +
                                  " is longer than max_steps=" + std::to_string(view_.max_steps) +
                                  " of table '" + name_ +
                                  "' (the longest episode it takes; at most step_capacity)");
    }
    if (lengths != nullptr && (lengths[b] < 1 || lengths[b] > steps)) {
      throw std::invalid_argument("lengths[" + std::to_string(b) + "] = " + std::to_string(lengths[b]) +
                                  " is outside [1, " + std::to_string(steps) + "]");
    }
    if (priorities != nullptr) CheckPriority(priorities[b], "priorities[" + std::to_string(b) + "]");
  }
  if (step_ring()) return InsertEpisodes(field_data, batch, steps, lengths, priorities, rows, reserved);
  // A chunk holds at most an eighth of the ring, so that writers filling a small table together still
  // find free rows.
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(kInsertChunk, view_.capacity / 8));
  uint64_t held[kInsertChunk];
  bool reclaimed = false;
  {
    // One counter window for the batch: a recount cannot succeed while this process writes anyway.
    CounterWindow window(*this);
    for (int64_t b = 0; b < batch;) {
      CountedOut counted;
      const int64_t n = ClaimRows(std::min(chunk, batch - b), rows + b, held, &reclaimed, &counted);
      CopyRows(field_data, b, n, rows + b, steps, lengths);
      PublishRows(n, rows + b, held, lengths != nullptr ? lengths + b : nullptr, steps,
                  priorities != nullptr ? priorities + b : nullptr, counted, reserved);
      b += n;
    }
  }
  AfterWrites(reclaimed);
}

}  // namespace gear
