#include "xla_ffi/checkpoint_rows.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/atomics.h"

namespace gear {

void ReadRowStates(const TableView& view, int64_t start, int64_t count, uint64_t* out) {
  if (start < 0 || count < 0 || start > view.capacity - count) {
    throw std::out_of_range("rows [" + std::to_string(start) + ", " + std::to_string(start + count) +
                            ") are outside the table");
  }
  FenceAcquire();
  for (int64_t i = 0; i < count; ++i) out[i] = LoadAcquire(&view.state[start + i]);
}

void ReadRowStatesAt(const TableView& view, const int64_t* rows, int64_t count, uint64_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    if (rows[i] < 0 || rows[i] >= view.capacity)
      throw std::out_of_range("row " + std::to_string(rows[i]) + " is outside the table");
  }
  FenceAcquire();
  for (int64_t i = 0; i < count; ++i) out[i] = LoadAcquire(&view.state[rows[i]]);
}

void CopyRingSteps(const TableView& view, const uint64_t* starts, const int64_t* counts, int64_t pieces,
                   uint8_t* const* out) {
  if (view.step_capacity == 0) throw std::invalid_argument("the table is not a step ring");
  for (int64_t i = 0; i < pieces; ++i) {
    if (counts[i] < 0 || counts[i] > view.step_capacity) {
      throw std::invalid_argument("a piece of " + std::to_string(counts[i]) + " steps is outside [0, " +
                                  std::to_string(view.step_capacity) + "]");
    }
  }
  for (int32_t f = 0; f < view.num_fields; ++f) {
    const FieldView& field = view.fields[f];
    uint8_t* target = out[f];
    for (int64_t i = 0; i < pieces; ++i) {
      int64_t head = 0;
      const uint8_t* source = StepSource(view, field, 0, starts[i], 0, counts[i], &head);
      const size_t head_bytes = static_cast<size_t>(head * field.step_bytes);
      const size_t tail_bytes = static_cast<size_t>((counts[i] - head) * field.step_bytes);
      std::memcpy(target, source, head_bytes);
      std::memcpy(target + head_bytes, field.data, tail_bytes);  // the steps past the ring's end
      target += head_bytes + tail_bytes;
    }
  }
}

namespace {

// Publishes one restored row (PublishRestoredRows); false when a writer took the row first.
bool PublishRestoredRow(const TableView& view, int64_t row, uint64_t state) {
  uint64_t empty = 0;
  if (!CompareExchange(&view.state[row], &empty, state)) return false;
  NoteRowChanged(view, row);
  if (StateSelectable(state)) RaiseMaxPriority(view, StatePriority(state));
  RaiseLongest(view, LoadRelaxed(&view.length[row]));
  return true;
}

}  // namespace

int64_t PublishRestoredRows(const TableView& view, int64_t start, const uint64_t* states, int64_t count) {
  if (start < 0 || start > view.capacity - count)
    throw std::out_of_range("restored rows are outside the table");
  int64_t taken = 0;
  for (int64_t i = 0; i < count; ++i) taken += !PublishRestoredRow(view, start + i, states[i]);
  return taken;
}

int64_t PublishRestoredRowsAt(const TableView& view, const int64_t* rows, const uint64_t* states,
                              int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (rows[i] < 0 || rows[i] >= view.capacity)
      throw std::out_of_range("restored row " + std::to_string(rows[i]) + " is outside the table");
  }
  int64_t taken = 0;
  for (int64_t i = 0; i < count; ++i) taken += !PublishRestoredRow(view, rows[i], states[i]);
  return taken;
}

void RestoreCursors(SharedTable& table, uint64_t next_seq, uint64_t commit_seq) {
  TableHeader* h = table.header();
  __atomic_store_n(&h->next_seq, next_seq, __ATOMIC_SEQ_CST);
  uint64_t seen = __atomic_load_n(&h->commit_seq, __ATOMIC_SEQ_CST);
  while (seen < commit_seq && !__atomic_compare_exchange_n(&h->commit_seq, &seen, commit_seq, false,
                                                           __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  __atomic_fetch_add(&h->counts_dirty, uint64_t{1}, __ATOMIC_SEQ_CST);
  table.CheckCounts(/*force=*/true);
}

void RestoreStepCursor(SharedTable& table, uint64_t next_step) {
  TableHeader* h = table.header();
  const int64_t step_capacity = table.view().step_capacity;  // as placed when the table was opened
  if (step_capacity == 0) throw std::invalid_argument("the table is not a step ring");
  if (next_step > static_cast<uint64_t>(step_capacity)) {
    throw std::invalid_argument("restored steps (" + std::to_string(next_step) + ") exceed step_capacity (" +
                                std::to_string(step_capacity) + ")");
  }
  // Raised, never lowered: steps a writer already claimed stay its own.
  uint64_t seen = __atomic_load_n(&h->next_step, __ATOMIC_SEQ_CST);
  while (seen < next_step && !__atomic_compare_exchange_n(&h->next_step, &seen, next_step, false,
                                                          __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
}

}  // namespace gear
