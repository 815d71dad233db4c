#include "xla_ffi/shared_table.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "kernels/atomics.h"
#if GEAR_JAX_WITH_CUDA
#include "xla_ffi/cuda_runtime.h"
#endif

namespace gear {
namespace {

constexpr uint64_t kColumnAlign = 4096;
constexpr int kPopulateShift = 21;                 // SharedTable::Populate maps 2 MiB blocks
constexpr uint64_t kHugePage = uint64_t{1} << 21;  // the page size BackWithHugePages makes
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1
#endif

uint64_t RoundUp(uint64_t value, uint64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

std::string ShmPath(const std::string& name) { return "/" + name; }

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// This process's pid, without a system call per row; reset in a forked child.
std::atomic<int32_t> cached_pid{0};
// This process's PID namespace (kNamespaceUnread until read); reset in a forked child, which an
// unshare(CLONE_NEWPID) of its parent puts in another namespace.
constexpr uint64_t kNamespaceUnread = ~uint64_t{0};
std::atomic<uint64_t> cached_namespace{kNamespaceUnread};

// Sequentially consistent atomics for ownership and counter windows (the argument before Claim needs one
// total order of them).
template <typename T>
T Load(const T* p) {
  return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}
template <typename T>
void Store(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}
template <typename T>
T Add(T* p, T v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
template <typename T>
bool Cas(T* p, T* expected, T desired) {
  return __atomic_compare_exchange_n(p, expected, desired, /*weak=*/false, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST);
}

// A writer slot: the process's pid in the low 32 bits, its open counter windows in the high 32.
constexpr uint64_t kOneWindow = uint64_t{1} << 32;
int32_t SlotPid(uint64_t slot) { return static_cast<int32_t>(slot & 0xffffffffu); }
uint32_t SlotWindows(uint64_t slot) { return static_cast<uint32_t>(slot >> 32); }

// How often CheckCounts(force = false) looks, and how far it backs off while recounts keep failing.
constexpr int64_t kCheckEveryNs = 10'000'000;
constexpr int64_t kCheckAtMostEveryNs = 1'000'000'000;

// Signs process `me` in to a free slot (or one left by a dead process); -1 when every slot is taken.
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

// Fills a new header into `base` from `plan`, the magic last: a header with magic is complete.
// `reuses` counts the tables the memory held before.
void WriteHeader(uint8_t* base, const TablePlan& plan, uint64_t total_bytes, const std::string& spec_json,
                 uint64_t spec_hash, uint64_t reuses) {
  TableHeader* h = reinterpret_cast<TableHeader*>(base);
  std::memcpy(h, &plan.layout, sizeof(TableHeader));  // the plan's magic, counters and slots are zero
  __atomic_store_n(&h->reuses, reuses, __ATOMIC_RELAXED);
  h->creator_pid = CurrentPid();
  h->creator_pid_namespace = PidNamespace();
  h->format_version = kFormatVersion;
  h->spec_json_bytes = static_cast<uint32_t>(spec_json.size());
  h->spec_hash = spec_hash;
  h->total_bytes = total_bytes;
  std::memcpy(h->spec_json, spec_json.data(), spec_json.size());
  __atomic_thread_fence(__ATOMIC_RELEASE);
  std::memcpy(h->magic, kTableMagic, sizeof(kTableMagic));
}

// Whether every column the header describes lies inside a mapping of `size` bytes.
bool LayoutFits(const TableHeader& h, uint64_t size) {
  if (h.capacity < 1 || h.capacity > INT32_MAX || h.max_steps < 1 || h.num_fields < 1 ||
      h.num_fields > kMaxFields) {
    return false;
  }
  const uint64_t rows = static_cast<uint64_t>(h.capacity);
  auto inside = [&](uint64_t offset, uint64_t stride) {
    uint64_t bytes = 0, end = 0;
    return !__builtin_mul_overflow(rows, stride, &bytes) && !__builtin_add_overflow(offset, bytes, &end) &&
           offset >= sizeof(TableHeader) && end <= size;
  };
  if (!inside(h.state_offset, 8) || !inside(h.length_offset, 4) || !inside(h.insert_seq_offset, 8) ||
      !inside(h.times_sampled_offset, 4) || !inside(h.writer_pid_offset, 4) ||
      !inside(h.change_counts_offset, 4)) {
    return false;
  }
  for (int f = 0; f < h.num_fields; ++f) {
    const FieldLayout& field = h.fields[f];
    int64_t row_bytes = 0;
    if (field.step_bytes < 1 ||
        __builtin_mul_overflow(field.step_bytes, static_cast<int64_t>(h.max_steps), &row_bytes) ||
        field.row_stride < row_bytes || !inside(field.offset, static_cast<uint64_t>(field.row_stride))) {
      return false;
    }
  }
  return true;
}

// What is wrong with the columns of a header that LayoutFits a mapping (empty: nothing). They must be
// exactly where PlanTable puts them for the header's capacity, max_steps and step sizes: then no two
// columns overlap, each is aligned as the kernels assume, and every row of a field holds max_steps
// steps within its own stride. The spec JSON is checked against this layout by gear_jax.Table.attach.
std::string LayoutProblem(const TableHeader& h, uint64_t size) {
  std::vector<int64_t> step_bytes;
  for (int f = 0; f < h.num_fields; ++f) step_bytes.push_back(h.fields[f].step_bytes);
  TablePlan plan{};
  try {
    plan = PlanTable(h.capacity, h.max_steps, step_bytes, std::string());
  } catch (const std::exception& e) {
    return std::string("its layout can not be planned (") + e.what() + ")";
  }
  if (plan.total_bytes > size) {
    return "its layout needs " + std::to_string(plan.total_bytes) + " bytes, the file holds " +
           std::to_string(size);
  }
  const TableHeader& want = plan.layout;
  if (h.state_offset != want.state_offset || h.length_offset != want.length_offset ||
      h.insert_seq_offset != want.insert_seq_offset || h.times_sampled_offset != want.times_sampled_offset ||
      h.writer_pid_offset != want.writer_pid_offset || h.change_counts_offset != want.change_counts_offset) {
    return "its row status columns are not where its layout puts them";
  }
  for (int f = 0; f < h.num_fields; ++f) {
    const FieldLayout &have = h.fields[f], &planned = want.fields[f];
    if (have.offset != planned.offset || have.row_stride != planned.row_stride) {
      return "the column of field " + std::to_string(f) + " (offset " + std::to_string(have.offset) +
             ", row stride " + std::to_string(have.row_stride) +
             ") is not where its layout puts it (offset " + std::to_string(planned.offset) + ", row stride " +
             std::to_string(planned.row_stride) + ")";
    }
  }
  return {};
}

}  // namespace

bool ProcessAlive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

int64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

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

std::string ShmFile(const std::string& name) { return "/dev/shm/" + name; }

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

void CudaPinningDeleter::operator()(CudaPinning* pinning) const {
#if GEAR_JAX_WITH_CUDA
  delete pinning;
#else
  (void)pinning;  // no CudaPinning exists in a CPU-only build
#endif
}

TableMemory::TableMemory(uint8_t* base, size_t bytes)
    : base_(base), bytes_(bytes), mapped_by_pid_(CurrentPid()) {
  MappedMemories::Get().Add(this);
}

TableMemory::~TableMemory() {
#if GEAR_JAX_WITH_CUDA
  if (mapped_by_pid_ != CurrentPid()) {
    cuda_.release();  // a forked child must not call CUDA: leave the registration to the parent
  }
  cuda_.reset();  // waits for this process's kernels, unregisters the memory before it is unmapped
#endif
  // After the kernels: until now, this open may still have touched the memory.
  MappedMemories::Get().Remove(this);
  SignOut(reinterpret_cast<TableHeader*>(base_), attach_slot_);
  munmap(base_, bytes_);
}

bool TableMemory::pinned() const {
#if GEAR_JAX_WITH_CUDA
  return cuda_ && cuda_->pinned();
#else
  return false;
#endif
}

void TableMemory::Pin(bool want) {
#if GEAR_JAX_WITH_CUDA
  if (cuda_ && (cuda_->pinned() || !want)) return;
  cuda_.reset(CudaPinning::Pin(base_, bytes_, want).release());
#else
  (void)want;
#endif
}

void TableMemory::Quiesce() {
#if GEAR_JAX_WITH_CUDA
  if (cuda_) cuda_->Quiesce();
#endif
}

void TableMemory::WaitForKernels() {
#if GEAR_JAX_WITH_CUDA
  if (cuda_ && mapped_by_pid_ == CurrentPid()) cuda_->WaitForKernels();
#endif
}

int64_t RowStride(int64_t row_bytes) {
  return static_cast<int64_t>(RoundUp(row_bytes, row_bytes >= 1024 ? 128 : 16));
}

SharedTable::SharedTable(std::string name, std::shared_ptr<TableMemory> memory, bool creator)
    : name_(std::move(name)),
      memory_(std::move(memory)),
      base_(memory_->base()),
      creator_(creator),
      rate_limiter_(&header()->rate_limiter, &header()->size, &name_) {
  TableHeader* h = header();
  view_.capacity = h->capacity;
  view_.max_steps = h->max_steps;
  view_.num_fields = h->num_fields;
  view_.state = reinterpret_cast<uint64_t*>(base_ + h->state_offset);
  view_.length = reinterpret_cast<int32_t*>(base_ + h->length_offset);
  view_.insert_seq = reinterpret_cast<uint64_t*>(base_ + h->insert_seq_offset);
  view_.times_sampled = reinterpret_cast<uint32_t*>(base_ + h->times_sampled_offset);
  view_.change_counts = reinterpret_cast<uint32_t*>(base_ + h->change_counts_offset);
  view_.next_seq = &h->next_seq;
  view_.selectable = &h->selectable;
  view_.max_priority_bits = &h->max_priority_bits;
  populated_ = std::make_unique<std::atomic<uint64_t>[]>(((memory_->bytes() - 1) >> kPopulateShift) / 64 + 1);
  for (int f = 0; f < h->num_fields; ++f) {
    view_.fields[f] =
        FieldView{base_ + h->fields[f].offset, h->fields[f].row_stride, h->fields[f].step_bytes};
  }
}

SharedTable::~SharedTable() {
  // A kernel enqueued earlier may still read a GPU's priority index, which goes with this object.
  if (priority_indexes_.HasDeviceIndexes()) memory_->WaitForKernels();
  // Frees this open's writer slot (the process may attach again, and slots are few).
  const int64_t mine = writer_slot_.load(std::memory_order_acquire);
  if (mine != 0 && static_cast<int32_t>(mine >> 32) == CurrentPid() && static_cast<int32_t>(mine) >= 0) {
    uint64_t idle = static_cast<uint32_t>(CurrentPid());
    Cas(&header()->writer_slots[static_cast<int32_t>(mine)], &idle, uint64_t{0});
  }
}

TablePlan PlanTable(int64_t capacity, int32_t max_steps, const std::vector<int64_t>& step_bytes,
                    const std::string& spec_json) {
  if (capacity < 1 || capacity > INT32_MAX) throw std::invalid_argument("capacity must be in [1, 2**31 - 1]");
  if (max_steps < 1) throw std::invalid_argument("max_steps must be >= 1");
  if (step_bytes.empty() || step_bytes.size() > static_cast<size_t>(kMaxFields)) {
    throw std::invalid_argument("a table needs 1 to 64 fields");
  }
  if (spec_json.size() >= kSpecJsonCapacity) throw std::invalid_argument("the spec is too large to store");

  TablePlan plan{};
  TableHeader& layout = plan.layout;
  uint64_t offset = RoundUp(sizeof(TableHeader), kColumnAlign);
  auto too_large = [] {
    return std::invalid_argument("the table is too large to address (capacity x max_steps x field bytes)");
  };
  auto column = [&](uint64_t bytes) {
    uint64_t at = offset, end = 0;
    if (bytes > (uint64_t{1} << 60) || __builtin_add_overflow(offset, bytes + kColumnAlign, &end) ||
        end > (uint64_t{1} << 60)) {
      throw too_large();
    }
    offset = RoundUp(offset + bytes, kColumnAlign);
    return at;
  };
  const uint64_t rows = static_cast<uint64_t>(capacity);
  // The status columns first and together: reusing memory clears them in one stretch.
  layout.state_offset = column(rows * sizeof(uint64_t));
  layout.length_offset = column(rows * sizeof(int32_t));
  layout.insert_seq_offset = column(rows * sizeof(uint64_t));
  layout.times_sampled_offset = column(rows * sizeof(uint32_t));
  layout.writer_pid_offset = column(rows * sizeof(int32_t));
  layout.change_counts_offset =
      column(static_cast<uint64_t>(ChangeCounterCount(capacity)) * sizeof(uint32_t));
  for (size_t f = 0; f < step_bytes.size(); ++f) {
    if (step_bytes[f] < 1) throw std::invalid_argument("every field needs at least one byte per step");
    int64_t row_bytes = 0;
    uint64_t column_bytes = 0;
    if (__builtin_mul_overflow(step_bytes[f], static_cast<int64_t>(max_steps), &row_bytes) ||
        row_bytes > (int64_t{1} << 48)) {
      throw too_large();
    }
    const int64_t stride = RowStride(row_bytes);
    if (__builtin_mul_overflow(rows, static_cast<uint64_t>(stride), &column_bytes)) throw too_large();
    layout.fields[f] = FieldLayout{column(column_bytes), stride, step_bytes[f]};
  }
  layout.capacity = capacity;
  layout.max_steps = max_steps;
  layout.num_fields = static_cast<int32_t>(step_bytes.size());
  plan.total_bytes = offset;
  return plan;
}

namespace {

// The kernel's page-middle-directory page (2 MiB on x86-64; 512 MiB on arm64 kernels of 64 KiB pages),
// or 0 where it does not say.
uint64_t PmdPageBytes() {
  static const uint64_t bytes = [] {
    uint64_t value = 0;
    if (FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r")) {
      unsigned long long read = 0;
      if (std::fscanf(f, "%llu", &read) == 1) value = read;
      std::fclose(f);
    }
    return value;
  }();
  return bytes;
}

// Maps `size` bytes of the table file `fd`, shared and writable. From 2 MiB on, at an address aligned to
// 2 MiB: only an aligned mapping lets the kernel map the table's 2 MiB pages (BackWithHugePages) with
// one page-table entry each, in this process and in every process that attaches.
void* MapTable(int fd, size_t size) {
  if (size < kHugePage) return mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t area_bytes = RoundUp(size + kHugePage, page);
  void* area = mmap(nullptr, area_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (area == MAP_FAILED) return MAP_FAILED;
  const uintptr_t start = reinterpret_cast<uintptr_t>(area);
  const uintptr_t aligned = RoundUp(start, kHugePage);
  void* base =
      mmap(reinterpret_cast<void*>(aligned), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    munmap(area, area_bytes);
    errno = err;
    return MAP_FAILED;
  }
  const uintptr_t end = RoundUp(aligned + size, page);
  if (aligned > start) munmap(area, aligned - start);
  if (start + area_bytes > end) munmap(reinterpret_cast<void*>(end), start + area_bytes - end);
  return base;
}

// Backs the whole 2 MiB blocks of a new table file with 2 MiB pages, best effort, before the rest is
// reserved. /dev/shm is often mounted without huge pages, and then every row a sample or gather reads
// is a TLB miss and a page walk; with 2 MiB pages a random gather of 256 rows of 1 KiB took about 20%
// less time here (docs/ARCHITECTURE.md, "Huge pages for tables"). MADV_COLLAPSE (Linux 6.1) makes a 2 MiB
// page of a block regardless of the mount's and the system's settings, but only of a block that holds a page:
// so each block gets one page first (posix_fallocate of its first 4 KiB), then the blocks are collapsed
// 64 MiB at a time. Collapsing allocates 2 MiB pages, which can make the kernel compact memory: the work
// stops once it took 500 ms per GiB of table (at least 250 ms), and the blocks not done get 4 KiB pages
// from the reservation that follows. Nothing is done for a table larger than the free space, which the
// reservation then refuses, nor where the kernel's huge page is not 2 MiB (arm64 kernels of 64 KiB
// pages: 512 MiB). GEAR_JAX_HUGE_PAGES=0 skips it; =1 collapses every block.
void BackWithHugePages(int fd, uint8_t* base, uint64_t total) {
  const char* setting = std::getenv("GEAR_JAX_HUGE_PAGES");
  if (setting != nullptr && std::strcmp(setting, "0") == 0) return;
  const bool unbounded = setting != nullptr && std::strcmp(setting, "1") == 0;
  if (PmdPageBytes() != kHugePage) return;
  const uint64_t blocks_end = total / kHugePage * kHugePage;
  if (blocks_end == 0 || reinterpret_cast<uintptr_t>(base) % kHugePage != 0) return;
  struct statvfs fs{};
  if (fstatvfs(fd, &fs) != 0 || static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize < total)
    return;  // ENOSPC next
  constexpr uint64_t kChunk = uint64_t{64} << 20;
  const int64_t budget_ns =
      std::max<int64_t>(250'000'000, static_cast<int64_t>(static_cast<double>(total) / (1 << 30) * 5e8));
  const int64_t start = MonotonicNs();
  for (uint64_t chunk = 0; chunk < blocks_end; chunk += kChunk) {
    const uint64_t end = std::min(chunk + kChunk, blocks_end);
    for (uint64_t block = chunk; block < end; block += kHugePage) {
      if (posix_fallocate(fd, static_cast<off_t>(block), 4096) != 0) return;  // the reservation reports it
    }
    if (madvise(base + chunk, end - chunk, MADV_COLLAPSE) != 0 && errno == EINVAL) return;  // before 6.1
    if (!unbounded && MonotonicNs() - start > budget_ns) return;
  }
}

}  // namespace

std::shared_ptr<SharedTable> SharedTable::Create(const std::string& name, const TablePlan& plan,
                                                 const std::string& spec_json, uint64_t spec_hash, bool pin) {
  const uint64_t total = plan.total_bytes;
  const std::string path = ShmPath(name);
  int fd = shm_open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    if (errno == EEXIST)
      throw std::invalid_argument("a shared-memory object named '" + name +
                                  "' already exists; pick another name");
    throw std::runtime_error(Errno(("shm_open('" + path + "')").c_str()));
  }
  auto fail = [&](const std::string& message) {
    close(fd);
    shm_unlink(path.c_str());
    throw std::runtime_error(message);
  };
  if (ftruncate(fd, static_cast<off_t>(total)) != 0) fail(Errno("ftruncate"));
  void* base = MapTable(fd, total);
  if (base == MAP_FAILED) fail(Errno("mmap"));
  BackWithHugePages(fd, static_cast<uint8_t*>(base), total);
  // Reserve every page now, so that a table too large for /dev/shm fails here instead of with SIGBUS.
  if (int err = posix_fallocate(fd, 0, static_cast<off_t>(total)); err != 0) {
    munmap(base, total);
    if (err == ENOSPC) {
      close(fd);
      shm_unlink(path.c_str());
      throw OutOfSpaceError("cannot reserve " + std::to_string(total) +
                            " bytes of shared memory for table '" + name + "': " + std::strerror(err) +
                            " (free space in /dev/shm, or lower capacity)");
    }
    fail("cannot reserve " + std::to_string(total) + " bytes of shared memory for table '" + name +
         "': " + std::strerror(err));
  }
  close(fd);

  WriteHeader(static_cast<uint8_t*>(base), plan, total, spec_json, spec_hash, 0);
  auto memory = std::make_shared<TableMemory>(static_cast<uint8_t*>(base), total);
  try {
    memory->Pin(pin);
  } catch (...) {
    shm_unlink(path.c_str());  // the memory unmaps itself; nothing else holds the file yet
    throw;
  }
  return std::shared_ptr<SharedTable>(new SharedTable(name, std::move(memory), true));
}

std::shared_ptr<SharedTable> SharedTable::Reopen(const SharedTable& closed, const std::string& pool_name,
                                                 const std::string& name, const TablePlan& plan,
                                                 const std::string& spec_json, uint64_t spec_hash, bool pin) {
  std::shared_ptr<TableMemory> memory = closed.memory();
  if (memory->bytes() < plan.total_bytes)
    throw std::logic_error("reopening a table in memory too small for it");
  memory->Quiesce();  // no kernel of the closed table still reads or writes the memory
  uint8_t* base = memory->base();
  TableHeader* h = reinterpret_cast<TableHeader*>(base);
  // A new count first: an attach that read the old header notices the change and fails. Then, without
  // its magic, the memory is no table: an attach by the new name fails until the header is new.
  const uint64_t reuses = __atomic_add_fetch(&h->reuses, 1, __ATOMIC_SEQ_CST);
  std::memset(h->magic, 0, sizeof(h->magic));
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  // link + unlink instead of rename: fails, changing nothing, when `name` exists.
  if (link(ShmFile(pool_name).c_str(), ShmFile(name).c_str()) != 0) {
    const int err = errno;
    std::memcpy(h->magic, kTableMagic, sizeof(kTableMagic));
    if (err == EEXIST)
      throw std::invalid_argument("a shared-memory object named '" + name +
                                  "' already exists; pick another name");
    throw PoolEntryLost("link('" + ShmFile(pool_name) + "'): " + std::strerror(err));
  }
  unlink(ShmFile(pool_name).c_str());
  const TableHeader& old_layout = *h;
  const bool state_in_place =
      old_layout.state_offset == plan.layout.state_offset && old_layout.capacity == plan.layout.capacity;
  uint64_t* state = reinterpret_cast<uint64_t*>(base + plan.layout.state_offset);
  const uint64_t state_end =
      plan.layout.state_offset + static_cast<uint64_t>(plan.layout.capacity) * sizeof(uint64_t);
  if (state_in_place) {
    // Empty rows of the next even generation: no Sample of the closed table matches them.
    for (int64_t row = 0; row < plan.layout.capacity; ++row) {
      state[row] = MakeState((StateGeneration(state[row]) + 2u) & ~1u, 0.0f);
    }
  } else {
    std::memset(state, 0, state_end - plan.layout.state_offset);
  }
  const uint64_t status_end = plan.layout.fields[0].offset;
  std::memset(base + state_end, 0, status_end - state_end);
  WriteHeader(base, plan, memory->bytes(), spec_json, spec_hash, reuses);
  memory->Pin(pin);
  return std::shared_ptr<SharedTable>(new SharedTable(name, std::move(memory), true));
}

std::shared_ptr<SharedTable> SharedTable::Attach(const std::string& name, bool pin) {
  const std::string path = ShmPath(name);
  int fd = shm_open(path.c_str(), O_RDWR, 0);
  if (fd < 0) {
    if (errno == ENOENT)
      throw NotFoundError("no gear_jax table named '" + name +
                          "' exists on this host (it was never created, or its creator closed it)");
    throw std::runtime_error(Errno(("shm_open('" + path + "')").c_str()));
  }
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    close(fd);
    throw std::runtime_error(Errno("fstat"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < sizeof(TableHeader)) {
    close(fd);
    throw FormatError("'" + ShmFile(name) + "' is not a gear_jax table (too small)");
  }
  void* base = MapTable(fd, size);
  close(fd);
  if (base == MAP_FAILED) throw std::runtime_error(Errno("mmap"));
  auto memory = std::make_shared<TableMemory>(static_cast<uint8_t*>(base), size);  // unmaps on a throw
  TableHeader* h = static_cast<TableHeader*>(base);
  // The count of reuses before anything else: if the memory is given to another table while this
  // reads the header, the count differs at the end and the attach fails instead of mixing two tables.
  const uint64_t reuses = __atomic_load_n(&h->reuses, __ATOMIC_SEQ_CST);
  char magic[sizeof(kTableMagic)];
  for (size_t i = 0; i < sizeof(magic); ++i) magic[i] = __atomic_load_n(&h->magic[i], __ATOMIC_ACQUIRE);
  std::string problem;
  if (std::memcmp(magic, kTableMagic, sizeof(kTableMagic)) != 0) {
    problem = "is not a gear_jax table (no gear_jax header)";
  } else if (h->format_version != kFormatVersion) {
    problem = "has table format " + std::to_string(h->format_version) + ", this gear_jax reads format " +
              std::to_string(kFormatVersion);
  } else if (h->total_bytes != size) {
    problem = "has a damaged header: it gives the table " + std::to_string(h->total_bytes) +
              " bytes, the file holds " + std::to_string(size);
  } else if (h->spec_json_bytes >= kSpecJsonCapacity) {
    problem = "has a damaged header: its spec JSON length " + std::to_string(h->spec_json_bytes) +
              " is past the " + std::to_string(kSpecJsonCapacity) + " bytes it has room for";
  } else if (!LayoutFits(*h, size)) {
    problem = "has a damaged header: its layout (capacity " + std::to_string(h->capacity) + ", max_steps " +
              std::to_string(h->max_steps) + ", " + std::to_string(h->num_fields) +
              " fields) has sizes out of range or columns outside the file";
  } else if (std::string layout = LayoutProblem(*h, size); !layout.empty()) {
    problem = "has a damaged header: " + layout;
  }
  if (!problem.empty()) throw FormatError("'" + ShmFile(name) + "' " + problem);
  // A process of another PID namespace than the creator's: from now on no process may judge a pid of
  // this table by kill(pid, 0). Set before this process signs in or writes (see PidMayBeAlive).
  if (Load(&h->creator_pid_namespace) != PidNamespace()) Store(&h->mixed_pid_namespaces, 1u);
  const int slot = SignIn(h, CurrentPid());
  memory->set_attach_slot(slot);
  // Signed in first, then the creator's mark: a creator closing now sees the slot, or this sees the mark.
  if (__atomic_load_n(&h->closed, __ATOMIC_SEQ_CST) != 0 ||
      __atomic_load_n(&h->reuses, __ATOMIC_SEQ_CST) != reuses ||
      __atomic_load_n(&h->magic[0], __ATOMIC_ACQUIRE) != kTableMagic[0]) {
    throw NotFoundError("gear_jax table '" + name + "' was closed by its creator");
  }
  // Signed in first, then the name: the sweep of dead tables (dead_tables.cc) renames a table away
  // before its last look at the attach slots, so it sees this slot, or this sees the name gone.
  struct stat named{};
  if (stat(ShmFile(name).c_str(), &named) != 0 || named.st_ino != st.st_ino || named.st_dev != st.st_dev) {
    throw NotFoundError("gear_jax table '" + name +
                        "' was removed: its creator and every process using it were gone");
  }
  memory->Pin(pin);
  return std::shared_ptr<SharedTable>(new SharedTable(name, std::move(memory), false));
}

std::string SharedTable::spec_json() const {
  return std::string(header()->spec_json, header()->spec_json_bytes);
}

void SharedTable::MarkClosed() { __atomic_store_n(&header()->closed, 1u, __ATOMIC_SEQ_CST); }

bool SharedTable::AttachedElsewhere() const {
  const TableHeader* h = header();
  for (int slot = 0; slot < kMaxAttachments; ++slot) {
    if (PidMayBeAlive(h, __atomic_load_n(&h->attached_pids[slot], __ATOMIC_SEQ_CST))) return true;
  }
  // The mark after the slots ("Forks"): a process that forked and has exited since was signed in
  // before, and marked the table before its fork.
  return __atomic_load_n(&h->never_reuse, __ATOMIC_SEQ_CST) != 0;
}

bool SharedTable::RenameForPool(const std::string& new_name) {
  // link + unlink: never replaces an object of that name.
  if (unlinked_ || link(ShmFile(name_).c_str(), ShmFile(new_name).c_str()) != 0) return false;
  unlink(ShmFile(name_).c_str());
  name_ = new_name;
  return true;
}

void SharedTable::Unlink() {
  if (!unlinked_) shm_unlink(ShmPath(name_).c_str());
  unlinked_ = true;
}

// Ownership and counters: what a process killed at any instant leaves behind.
//
// Ownership is one word per row, the owner word (the writer_pid column): 0, or the pid of the process
// that owns the row. A writer takes it by compare-and-swap (from 0, or from the pid of a process that is
// gone) BEFORE it changes the row's state, and gives it back (stores 0) only AFTER the CAS that publishes
// the row:
//   Claim:   owner CAS 0/dead -> me | state CAS g -> g + 1 (g + 2 from a dead holder's odd g) | counters
//   Commit:  insert_seq, length | state CAS -> g + 1, priority | counters | owner = 0 (release)
//   Abandon: length = 0 | state CAS -> g + 1, priority 0 | owner = 0 (release)
// So a row is odd only while its owner word names the process holding it, and wherever a process dies,
// each row it touched is either unchanged (owner word not taken) or owned by a pid that is gone, which
// the next writer to reach the row takes over whatever its generation (odd: abandoned mid-write; even:
// published, the owner word not yet given back). Rows owned by a live process are skipped. Besides
// the owner, only priority updates change a state word: the priority of an even row, by a CAS that keeps
// its generation; a claim retries its state CAS when one lands in between.
//
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
// this scheme). The priority updates of the CUDA handlers (host callback and device atomics) open no
// window: a learner killed between a priority's CAS and its counter update leaves selectable off by one,
// and a recount overlapping such an update can be off by one (the update's two instructions must
// straddle the scan of its row and step 4). A pid reused by a new process makes a dead owner look alive
// until that process exits. The CPU priority handler opens a window. Where kill(pid, 0) cannot answer
// for the table's pids (a process of another PID namespace attached, or this one is in another: see
// PidMayBeAlive), every recorded pid counts as alive: rows held by a killed writer stay held, and a
// window it left open keeps the counters from being recounted, for as long as the table exists.
namespace {

// Closes a counter window when the scope ends, a throw included (a kill skips it: that is the point).
struct WindowScope {
  SharedTable* table;
  int slot;
  ~WindowScope() { table->CloseWindow(slot); }
};

}  // namespace

int64_t SharedTable::Claim() {
  bool reclaimed = false;
  int32_t row = 0;
  uint64_t held = 0;
  {
    WindowScope window{this, OpenWindow()};
    CountedOut out;
    ClaimRows(1, &row, &held, &reclaimed, &out);
    // The row stays held after the window closes: count it out now.
    if (out.selectable != 0) Add<int64_t>(&header()->selectable, -out.selectable);
    if (out.size != 0) Add<int64_t>(&header()->size, -out.size);
  }
  AfterWrites(reclaimed);
  return row;
}

// Inserts. A batch is claimed, copied and published a chunk (up to kInsertChunk rows) at a time, so that
// the shared words change once per chunk rather than once per row, and the copies of its rows run back
// to back, with no atomic instruction between them to wait for their stores:
//   claim:   next_seq += n (one reservation; more when rows are held by others) | per row: owner CAS,
//            state CAS | change counters | lengths = 0
//   copy:    the field bytes of every row
//   publish: commit_seq += n | per row: insert_seq, length, state CAS | change counters | size and
//            selectable += the rows published - the rows the claims counted out | per row: owner = 0
//            (release)
// Every row goes through the same states as one claimed and committed alone, in the same order, inside
// the one counter window of the batch; a writer killed at any instant holds its chunk's rows under a
// pid that is gone (reclaimed by the next writer that reaches them) and leaves its window open (the
// counters are recounted), as it would with one row. Between claim and publish, size and selectable
// still count the chunk's rows that were counted before (they are exact again when the window closes,
// which is all a recount needs). The change counters of a group are raised once
// per chunk and phase, after every state change of the phase (level 0, then 1, then 2).
namespace {

constexpr int64_t kInsertChunk = 256;

}  // namespace

bool SharedTable::TryClaimRow(int64_t row, uint64_t* before, uint64_t* claimed, bool* reclaimed) {
  TableHeader* h = header();
  int32_t* owner = owners();
  int32_t previous = Load(&owner[row]);
  if (previous != 0 && PidMayBeAlive(h, previous))
    return false;                                                // held, or being published, by a live writer
  if (!Cas(&owner[row], &previous, CurrentPid())) return false;  // another writer took it first
  uint64_t state = Load(&view_.state[row]);
  uint64_t next = 0;
  do {  // fails only when a priority update lands in between
    const uint32_t generation = StateGeneration(state);
    next = MakeState(generation + ((generation & 1u) ? 2u : 1u), 0.0f);
  } while (!Cas(&view_.state[row], &state, next));
  if (previous != 0) *reclaimed = true;
  *before = state;
  *claimed = next;
  return true;
}

int64_t SharedTable::ClaimRows(int64_t want, int32_t* rows, uint64_t* held, bool* reclaimed,
                               CountedOut* counted) {
  TableHeader* h = header();
  const int64_t capacity = view_.capacity;
  const uint64_t limit = 2 * static_cast<uint64_t>(capacity) + 64;
  int64_t got = 0;
  uint64_t tried = 0;
  while (got < want) {
    // A lap of the ring found rows held by others: publish what this writer holds rather than wait.
    if (got > 0 && tried >= static_cast<uint64_t>(capacity)) break;
    if (tried >= limit) {
      throw std::runtime_error("every row of table '" + name_ +
                               "' is being written; raise capacity or end episodes sooner");
    }
    const uint64_t ask = static_cast<uint64_t>(want - got);
    const uint64_t first = FetchAdd<uint64_t>(&h->next_seq, ask);
    tried += ask;
    for (uint64_t k = 0; k < ask; ++k) {
      const int64_t row = static_cast<int64_t>((first + k) % static_cast<uint64_t>(capacity));
      uint64_t before = 0;
      if (!TryClaimRow(row, &before, &held[got], reclaimed)) continue;
      if ((StateGeneration(before) & 1u) == 0) {  // the row was counted: the caller counts it out
        counted->selectable += StatePriority(before) > 0.0f;
        counted->size += LoadRelaxed(&view_.length[row]) > 0;
      }
      rows[got++] = static_cast<int32_t>(row);
    }
  }
  NoteRowsChanged(view_, rows, got);
  FenceRelease();  // the odd generations become visible before any data this writer stores
  for (int64_t i = 0; i < got; ++i) StoreRelaxed(&view_.length[rows[i]], 0);
  return got;
}

void SharedTable::PublishRows(int64_t n, const int32_t* rows, const uint64_t* held, const int32_t* lengths,
                              int32_t length, const float* priorities, CountedOut counted,
                              InsertReservation* reserved) {
  TableHeader* h = header();
  const uint64_t first_seq = FetchAdd<uint64_t>(&h->commit_seq, static_cast<uint64_t>(n)) + 1;
  int32_t published[kInsertChunk];
  int64_t done = 0, selectable = 0, lost = -1;
  float max_priority = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = rows[i];
    const float priority = priorities != nullptr ? priorities[i] : 1.0f;
    StoreRelaxed(&view_.insert_seq[row], first_seq + static_cast<uint64_t>(i));
    StoreRelaxed(&view_.length[row], lengths != nullptr ? lengths[i] : length);
    // Publish (release: every byte of the row before the even generation), only if the row is still the
    // one this writer claimed.
    uint64_t expected = held[i];
    if (!Cas(&view_.state[row], &expected, MakeState(StateGeneration(held[i]) + 1, priority))) {
      if (lost < 0) lost = row;
      continue;
    }
    published[done++] = static_cast<int32_t>(row);
    selectable += priority > 0.0f;
    max_priority = std::max(max_priority, priority);
  }
  NoteRowsChanged(view_, published, done);
  RaiseMaxPriority(view_, max_priority);
  // The rows' claims' counts and the publications' in one add each (none when they cancel out, as
  // they do when a full ring is overwritten).
  if (done != counted.size) Add<int64_t>(&h->size, done - counted.size);
  if (selectable != counted.selectable) Add<int64_t>(&h->selectable, selectable - counted.selectable);
  if (reserved != nullptr) {
    reserved->Use(done);
  } else if (rate_limiter_.enabled()) {
    rate_limiter_.CountInserts(done);
  }
  // Given back only now (release: a claimer that reads 0 sees the publication): until here, a death
  // leaves the row to a reclaimer.
  for (int64_t i = 0; i < done; ++i) __atomic_store_n(&owners()[published[i]], 0, __ATOMIC_RELEASE);
  if (lost >= 0) throw std::runtime_error(NotHeld(lost));
}

void SharedTable::Populate(const uint8_t* from, const uint8_t* to) {
  const uint64_t first = static_cast<uint64_t>(from - base_) >> kPopulateShift;
  const uint64_t last = static_cast<uint64_t>(to - 1 - base_) >> kPopulateShift;
  for (uint64_t block = first; block <= last; ++block) {
    std::atomic<uint64_t>& word = populated_[block >> 6];
    const uint64_t bit = uint64_t{1} << (block & 63);
    if (word.load(std::memory_order_relaxed) & bit) continue;
    // A read every 64 KiB: the kernel maps the pages around a read fault (the 64 KiB around it, by
    // default) in one go, and maps shared memory writable, so the copies that follow take no fault
    // (pages it left out fault one by one, as they would have).
    const volatile uint8_t* page = base_ + (block << kPopulateShift);
    const volatile uint8_t* end = base_ + std::min<uint64_t>((block + 1) << kPopulateShift, total_bytes());
    uint8_t sink = 0;
    for (; page < end; page += 65536) sink ^= *page;
    (void)sink;
    word.fetch_or(bit, std::memory_order_relaxed);
  }
}

void SharedTable::AfterWrites(bool reclaimed) {
  TableHeader* h = header();
  // A reclaimed row means a writer died, perhaps inside a window: look now rather than in 10 ms.
  if (reclaimed) SweepWriterSlots();
  if (Load(&h->counts_dirty) != 0) CheckCounts(false);
}

void SharedTable::CheckRowInRange(int64_t row) const {
  if (row < 0 || row >= view_.capacity)
    throw std::out_of_range("row " + std::to_string(row) + " is outside the table");
}

uint64_t SharedTable::CheckOwned(int64_t row) const {
  CheckRowInRange(row);
  const uint64_t state = LoadAcquire(&view_.state[row]);
  if ((StateGeneration(state) & 1u) == 0 || LoadRelaxed(&owners()[row]) != CurrentPid()) {
    throw std::runtime_error(NotHeld(row));
  }
  return state;
}

std::string SharedTable::NotHeld(int64_t row) const {
  return "row " + std::to_string(row) + " of table '" + name_ +
         "' is not held by this writer (it was reclaimed or already committed)";
}

void SharedTable::Commit(int64_t row, int32_t length, float priority, InsertReservation* reserved) {
  if (length < 1 || length > view_.max_steps) {
    throw std::invalid_argument("length " + std::to_string(length) +
                                " is outside [1, max_steps=" + std::to_string(view_.max_steps) + "]");
  }
  if (!std::isfinite(priority) || priority < 0.0f) {
    throw std::invalid_argument("priority " + std::to_string(priority) + " must be finite and >= 0");
  }
  const uint64_t held = CheckOwned(row);
  {
    WindowScope window{this, OpenWindow()};
    const int32_t claimed = static_cast<int32_t>(row);
    PublishRows(1, &claimed, &held, nullptr, length, &priority, CountedOut{}, reserved);
  }
  AfterWrites(false);
}

void SharedTable::Abandon(int64_t row) {
  uint64_t held = CheckOwned(row);
  // No window: a held row counts in neither counter, nor does an empty row of priority 0.
  StoreRelaxed(&view_.length[row], 0);
  if (!Cas(&view_.state[row], &held, MakeState(StateGeneration(held) + 1, 0.0f))) {
    throw std::runtime_error(NotHeld(row));
  }
  NoteRowChanged(view_, row);
  __atomic_store_n(&owners()[row], 0, __ATOMIC_RELEASE);
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
    if (free && Cas(&h->writer_slots[s], &seen, static_cast<uint64_t>(static_cast<uint32_t>(me)))) slot = s;
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
    if (SlotWindows(seen) == 0) continue;
    if (PidMayBeAlive(h, SlotPid(seen))) {
      live = true;
      continue;
    }
    // The mark first, then the slot may go: from now on the mark is the evidence.
    Add<uint64_t>(&h->counts_dirty, 1);
    Cas(&h->writer_slots[s], &seen, uint64_t{0});
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

void SharedTable::CopyRows(const std::vector<const uint8_t*>& field_data, int64_t first, int64_t n,
                           const int32_t* rows, int32_t steps, const int32_t* lengths) {
  for (int32_t f = 0; f < view_.num_fields; ++f) {
    const FieldView& field = view_.fields[f];
    const int64_t source_stride = steps * field.step_bytes;
    // Rows that follow each other in the ring follow each other in the column when a row is exactly
    // `steps` steps long: a run of them, each copied whole, is one copy.
    const bool runs = field.row_stride == source_stride;
    const uint8_t* source = field_data[f] + first * source_stride;
    for (int64_t i = 0; i < n;) {
      const int64_t used = lengths != nullptr ? lengths[first + i] : steps;
      int64_t j = i + 1;
      if (runs && used == steps) {
        while (j < n && rows[j] == rows[j - 1] + 1 && (lengths == nullptr || lengths[first + j] == steps))
          ++j;
      }
      uint8_t* target = field.data + rows[i] * field.row_stride;
      const size_t bytes = j - i > 1 ? static_cast<size_t>((j - i) * source_stride)
                                     : static_cast<size_t>(used * field.step_bytes);
      Populate(target, target + bytes);
      std::memcpy(target, source + i * source_stride, bytes);
      i = j;
    }
  }
}

void SharedTable::Insert(const std::vector<const uint8_t*>& field_data, int64_t batch, int32_t steps,
                         const int32_t* lengths, const float* priorities, int32_t* rows,
                         InsertReservation* reserved) {
  for (int64_t b = 0; b < batch; ++b) {  // validate everything before claiming anything
    if (lengths != nullptr && (lengths[b] < 1 || lengths[b] > steps)) {
      throw std::invalid_argument("lengths[" + std::to_string(b) + "] = " + std::to_string(lengths[b]) +
                                  " is outside [1, " + std::to_string(steps) + "]");
    }
    if (priorities != nullptr && (!std::isfinite(priorities[b]) || priorities[b] < 0.0f)) {
      throw std::invalid_argument("priorities[" + std::to_string(b) + "] = " + std::to_string(priorities[b]) +
                                  " must be finite and >= 0");
    }
  }
  // A chunk holds at most an eighth of the ring, so that writers filling a small table together still
  // find free rows.
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(kInsertChunk, view_.capacity / 8));
  uint64_t held[kInsertChunk];
  bool reclaimed = false;
  {
    // One counter window for the batch: a recount cannot succeed while this process writes anyway.
    WindowScope window{this, OpenWindow()};
    for (int64_t b = 0; b < batch;) {
      CountedOut counted;
      const int64_t n = ClaimRows(std::min(chunk, batch - b), rows + b, held, &reclaimed, &counted);
      CopyRows(field_data, b, n, rows + b, steps, lengths);
      PublishRows(n, rows + b, held, lengths != nullptr ? lengths + b : nullptr, steps,
                  priorities != nullptr ? priorities + b : nullptr, counted, reserved);
      b += n;
    }
  }
  AfterWrites(reclaimed);
}

}  // namespace gear
