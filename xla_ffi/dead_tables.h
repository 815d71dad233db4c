// Tables whose processes are all gone: found in /dev/shm by their headers, and removed.
//
// A creator killed (SIGKILL, SIGTERM's default action) or gone by _exit never closes its table, and
// nothing else removed its name: it stayed in /dev/shm, holding memory, until the host rebooted. A table
// is dead when its header has the gear_jax magic and this format, its creator's PID namespace is this
// process's (and no process of another namespace attached: kill(pid, 0) answers for its pids), and
// neither its creator, nor a process signed in to an attach slot (forked children sign in too), nor
// one holding a writer slot is alive. A table created to outlive its creator (the header's
// `persistent`) is removed only when asked for explicitly (`python -m gear_jax.cleanup --remove
// --include_persistent`).
//
// Every process that creates a table sweeps /dev/shm first (at most once a second): it reads the
// headers of the files there and removes the dead tables (RemoveIfDead has the argument why no open of
// a table it removes can be made, or kept by an attach that started before). Files that are not
// gear_jax tables of this format (no magic: another program's, or a table whose header is being
// written) are only read, never changed.
//
// What the sweep cannot see: an attach that found every attach slot taken (more than 256 at once) and
// has not written (no writer slot names it). When the table's creator and every process with a slot
// are gone, the name goes; such a process keeps its mapping (the memory lives until it unmaps), but no
// process can attach by the name any more.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gear {

// What the header of one gear_jax table in /dev/shm says, and which of its processes are alive here.
struct TableRecord {
  std::string name;
  uint64_t bytes = 0;
  uint64_t inode = 0, device = 0;
  uint32_t format_version = 0;  // the other fields are read only for this gear_jax's format
  bool pool = false;            // a name of the pool of closed tables (table_pool.h)
  int32_t creator_pid = 0;
  uint64_t creator_pid_namespace = 0;
  bool persistent = false;  // created to outlive its creator
  bool closed = false;      // its creator closed it
  bool mixed_pid_namespaces = false;
  bool same_pid_namespace = false;  // kill(pid, 0) answers for its pids (PidsComparable)
  bool creator_alive = false;       // by kill(pid, 0) here, whatever the namespace
  int attached_alive = 0;           // attach slots of processes alive here
  int writers_alive = 0;            // writer slots of processes alive here
  // With no slot naming a live process, and more processes than slots (or a fork) marked: whether
  // /proc shows another process mapping the file (or cannot tell).
  bool mapped_elsewhere = false;
  // The file is shorter than its header's total_bytes: truncated after its creation. A process that
  // touches a mapped page past the end dies of SIGBUS.
  bool truncated = false;
  // "live", "dead", "pool" (pooled by a live process), "pool-orphan" (pooled by a dead one),
  // "other-namespace" (liveness unknown here) or "other-format".
  std::string state;
};

// The header of /dev/shm/`name` when it is a gear_jax table (has the magic); nullopt otherwise.
std::optional<TableRecord> InspectTable(const std::string& name);

// Every gear_jax table in /dev/shm, by name.
std::vector<TableRecord> FindTables();

// Whether the record is of a table to remove: dead (or a pool orphan), and not persistent unless
// `include_persistent`. With `ignore_pid_namespaces`, a table of another namespace counts as dead when
// no process it records is alive by kill(pid, 0) here (whose answers are about other processes).
bool Removable(const TableRecord& record, bool include_persistent, bool ignore_pid_namespaces);

// Removes /dev/shm/`name` if it is a removable table (see Removable); whether it did.
bool RemoveIfDead(const std::string& name, bool include_persistent, bool ignore_pid_namespaces);

// Removes every dead table that is not persistent; returns their names. Without `force`, does nothing
// when this process swept less than a second ago.
std::vector<std::string> SweepDeadTables(bool force);

// Whether the header of /dev/shm/`name` (magic or not: a pool name may lose it mid-reuse) records a
// table of this format created in this process's PID namespace (the pool's orphan sweep asks).
bool CreatedInThisPidNamespace(const std::string& name);

}  // namespace gear
