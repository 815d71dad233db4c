// The pool of closed tables: memory (mapped, registered with CUDA when pinned) and registry handles of
// tables this process created and closed, kept for the next table that fits.
//
// Creating a table pays for reserving and mapping its memory and, on a CUDA machine, for registering
// it (cudaHostRegister takes about a second per few GiB); a compiled function pays for tracing and
// compiling. Test suites, sweeps and notebooks create and close tables of the same shape over and over:
// a table made from the pool skips the first cost, and when it has the spec of the closed table whose
// memory it takes, it also gets that table's handle, so functions compiled for the closed table run on
// it without being traced again.
//
// Only memory nobody else can reach goes to the pool: the creator's close renames the mapping to a
// private name (`gear_jax_pool_<pid>_<n>_<random>`), and only when no other open of the table is
// alive and no process forked while it had the table mapped (a child may write into it: see
// table_processes.cc, "Forks").
// Pooled memory stays in /dev/shm; the pool holds at most `max_tables` tables and `max_bytes` bytes
// (oldest dropped first; by default 8 tables and 16 GiB, at most a quarter of /dev/shm), and a create
// that finds /dev/shm full empties it and tries again. Names that a crashed process left in the pool
// are removed whenever a process pools a table, when their header records this process's PID namespace
// (kill(pid, 0) tells nothing of another's pids; `python -m gear_jax.cleanup` lists those).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "xla_ffi/shared_table.h"

namespace gear {

// The names of closed tables the pool keeps: gear_jax_pool_<pid>_<n>_<random> (gear_jax.table's
// POOL_NAME_PREFIX says the same to Python).
inline constexpr char kPoolNamePrefix[] = "gear_jax_pool_";

struct PooledTable {
  int64_t handle;                      // the closed table's registry handle, for the next table
  uint64_t spec_hash;                  // the closed table's spec
  std::shared_ptr<SharedTable> table;  // closed; its mapping is named `pool_name`
  std::string pool_name;
};

struct TablePoolStats {
  int64_t tables = 0;  // closed tables held now
  uint64_t bytes = 0;  // their memory
  int64_t max_tables = 0;
  uint64_t max_bytes = 0;
  int64_t reused = 0;          // creates served from the pool, in this process
  int64_t reused_handles = 0;  // of those, creates that also took the closed table's handle (same spec)
  int64_t pooled = 0;          // closes whose memory went to the pool
  int64_t refused = 0;         // creator closes the pool did not take (attached elsewhere, too large, full)
};

class TablePool {
 public:
  static TablePool& Get();

  // Offers the memory of a table this process created and is closing (already marked closed and out of
  // the registry). true: the pool keeps it under a private name. false: the caller unlinks it as usual.
  bool Offer(const std::shared_ptr<SharedTable>& table, int64_t handle);
  // Takes a closed table whose memory holds `bytes` and is at most twice that (plus 1 MiB), that no call
  // still uses: the same spec and size first, then the smallest. The caller reopens it with
  // SharedTable::Reopen, or gives it back with Return when that fails.
  std::optional<PooledTable> Take(uint64_t bytes, uint64_t spec_hash);
  void Return(PooledTable entry);
  // Counts a create served from the pool.
  void CountReuse(bool same_handle);
  // Drops every pooled table (unlinking its name); its memory is unmapped once no call uses it.
  void Clear();
  // 0 disables the pool (and empties it).
  void Configure(int64_t max_tables, uint64_t max_bytes);
  TablePoolStats Stats();

 private:
  TablePool();
  std::vector<PooledTable> TrimLocked();  // removes the oldest entries while over the limits
                                          // (the caller destroys them after unlocking)
  void ForgetIfForkedLocked();  // a forked child holds its parent's entries: forget them, unlink nothing
  void RemoveOrphans();         // names of pooled tables whose process is gone

  std::mutex mutex_;
  int32_t owner_pid_;
  int64_t next_id_ = 0;
  std::vector<PooledTable> entries_;  // oldest first
  TablePoolStats stats_;
};

}  // namespace gear
