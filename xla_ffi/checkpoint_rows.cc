#include "xla_ffi/checkpoint_rows.h"

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

int64_t PublishRestoredRows(const TableView& view, int64_t start, const uint64_t* states, int64_t count) {
  if (start < 0 || start > view.capacity - count)
    throw std::out_of_range("restored rows are outside the table");
  int64_t taken = 0;
  for (int64_t i = 0; i < count; ++i) {
    uint64_t empty = 0;
    if (!CompareExchange(&view.state[start + i], &empty, states[i])) {
      ++taken;
    } else {
      NoteRowChanged(view, start + i);
      if (StateSelectable(states[i])) RaiseMaxPriority(view, StatePriority(states[i]));
      RaiseLongest(view, LoadRelaxed(&view.length[start + i]));
    }
  }
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

}  // namespace gear
