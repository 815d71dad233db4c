#include "xla_ffi/shared_table.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "kernels/atomics.h"
#if GEAR_JAX_WITH_CUDA
#include "xla_ffi/cuda_runtime.h"
#endif

namespace gear {
namespace {

constexpr uint64_t kColumnAlign = 4096;

uint64_t RoundUp(uint64_t value, uint64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

std::string ShmPath(const std::string& name) { return "/" + name; }

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// This process's pid, without a system call per row; reset in a forked child.
std::atomic<int32_t> cached_pid{0};
// Forks this process made (counted in the parent): memory mapped before a fork may be written by the child.
std::atomic<uint64_t> forks{0};

void CountForks() {
  static const bool counting =
      pthread_atfork(nullptr, [] { forks.fetch_add(1, std::memory_order_relaxed); }, nullptr) == 0;
  (void)counting;
}

// A claimed row whose pid is not yet recorded (0) counts as written by a live process.
bool WriterAlive(int32_t pid) { return pid <= 0 || ProcessAlive(pid); }

// Signs this open in to a free slot (or one left by a dead process); -1 when every slot is taken.
int SignIn(TableHeader* h) {
  const int32_t me = CurrentPid();
  for (int slot = 0; slot < kMaxAttachments; ++slot) {
    int32_t seen = __atomic_load_n(&h->attached_pids[slot], __ATOMIC_RELAXED);
    if (seen != 0 && ProcessAlive(seen)) continue;
    if (__atomic_compare_exchange_n(&h->attached_pids[slot], &seen, me, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_RELAXED)) {
      return slot;
    }
  }
  __atomic_store_n(&h->attachments_overflowed, 1u, __ATOMIC_SEQ_CST);
  return -1;
}

void SignOut(TableHeader* h, int slot) {
  if (slot < 0) return;
  int32_t me = CurrentPid();
  __atomic_compare_exchange_n(&h->attached_pids[slot], &me, 0, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

// Fills a new header into `base` from `plan`, the magic last: a header with magic is complete.
// `reuses` counts the tables the memory held before.
void WriteHeader(uint8_t* base, const TablePlan& plan, uint64_t total_bytes, const std::string& spec_json,
                 uint64_t spec_hash, uint64_t reuses) {
  TableHeader* h = reinterpret_cast<TableHeader*>(base);
  std::memcpy(h, &plan.layout, sizeof(TableHeader));  // the plan's magic, counters and slots are zero
  __atomic_store_n(&h->reuses, reuses, __ATOMIC_RELAXED);
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
      !inside(h.times_sampled_offset, 4) || !inside(h.writer_pid_offset, 4)) {
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

}  // namespace

bool ProcessAlive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

std::string ShmFile(const std::string& name) { return "/dev/shm/" + name; }

int32_t CurrentPid() {
  int32_t pid = cached_pid.load(std::memory_order_relaxed);
  if (pid == 0) {
    static const bool reset_after_fork =
        pthread_atfork(nullptr, nullptr, [] { cached_pid.store(0, std::memory_order_relaxed); }) == 0;
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
  CountForks();
  forks_when_mapped_ = forks.load(std::memory_order_relaxed);
}

TableMemory::~TableMemory() {
#if GEAR_JAX_WITH_CUDA
  if (mapped_by_pid_ != CurrentPid()) {
    cuda_.release();  // a forked child must not call CUDA: leave the registration to the parent
  }
  cuda_.reset();  // waits for this process's kernels, unregisters the memory before it is unmapped
#endif
  // After the kernels: until now, this open may still have touched the memory.
  SignOut(reinterpret_cast<TableHeader*>(base_), attach_slot_);
  munmap(base_, bytes_);
}

bool TableMemory::ForkedSince() const { return forks.load(std::memory_order_relaxed) != forks_when_mapped_; }

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

int64_t RowStride(int64_t row_bytes) {
  return static_cast<int64_t>(RoundUp(row_bytes, row_bytes >= 1024 ? 128 : 16));
}

SharedTable::SharedTable(std::string name, std::shared_ptr<TableMemory> memory, bool creator)
    : name_(std::move(name)), memory_(std::move(memory)), base_(memory_->base()), creator_(creator) {
  TableHeader* h = header();
  view_.capacity = h->capacity;
  view_.max_steps = h->max_steps;
  view_.num_fields = h->num_fields;
  view_.state = reinterpret_cast<uint64_t*>(base_ + h->state_offset);
  view_.length = reinterpret_cast<int32_t*>(base_ + h->length_offset);
  view_.insert_seq = reinterpret_cast<uint64_t*>(base_ + h->insert_seq_offset);
  view_.times_sampled = reinterpret_cast<uint32_t*>(base_ + h->times_sampled_offset);
  view_.next_seq = &h->next_seq;
  view_.selectable = &h->selectable;
  for (int f = 0; f < h->num_fields; ++f) {
    view_.fields[f] =
        FieldView{base_ + h->fields[f].offset, h->fields[f].row_stride, h->fields[f].step_bytes};
  }
}

SharedTable::~SharedTable() = default;

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
  // Reserve every page now, so that a table too large for /dev/shm fails here instead of with SIGBUS.
  if (int err = posix_fallocate(fd, 0, static_cast<off_t>(total)); err != 0) {
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
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) fail(Errno("mmap"));
  close(fd);

  WriteHeader(static_cast<uint8_t*>(base), plan, total, spec_json, spec_hash, 0);
  auto memory = std::make_shared<TableMemory>(static_cast<uint8_t*>(base), total);
  memory->Pin(pin);
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
    throw FormatError("shared-memory object '" + name + "' is not a gear_jax table (too small)");
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
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
  } else if (h->total_bytes != size || h->spec_json_bytes >= kSpecJsonCapacity || !LayoutFits(*h, size)) {
    problem = "has a damaged header";
  }
  if (!problem.empty()) throw FormatError("shared-memory object '" + name + "' " + problem);
  const int slot = SignIn(h);
  memory->set_attach_slot(slot);
  // Signed in first, then the creator's mark: a creator closing now sees the slot, or this sees the mark.
  if (__atomic_load_n(&h->closed, __ATOMIC_SEQ_CST) != 0 ||
      __atomic_load_n(&h->reuses, __ATOMIC_SEQ_CST) != reuses ||
      __atomic_load_n(&h->magic[0], __ATOMIC_ACQUIRE) != kTableMagic[0]) {
    throw NotFoundError("gear_jax table '" + name + "' was closed by its creator");
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
  if (__atomic_load_n(&h->attachments_overflowed, __ATOMIC_SEQ_CST) != 0) return true;
  for (int slot = 0; slot < kMaxAttachments; ++slot) {
    if (ProcessAlive(__atomic_load_n(&h->attached_pids[slot], __ATOMIC_SEQ_CST))) return true;
  }
  return false;
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

int64_t SharedTable::Claim() {
  TableHeader* h = header();
  int32_t* writer_pid = reinterpret_cast<int32_t*>(base_ + h->writer_pid_offset);
  const int64_t capacity = view_.capacity;
  for (int64_t attempt = 0; attempt < 2 * capacity + 64; ++attempt) {
    const uint64_t seq = FetchAdd<uint64_t>(&h->next_seq, 1);
    const int64_t row = static_cast<int64_t>(seq % static_cast<uint64_t>(capacity));
    uint64_t state = LoadAcquire(&view_.state[row]);
    uint32_t generation = StateGeneration(state);
    if (generation & 1u) {
      // Being written. Take it over only if its writer process is gone: first its pid (so that one
      // reclaimer wins), then its generation.
      int32_t dead = LoadRelaxed(&writer_pid[row]);
      if (WriterAlive(dead)) continue;
      if (!CompareExchange(&writer_pid[row], &dead, CurrentPid())) continue;
      if (!CompareExchange(&view_.state[row], &state, MakeState(generation + 2, 0.0f))) continue;
    } else {
      if (!CompareExchange(&view_.state[row], &state, MakeState(generation + 1, 0.0f))) continue;
      if (StatePriority(state) > 0.0f) FetchAdd<int64_t>(&h->selectable, -1);
      if (LoadRelaxed(&view_.length[row]) > 0) FetchAdd<int64_t>(&h->size, -1);
      StoreRelaxed(&writer_pid[row], CurrentPid());
    }
    FenceRelease();  // the odd generation becomes visible before any data this writer stores
    StoreRelaxed(&view_.length[row], 0);
    return row;
  }
  throw std::runtime_error("every row of table '" + name_ +
                           "' is being written; raise capacity or end episodes sooner");
}

void SharedTable::CheckRowInRange(int64_t row) const {
  if (row < 0 || row >= view_.capacity)
    throw std::out_of_range("row " + std::to_string(row) + " is outside the table");
}

uint64_t SharedTable::CheckOwned(int64_t row) const {
  CheckRowInRange(row);
  const int32_t* writer_pid = reinterpret_cast<const int32_t*>(base_ + header()->writer_pid_offset);
  const uint64_t state = LoadAcquire(&view_.state[row]);
  if ((StateGeneration(state) & 1u) == 0 || LoadRelaxed(&writer_pid[row]) != CurrentPid()) {
    throw std::runtime_error(NotHeld(row));
  }
  return state;
}

std::string SharedTable::NotHeld(int64_t row) const {
  return "row " + std::to_string(row) + " of table '" + name_ +
         "' is not held by this writer (it was reclaimed or already committed)";
}

void SharedTable::Commit(int64_t row, int32_t length, float priority) {
  if (length < 1 || length > view_.max_steps) {
    throw std::invalid_argument("length " + std::to_string(length) +
                                " is outside [1, max_steps=" + std::to_string(view_.max_steps) + "]");
  }
  if (!std::isfinite(priority) || priority < 0.0f) {
    throw std::invalid_argument("priority " + std::to_string(priority) + " must be finite and >= 0");
  }
  uint64_t held = CheckOwned(row);
  TableHeader* h = header();
  int32_t* writer_pid = reinterpret_cast<int32_t*>(base_ + h->writer_pid_offset);
  StoreRelaxed(&view_.insert_seq[row], FetchAdd<uint64_t>(&h->commit_seq, 1) + 1);
  StoreRelaxed(&view_.length[row], length);
  StoreRelaxed(&writer_pid[row], 0);
  // Publish (release) only if the row is still the one this writer claimed.
  if (!CompareExchange(&view_.state[row], &held, MakeState(StateGeneration(held) + 1, priority))) {
    throw std::runtime_error(NotHeld(row));
  }
  FetchAdd<int64_t>(&h->size, 1);
  if (priority > 0.0f) FetchAdd<int64_t>(&h->selectable, 1);
}

void SharedTable::Abandon(int64_t row) {
  uint64_t held = CheckOwned(row);
  int32_t* writer_pid = reinterpret_cast<int32_t*>(base_ + header()->writer_pid_offset);
  StoreRelaxed(&view_.length[row], 0);
  StoreRelaxed(&writer_pid[row], 0);
  if (!CompareExchange(&view_.state[row], &held, MakeState(StateGeneration(held) + 1, 0.0f))) {
    throw std::runtime_error(NotHeld(row));
  }
}

std::vector<int32_t> SharedTable::Insert(const std::vector<const uint8_t*>& field_data, int64_t batch,
                                         int32_t steps, const int32_t* lengths, const float* priorities) {
  for (int64_t b = 0; b < batch; ++b) {  // validate everything before claiming anything
    if (lengths[b] < 1 || lengths[b] > steps) {
      throw std::invalid_argument("lengths[" + std::to_string(b) + "] = " + std::to_string(lengths[b]) +
                                  " is outside [1, " + std::to_string(steps) + "]");
    }
    if (!std::isfinite(priorities[b]) || priorities[b] < 0.0f) {
      throw std::invalid_argument("priorities[" + std::to_string(b) + "] = " + std::to_string(priorities[b]) +
                                  " must be finite and >= 0");
    }
  }
  std::vector<int32_t> rows;
  rows.reserve(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t row = Claim();
    for (int32_t f = 0; f < view_.num_fields; ++f) {
      const FieldView& field = view_.fields[f];
      std::memcpy(field.data + row * field.row_stride, field_data[f] + b * steps * field.step_bytes,
                  static_cast<size_t>(lengths[b] * field.step_bytes));
    }
    Commit(row, lengths[b], priorities[b]);
    rows.push_back(static_cast<int32_t>(row));
  }
  return rows;
}

}  // namespace gear
