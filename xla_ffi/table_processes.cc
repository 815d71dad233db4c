#include "xla_ffi/table_processes.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
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

// Liveness locks (table_processes.h). The lock this process holds, for pid `pid` (0: none taken yet),
// on `hold_fd` (-1: none held), in the file of `device` and `inode`; changed under `liveness_busy` only.
constexpr char kLivenessFile[] = "/dev/shm/gear_jax_liveness";
struct LivenessLock {
  int32_t pid = 0;
  int hold_fd = -1;
  uint64_t device = 0, inode = 0;
};
LivenessLock liveness;
std::atomic_flag liveness_busy = ATOMIC_FLAG_INIT;
// The descriptor through which this process asks who holds a lock (F_OFD_GETLK reports the locks of
// other open files only, so not the one that holds this process's own lock).
std::atomic<int> probe_fd{-1};

// Holds `liveness_busy` while it lives (a spin: the holders make a few system calls at most).
class LivenessBusy {
 public:
  LivenessBusy() {
    while (liveness_busy.test_and_set(std::memory_order_acquire)) sched_yield();
  }
  ~LivenessBusy() { liveness_busy.clear(std::memory_order_release); }
  LivenessBusy(const LivenessBusy&) = delete;
  LivenessBusy& operator=(const LivenessBusy&) = delete;
};

// The lock request of `type` on pid `pid`'s byte.
struct flock PidByte(int32_t pid, short type) {
  struct flock lock{};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_start = pid;
  lock.l_len = 1;
  return lock;
}

// Whether the file of `device` and `inode` is the liveness file table `h` names.
bool IsTablesFile(const TableHeader* h, uint64_t device, uint64_t inode) {
  return device == Load(&h->liveness_device) && inode == Load(&h->liveness_inode);
}

// Whether a second open file of the liveness file reports the lock `fd` holds on byte `pid`, as OFD locks
// do on Linux; a kernel that treated them as a process's own locks (hidden from the process) would
// make this process judge its own pids dead. Async-signal-safe (open, fcntl, fstat, close).
bool SeesOwnLock(int fd, int32_t pid) {
  const int other = open(kLivenessFile, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (other < 0) return false;
  struct stat mine{}, theirs{};
  struct flock lock = PidByte(pid, F_WRLCK);
  const bool seen = fstat(fd, &mine) == 0 && fstat(other, &theirs) == 0 && mine.st_dev == theirs.st_dev &&
                    mine.st_ino == theirs.st_ino && fcntl(other, F_OFD_GETLK, &lock) == 0 &&
                    lock.l_type == F_RDLCK;
  close(other);
  return seen;
}

// Takes the lock of `pid` unless this process holds it already. Only async-signal-safe calls (open,
// fcntl, fstat, close): a forked child calls it. A descriptor left from the parent (the parent's lock,
// which stays the parent's while the parent keeps its own descriptor) is closed first.
void TakeLiveness(int32_t pid, bool in_child) {
  if (in_child) liveness_busy.clear(std::memory_order_relaxed);  // a parent's thread may have held it
  LivenessBusy busy;
  if (liveness.pid == pid) return;
  if (liveness.hold_fd >= 0) close(liveness.hold_fd);
  liveness = LivenessLock{};
  liveness.pid = pid;
  // Read-only and readable by every user: a read lock needs no more, and no process but the file's
  // owner can take a write lock that would keep the others' read locks out (0644 whatever the umask).
  const int fd = open(kLivenessFile, O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return;
  fchmod(fd, 0644);  // fails harmlessly on another user's file
  const struct flock lock = PidByte(pid, F_RDLCK);
  struct stat st{};
  if (fcntl(fd, F_OFD_SETLK, &lock) != 0 || fstat(fd, &st) != 0 || !SeesOwnLock(fd, pid)) {
    close(fd);
    return;
  }
  liveness.hold_fd = fd;
  liveness.device = static_cast<uint64_t>(st.st_dev);
  liveness.inode = static_cast<uint64_t>(st.st_ino);
}

// The probe descriptor (opened at the first use), -1 where the file cannot be opened.
int ProbeFd() {
  int fd = probe_fd.load(std::memory_order_acquire);
  if (fd >= 0) return fd;
  fd = open(kLivenessFile, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -1;
  int expected = -1;
  if (!probe_fd.compare_exchange_strong(expected, fd, std::memory_order_acq_rel)) {
    close(fd);  // another thread opened one first
    return expected;
  }
  return fd;
}

// Whether some process may hold the liveness lock of `pid` in the file table `h` names: false only when
// the probe finds no lock on the pid's byte and its descriptor is of that very file (its number may
// since name another file, closed by code that did not own it, or the file may have been made again).
bool LivenessLockHeld(const TableHeader* h, int32_t pid) {
  const int fd = ProbeFd();
  if (fd < 0) return true;
  struct flock lock = PidByte(pid, F_WRLCK);  // conflicts with every read lock on the byte
  if (fcntl(fd, F_OFD_GETLK, &lock) != 0 || lock.l_type != F_UNLCK) return true;
  struct stat st{};
  return fstat(fd, &st) != 0 ||
         !IsTablesFile(h, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino));
}

// ProveLiveness's work, under `liveness_busy` (async-signal-safe: atomics only).
void ProveLivenessTaken(TableHeader* h) {
  if (liveness.hold_fd < 0 || !IsTablesFile(h, liveness.device, liveness.inode)) {
    Store(&h->liveness_unproven, 1u);
  }
}

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
    // Only async-signal-safe calls here (getpid, kill, stat of /proc/self/ns/pid, open, fcntl, close,
    // atomics): the parent may have had other threads. The child's liveness lock before its pid goes
    // into any slot.
    const int32_t me = static_cast<int32_t>(getpid());
    TakeLiveness(me, /*in_child=*/true);
    // A parent that had unshared its PID namespace forks children into the new one: as an attach from
    // another namespace does, the child marks the table before its pid goes into a slot.
    struct stat ns{};
    const uint64_t namespace_id = stat("/proc/self/ns/pid", &ns) == 0 ? static_cast<uint64_t>(ns.st_ino) : 0;
    for (TableMemory* memory : memories_) {
      if (!IsTable(memory)) continue;
      TableHeader* h = Header(memory);
      if (namespace_id == 0 || Load(&h->creator_pid_namespace) != namespace_id) {
        Store(&h->mixed_pid_namespaces, 1u);
      }
      ProveLivenessTaken(h);
      memory->set_attach_slot(SignIn(h, me));
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
  // The flags after the pid (the callers load the pid first): a process of another namespace sets
  // mixed_pid_namespaces, and one without a lock in the table's file liveness_unproven, before it signs
  // in or writes anything, so whoever reads its pid also reads the flags.
  if (PidsComparable(h)) return ProcessAlive(pid);
  return Load(&h->liveness_unproven) != 0 || LivenessLockHeld(h, pid);
}

bool LivenessFile(uint64_t* device, uint64_t* inode) {
  CurrentPid();  // takes the lock
  LivenessBusy busy;
  *device = liveness.device;
  *inode = liveness.inode;
  return liveness.hold_fd >= 0;
}

void ProveLiveness(TableHeader* h) {
  CurrentPid();  // takes the lock
  LivenessBusy busy;
  ProveLivenessTaken(h);
}

int32_t CurrentPid() {
  int32_t pid = cached_pid.load(std::memory_order_relaxed);
  if (pid == 0) {
    // Around a fork, the liveness lock's state is held (prepare), so that no other thread is inside
    // TakeLiveness when the process is copied: a child would otherwise spin for good on the flag, or
    // start from a state half written. Registered before this process's first TakeLiveness.
    static const bool reset_after_fork =
        pthread_atfork(
            [] {
              while (liveness_busy.test_and_set(std::memory_order_acquire)) sched_yield();
            },
            [] { liveness_busy.clear(std::memory_order_release); },
            [] {
              liveness_busy.clear(std::memory_order_release);
              cached_pid.store(0, std::memory_order_relaxed);
              cached_namespace.store(kNamespaceUnread, std::memory_order_relaxed);
            }) == 0;
    (void)reset_after_fork;
    pid = static_cast<int32_t>(getpid());
    TakeLiveness(pid, /*in_child=*/false);  // before the pid can be recorded anywhere
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
