#include "xla_ffi/dead_tables.h"

#include <dirent.h>
#include <fcntl.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "xla_ffi/clock.h"
#include "xla_ffi/shared_table.h"
#include "xla_ffi/table_pool.h"

namespace gear {
namespace {

// Whether a process (this one too) maps the file (device, inode): its /proc/<pid>/maps lists the inode
// with the device's major:minor. A process whose maps this one may not read (another user's; pid 1 in
// some sandboxes) is not counted: a process of the table's own user can always be read.
bool MappedByAProcess(uint64_t device, uint64_t inode) {
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return true;
  const unsigned major_id = major(static_cast<dev_t>(device)), minor_id = minor(static_cast<dev_t>(device));
  char wanted_device[32];
  std::snprintf(wanted_device, sizeof(wanted_device), "%02x:%02x", major_id, minor_id);
  const std::string wanted_inode = std::to_string(inode);
  bool found = false;
  while (!found) {
    const dirent* entry = readdir(proc);
    if (entry == nullptr) break;
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || pid <= 0) continue;
    const std::string path = std::string("/proc/") + entry->d_name + "/maps";
    FILE* maps = std::fopen(path.c_str(), "re");
    if (maps == nullptr) continue;  // gone meanwhile, or not ours to read
    char line[4096];
    while (!found && std::fgets(line, sizeof(line), maps) != nullptr) {
      // address perms offset dev inode path
      char dev[32], ino[32];
      if (std::sscanf(line, "%*s %*s %*s %31s %31s", dev, ino) == 2) {
        found = wanted_inode == ino && strcasecmp(dev, wanted_device) == 0;
      }
    }
    std::fclose(maps);
  }
  closedir(proc);
  return found;
}

constexpr char kRemovingPrefix[] = "gear_jax_removing_";  // a table on its way out (RemoveIfDead)
constexpr int64_t kSweepEveryNs = 1'000'000'000;

bool StartsWith(const std::string& text, const char* prefix) {
  return text.compare(0, std::strlen(prefix), prefix) == 0;
}

// A copy of the header of /dev/shm/`name` up to its spec, read with pread: the files are other
// processes' (a mapping would take SIGBUS from one another program truncates), and only read.
struct HeaderCopy {
  std::unique_ptr<TableHeader> header = std::make_unique<TableHeader>();
  struct stat st{};
};

// Reads the header when the file is a regular file large enough to hold one; with `need_magic`, only
// when it has the gear_jax magic and this format (else the rest is not read: most files are not tables).
bool ReadHeader(const std::string& name, bool need_magic, HeaderCopy* out) {
  const int fd = open(ShmFile(name).c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return false;
  bool ok = fstat(fd, &out->st) == 0 && S_ISREG(out->st.st_mode) &&
            static_cast<uint64_t>(out->st.st_size) >= sizeof(TableHeader);
  char* bytes = reinterpret_cast<char*>(out->header.get());
  constexpr size_t kStart = offsetof(TableHeader, format_version) + sizeof(uint32_t);
  ok = ok && pread(fd, bytes, kStart, 0) == static_cast<ssize_t>(kStart);
  if (ok && need_magic) ok = std::memcmp(out->header->magic, kTableMagic, sizeof(kTableMagic)) == 0;
  if (ok && (need_magic || out->header->format_version == kFormatVersion)) {
    constexpr size_t kBytes = offsetof(TableHeader, spec_json);
    ok = pread(fd, bytes, kBytes, 0) == static_cast<ssize_t>(kBytes);
  }
  close(fd);
  return ok;
}

std::string RemovingName() {
  static thread_local std::mt19937_64 random(std::random_device{}());
  char suffix[17];
  std::snprintf(suffix, sizeof(suffix), "%016llx", static_cast<unsigned long long>(random()));
  return kRemovingPrefix + std::to_string(CurrentPid()) + "_" + suffix;
}

std::vector<std::string> ShmNames() {
  std::vector<std::string> names;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    if (entry->d_type != DT_REG && entry->d_type != DT_UNKNOWN) continue;
    names.emplace_back(entry->d_name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::optional<TableRecord> InspectTable(const std::string& name) {
  HeaderCopy copy;
  if (!ReadHeader(name, /*need_magic=*/true, &copy)) return std::nullopt;
  const TableHeader& h = *copy.header;
  TableRecord r;
  r.name = name;
  r.bytes = static_cast<uint64_t>(copy.st.st_size);
  r.inode = static_cast<uint64_t>(copy.st.st_ino);
  r.device = static_cast<uint64_t>(copy.st.st_dev);
  r.format_version = h.format_version;
  r.pool = StartsWith(name, kPoolNamePrefix);
  if (h.format_version != kFormatVersion) {
    r.state = "other-format";  // its header is laid out otherwise: nothing more is read
    return r;
  }
  r.truncated = static_cast<uint64_t>(copy.st.st_size) < h.total_bytes;
  r.creator_pid = h.creator_pid;
  r.creator_pid_namespace = h.creator_pid_namespace;
  r.persistent = h.persistent != 0;
  r.closed = h.closed != 0;
  r.mixed_pid_namespaces = h.mixed_pid_namespaces != 0;
  r.same_pid_namespace = PidsComparable(&h);
  r.creator_alive = ProcessAlive(h.creator_pid);
  for (int slot = 0; slot < kMaxAttachments; ++slot) {
    if (h.attached_pids[slot] > 0 && ProcessAlive(h.attached_pids[slot])) ++r.attached_alive;
  }
  // Every writer slot, also past writer_slots_used (a slot is taken before the count follows), idle
  // ones too: a process with a slot has the table open, if only by a mapping inherited through fork.
  for (int slot = 0; slot < kMaxWriterSlots; ++slot) {
    const int32_t pid = static_cast<int32_t>(h.writer_slots[slot] & 0xffffffffu);
    if (pid > 0 && ProcessAlive(pid)) ++r.writers_alive;
  }
  bool anyone = r.creator_alive || r.attached_alive > 0 || r.writers_alive > 0;
  // More processes attached than there are slots, or a fork: a process may map the table with no slot
  // naming it. Before calling such a table dead, look for its mappings in /proc.
  if (!anyone && h.never_reuse != 0 && PidsComparable(&h)) {
    r.mapped_elsewhere = MappedByAProcess(r.device, r.inode);
    anyone = r.mapped_elsewhere;
  }
  if (!r.same_pid_namespace) {
    r.state = "other-namespace";
  } else if (r.pool) {
    r.state = anyone ? "pool" : "pool-orphan";
  } else {
    r.state = anyone ? "live" : "dead";
  }
  return r;
}

std::vector<TableRecord> FindTables() {
  std::vector<TableRecord> tables;
  for (const std::string& name : ShmNames()) {
    if (std::optional<TableRecord> record = InspectTable(name)) tables.push_back(std::move(*record));
  }
  return tables;
}

bool Removable(const TableRecord& r, bool include_persistent, bool ignore_pid_namespaces) {
  if (r.format_version != kFormatVersion) return false;
  // A closed table (in the pool, or its creator died before removing the name) outlives nothing.
  if (r.persistent && !r.closed && !include_persistent) return false;
  if (r.state == "dead" || r.state == "pool-orphan") return true;
  return r.state == "other-namespace" && ignore_pid_namespaces && !r.creator_alive && r.attached_alive == 0 &&
         r.writers_alive == 0;
}

// Removal, and why no process keeps an open of a table removed (or gets one).
//
// 1. read the header of `name`: removable (its creator and every process with a slot gone)
// 2. rename `name` to a name of its own (gear_jax_removing_<pid>_<random>): attaches by `name` fail now
// 3. read the header again, under the new name: still the same file and removable -> 4; else the name
//    is given back (link, so that a table made under `name` meanwhile is not replaced) -> done
// 4. unlink the new name
// An attach (SharedTable::Attach) signs in to an attach slot, and only then checks that `name` still
// names the file it mapped. Take an attach that passes that check: the check came before the rename of
// step 2 (after it, `name` names no file, or another one), so its sign-in came before step 3 read the
// slots (the rename and the check are ordered by the file system, the sign-in and the read are
// sequentially consistent), and step 3 saw its pid, alive: nothing was removed. An attach whose check
// failed signs out again. A creator cannot come back (its pid is gone; a pid reused makes the table
// look alive, which keeps it), and a writer slot is only taken by a process that has the table open.
// Two sweeps racing: one renames, the other's rename fails. A sweep killed between steps 2 and 4 leaves
// the table under its new name, dead: the next sweep removes it. A name given back in step 3 may make
// an attach that checked during the instant it was away fail (TableNotFoundError), spuriously.
bool RemoveIfDead(const std::string& name, bool include_persistent, bool ignore_pid_namespaces) {
  const std::optional<TableRecord> first = InspectTable(name);
  if (!first || !Removable(*first, include_persistent, ignore_pid_namespaces)) return false;
  const std::string removing = RemovingName();
  if (rename(ShmFile(name).c_str(), ShmFile(removing).c_str()) != 0) return false;
  const std::optional<TableRecord> again = InspectTable(removing);
  if (again && again->inode == first->inode && again->device == first->device &&
      Removable(*again, include_persistent, ignore_pid_namespaces)) {
    unlink(ShmFile(removing).c_str());
    return true;
  }
  // Fails when a table was made under `name` meanwhile: then this one stays under the new name, and
  // goes once it is dead.
  if (link(ShmFile(removing).c_str(), ShmFile(name).c_str()) == 0) unlink(ShmFile(removing).c_str());
  return false;
}

std::vector<std::string> SweepDeadTables(bool force) {
  static std::atomic<int64_t> next_sweep_ns{0};
  const int64_t now = MonotonicNs();
  int64_t due = next_sweep_ns.load(std::memory_order_relaxed);
  if (!force && (now < due || !next_sweep_ns.compare_exchange_strong(due, now + kSweepEveryNs))) return {};
  if (force) next_sweep_ns.store(now + kSweepEveryNs, std::memory_order_relaxed);
  std::vector<std::string> removed;
  for (const std::string& name : ShmNames()) {
    if (RemoveIfDead(name, /*include_persistent=*/false, /*ignore_pid_namespaces=*/false)) {
      removed.push_back(name);
    }
  }
  return removed;
}

bool CreatedInThisPidNamespace(const std::string& name) {
  HeaderCopy copy;
  if (!ReadHeader(name, /*need_magic=*/false, &copy)) return false;
  const uint64_t mine = PidNamespace();
  return copy.header->format_version == kFormatVersion && mine != 0 &&
         copy.header->creator_pid_namespace == mine;
}

}  // namespace gear
