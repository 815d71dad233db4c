// The write side of step-ring tables (shared_table.h, TableView::step_capacity): inserts of whole
// episodes whose steps go back to back into the ring, and the retirement of the episodes whose steps a
// writer is about to reuse. The read side is the rows' seqlock (kernels/gather.*): an episode's state
// word changes before any of its steps is overwritten.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/atomics.h"
#include "xla_ffi/seq_cst.h"
#include "xla_ffi/shared_table.h"

namespace gear {

// Retire before reuse. Steps are numbered by a 64-bit sequence number (next_step, claimed by a
// fetch-add); step n lies in ring slot n % step_capacity. A writer that claims steps [a, b) reuses the
// slots of steps [a - step_capacity, b - step_capacity), so before it copies, every episode with a step
// below b - step_capacity must be unselectable. Two marks in the header:
//   retire_target: announced (raised by CAS) BEFORE the scan that retires the episodes below it;
//   retired_below: raised AFTER such a scan completed (by whoever scanned: each scan covers everything
//                  below its own target, so one scan never relies on another's).
// A writer copies only once retired_below >= b - step_capacity; otherwise it announces a target T
// (b - step_capacity plus some slack, at most a: never its own steps) and scans every episode row:
//   - published (even, length > 0) with first_step < T: taken over as a claimer takes a row (owner
//     word, then state: its generation changes, which every reader's seqlock sees) and left empty;
//   - held by a live writer with first_step < T (a writer that claimed its steps a whole ring ago and
//     is still copying): its state word is moved on (odd to odd); its publish fails and it claims new
//     steps (InsertEpisodes), so its half-overwritten copy is never published;
//   - held by a dead writer: reclaimed and left empty, as any claimer would.
// A holder stores its first_step (seq_cst), then loads retire_target (seq_cst); a retirer raises
// retire_target (seq_cst), then loads first_step. In the one total order of these four, either the
// holder sees the new target (and claims new steps before copying) or the retirer sees its first_step
// (and moves its state on). Before it has steps, a holder's first_step is kNoStep, which no target
// passes. A retirement is a little wider than needed (slack: a sixteenth of the ring), so that one scan
// of the index serves many inserts.
namespace {

constexpr uint64_t kNoStep = ~uint64_t{0};
constexpr int kMaxLaps = 1000;  // a writer lapped this often gives up (the ring is far too small)

// Raises *word to at least `value`.
void RaiseTo(uint64_t* word, uint64_t value) {
  uint64_t seen = Load(word);
  while (seen < value && !Cas(word, &seen, value)) {
  }
}

}  // namespace

void SharedTable::RetireSteps(uint64_t below, CountedOut* counted, bool* reclaimed) {
  TableHeader* h = header();
  RaiseTo(&h->retire_target, below);
  int32_t* owner = owners();
  for (int64_t row = 0; row < view_.capacity; ++row) {
    for (int tries = 0;; ++tries) {
      const uint64_t state = Load(&view_.state[row]);
      const uint32_t generation = StateGeneration(state);
      if ((generation & 1u) == 0) {
        if (LoadRelaxed(&view_.length[row]) == 0 || Load(&view_.first_step[row]) >= below) break;
      } else {
        const int32_t holder = Load(&owner[row]);
        if (holder != 0 && PidMayBeAlive(h, holder)) {
          const uint64_t first = Load(&view_.first_step[row]);
          if (first == kNoStep || first >= below) break;
          uint64_t expected = state;  // lapped: its publish will fail
          if (Cas(&view_.state[row], &expected, MakeState(generation + 2u, 0.0f))) {
            NoteRowChanged(view_, row);
            break;
          }
          continue;  // it published or gave up meanwhile: look again
        }
      }
      // Take the row as a claimer would, then leave it empty.
      uint64_t before = 0, held = 0;
      if (!TryClaimRow(row, &before, &held, reclaimed)) {
        if (tries > 1000000)
          throw std::runtime_error("table '" + name_ + "': an episode row stays contended");
        continue;  // a live writer took it first: look again
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
  const int64_t ring = view_.step_capacity;
  auto length_of = [&](int64_t b) -> int64_t { return lengths != nullptr ? lengths[b] : steps; };
  // Episodes a chunk at a time: at most kInsertChunk rows (an eighth of the index) and a quarter of the
  // ring's steps (at least one episode), claimed by one fetch-add of their steps.
  const int64_t max_rows = std::max<int64_t>(1, std::min<int64_t>(kInsertChunk, view_.capacity / 8));
  const int64_t max_steps = std::max<int64_t>(1, ring / 4);
  const int64_t slack = ring / 16;
  uint64_t held[kInsertChunk];
  uint64_t first[kInsertChunk];
  int32_t chunk_lengths[kInsertChunk];
  float chunk_priorities[kInsertChunk];
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
      for (int64_t i = 0; i < n; ++i) {
        Store(&view_.first_step[rows[b + i]], kNoStep);
        chunk_lengths[i] = static_cast<int32_t>(length_of(b + i));
        chunk_priorities[i] = priorities != nullptr ? priorities[b + i] : 1.0f;
      }
      // pending[0, left): positions in the chunk still to be copied and published.
      int64_t pending[kInsertChunk];
      int64_t left = n;
      for (int64_t i = 0; i < n; ++i) pending[i] = i;
      for (int lap = 0; left > 0; ++lap) {
        if (lap >= kMaxLaps) {
          for (int64_t k = 0; k < left; ++k) AbandonHeld(rows[b + pending[k]], held[pending[k]]);
          throw std::runtime_error(
              "table '" + name_ + "': writers kept overwriting each other's steps; raise " +
              "step_capacity (" + std::to_string(ring) + " steps) or write shorter episodes");
        }
        uint64_t total = 0;
        for (int64_t k = 0; k < left; ++k) total += static_cast<uint64_t>(chunk_lengths[pending[k]]);
        const uint64_t start = FetchAdd<uint64_t>(&h->next_step, total);
        uint64_t at = start;
        for (int64_t k = 0; k < left; ++k) {
          first[pending[k]] = at;
          at += static_cast<uint64_t>(chunk_lengths[pending[k]]);
          Store(&view_.first_step[rows[b + pending[k]]], first[pending[k]]);
        }
        const uint64_t end = start + total;
        if (end > static_cast<uint64_t>(ring) &&
            Load(&h->retired_below) < end - static_cast<uint64_t>(ring)) {
          const uint64_t need = end - static_cast<uint64_t>(ring);
          CountedOut retired;
          RetireSteps(std::min(need + static_cast<uint64_t>(slack), start), &retired, &reclaimed);
          if (retired.size != 0) Add<int64_t>(&h->size, -retired.size);
          if (retired.selectable != 0) Add<int64_t>(&h->selectable, -retired.selectable);
        }
        if (Load(&h->retire_target) > start) continue;  // lapped before copying: claim new steps
        for (int32_t f = 0; f < view_.num_fields; ++f) {
          const FieldView& field = view_.fields[f];
          const int64_t source_stride = static_cast<int64_t>(steps) * field.step_bytes;
          for (int64_t k = 0; k < left; ++k) {
            const int64_t i = pending[k];
            const uint8_t* source = field_data[f] + (b + i) * source_stride;
            int64_t head = 0;
            uint8_t* target =
                const_cast<uint8_t*>(StepSource(view_, field, 0, first[i], 0, chunk_lengths[i], &head));
            const size_t head_bytes = static_cast<size_t>(head * field.step_bytes);
            Populate(target, target + head_bytes);
            std::memcpy(target, source, head_bytes);
            if (head < chunk_lengths[i]) {
              const size_t tail_bytes = static_cast<size_t>((chunk_lengths[i] - head) * field.step_bytes);
              Populate(field.data, field.data + tail_bytes);
              std::memcpy(field.data, source + head_bytes, tail_bytes);
            }
          }
        }
        // Publish the pending rows; those a retirer moved on (lapped while copying) come back in `lost`
        // and claim new steps.
        int32_t pending_rows[kInsertChunk];
        uint64_t pending_held[kInsertChunk];
        int32_t pending_lengths[kInsertChunk];
        float pending_priorities[kInsertChunk];
        for (int64_t k = 0; k < left; ++k) {
          pending_rows[k] = rows[b + pending[k]];
          pending_held[k] = held[pending[k]];
          pending_lengths[k] = chunk_lengths[pending[k]];
          pending_priorities[k] = chunk_priorities[pending[k]];
        }
        int64_t lost[kInsertChunk];
        const int64_t lost_count = PublishRows(left, pending_rows, pending_held, pending_lengths, 0,
                                               pending_priorities, counted, reserved, lost);
        counted = CountedOut{};
        int64_t next_left = 0;
        for (int64_t j = 0; j < lost_count; ++j) {
          const int64_t i = pending[lost[j]];
          const int32_t row = rows[b + i];
          const uint64_t now = Load(&view_.state[row]);
          if ((StateGeneration(now) & 1u) == 0 || Load(&owners()[row]) != CurrentPid()) {
            throw std::runtime_error(NotHeld(row));  // taken over (as a dead writer's): not ours any more
          }
          held[i] = now;
          Store(&view_.first_step[row], kNoStep);
          pending[next_left++] = i;
        }
        left = next_left;
      }
      b += n;
    }
  }
  AfterWrites(reclaimed);
}

void SharedTable::AbandonHeld(int64_t row, uint64_t held) {
  StoreRelaxed(&view_.length[row], 0);
  uint64_t expected = held;
  if (!Cas(&view_.state[row], &expected, MakeState(StateGeneration(held) + 1, 0.0f))) {
    expected = Load(&view_.state[row]);  // moved on by a retirer: still odd, still ours
    Cas(&view_.state[row], &expected, MakeState(StateGeneration(expected) + 1u, 0.0f));
  }
  NoteRowChanged(view_, row);
  __atomic_store_n(&owners()[row], 0, __ATOMIC_RELEASE);
}

}  // namespace gear
