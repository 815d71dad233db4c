// A gear_jax table in a named POSIX shared-memory mapping: header, per-row status, one column per field.
//
// Any process on the host can attach by name and write rows; writers allocate rows without locks (a
// shared FIFO cursor plus a compare-and-swap claim of the row's generation), so the ring overwrites the
// oldest rows when full. A row whose writer died mid-write (odd generation, dead writer pid) is
// reclaimed by the next writer that reaches it.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/table_view.h"

namespace gear {

#if GEAR_JAX_WITH_CUDA
class CudaPinning;
#endif

inline constexpr char kTableMagic[8] = {'G', 'E', 'A', 'R', 'J', 'A', 'X', '\0'};
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr size_t kSpecJsonCapacity = 16384;

struct FieldLayout {
  uint64_t offset;      // from the start of the mapping; 4096-byte aligned
  int64_t row_stride;   // bytes between rows
  int64_t step_bytes;   // bytes of one step
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
  FieldLayout fields[kMaxFields];
  alignas(64) uint64_t next_seq;   // allocation cursor (row = seq % capacity)
  alignas(64) uint64_t commit_seq; // last insert_seq handed out
  alignas(64) int64_t size;        // rows holding a committed trajectory
  alignas(64) int64_t selectable;  // rows with an even generation and priority > 0
  alignas(64) char spec_json[kSpecJsonCapacity];
};

// Errors the Python module maps to exception types.
struct NotFoundError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Bytes between rows of a field: 16-byte multiples so that vector loads stay aligned, 128-byte
// multiples for rows of 1 KiB and more so that GPU reads come in whole cache lines.
int64_t RowStride(int64_t row_bytes);

class SharedTable {
 public:
  // Creates the mapping `/name` (mode 0600, fails if it exists) and its header. With `pin`, in a CUDA
  // build on a process that sees a GPU, the memory is also registered with CUDA (pinned and mapped).
  static std::shared_ptr<SharedTable> Create(const std::string& name, int64_t capacity,
                                             int32_t max_steps, const std::vector<int64_t>& step_bytes,
                                             const std::string& spec_json, uint64_t spec_hash, bool pin);
  // Maps an existing table; refuses mappings that are not gear_jax tables of this format.
  static std::shared_ptr<SharedTable> Attach(const std::string& name, bool pin);

  ~SharedTable();
  SharedTable(const SharedTable&) = delete;
  SharedTable& operator=(const SharedTable&) = delete;

  const std::string& name() const { return name_; }
  bool creator() const { return creator_; }
  uint8_t* base() const { return base_; }
  size_t total_bytes() const { return total_bytes_; }
  TableHeader* header() const { return reinterpret_cast<TableHeader*>(base_); }
  const TableView& view() const { return view_; }
  std::string spec_json() const;
  // Whether the memory is registered with CUDA (pinned and mapped into the GPUs' address space).
  bool pinned() const;
#if GEAR_JAX_WITH_CUDA
  CudaPinning* cuda() const { return cuda_.get(); }
#endif

  // Writers. Claim returns a row now owned by this process (odd generation, priority 0, length 0).
  int64_t Claim();
  void Commit(int64_t row, int32_t length, float priority);
  void Abandon(int64_t row);
  // Claims, copies and commits `batch` rows. field_data[f] points at [batch, steps, step_bytes[f]].
  std::vector<int32_t> Insert(const std::vector<const uint8_t*>& field_data, int64_t batch,
                              int32_t steps, const int32_t* lengths, const float* priorities);

  // Removes the name (the creator does this on close); the memory lives until the last user unmaps.
  void Unlink();

 private:
  SharedTable(std::string name, uint8_t* base, size_t total_bytes, bool creator, bool pin);
  // The state of a row this process holds (odd generation, this pid); throws otherwise.
  uint64_t CheckOwned(int64_t row) const;
  std::string NotHeld(int64_t row) const;

  std::string name_;
  uint8_t* base_;
  size_t total_bytes_;
  bool creator_;
  bool unlinked_ = false;
  TableView view_;
#if GEAR_JAX_WITH_CUDA
  std::unique_ptr<CudaPinning> cuda_;  // always set; unpinned where the process sees no GPU
#endif
};

}  // namespace gear
