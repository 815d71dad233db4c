#include "xla_ffi/table_pool.h"

#include <dirent.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <utility>

#include "xla_ffi/dead_tables.h"

namespace gear {
namespace {

constexpr int64_t kDefaultMaxTables = 8;
constexpr uint64_t kDefaultMaxBytes = uint64_t{16} << 30;

// GEAR_JAX_POOL_BYTES sets the byte limit (0 disables the pool); by default 16 GiB, and at most a
// quarter of /dev/shm, which pooled memory occupies (and keeps resident) while nobody uses it.
uint64_t DefaultMaxBytes() {
  const char* text = std::getenv("GEAR_JAX_POOL_BYTES");
  if (text != nullptr && *text != '\0') {
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text, &end, 10);
    if (end != nullptr && *end == '\0') return static_cast<uint64_t>(value);
  }
  struct statvfs shm{};
  if (statvfs("/dev/shm", &shm) == 0) {
    return std::min<uint64_t>(kDefaultMaxBytes, static_cast<uint64_t>(shm.f_blocks) * shm.f_frsize / 4);
  }
  return kDefaultMaxBytes;
}

void UnlinkPoolName(const std::string& name) { unlink(ShmFile(name).c_str()); }

}  // namespace

TablePool& TablePool::Get() {
  static TablePool* pool = new TablePool();  // never destroyed: tables may close during exit
  return *pool;
}

TablePool::TablePool() : owner_pid_(CurrentPid()) {
  stats_.max_tables = kDefaultMaxTables;
  stats_.max_bytes = DefaultMaxBytes();
}

void TablePool::ForgetIfForkedLocked() {
  if (owner_pid_ == CurrentPid()) return;
  // The parent owns these names and mappings; dropping the entries here would unmap (and, on a CUDA
  // machine, call CUDA in a forked child). Leak them instead: the child's pool starts empty.
  new std::vector<PooledTable>(std::move(entries_));
  entries_.clear();
  stats_.tables = 0;
  stats_.bytes = 0;
  owner_pid_ = CurrentPid();
}

void TablePool::RemoveOrphans() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  const std::string prefix = kPoolNamePrefix;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    // Only names pooled in this PID namespace: kill(pid, 0) says nothing of another's pids.
    if (pid > 0 && pid <= INT32_MAX && !ProcessAlive(static_cast<int32_t>(pid)) &&
        CreatedInThisPidNamespace(name)) {
      UnlinkPoolName(name);
    }
  }
  closedir(dir);
}

bool TablePool::Offer(const std::shared_ptr<SharedTable>& table, int64_t handle) {
  std::vector<PooledTable> dropped;  // destroyed (unmapped) after the lock is released
  std::lock_guard<std::mutex> lock(mutex_);
  ForgetIfForkedLocked();
  const uint64_t bytes = table->total_bytes();
  if (stats_.max_tables == 0 || bytes > stats_.max_bytes || !table->creator() || table->AttachedElsewhere()) {
    ++stats_.refused;
    return false;
  }
  RemoveOrphans();
  // pid (for the orphan sweep), then a random part: pids repeat across containers sharing /dev/shm.
  static thread_local std::mt19937_64 random(std::random_device{}());
  const std::string pool_name = kPoolNamePrefix + std::to_string(owner_pid_) + "_" +
                                std::to_string(next_id_++) + "_" + std::to_string(random());
  if (!table->RenameForPool(pool_name)) {
    ++stats_.refused;
    return false;
  }
  entries_.push_back(PooledTable{handle, table->header()->spec_hash, table, pool_name});
  ++stats_.tables;
  stats_.bytes += bytes;
  ++stats_.pooled;
  dropped = TrimLocked();
  return true;
}

std::optional<PooledTable> TablePool::Take(uint64_t bytes, uint64_t spec_hash) {
  std::lock_guard<std::mutex> lock(mutex_);
  ForgetIfForkedLocked();
  const uint64_t largest = 2 * bytes + (uint64_t{1} << 20);
  int best = -1;
  auto rank = [&](const PooledTable& e) {
    const bool exact = e.spec_hash == spec_hash && e.table->total_bytes() == bytes;
    return std::make_pair(exact ? 0 : 1, e.table->total_bytes());
  };
  for (int i = 0; i < static_cast<int>(entries_.size()); ++i) {
    const PooledTable& e = entries_[i];
    const uint64_t size = e.table->total_bytes();
    // use_count 1: the pool's reference is the only one, so no handler is still working on it.
    if (size < bytes || size > largest || e.table.use_count() != 1) continue;
    if (best < 0 || rank(e) < rank(entries_[best])) best = i;
  }
  if (best < 0) return std::nullopt;
  __atomic_thread_fence(__ATOMIC_ACQUIRE);  // after the last handler's release of its reference
  PooledTable entry = std::move(entries_[best]);
  entries_.erase(entries_.begin() + best);
  --stats_.tables;
  stats_.bytes -= entry.table->total_bytes();
  return entry;
}

void TablePool::Return(PooledTable entry) {
  std::vector<PooledTable> dropped;
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.tables;
  stats_.bytes += entry.table->total_bytes();
  entries_.push_back(std::move(entry));
  dropped = TrimLocked();
}

void TablePool::CountReuse(bool same_handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.reused;
  if (same_handle) ++stats_.reused_handles;
}

std::vector<PooledTable> TablePool::TrimLocked() {
  std::vector<PooledTable> dropped;
  while (!entries_.empty() && (stats_.tables > stats_.max_tables || stats_.bytes > stats_.max_bytes)) {
    PooledTable& oldest = entries_.front();
    UnlinkPoolName(oldest.pool_name);
    --stats_.tables;
    stats_.bytes -= oldest.table->total_bytes();
    dropped.push_back(std::move(oldest));
    entries_.erase(entries_.begin());
  }
  return dropped;
}

void TablePool::Clear() {
  std::vector<PooledTable> dropped;  // unmapped outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ForgetIfForkedLocked();
    for (const PooledTable& e : entries_) UnlinkPoolName(e.pool_name);
    dropped = std::move(entries_);
    entries_.clear();
    stats_.tables = 0;
    stats_.bytes = 0;
  }
}

void TablePool::Configure(int64_t max_tables, uint64_t max_bytes) {
  std::vector<PooledTable> dropped;
  std::lock_guard<std::mutex> lock(mutex_);
  ForgetIfForkedLocked();
  stats_.max_tables = max_tables;
  stats_.max_bytes = max_bytes;
  dropped = TrimLocked();
}

TablePoolStats TablePool::Stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  ForgetIfForkedLocked();
  return stats_;
}

}  // namespace gear
