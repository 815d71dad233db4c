// The write side of step-ring tables (shared_table.h, TableView::step_capacity): inserts of whole
// episodes whose steps go back to back into the ring, and the retirement of the episodes whose steps a
// writer is about to reuse. The read side is the rows' seqlock (kernels/gather.*): an episode's state
// word changes before any of its steps is overwritten.
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/atomics.h"
#include "xla_ffi/clock.h"
#include "xla_ffi/seq_cst.h"
#include "xla_ffi/shared_table.h"

namespace gear {

// Retire before reuse. Steps are numbered by a 64-bit sequence number (next_step, claimed by a
// fetch-add); step n lies in ring slot n % step_capacity. A writer that claims steps [a, b) reuses the
// slots of steps [a - step_capacity, b - step_capacity), so before it copies, every episode with a step
// below b - step_capacity must be unselectable, and no other writer may still be copying into those
// slots. Two marks in the header:
//   retire_target: announced (raised by CAS) BEFORE the scan that retires the episodes below it;
//   retired_below: raised AFTER such a scan completed (by whoever scanned: each scan covers everything
//                  below its own target, so one scan never relies on another's).
// A writer copies only once retired_below >= b - step_capacity; otherwise it announces a target T
// (b - step_capacity plus some slack, at most a: never its own steps) and scans every episode row:
//   - published (even, length > 0) with first_step < T: taken over as a claimer takes a row (owner
//     word, then state: its generation changes, which every reader's seqlock sees) and left empty;
//   - held by a live writer with first_step < T: that writer claimed its steps a whole ring ago and is
//     copying them. The scan waits until it publishes (then retires the new episode) or gives its
//     steps up: a copy still running must not meet another writer's copy into the same slots;
//   - held by a dead writer: reclaimed and left empty, as any claimer would.
// A holder stores its first_step (seq_cst), then loads retire_target (seq_cst); a retirer raises
// retire_target (seq_cst), then loads first_step. In the one total order of these four, either the
// holder sees the new target (stores first_step = kNoStep and claims new steps, copying nothing) or the
// retirer sees its first_step (and waits for its copy). Before it has steps, a holder's first_step is
// kNoStep, which no scan waits for. Waits only go from a writer to one whose steps are older (a target
// is never past the waiting writer's own first step), so they cannot form a cycle. A retirement is a
// little wider than needed (slack: a sixteenth of the ring), so that one scan of the index serves many
// inserts.
namespace {

constexpr uint64_t kNoStep = ~uint64_t{0};
constexpr int kMaxLaps = 1000;  // a writer lapped this often gives up (the ring is far too small)
constexpr int64_t kHolderWaitNs = 10'000'000'000;  // a retirement waits this long for a copying writer

// Raises *word to at least `value`.
void RaiseTo(uint64_t* word, uint64_t value) {
  uint64_t seen = Load(word);
  while (seen < value && !Cas(word, &seen, value)) {
  }
}

}  // namespace

void SharedTable::RetireSteps(uint64_t below, bool* reclaimed) {
  TableHeader* h = header();
  RaiseTo(&h->retire_target, below);
  // The retired rows leave size and selectable when the scan ends, however it ends (the caller's
  // counter window is open meanwhile).
  struct Retired {
    TableHeader* h;
    CountedOut counted;
    ~Retired() {
      if (counted.size != 0) Add<int64_t>(&h->size, -counted.size);
      if (counted.selectable != 0) Add<int64_t>(&h->selectable, -counted.selectable);
    }
  } retired{h, {}};
  CountedOut* counted = &retired.counted;
  int32_t* owner = owners();
  for (int64_t row = 0; row < view_.capacity; ++row) {
    int64_t waiting_since = 0;  // MonotonicNs() when this row first made the scan wait (0: not yet)
    for (;;) {
      const uint64_t state = Load(&view_.state[row]);
      if ((StateGeneration(state) & 1u) == 0) {
        if (LoadRelaxed(&view_.length[row]) == 0 || Load(&view_.first_step[row]) >= below) break;
      } else {
        const int32_t holder = Load(&owner[row]);
        if (holder != 0 && PidMayBeAlive(h, holder)) {
          const uint64_t first = Load(&view_.first_step[row]);
          if (first == kNoStep || first >= below) break;  // it will see the target, or copies above it
        }
      }
      // Take the row as a claimer would (a dead holder's too), then leave it empty. A live writer that
      // holds it with steps below the target is copying them: wait until it publishes (the next look
      // retires the episode) or gives its steps up.
      uint64_t before = 0, held = 0;
      if (!TryClaimRow(row, &before, &held, reclaimed)) {
        const int64_t now = MonotonicNs();
        if (waiting_since == 0) waiting_since = now;
        if (now - waiting_since > kHolderWaitNs) {
          const bool unjudged = !PidsComparable(h) && Load(&h->liveness_unproven) != 0;
          throw std::runtime_error(
              "table '" + name_ + "': the writer holding episode row " + std::to_string(row) +
              " has not finished copying its steps for " + std::to_string(kHolderWaitNs / 1'000'000'000) +
              " s (stopped?), and the ring needs them; nothing of this insert was published" +
              (unjudged ? ". Processes of other PID namespaces use this table and one of them held no lock "
                          "in /dev/shm/gear_jax_liveness, so a writer that died cannot be told from a live "
                          "one: if the writer of that row was killed, the ring takes no episode again; "
                          "create the table again (or load its checkpoint), and let every process open "
                          "/dev/shm/gear_jax_liveness (docs/ARCHITECTURE.md, \"PID namespaces\")"
                        : ""));
        }
        // A copy takes microseconds to milliseconds: yield at first, then sleep up to 1 ms between looks
        // rather than keep a core busy for the whole wait.
        if (now - waiting_since < 1'000'000) {
          sched_yield();
        } else {
          const struct timespec pause{0, 1'000'000};
          nanosleep(&pause, nullptr);
        }
        continue;
      }
      if ((StateGeneration(before) & 1u) == 0) {
        counted->selectable += StatePriority(before) > 0.0f;
        counted->size += LoadRelaxed(&view_.length[row]) > 0;
      }
      StoreRelaxed(&view_.length[row], 0);
      uint64_t expected = held;
      Cas(&view_.state[row], &expected, MakeState(StateGeneration(held) + 1u, 0.0f));  // held: cannot fail
      NoteRowChanged(view_, row);
      __atomic_store_n(&owner[row], 0, __ATOMIC_RELEASE);
      break;
    }
  }
  RaiseTo(&h->retired_below, below);
}

void SharedTable::InsertEpisodes(const std::vector<const uint8_t*>& field_data, int64_t batch, int32_t steps,
                                 const int32_t* lengths, const float* priorities, int32_t* rows,
                                 InsertReservation* reserved) {
  TableHeader* h = header();
  const uint64_t ring = static_cast<uint64_t>(view_.step_capacity);
  auto length_of = [&](int64_t b) -> int64_t { return lengths != nullptr ? lengths[b] : steps; };
  // Episodes a chunk at a time: at most kInsertChunk rows (an eighth of the index) and a quarter of the
  // ring's steps (at least one episode), claimed by one fetch-add of their steps.
  const int64_t max_rows = std::max<int64_t>(1, std::min<int64_t>(kInsertChunk, view_.capacity / 8));
  const int64_t max_steps = std::max<int64_t>(1, view_.step_capacity / 4);
  const uint64_t slack = ring / 16;
  uint64_t held[kInsertChunk];
  uint64_t first[kInsertChunk];
  int32_t chunk_lengths[kInsertChunk];
  bool reclaimed = false;
  {
    CounterWindow window(*this);
    for (int64_t b = 0; b < batch;) {
      int64_t want = 1, want_steps = length_of(b);
      while (want < max_rows && b + want < batch && want_steps + length_of(b + want) <= max_steps) {
        want_steps += length_of(b + want);
        ++want;
      }
      CountedOut counted;
      const int64_t n = ClaimRows(want, rows + b, held, &reclaimed, &counted);
      uint64_t total = 0;
      for (int64_t i = 0; i < n; ++i) {
        Store(&view_.first_step[rows[b + i]], kNoStep);
        chunk_lengths[i] = static_cast<int32_t>(length_of(b + i));
        total += static_cast<uint64_t>(chunk_lengths[i]);
      }
      auto give_back = [&] {
        for (int64_t i = 0; i < n; ++i) AbandonHeld(rows[b + i], held[i]);
      };
      for (int lap = 0;; ++lap) {
        if (lap >= kMaxLaps) {
          give_back();
          throw std::runtime_error("table '" + name_ + "': writers kept taking each other's steps; raise " +
                                   "step_capacity (" + std::to_string(ring) +
                                   " steps) or write shorter episodes");
        }
        const uint64_t start = FetchAdd<uint64_t>(&h->next_step, total);
        uint64_t at = start;
        for (int64_t i = 0; i < n; ++i) {
          first[i] = at;
          at += static_cast<uint64_t>(chunk_lengths[i]);
          Store(&view_.first_step[rows[b + i]], first[i]);
        }
        const uint64_t end = start + total;
        if (end > ring && Load(&h->retired_below) < end - ring) {
          try {
            RetireSteps(std::min(end - ring + slack, start), &reclaimed);
          } catch (...) {  // a writer that never finished copying: give this chunk's rows back
            give_back();
            throw;
          }
        }
        if (Load(&h->retire_target) <= start) break;
        // Lapped before copying (a retirement announced past these steps): give them up, take new ones.
        for (int64_t i = 0; i < n; ++i) Store(&view_.first_step[rows[b + i]], kNoStep);
      }
      for (int32_t f = 0; f < view_.num_fields; ++f) {
        const FieldView& field = view_.fields[f];
        const int64_t source_stride = static_cast<int64_t>(steps) * field.step_bytes;
        for (int64_t i = 0; i < n; ++i) {
          const uint8_t* source = field_data[f] + (b + i) * source_stride;
          int64_t head = 0;
          uint8_t* target =
              const_cast<uint8_t*>(StepSource(view_, field, 0, first[i], 0, chunk_lengths[i], &head));
          const size_t head_bytes = static_cast<size_t>(head * field.step_bytes);
          Populate(target, target + head_bytes);
          std::memcpy(target, source, head_bytes);
          if (head < chunk_lengths[i]) {  // the episode wraps the ring's end
            const size_t tail_bytes = static_cast<size_t>((chunk_lengths[i] - head) * field.step_bytes);
            Populate(field.data, field.data + tail_bytes);
            std::memcpy(field.data, source + head_bytes, tail_bytes);
          }
        }
      }
      PublishRows(n, rows + b, held, chunk_lengths, 0, priorities != nullptr ? priorities + b : nullptr,
                  counted, reserved);
      b += n;
    }
  }
  AfterWrites(reclaimed);
}

void SharedTable::AbandonHeld(int64_t row, uint64_t held) {
  StoreRelaxed(&view_.length[row], 0);
  uint64_t expected = held;
  if (!Cas(&view_.state[row], &expected, MakeState(StateGeneration(held) + 1, 0.0f))) return;  // not ours
  NoteRowChanged(view_, row);
  __atomic_store_n(&owners()[row], 0, __ATOMIC_RELEASE);
}

}  // namespace gear
