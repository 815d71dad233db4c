// A gear_jax table in a named POSIX shared-memory mapping: header, per-row status, one column per field
// (table_layout.h places them).
//
// Any process on the host can attach by name and write rows; writers allocate rows without locks (a
// shared FIFO cursor plus a compare-and-swap of the row's owner word, then of its generation), so the
// ring overwrites the oldest rows when full. A row whose owner died (dead pid in its owner word) is
// reclaimed by the next writer that reaches it (row_protocol.cc, "Ownership"). The counters `size` and
// `selectable` are changed only inside counter windows (counter_window.h); a process killed inside one
// is found there, and the counters are recounted from the rows.
//
// The creator's close can hand the memory (still mapped, still registered with CUDA) to the pool of
// closed tables (table_pool.h), so that the next table that fits reuses it: only when no other
// process, and no other open of this process, has the table attached (table_processes.h: attach slots
// and forks).
//
// Files: table_layout.* (the header and where columns go), table_processes.* (pids, attach slots,
// forks), table_mapping.* (the file, its mapping, huge pages, CUDA pinning), shared_table.cc (create,
// reopen, attach, close), row_protocol.cc (claim, copy, publish), counter_window.* (windows, recounts),
// consume.cc (a queue's consumption).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/table_view.h"
#include "xla_ffi/counter_window.h"
#include "xla_ffi/native_errors.h"
#include "xla_ffi/priority_indexes.h"
#include "xla_ffi/rate_limiter.h"
#include "xla_ffi/table_layout.h"
#include "xla_ffi/table_mapping.h"
#include "xla_ffi/table_processes.h"

namespace gear {

class SharedTable {
 public:
  // Creates the mapping `/name` (mode 0600, fails if it exists) and its header. With `pin`, in a CUDA
  // build on a process that sees a GPU, the memory is also registered with CUDA (pinned and mapped).
  static std::shared_ptr<SharedTable> Create(const std::string& name, const TablePlan& plan,
                                             const std::string& spec_json, uint64_t spec_hash, bool pin);
  // Creates the table `name` in the memory of `closed`, a table of this process closed into the pool
  // under the name `pool_name` (its memory must hold plan.total_bytes, and nothing else may use it):
  // renames the mapping, writes a new header and empties every row. Rows keep rising generations
  // (where the state column stays in place), so a Sample of the closed table never matches a row of
  // the new one. Field bytes are not cleared (no read ever returns bytes of a row beyond what its
  // writer wrote). Throws std::invalid_argument, changing nothing, when `name` exists, and
  // PoolEntryLost when the pool's name for the memory is gone (the entry is useless then).
  static std::shared_ptr<SharedTable> Reopen(const SharedTable& closed, const std::string& pool_name,
                                             const std::string& name, const TablePlan& plan,
                                             const std::string& spec_json, uint64_t spec_hash, bool pin);
  // Maps an existing table; refuses mappings that are not gear_jax tables of this format.
  static std::shared_ptr<SharedTable> Attach(const std::string& name, bool pin);

  ~SharedTable();
  SharedTable(const SharedTable&) = delete;
  SharedTable& operator=(const SharedTable&) = delete;

  const std::string& name() const { return name_; }
  bool creator() const { return creator_; }
  uint8_t* base() const { return base_; }
  size_t total_bytes() const { return memory_->bytes(); }
  const std::shared_ptr<TableMemory>& memory() const { return memory_; }
  TableHeader* header() const { return reinterpret_cast<TableHeader*>(base_); }
  const TableView& view() const { return view_; }
  // The owner words (the writer_pid column), where the header put them when this process opened the
  // table: like every column of view_, never read from the header again, so that bytes written over
  // the header later cannot send a claim outside the mapping.
  int32_t* owners() const { return owners_; }
  std::string spec_json() const;
  // Whether the memory is registered with CUDA (pinned and mapped into the GPUs' address space).
  bool pinned() const { return memory_->pinned(); }
  CudaPinning* cuda() const { return memory_->cuda(); }
  // This process's indexes over the table's priorities (prioritized sampling, total weights).
  PriorityIndexes& priority_indexes() { return priority_indexes_; }
  // The table's rate limiter (rate_limiter.h), over the header's shared state.
  RateLimiter& rate_limiter() { return rate_limiter_; }
  // This process's writer slot in the header (counter_window.cc), taken on first use (-1 when every
  // slot is taken).
  int WriterSlot();

  // Writers. Claim returns a row now owned by this process (odd generation, priority 0, length 0, its
  // pid in the owner word).
  // Commit and Insert count the rows they publish in the rate limiter: against `reserved`, admitted
  // before (a host path that waited), or, when it is null, as published without a check (the insert
  // custom call, which never waits; see rate_limiter.h).
  int64_t Claim();
  void Commit(int64_t row, int32_t length, float priority, InsertReservation* reserved = nullptr);
  void Abandon(int64_t row);
  // Makes size and selectable exact again if a process died inside a counter window: finds such a
  // process in the writer slots (marking counts_dirty), then recounts the rows. A recount that overlaps
  // another process's window is thrown away and tried again later. Without `force`, runs at most every
  // 10 ms in this open (backing off to 1 s while recounts keep being overlapped); cheap when nothing is
  // off.
  void CheckCounts(bool force);
  // Throws std::out_of_range for a row id outside the table.
  void CheckRowInRange(int64_t row) const;
  // Claims, copies and commits `batch` rows, writing their ids to rows[0, batch). field_data[f] points
  // at [batch, steps, step_bytes[f]]. `lengths` (nullptr: every row `steps` long) and `priorities`
  // (nullptr: 1) hold one entry per row; a bad one throws std::invalid_argument before anything is
  // claimed. Rows are claimed, copied and published a chunk at a time (row_protocol.cc, "Inserts").
  // In a step ring (step_capacity > 0) each row is an episode: its steps go back to back into the ring
  // (step_ring.cc), and `lengths` must be at most max_steps.
  void Insert(const std::vector<const uint8_t*>& field_data, int64_t batch, int32_t steps,
              const int32_t* lengths, const float* priorities, int32_t* rows,
              InsertReservation* reserved = nullptr);
  bool step_ring() const { return view_.step_capacity > 0; }
  bool queue() const { return header()->rate_limiter.queue != 0; }
  // Refuses (std::invalid_argument) a priority no row of this table may be published with: not finite,
  // negative, or 0 in a queue (a queue's row of priority 0 could never be consumed, while its limiter
  // counts it as an insert: the queue would lose that room for good). `what` names the value.
  void CheckPriority(float priority, const std::string& what) const;
  // Queues (gear_jax.queues): takes the picks `delivered` marks out of the table (ConsumePicksCpu, inside
  // a counter window) and counts the rows taken as the rate limiter's samples, which frees their room
  // for the queue's inserts. consumed[i]: pick i took its row.
  KernelStatus Consume(const int32_t* indices, const uint32_t* generations, const bool* delivered, int64_t n,
                       bool* consumed);

  // The creator's close, first step: no attach succeeds from now on.
  void MarkClosed();
  // Whether another open of this table (another process's, or another attach in this one) may still
  // use it: a signed-in attacher that is alive, or more attachers than the header has slots for.
  bool AttachedElsewhere() const;
  // Renames the mapping to `new_name` (the pool's name for it); false when the file system refuses.
  bool RenameForPool(const std::string& new_name);
  // Removes the name (the creator does this on close); the memory lives until the last user unmaps.
  void Unlink();

 private:
  friend class CounterWindow;
  static constexpr int kPopulateShift = 21;     // Populate maps 2 MiB blocks
  static constexpr int64_t kInsertChunk = 256;  // rows claimed, copied and published together

  SharedTable(std::string name, std::shared_ptr<TableMemory> memory, bool creator);
  // Opens a counter window (counter_window.cc, "Counters") before a change that moves a row in or out
  // of `size` or `selectable`; CloseWindow closes it once both counters have followed. Only
  // CounterWindow calls them. OpenWindow returns the writer slot the window is counted in (-1: none
  // free, counted in unslotted_windows).
  int OpenWindow();
  void CloseWindow(int slot);
  // Frees this open's writer slot (the process may attach again, and slots are few).
  void ReleaseWriterSlot();
  // The state of a row this process holds (odd generation, this pid); throws otherwise.
  uint64_t CheckOwned(int64_t row) const;
  std::string NotHeld(int64_t row) const;
  // Rows counted in size and selectable before a claim, which the caller counts out (in one add).
  struct CountedOut {
    int64_t size = 0;
    int64_t selectable = 0;
  };
  // Claim and Commit inside a counter window the caller opened. ClaimRows claims up to `want` rows
  // (at least one; fewer when a lap of the ring found the others held) into rows[] and their new states
  // into held[], and returns how many; it sets *reclaimed when it took a row over from a dead owner, and
  // adds to *counted the rows it took out of size and selectable.
  int64_t ClaimRows(int64_t want, int32_t* rows, uint64_t* held, bool* reclaimed, CountedOut* counted);
  // Takes `row` (owner word, then state word) unless a live writer holds it; sets *before to the
  // state it replaced and *claimed to the new one.
  bool TryClaimRow(int64_t row, uint64_t* before, uint64_t* claimed, bool* reclaimed);
  // Publishes rows[0, n) claimed as held[0, n): lengths (nullptr: `length` each) and priorities
  // (nullptr: 1), and moves size and selectable by the rows published less `counted` (the claims'), and
  // counts them in the rate limiter (see Commit). A row taken from this writer meanwhile is left alone;
  // the others are published, then NotHeld is thrown.
  void PublishRows(int64_t n, const int32_t* rows, const uint64_t* held, const int32_t* lengths,
                   int32_t length, const float* priorities, CountedOut counted, InsertReservation* reserved);
  // Step rings (step_ring.cc): Insert's path for them; the retirement of every episode with a step
  // below `below` (inside the caller's counter window; the rows it empties leave size and selectable),
  // which throws std::runtime_error when a live writer holding such steps does not finish; and the
  // release of a row this writer holds as `held`, left empty.
  void InsertEpisodes(const std::vector<const uint8_t*>& field_data, int64_t batch, int32_t steps,
                      const int32_t* lengths, const float* priorities, int32_t* rows,
                      InsertReservation* reserved);
  void RetireSteps(uint64_t below, bool* reclaimed);
  void AbandonHeld(int64_t row, uint64_t held);
  // Copies rows[0, n), taken for rows first.. of the batch, from field_data (see Insert).
  void CopyRows(const std::vector<const uint8_t*>& field_data, int64_t first, int64_t n, const int32_t* rows,
                int32_t steps, const int32_t* lengths);
  // Maps the pages of [from, to) into this process before the first write to them (a write fault per
  // 4 KiB page costs far more): once per 2 MiB block of the mapping.
  void Populate(const uint8_t* from, const uint8_t* to);
  // After a write, outside its window: looks for a writer killed inside a window when this one
  // reclaimed a row, and repairs the counters if they are marked off (CheckCounts, throttled).
  void AfterWrites(bool reclaimed);
  // Raises counts_dirty for, and frees, every writer slot with windows open by a process that is gone,
  // and takes back the admitted inserts of every gone process's slot; returns whether a live process has
  // a window open.
  bool SweepWriterSlots();
  // Moves writer slot `slot` from `seen` (a free slot, or a gone process's) to `next`, first taking the
  // gone process's admitted inserts back from the rate limiter; false when another process moved the
  // slot first.
  bool TakeOverSlot(int slot, uint64_t seen, uint64_t next);
  // One recount of size and selectable from the rows; false (to be tried again) when a live process
  // had a window open or opened one meanwhile.
  bool Recount();

  std::string name_;
  std::shared_ptr<TableMemory> memory_;
  uint8_t* base_;
  bool creator_;
  bool unlinked_ = false;
  TableView view_;
  int32_t* owners_ = nullptr;            // owners()
  std::atomic<int64_t> writer_slot_{0};  // this process's writer slot: pid << 32 | slot (0: none yet)
  std::atomic<int64_t> next_check_ns_{0};
  std::atomic<int64_t> check_interval_ns_{0};
  PriorityIndexes priority_indexes_;  // a GPU's may still be read by a kernel: see ~SharedTable
  RateLimiter rate_limiter_;
  // One bit per 2 MiB block of the mapping: set once Populate mapped the block in this process.
  std::unique_ptr<std::atomic<uint64_t>[]> populated_;
};

}  // namespace gear
