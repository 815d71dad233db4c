#include "xla_ffi/table_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "xla_ffi/clock.h"
#include "xla_ffi/native_errors.h"
#include "xla_ffi/table_layout.h"
#include "xla_ffi/table_processes.h"
#if GEAR_JAX_WITH_CUDA
#include "xla_ffi/cuda_runtime.h"
#endif

namespace gear {
namespace {

constexpr uint64_t kHugePage = uint64_t{1} << 21;  // the page size BackWithHugePages makes
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1
#endif

uint64_t RoundUp(uint64_t value, uint64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

std::string ShmPath(const std::string& name) { return "/" + name; }

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

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

std::string ShmFile(const std::string& name) { return "/dev/shm/" + name; }

uint8_t* CreateTableFile(const std::string& name, uint64_t total) {
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
      throw OutOfSpaceError("Table.create: cannot reserve " + std::to_string(total) +
                            " bytes of shared memory for table '" + name + "': " + std::strerror(err) +
                            " (free space in /dev/shm, or lower capacity)");
    }
    fail("cannot reserve " + std::to_string(total) + " bytes of shared memory for table '" + name +
         "': " + std::strerror(err));
  }
  close(fd);
  return static_cast<uint8_t*>(base);
}

MappedFile MapTableFile(const std::string& name) {
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
  return MappedFile{static_cast<uint8_t*>(base), size, st.st_dev, st.st_ino};
}

bool StillNamed(const std::string& name, const MappedFile& file) {
  struct stat named{};
  return stat(ShmFile(name).c_str(), &named) == 0 && named.st_ino == file.inode &&
         named.st_dev == file.device;
}

void RemoveTableFile(const std::string& name) { shm_unlink(ShmPath(name).c_str()); }

void CudaPinningDeleter::operator()(CudaPinning* pinning) const {
#if GEAR_JAX_WITH_CUDA
  delete pinning;
#else
  (void)pinning;  // no CudaPinning exists in a CPU-only build
#endif
}

TableMemory::TableMemory(uint8_t* base, size_t bytes)
    : base_(base), bytes_(bytes), mapped_by_pid_(CurrentPid()) {
  TrackMapping(this);
}

TableMemory::~TableMemory() {
#if GEAR_JAX_WITH_CUDA
  if (mapped_by_pid_ != CurrentPid()) {
    cuda_.release();  // a forked child must not call CUDA: leave the registration to the parent
  }
  cuda_.reset();  // waits for this process's kernels, unregisters the memory before it is unmapped
#endif
  // After the kernels: until now, this open may still have touched the memory.
  UntrackMapping(this);
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

}  // namespace gear
