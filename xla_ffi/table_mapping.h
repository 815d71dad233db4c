// A table's memory: the file in /dev/shm that holds it, its mapping into this process (aligned for 2 MiB
// pages, which new tables get where the kernel allows: table_mapping.cc, BackWithHugePages), and its CUDA
// registration when pinned. Unregistered and unmapped when the last holder lets go (open tables, calls
// running on them, the pool).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace gear {

class CudaPinning;  // cuda_runtime.h; exists in CUDA builds only
// Deletes a CudaPinning (never called in a CPU-only build, where none is made).
struct CudaPinningDeleter {
  void operator()(CudaPinning* pinning) const;
};

// Where glibc keeps the object shm_open("/name") opens; renaming it there renames the object.
std::string ShmFile(const std::string& name);

// Creates the object `name` (mode 0600) of `total` bytes and maps it: 2 MiB pages where it can, then
// every page reserved, so that a table too large for /dev/shm fails here instead of with SIGBUS later.
// Throws std::invalid_argument when `name` exists, OutOfSpaceError when /dev/shm cannot hold it and
// std::runtime_error for other failures; the object is removed on a throw.
uint8_t* CreateTableFile(const std::string& name, uint64_t total);

// An existing object, mapped.
struct MappedFile {
  uint8_t* base;
  size_t size;
  dev_t device;  // the file's identity, to tell whether the name still leads to it (StillNamed)
  ino_t inode;
};
// Maps the object `name` whole. Throws NotFoundError when there is none, FormatError when it is too
// small to hold a table header, std::runtime_error for other failures.
MappedFile MapTableFile(const std::string& name);
// Whether the name `name` still leads to the file `file` maps.
bool StillNamed(const std::string& name, const MappedFile& file);
// Removes the name `name` (the memory lives until the last mapping goes).
void RemoveTableFile(const std::string& name);

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
  // A forked child signs in to a slot of its own for every mapping it inherits (table_processes.cc,
  // "Forks").
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

}  // namespace gear
