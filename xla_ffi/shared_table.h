// A gear_jax table in a named POSIX shared-memory mapping: header, per-row status, one column per field.
//
// Any process on the host can attach by name and write rows; writers allocate rows without locks (a
// shared FIFO cursor plus a compare-and-swap of the row's owner word, then of its generation), so the
// ring overwrites the oldest rows when full. A row whose owner died (dead pid in its owner word) is
// reclaimed by the next writer that reaches it. The counters `size` and `selectable` are changed only
// inside "windows" that each writer process announces in a slot of the header; a process killed inside
// one is found there, and the counters are recounted from the rows (shared_table.cc, "Ownership and
// counters", has the argument for every instant a process can die).
//
// The creator's close can hand the memory (still mapped, still registered with CUDA) to the pool of
// closed tables (table_pool.h), so that the next table that fits reuses it: only when no other
// process, and no other open of this process, has the table attached. Attaching processes sign in to a
// slot of the header; the creator marks the table closed before it reads the slots, and an attach
// reads the mark after it signs in, so one of the two always sees the other.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/table_view.h"
#include "xla_ffi/priority_indexes.h"
#include "xla_ffi/rate_limiter.h"

namespace gear {

class CudaPinning;  // cuda_runtime.h; exists in CUDA builds only
// Deletes a CudaPinning (never called in a CPU-only build, where none is made).
struct CudaPinningDeleter {
  void operator()(CudaPinning* pinning) const;
};

inline constexpr char kTableMagic[8] = {'G', 'E', 'A', 'R', 'J', 'A', 'X', '\0'};
inline constexpr uint32_t kFormatVersion = 6;  // 6: the largest priority and the rate limiter in the header
inline constexpr size_t kSpecJsonCapacity = 16384;
inline constexpr int kMaxAttachments = 256;
inline constexpr int kMaxWriterSlots =
    1024;  // processes writing a table at once (more: shared_table.cc, "Limits")

struct FieldLayout {
  uint64_t offset;     // from the start of the mapping; 4096-byte aligned
  int64_t row_stride;  // bytes between rows
  int64_t step_bytes;  // bytes of one step
};

// The first bytes of every table mapping. Counters sit on cache lines of their own.
struct TableHeader {
  char magic[8];
  uint32_t format_version;
  uint32_t spec_json_bytes;
  uint64_t spec_hash;
  uint64_t total_bytes;
  int64_t capacity;
  int32_t max_steps;
  int32_t num_fields;
  uint64_t state_offset, length_offset, insert_seq_offset, times_sampled_offset, writer_pid_offset;
  uint64_t change_counts_offset;  // uint32[ChangeCounterCount(capacity)]
  FieldLayout fields[kMaxFields];
  alignas(64) uint64_t next_seq;    // allocation cursor (row = seq % capacity)
  alignas(64) uint64_t commit_seq;  // last insert_seq handed out
  alignas(64) int64_t size;         // rows holding a committed trajectory
  alignas(64) int64_t selectable;   // rows with an even generation and priority > 0
  // Counter windows (shared_table.cc): every process that changes size or selectable opens a window
  // first (counted in its writer slot) and closes it after the counters are updated.
  alignas(64) uint64_t windows_opened;  // windows ever opened, by every process: a recount's witness
  int64_t unslotted_windows;            // windows open in processes that found no free writer slot
  alignas(64) uint64_t counts_dirty;    // nonzero: a process died inside a window; recount size/selectable
  int32_t writer_slots_used;            // writer slots [0, used) were ever taken
  alignas(64) uint64_t writer_slots[kMaxWriterSlots];  // pid | windows open << 32 (0: free slot)
  alignas(64) uint32_t closed;  // set by the creator's close: no process may attach any more
  // Nonzero: the memory never goes to another table. Set when an attach found no free slot, and when a
  // process forked while it had the table mapped (the child may write into it, unseen by the slots).
  uint32_t never_reuse;
  uint64_t reuses;  // tables this memory held before the current one (kept by reuse)
  // Who made the table, for the sweep of tables whose processes are all gone (dead_tables.h): the
  // creator's pid and PID namespace (the inode of its /proc/self/ns/pid; 0: unknown), and whether the
  // table is to outlive its creator (Table.create(outlive_creator=True): never swept automatically).
  int32_t creator_pid;
  uint32_t persistent;
  uint64_t creator_pid_namespace;
  // Set (never cleared) by an attach from another PID namespace than the creator's: kill(pid, 0) then
  // answers for no pid in the table, and every process takes every recorded pid for alive (PidMayBeAlive).
  uint32_t mixed_pid_namespaces;
  // The largest priority a row was published or updated with so far, as float32 bits (priorities are
  // >= 0, whose bits order as their values): 0 until some row had a priority above 0. Only ever raised
  // (RaiseMaxPriority in kernels/atomics.h), by inserts, commits, priority updates and restores.
  alignas(64) uint32_t max_priority_bits;
  alignas(64) RateLimiterState rate_limiter;           // rate_limiter.h
  alignas(64) int32_t attached_pids[kMaxAttachments];  // one per open by attach (0: free slot)
  alignas(64) char spec_json[kSpecJsonCapacity];
};

// Where each column of a table goes, for a capacity, a row length and field sizes.
struct TablePlan {
  TableHeader layout;    // offsets, capacity, max_steps, num_fields (persistent: the caller's); the rest zero
  uint64_t total_bytes;  // bytes the table needs
};
// Throws std::invalid_argument for sizes out of range or too large to address.
TablePlan PlanTable(int64_t capacity, int32_t max_steps, const std::vector<int64_t>& step_bytes,
                    const std::string& spec_json);

// This process's pid (cached; reset in a forked child).
int32_t CurrentPid();
// Whether process `pid` (> 0) exists in this process's PID namespace, by kill(pid, 0).
bool ProcessAlive(int32_t pid);
// This process's PID namespace: the inode of /proc/self/ns/pid (cached; reset in a forked child), 0
// where it cannot be read.
uint64_t PidNamespace();
// Whether kill(pid, 0) answers for the pids recorded in table `h`: this process is in the creator's PID
// namespace (known), and no process of another namespace attached (mixed_pid_namespaces).
bool PidsComparable(const TableHeader* h);
// Whether the process `pid` recorded in table `h` (an owner word, a writer or attach slot) may still
// run: false only for pid <= 0 and for a pid kill(pid, 0) finds gone where PidsComparable(h). Containers
// that share /dev/shm but not a PID namespace see each other's processes as gone (or as others): their
// pids are unknown here, taken for alive, so nothing of theirs is reclaimed.
bool PidMayBeAlive(const TableHeader* h, int32_t pid);
// CLOCK_MONOTONIC in nanoseconds.
int64_t MonotonicNs();
// Where glibc keeps the object shm_open("/name") opens; renaming it there renames the object.
std::string ShmFile(const std::string& name);

// The memory of one table: a shared mapping, registered with CUDA when pinned. Unregistered and
// unmapped when the last holder lets go (open tables, calls running on them, the pool).
class TableMemory {
 public:
  TableMemory(uint8_t* base, size_t bytes);
  ~TableMemory();
  TableMemory(const TableMemory&) = delete;
  TableMemory& operator=(const TableMemory&) = delete;

  uint8_t* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  bool pinned() const;
  // Registers the memory with CUDA when asked and not yet done (see CudaPinning::Pin).
  void Pin(bool want);
  // Waits until no kernel enqueued earlier still reads the memory and clears the kernels' error records.
  void Quiesce();
  // Waits until no kernel enqueued earlier still reads the memory (or an index of a table in it).
  void WaitForKernels();
  // The attach slot this mapping signed in to; signed out when the memory goes, after its kernels.
  // A forked child signs in to a slot of its own for every mapping it inherits (shared_table.cc, "Forks").
  void set_attach_slot(int slot) { attach_slot_ = slot; }
  // The memory's CUDA registration; nullptr until Pin, and always in a CPU-only build.
  CudaPinning* cuda() const { return cuda_.get(); }

 private:
  uint8_t* base_;
  size_t bytes_;
  int attach_slot_ = -1;
  int32_t mapped_by_pid_;
  // The same member in every build, so that a CUDA build does not change the class's layout.
  std::unique_ptr<CudaPinning, CudaPinningDeleter> cuda_;  // null until Pin
};

// Errors the Python module maps to exception types.
struct NotFoundError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct OutOfSpaceError : std::runtime_error {  // /dev/shm cannot hold the table
  using std::runtime_error::runtime_error;
};
struct PoolEntryLost : std::runtime_error {  // a pooled table's name vanished from /dev/shm
  using std::runtime_error::runtime_error;
};

// Bytes between rows of a field: 16-byte multiples so that vector loads stay aligned, 128-byte
// multiples for rows of 1 KiB and more so that GPU reads come in whole cache lines.
int64_t RowStride(int64_t row_bytes);

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
  std::string spec_json() const;
  // Whether the memory is registered with CUDA (pinned and mapped into the GPUs' address space).
  bool pinned() const { return memory_->pinned(); }
  CudaPinning* cuda() const { return memory_->cuda(); }
  // This process's indexes over the table's priorities (prioritized sampling, total weights).
  PriorityIndexes& priority_indexes() { return priority_indexes_; }
  // The table's rate limiter (rate_limiter.h), over the header's shared state.
  RateLimiter& rate_limiter() { return rate_limiter_; }

  // Writers. Claim returns a row now owned by this process (odd generation, priority 0, length 0, its
  // pid in the owner word).
  // Commit and Insert count the rows they publish in the rate limiter: against `reserved`, admitted
  // before (a host path that waited), or, when it is null, as published without a check (the insert
  // custom call, which never waits; see rate_limiter.h).
  int64_t Claim();
  void Commit(int64_t row, int32_t length, float priority, InsertReservation* reserved = nullptr);
  void Abandon(int64_t row);
  // A counter window (shared_table.cc, "Ownership and counters"): opened before a change that moves a
  // row in or out of `size` or `selectable` and closed once both counters have followed. Returns the
  // writer slot the window is counted in (-1: none free, counted in unslotted_windows).
  int OpenWindow();
  void CloseWindow(int slot);
  // Makes size and selectable exact again if a process died inside a window: finds such a process in
  // the writer slots (marking counts_dirty), then recounts the rows. A recount that overlaps another
  // process's window is thrown away and tried again later. Without `force`, runs at most every 10 ms in
  // this open (backing off to 1 s while recounts keep being overlapped); cheap when nothing is off.
  void CheckCounts(bool force);
  // Throws std::out_of_range for a row id outside the table.
  void CheckRowInRange(int64_t row) const;
  // Claims, copies and commits `batch` rows, writing their ids to rows[0, batch). field_data[f] points
  // at [batch, steps, step_bytes[f]]. `lengths` (nullptr: every row `steps` long) and `priorities`
  // (nullptr: 1) hold one entry per row; a bad one throws std::invalid_argument before anything is
  // claimed. Rows are claimed, copied and published a chunk at a time (shared_table.cc, "Inserts").
  void Insert(const std::vector<const uint8_t*>& field_data, int64_t batch, int32_t steps,
              const int32_t* lengths, const float* priorities, int32_t* rows,
              InsertReservation* reserved = nullptr);

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
  SharedTable(std::string name, std::shared_ptr<TableMemory> memory, bool creator);
  // The state of a row this process holds (odd generation, this pid); throws otherwise.
  uint64_t CheckOwned(int64_t row) const;
  std::string NotHeld(int64_t row) const;
  int32_t* owners() const { return reinterpret_cast<int32_t*>(base_ + header()->writer_pid_offset); }
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
  // Copies rows[0, n), taken for rows first.. of the batch, from field_data (see Insert).
  void CopyRows(const std::vector<const uint8_t*>& field_data, int64_t first, int64_t n, const int32_t* rows,
                int32_t steps, const int32_t* lengths);
  // Maps the pages of [from, to) into this process before the first write to them (a write fault per
  // 4 KiB page costs far more): once per 2 MiB block of the mapping.
  void Populate(const uint8_t* from, const uint8_t* to);
  // After a write, outside its window: looks for a writer killed inside a window when this one
  // reclaimed a row, and repairs the counters if they are marked off (CheckCounts, throttled).
  void AfterWrites(bool reclaimed);
  // This process's writer slot in the header, taken on first use (-1 when every slot is taken).
  int WriterSlot();
  // Raises counts_dirty for, and frees, every writer slot with windows open by a process that is gone;
  // returns whether a live process has a window open.
  bool SweepWriterSlots();
  // One recount of size and selectable from the rows; false (to be tried again) when a live process
  // had a window open or opened one meanwhile.
  bool Recount();

  std::string name_;
  std::shared_ptr<TableMemory> memory_;
  uint8_t* base_;
  bool creator_;
  bool unlinked_ = false;
  TableView view_;
  std::atomic<int64_t> writer_slot_{0};  // this process's writer slot: pid << 32 | slot (0: none yet)
  std::atomic<int64_t> next_check_ns_{0};
  std::atomic<int64_t> check_interval_ns_{0};
  PriorityIndexes priority_indexes_;  // a GPU's may still be read by a kernel: see ~SharedTable
  RateLimiter rate_limiter_;
  // One bit per 2 MiB block of the mapping: set once Populate mapped the block in this process.
  std::unique_ptr<std::atomic<uint64_t>[]> populated_;
};

}  // namespace gear
