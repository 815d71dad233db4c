#include "xla_ffi/table_processes.h"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "xla_ffi/seq_cst.h"
#include "xla_ffi/table_layout.h"
#include "xla_ffi/table_mapping.h"

namespace gear {
namespace {

// This process's pid, without a system call per row; reset in a forked child.
std::atomic<int32_t> cached_pid{0};
// This process's PID namespace (kNamespaceUnread until read); reset in a forked child, which an
// unshare(CLONE_NEWPID) of its parent puts in another namespace.
constexpr uint64_t kNamespaceUnread = ~uint64_t{0};
std::atomic<uint64_t> cached_namespace{kNamespaceUnread};

// Forks. A child inherits every mapping of its parent and may write into it, after the parent (the
// only process signed in for it) has exited: the creator's close would then see no live process and
// hand the memory to another table while the child still writes. So every fork, before it happens
// (the parent is alive and signed in, or is the creator), marks each mapped table never to be reused;
// the creator reads the mark after the slots, so it sees the live parent or the mark. The child then
// signs in to a slot of its own for each mapping, so that its liveness counts where slots are read
// (close, dead-table sweeps); the mark alone already keeps the memory out of the pool.
class MappedMemories {
 public:
  static MappedMemories& Get() {
    static MappedMemories* memories = new MappedMemories();  // never destroyed: mappings outlive exit
    return *memories;
  }
  void Add(TableMemory* memory) {
    std::lock_guard<std::mutex> lock(mutex_);
    memories_.insert(memory);
  }
  void Remove(TableMemory* memory) {
    std::lock_guard<std::mutex> lock(mutex_);
    memories_.erase(memory);
  }

 private:
  MappedMemories() {
    pthread_atfork([] { Get().BeforeFork(); }, [] { Get().mutex_.unlock(); }, [] { Get().InChild(); });
  }
  void BeforeFork() {
    mutex_.lock();  // held across the fork: no mapping comes or goes meanwhile
    for (TableMemory* memory : memories_) {
      if (IsTable(memory)) __atomic_store_n(&Header(memory)->never_reuse, 1u, __ATOMIC_SEQ_CST);
    }
  }
  void InChild() {
    // Only async-signal-safe calls here (getpid, kill, stat of /proc/self/ns/pid, atomics): the parent
    // may have had other threads.
    const int32_t me = static_cast<int32_t>(getpid());
    for (TableMemory* memory : memories_) {
      if (IsTable(memory)) memory->set_attach_slot(SignIn(Header(memory), me));
    }
    mutex_.unlock();
  }

  static TableHeader* Header(TableMemory* memory) { return reinterpret_cast<TableHeader*>(memory->base()); }
  // Attach maps a file before it knows it is a table: leave other files alone.
  static bool IsTable(TableMemory* memory) {
    return std::memcmp(Header(memory)->magic, kTableMagic, sizeof(kTableMagic)) == 0;
  }

  std::mutex mutex_;
  std::unordered_set<TableMemory*> memories_;
};

}  // namespace

bool ProcessAlive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

uint64_t PidNamespace() {
  CurrentPid();  // registers the reset after a fork
  uint64_t ns = cached_namespace.load(std::memory_order_relaxed);
  if (ns == kNamespaceUnread) {
    struct stat st{};
    ns = stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
    cached_namespace.store(ns, std::memory_order_relaxed);
  }
  return ns;
}

bool PidsComparable(const TableHeader* h) {
  const uint64_t mine = PidNamespace();
  return mine != 0 && Load(&h->creator_pid_namespace) == mine && Load(&h->mixed_pid_namespaces) == 0;
}

bool PidMayBeAlive(const TableHeader* h, int32_t pid) {
  if (pid <= 0) return false;
  // The flag after the pid (the callers load the pid first): a process of another namespace sets it
  // before it signs in or writes anything, so whoever reads its pid also reads the flag.
  return !PidsComparable(h) || ProcessAlive(pid);
}

int32_t CurrentPid() {
  int32_t pid = cached_pid.load(std::memory_order_relaxed);
  if (pid == 0) {
    static const bool reset_after_fork =
        pthread_atfork(nullptr, nullptr, [] {
          cached_pid.store(0, std::memory_order_relaxed);
          cached_namespace.store(kNamespaceUnread, std::memory_order_relaxed);
        }) == 0;
    (void)reset_after_fork;
    pid = static_cast<int32_t>(getpid());
    cached_pid.store(pid, std::memory_order_relaxed);
  }
  return pid;
}

int SignIn(TableHeader* h, int32_t me) {
  for (int slot = 0; slot < kMaxAttachments; ++slot) {
    int32_t seen = __atomic_load_n(&h->attached_pids[slot], __ATOMIC_SEQ_CST);  // before the flag
    if (seen != 0 && PidMayBeAlive(h, seen)) continue;
    if (__atomic_compare_exchange_n(&h->attached_pids[slot], &seen, me, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_RELAXED)) {
      return slot;
    }
  }
  __atomic_store_n(&h->never_reuse, 1u, __ATOMIC_SEQ_CST);
  return -1;
}

void SignOut(TableHeader* h, int slot) {
  if (slot < 0) return;
  int32_t me = CurrentPid();
  __atomic_compare_exchange_n(&h->attached_pids[slot], &me, 0, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

bool AttachedElsewhere(const TableHeader* h) {
  for (int slot = 0; slot < kMaxAttachments; ++slot) {
    if (PidMayBeAlive(h, __atomic_load_n(&h->attached_pids[slot], __ATOMIC_SEQ_CST))) return true;
  }
  // The mark after the slots ("Forks"): a process that forked and has exited since was signed in
  // before, and marked the table before its fork.
  return __atomic_load_n(&h->never_reuse, __ATOMIC_SEQ_CST) != 0;
}

void TrackMapping(TableMemory* memory) { MappedMemories::Get().Add(memory); }

void UntrackMapping(TableMemory* memory) { MappedMemories::Get().Remove(memory); }

}  // namespace gear
