// Where everything of a table lies in its mapping: the header (TableHeader), then one column per row
// status (state, length, insert_seq, times_sampled, writer_pid), the change counters and one column per
// field, each starting on a 4096-byte boundary. PlanTable is the one place that places them; an attach
// accepts a header only where its columns are exactly where PlanTable puts them (HeaderProblem), since
// any process may have written the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/table_view.h"
#include "xla_ffi/rate_limiter.h"

namespace gear {

inline constexpr char kTableMagic[8] = {'G', 'E', 'A', 'R', 'J', 'A', 'X', '\0'};
inline constexpr uint32_t kFormatVersion =
    10;  // 7: step rings (step_capacity, first_step, the ring's cursors); 8: admitted_inserts; 9: the
         // sampling rules (max_times_sampled, queue); 10: liveness locks (liveness_*)
inline constexpr size_t kSpecJsonCapacity = 16384;
inline constexpr int kMaxAttachments = 256;
inline constexpr int kMaxWriterSlots =
    1024;  // processes writing a table at once (more: counter_window.cc, "Limits")
inline constexpr uint64_t kColumnAlign = 4096;

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
  // Step rings (step_ring.cc): steps in the ring per field (0: a table of padded rows), and the
  // uint64[capacity] column of each episode's first step (0 without a ring).
  int64_t step_capacity;
  uint64_t first_step_offset;
  FieldLayout fields[kMaxFields];
  alignas(64) uint64_t next_seq;    // allocation cursor (row = seq % capacity)
  alignas(64) uint64_t commit_seq;  // last insert_seq handed out
  alignas(64) int64_t size;         // rows holding a committed trajectory
  alignas(64) int64_t selectable;   // rows with an even generation and priority > 0
  // Counter windows (counter_window.h): every process that changes size or selectable opens a window
  // first (counted in its writer slot) and closes it after the counters are updated.
  alignas(64) uint64_t windows_opened;  // windows ever opened, by every process: a recount's witness
  int64_t unslotted_windows;            // windows open in processes that found no free writer slot
  alignas(64) uint64_t counts_dirty;    // nonzero: a process died inside a window; recount size/selectable
  int32_t writer_slots_used;            // writer slots [0, used) were ever taken
  alignas(64) uint64_t writer_slots[kMaxWriterSlots];  // pid | windows open << 32 (0: free slot)
  // Per writer slot: inserts its process's rate limiter admitted and it has neither published nor given
  // back yet, taken back from the limiter's count once the process is gone (rate_limiter.h, "Killed
  // inserters"). Only the slot's process changes its entry while it lives.
  alignas(64) uint64_t admitted_inserts[kMaxWriterSlots];
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
  // Liveness locks (table_processes.h): the file in which every process of this table holds its lock
  // (its device and inode, as its creator found them), and a mark set (never cleared) by a process that
  // maps the table without a lock in that file; from then on a pid that kill(pid, 0) cannot judge counts
  // as alive, as before liveness locks.
  uint64_t liveness_device;
  uint64_t liveness_inode;
  uint32_t liveness_unproven;
  // Samples after which a row's contents are retired (Table.create's max_times_sampled; 0: no limit;
  // TableView::max_times_sampled), set by the creator before the magic and never changed after. (A queue
  // is told by its rate limiter: RateLimiterState::queue.)
  uint32_t max_times_sampled;
  uint32_t reserved_rules;
  // The largest priority a row was published or updated with so far, as float32 bits (priorities are
  // >= 0, whose bits order as their values): 0 until some row had a priority above 0. Only ever raised
  // (RaiseMaxPriority in kernels/atomics.h), by inserts, commits, priority updates and restores.
  alignas(64) uint32_t max_priority_bits;
  int32_t longest_episode;  // the longest episode (row) published so far; only raised
  // Step rings (step_ring.cc, "Retire before reuse"): the cursor of step sequence numbers, the
  // sequence number below which steps were announced for reuse (retire_target) and below which every
  // episode was retired (retired_below).
  alignas(64) uint64_t next_step;
  alignas(64) uint64_t retire_target;
  alignas(64) uint64_t retired_below;
  alignas(64) RateLimiterState rate_limiter;           // rate_limiter.h
  alignas(64) int32_t attached_pids[kMaxAttachments];  // one per open by attach (0: free slot)
  alignas(64) char spec_json[kSpecJsonCapacity];
};

// The sampling rules of a new table (TableHeader::max_times_sampled, RateLimiterState::queue).
struct SamplingRules {
  uint32_t max_times_sampled = 0;  // 0: no limit; at most kMaxTimesSampledLimit
  bool queue = false;
};

// Where each column of a table goes, for a capacity, a row length and field sizes.
struct TablePlan {
  TableHeader layout;    // offsets, capacity, max_steps, num_fields (persistent: the caller's); the rest zero
  uint64_t total_bytes;  // bytes the table needs
};
// Throws std::invalid_argument for sizes out of range or too large to address. `step_capacity` > 0
// plans a step ring: each field's column holds step_capacity steps back to back (row stride 0), and
// max_steps (the longest episode) is at most step_capacity.
TablePlan PlanTable(int64_t capacity, int32_t max_steps, const std::vector<int64_t>& step_bytes,
                    const std::string& spec_json, int64_t step_capacity = 0);

// Bytes between rows of a field: 16-byte multiples so that vector loads stay aligned, 128-byte
// multiples for rows of 1 KiB and more so that GPU reads come in whole cache lines.
int64_t RowStride(int64_t row_bytes);

// What keeps the header `h` of a mapping of `size` bytes from being read as a table of this format
// (empty: nothing), in words that follow the file's name: no magic, another format version, a total
// size or spec length the file cannot hold, sizes out of range, or columns not exactly where PlanTable
// puts them for the header's capacity, max_steps and step sizes (then no two columns overlap, each is
// aligned as the kernels assume, and every row of a field holds max_steps steps within its own stride).
// The spec JSON is checked against this layout by gear_jax.Table.attach.
std::string HeaderProblem(const TableHeader& h, uint64_t size);

}  // namespace gear
