// The priority indexes (kernels/priority_index.h) one open table keeps in this process: one per priority
// exponent and place, made on first use. A place is the CPU, or one CUDA stream (whose kernels read an
// index the host refreshes in the stream's order, in pinned memory mapped for the GPU). The exponent
// kLengthWeights (kernels/selection.h) is the index over rows' lengths that uniform windows of step rings
// draw through; it counts among the exponents below.
//
// CPU indexes: at most kMaxCpuIndexes exponents; the one used least recently gives way to a new one
// (rebuilt on its next use: one pass over the rows). Each is refreshed and read under its own lock, so
// threads of this process that sample one table take turns.
// GPU indexes: at most kMaxDeviceIndexes per table, never evicted (a kernel may still read one); a
// further exponent samples by the scan of every row instead (sample.cu), and uniform windows without
// their index by rejection against the longest row. Their memory goes with the
// SharedTable, after its kernels are done.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/priority_index.h"

namespace gear {

// One index and the lock its users take turns under.
struct IndexSlot {
  std::mutex busy;
  std::unique_ptr<PriorityIndex> index;
};

class PriorityIndexes {
 public:
  static constexpr int kMaxCpuIndexes = 4;
  static constexpr int kMaxDeviceIndexes = 4;
  static constexpr uintptr_t kCpu = ~uintptr_t{0};  // no stream's address

  // An index held for one call (declared in this order: the lock goes before the slot).
  struct Held {
    std::shared_ptr<IndexSlot> slot;
    std::unique_lock<std::mutex> lock;
    const PriorityTreeView& view() const { return slot->index->view(); }
  };
  // The CPU's index for `exponent`, locked and refreshed from `table`.
  Held ForCpu(const TableView& table, float exponent);

  // The index of `exponent` for a device place (a CUDA stream), made with memory from `make_memory` on
  // first use; nullptr when kMaxDeviceIndexes others exist. The caller refreshes it in the stream's
  // order, under its lock, and the stream's kernels read it after.
  std::shared_ptr<IndexSlot> ForDevice(uintptr_t place, int64_t rows, float exponent,
                                       const std::function<std::unique_ptr<IndexMemory>()>& make_memory);
  bool HasDeviceIndexes();

  PriorityIndexes() = default;
  PriorityIndexes(const PriorityIndexes&) = delete;
  PriorityIndexes& operator=(const PriorityIndexes&) = delete;
  ~PriorityIndexes() {
    State* state = state_.load(std::memory_order_acquire);
    if (state != nullptr && state->pid == getpid()) delete state;  // a parent's copy stays leaked
  }

 private:
  struct Entry {
    uintptr_t place;
    float exponent;
    std::shared_ptr<IndexSlot> slot;
    uint64_t last_use;
  };
  // The indexes of one process. A child forked while another thread of its parent held a lock here,
  // or was refreshing an index, would inherit the lock held for good (that thread is not in the child)
  // and a half-refreshed index: the child leaves its copy of the parent's state alone (leaked: a locked
  // mutex may not be destroyed) and starts its own, its indexes rebuilt on first use.
  struct State {
    pid_t pid = getpid();
    std::mutex mutex;  // guards entries and uses
    std::vector<Entry> entries;
    uint64_t uses = 0;
  };
  State& Current();
  std::atomic<State*> state_{nullptr};
};

}  // namespace gear
