// The counter windows (counter_window.h) and the recount of size and selectable after a process died
// inside one: SharedTable's writer slots, sweeps and recounts.
#include "xla_ffi/counter_window.h"

#include <algorithm>

#include "xla_ffi/clock.h"
#include "xla_ffi/seq_cst.h"
#include "xla_ffi/shared_table.h"

namespace gear {

// Counters. size and selectable cannot change in the instruction that changes a row, so a process can
// always die between the two. Each change is therefore bracketed by a window, counted in the process's
// writer slot of the header:
//   open:  writer_slots[mine] += 1 << 32; windows_opened += 1
//          the row's state CAS; the counters' fetch-adds (Claim, Commit: one row; Insert: the batch)
//   close: writer_slots[mine] -= 1 << 32
// A process killed inside a window leaves a slot with open windows and a pid that is gone, and nothing
// else can leave the counters off (outside windows they change together with the rows). A sweep of the
// slots (SweepWriterSlots: reads of table.size, FFI handlers every 10 ms, a writer that reclaimed a row)
// raises counts_dirty for such a slot, then frees it: the mark is the evidence from then on. While
// counts_dirty is set, recounts (Recount) are tried until one succeeds:
//   1. v = windows_opened; s0 = size; n0 = selectable
//   2. sweep: any slot with windows of a live process (or unslotted_windows) -> give this round up;
//      those of dead processes are marked and freed (frozen: their effects are final); d = counts_dirty
//   3. scan the rows: S = even generation and length > 0; N = even generation and priority > 0
//   4. CAS size s0 -> S and selectable n0 -> N; windows_opened must still be v
//   5. clear counts_dirty by CAS from d: a death marked after step 2 keeps it set
// Why a round that passes step 4 is exact (every atomic here is sequentially consistent; a priority
// update's CAS releases, and the scan's loads acquire). Take any operation and its window:
//  - open when step 2 read its slot: its process is alive (round given up) or dead, and then the scan
//    sees its rows as it left them, and the counters are overwritten whatever part of its update it
//    made (a window whose slot an earlier sweep freed is a dead one, closed in the sense below);
//  - opened after step 2 read its slot (or after step 2 read writer_slots_used, for a slot taken
//    later): its bump of windows_opened came after step 1, so either before the check of step 4 (round
//    discarded) or after it, and then its state CAS and counter updates all come after the counters were
//    set, applied to a scan that saw its row before them;
//  - closed (or its process dead) before step 2 read its slot: its rows changed before the scan. If a
//    counter update of it came after step 1, the CAS of step 4 fails, or succeeds only because other
//    updates cancelled it, each of them (by the three cases) also made before the scan, which then is
//    the truth. Counter updates it never made (dead) are the errors the scan replaces.
// A round given up or discarded leaves counts_dirty set, and may leave a counter at a value that a later
// round rewrites: claims and commits that see counts_dirty, sample calls and reads of table.size and
// selectable try again (throttled, see CheckCounts). A recount killed at any step changes nothing a
// later round does not redo: it is idempotent and clears counts_dirty last.
// Limits: a process that finds every writer slot taken counts its windows in unslotted_windows; one of
// those dying inside a window blocks recounts for good (the counters then keep that error, as before
// this scheme). Priority updates open windows like every other change: the CPU handler and the host
// calls around their scatter, the CUDA handlers around the host scatter's callback and, for a device
// kernel, from before its launch to a host callback enqueued after it. Only a device kernel whose
// closing callback could not be enqueued runs outside a window (its handler closes the window at once):
// a learner killed then, between a priority's CAS and its counter update, leaves selectable off by one,
// and a recount overlapping that kernel can be off by one. A pid reused by a new process makes a dead
// owner look alive until that process exits. Where kill(pid, 0) cannot answer for the table's pids (a
// process of another PID namespace attached, or this one is in another: see PidMayBeAlive), every
// recorded pid counts as alive: rows held by a killed writer stay held, and a window it left open keeps
// the counters from being recounted, for as long as the table exists.
namespace {

// A writer slot: the process's pid in the low 32 bits, its open counter windows in the high 32.
constexpr uint64_t kOneWindow = uint64_t{1} << 32;
int32_t SlotPid(uint64_t slot) { return static_cast<int32_t>(slot & 0xffffffffu); }
uint32_t SlotWindows(uint64_t slot) { return static_cast<uint32_t>(slot >> 32); }
// A slot whose gone process's admitted inserts are being taken back (TakeOverSlot): no process takes it
// (its windows are not 0) and no sweep touches it, until the taker stores 0 or its own pid.
constexpr uint64_t kTakingBack = ~uint64_t{0};

// How often CheckCounts(force = false) looks, and how far it backs off while recounts keep failing.
constexpr int64_t kCheckEveryNs = 10'000'000;
constexpr int64_t kCheckAtMostEveryNs = 1'000'000'000;

}  // namespace

CounterWindow::CounterWindow(SharedTable& table) : table_(&table), slot_(table.OpenWindow()) {}

void CounterWindow::Close() {
  if (table_ == nullptr) return;
  table_->CloseWindow(slot_);
  table_ = nullptr;
}

bool SharedTable::TakeOverSlot(int slot, uint64_t seen, uint64_t next) {
  TableHeader* h = header();
  if (Load(&h->admitted_inserts[slot]) == 0) return Cas(&h->writer_slots[slot], &seen, next);
  // The gone process's admitted inserts first, while the slot is marked: whoever wins the slot settles
  // them, once, and no new owner counts into the entry before it is 0 (rate_limiter.h, "Killed inserters").
  if (!Cas(&h->writer_slots[slot], &seen, kTakingBack)) return false;
  rate_limiter_.TakeBackAdmitted(&h->admitted_inserts[slot]);
  Store(&h->writer_slots[slot], next);
  return true;
}

int SharedTable::WriterSlot() {
  const int32_t me = CurrentPid();
  int64_t mine = writer_slot_.load(std::memory_order_acquire);
  if (mine != 0 && static_cast<int32_t>(mine >> 32) == me) return static_cast<int32_t>(mine);
  // First window of this process (or of a forked child) in this open: take a free slot, or one left
  // idle by a process that is gone. A slot with open windows of a dead process waits for a sweep.
  TableHeader* h = header();
  int slot = -1;
  for (int s = 0; s < kMaxWriterSlots && slot < 0; ++s) {
    uint64_t seen = Load(&h->writer_slots[s]);
    const bool free = seen == 0 || (SlotWindows(seen) == 0 && !PidMayBeAlive(h, SlotPid(seen)));
    if (free && TakeOverSlot(s, seen, static_cast<uint64_t>(static_cast<uint32_t>(me)))) slot = s;
  }
  if (slot >= 0) {  // before any window of this slot opens: a recount reads `used` to know where to look
    int32_t used = Load(&h->writer_slots_used);
    while (used < slot + 1 && !Cas(&h->writer_slots_used, &used, slot + 1)) {
    }
  }
  const int64_t taken = (static_cast<int64_t>(me) << 32) | static_cast<uint32_t>(slot);
  if (writer_slot_.compare_exchange_strong(mine, taken, std::memory_order_acq_rel)) return slot;
  // Another thread of this process was first: give this slot back and use that one.
  if (slot >= 0) Store(&h->writer_slots[slot], uint64_t{0});
  return WriterSlot();
}

int SharedTable::OpenWindow() {
  TableHeader* h = header();
  const int slot = WriterSlot();
  if (slot >= 0) {
    Add<uint64_t>(&h->writer_slots[slot], kOneWindow);
  } else {
    Add<int64_t>(&h->unslotted_windows, 1);
  }
  Add<uint64_t>(&h->windows_opened, 1);
  return slot;
}

void SharedTable::CloseWindow(int slot) {
  TableHeader* h = header();
  if (slot >= 0) {
    Add<uint64_t>(&h->writer_slots[slot], ~kOneWindow + 1);  // minus one window
  } else {
    Add<int64_t>(&h->unslotted_windows, -1);
  }
}

bool SharedTable::SweepWriterSlots() {
  TableHeader* h = header();
  bool live = false;
  const int32_t used = std::min(Load(&h->writer_slots_used), kMaxWriterSlots);
  for (int s = 0; s < used; ++s) {
    uint64_t seen = Load(&h->writer_slots[s]);
    if (seen == 0 || seen == kTakingBack) continue;
    // An idle slot matters only while it holds admitted inserts (a process killed between an admission
    // and its first window): they are taken back once its process is gone.
    if (SlotWindows(seen) == 0 && Load(&h->admitted_inserts[s]) == 0) continue;
    if (PidMayBeAlive(h, SlotPid(seen))) {
      live = live || SlotWindows(seen) != 0;
      continue;
    }
    // The mark first, then the slot may go: from now on the mark is the evidence.
    if (SlotWindows(seen) != 0) Add<uint64_t>(&h->counts_dirty, 1);
    TakeOverSlot(s, seen, uint64_t{0});
  }
  return live;
}

bool SharedTable::Recount() {
  TableHeader* h = header();
  if (Load(&h->counts_dirty) == 0) return true;
  // 1.
  const uint64_t opened = Load(&h->windows_opened);
  int64_t size_before = Load(&h->size);
  int64_t selectable_before = Load(&h->selectable);
  // 2.
  if (Load(&h->unslotted_windows) != 0 || SweepWriterSlots()) return false;
  const uint64_t dirty = Load(&h->counts_dirty);
  // 3.
  int64_t size = 0, selectable = 0;
  for (int64_t row = 0; row < view_.capacity; ++row) {
    const uint64_t state = Load(&view_.state[row]);
    if (StateGeneration(state) & 1u) continue;
    if (StatePriority(state) > 0.0f) ++selectable;
    if (Load(&view_.length[row]) > 0) ++size;
  }
  // 4.
  if (!Cas(&h->size, &size_before, size) || !Cas(&h->selectable, &selectable_before, selectable) ||
      Load(&h->windows_opened) != opened) {
    return false;
  }
  // 5.
  uint64_t expected = dirty;
  Cas(&h->counts_dirty, &expected, uint64_t{0});
  return true;
}

void SharedTable::CheckCounts(bool force) {
  const int64_t now = MonotonicNs();
  if (!force) {
    int64_t due = next_check_ns_.load(std::memory_order_relaxed);
    if (now < due) return;
    // One thread of this open checks; the others go on.
    if (!next_check_ns_.compare_exchange_strong(due, now + kCheckEveryNs, std::memory_order_relaxed)) return;
  }
  TableHeader* h = header();
  int64_t interval = kCheckEveryNs;
  if (Load(&h->counts_dirty) == 0) SweepWriterSlots();
  if (Load(&h->counts_dirty) != 0 && !Recount()) {
    // Overlapped by live writers: back off, so that a busy table does not pay a scan every 10 ms.
    interval = std::min(2 * std::max(check_interval_ns_.load(std::memory_order_relaxed), kCheckEveryNs),
                        kCheckAtMostEveryNs);
  }
  check_interval_ns_.store(interval, std::memory_order_relaxed);
  next_check_ns_.store(now + interval, std::memory_order_relaxed);
}

void SharedTable::ReleaseWriterSlot() {
  const int64_t mine = writer_slot_.load(std::memory_order_acquire);
  if (mine != 0 && static_cast<int32_t>(mine >> 32) == CurrentPid() && static_cast<int32_t>(mine) >= 0) {
    // Inserts still admitted to this open (a reservation outlived its table) go back with the slot.
    TakeOverSlot(static_cast<int32_t>(mine), static_cast<uint32_t>(CurrentPid()), uint64_t{0});
  }
}

}  // namespace gear
