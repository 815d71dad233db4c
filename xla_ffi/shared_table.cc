#include "xla_ffi/shared_table.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "kernels/atomics.h"
#include "xla_ffi/seq_cst.h"

namespace gear {
namespace {

// Fills a new header into `base` from `plan`, the magic last: a header with magic is complete.
// `reuses` counts the tables the memory held before.
void WriteHeader(uint8_t* base, const TablePlan& plan, uint64_t total_bytes, const std::string& spec_json,
                 uint64_t spec_hash, uint64_t reuses) {
  TableHeader* h = reinterpret_cast<TableHeader*>(base);
  std::memcpy(h, &plan.layout, sizeof(TableHeader));  // the plan's magic, counters and slots are zero
  __atomic_store_n(&h->reuses, reuses, __ATOMIC_RELAXED);
  h->creator_pid = CurrentPid();
  h->creator_pid_namespace = PidNamespace();
  // The liveness file of this process's lock (table_processes.h), which every process of the table
  // must hold its lock in; none held: the table is liveness_unproven from the start.
  h->liveness_unproven = LivenessFile(&h->liveness_device, &h->liveness_inode) ? 0u : 1u;
  h->format_version = kFormatVersion;
  h->spec_json_bytes = static_cast<uint32_t>(spec_json.size());
  h->spec_hash = spec_hash;
  h->total_bytes = total_bytes;
  std::memcpy(h->spec_json, spec_json.data(), spec_json.size());
  __atomic_thread_fence(__ATOMIC_RELEASE);
  std::memcpy(h->magic, kTableMagic, sizeof(kTableMagic));
}

}  // namespace

SharedTable::SharedTable(std::string name, std::shared_ptr<TableMemory> memory, bool creator)
    : name_(std::move(name)),
      memory_(std::move(memory)),
      base_(memory_->base()),
      creator_(creator),
      rate_limiter_(&header()->rate_limiter, &header()->size, &name_, header()->admitted_inserts, this) {
  TableHeader* h = header();
  view_.capacity = h->capacity;
  view_.max_steps = h->max_steps;
  view_.num_fields = h->num_fields;
  view_.state = reinterpret_cast<uint64_t*>(base_ + h->state_offset);
  view_.length = reinterpret_cast<int32_t*>(base_ + h->length_offset);
  view_.insert_seq = reinterpret_cast<uint64_t*>(base_ + h->insert_seq_offset);
  view_.times_sampled = reinterpret_cast<uint32_t*>(base_ + h->times_sampled_offset);
  view_.change_counts = reinterpret_cast<uint32_t*>(base_ + h->change_counts_offset);
  owners_ = reinterpret_cast<int32_t*>(base_ + h->writer_pid_offset);
  view_.next_seq = &h->next_seq;
  view_.selectable = &h->selectable;
  view_.max_priority_bits = &h->max_priority_bits;
  view_.max_times_sampled = h->max_times_sampled;
  view_.step_capacity = h->step_capacity;
  if (h->step_capacity > 0) view_.first_step = reinterpret_cast<uint64_t*>(base_ + h->first_step_offset);
  view_.longest = &h->longest_episode;
  populated_ = std::make_unique<std::atomic<uint64_t>[]>(((memory_->bytes() - 1) >> kPopulateShift) / 64 + 1);
  for (int f = 0; f < h->num_fields; ++f) {
    view_.fields[f] =
        FieldView{base_ + h->fields[f].offset, h->fields[f].row_stride, h->fields[f].step_bytes};
  }
}

SharedTable::~SharedTable() {
  // A kernel enqueued earlier may still read a GPU's priority index, which goes with this object.
  if (priority_indexes_.HasDeviceIndexes()) memory_->WaitForKernels();
  ReleaseWriterSlot();
}

std::shared_ptr<SharedTable> SharedTable::Create(const std::string& name, const TablePlan& plan,
                                                 const std::string& spec_json, uint64_t spec_hash, bool pin) {
  const uint64_t total = plan.total_bytes;
  uint8_t* base = CreateTableFile(name, total);
  WriteHeader(base, plan, total, spec_json, spec_hash, 0);
  auto memory = std::make_shared<TableMemory>(base, total);
  try {
    memory->Pin(pin);
  } catch (...) {
    RemoveTableFile(name);  // the memory unmaps itself; nothing else holds the file yet
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
  const MappedFile file = MapTableFile(name);
  auto memory = std::make_shared<TableMemory>(file.base, file.size);  // unmaps on a throw
  TableHeader* h = reinterpret_cast<TableHeader*>(file.base);
  // The count of reuses before anything else: if the memory is given to another table while this
  // reads the header, the count differs at the end and the attach fails instead of mixing two tables.
  const uint64_t reuses = __atomic_load_n(&h->reuses, __ATOMIC_SEQ_CST);
  if (std::string problem = HeaderProblem(*h, file.size); !problem.empty()) {
    throw FormatError("'" + ShmFile(name) + "' " + problem);
  }
  // A process of another PID namespace than the creator's: from now on no process may judge a pid of
  // this table by kill(pid, 0). Set before this process signs in or writes (see PidMayBeAlive).
  if (Load(&h->creator_pid_namespace) != PidNamespace()) Store(&h->mixed_pid_namespaces, 1u);
  ProveLiveness(h);  // likewise: the lock of this process in the table's liveness file, or the mark
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
  if (!StillNamed(name, file)) {
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

bool SharedTable::AttachedElsewhere() const { return gear::AttachedElsewhere(header()); }

bool SharedTable::RenameForPool(const std::string& new_name) {
  // link + unlink: never replaces an object of that name.
  if (unlinked_ || link(ShmFile(name_).c_str(), ShmFile(new_name).c_str()) != 0) return false;
  unlink(ShmFile(name_).c_str());
  name_ = new_name;
  return true;
}

void SharedTable::Unlink() {
  if (!unlinked_) RemoveTableFile(name_);
  unlinked_ = true;
}

}  // namespace gear
