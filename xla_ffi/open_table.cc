#include "xla_ffi/open_table.h"

#include <optional>
#include <stdexcept>
#include <utility>

#include "xla_ffi/clock.h"
#include "xla_ffi/dead_tables.h"
#include "xla_ffi/native_errors.h"
#include "xla_ffi/rate_limiter.h"
#include "xla_ffi/registry.h"
#include "xla_ffi/table_pool.h"
#include "xla_ffi/table_processes.h"

#ifndef GEAR_JAX_WITH_CUDA
#define GEAR_JAX_WITH_CUDA 0
#endif
#if GEAR_JAX_WITH_CUDA
#include "xla_ffi/cuda_handlers.h"
#endif

namespace gear {
namespace {

constexpr int64_t kCreatorCheckNs = 20'000'000;  // a rate-limited wait asks whether the creator lives

// Lets go of the tables that host callbacks of update_priorities parked (cuda_handlers.h), from a
// thread that may make CUDA calls and outside any XLA execution: before a create or after a close.
void DropParkedTables() {
#if GEAR_JAX_WITH_CUDA
  DropTablesLeftByHostCallbacks();
#endif
}

}  // namespace

OpenTable::OpenTable(std::shared_ptr<SharedTable> table, int64_t handle)
    : table_(std::move(table)),
      name_(table_->name()),
      handle_(handle),
      creator_(table_->creator()),
      opened_by_pid_(CurrentPid()) {
  if (handle_ > 0) {
    RegisterTableAt(handle_, table_);
  } else {
    handle_ = RegisterTable(table_);
  }
}

void OpenTable::Close() noexcept {
  if (closed_.exchange(true, std::memory_order_acq_rel)) return;
  if (opened_by_pid_ != CurrentPid()) {
    new std::shared_ptr<SharedTable>(std::move(table_));  // leaked: no unmap, no CUDA call in a child
    return;
  }
  UnregisterTable(handle_);
  DropParkedTables();
  if (creator_) {
    table_->MarkClosed();
    bool pooled = false;
    try {
      pooled = held_rows_ == 0 && TablePool::Get().Offer(table_, handle_);
    } catch (...) {
      pooled = false;
    }
    if (!pooled) table_->Unlink();
  }
  if (held_rows_ == 0) table_.reset();
}

int64_t OpenTable::Claim() {
  const int64_t row = table().Claim();
  ++held_rows_;
  return row;
}

void OpenTable::Commit(int64_t row, int32_t length, float priority, InsertReservation* reserved) {
  SharedTable& t = table();
  try {
    t.Commit(row, length, priority, reserved);
  } catch (const std::invalid_argument&) {
    throw;  // refused before anything changed: the row is still held
  } catch (...) {
    --held_rows_;  // the row was reclaimed: held no more
    throw;
  }
  --held_rows_;
}

void OpenTable::Abandon(int64_t row) {
  if (!table_) return;
  table_->CheckRowInRange(row);
  --held_rows_;
  try {
    table_->Abandon(row);
  } catch (...) {
    if (closed_ && held_rows_ == 0) table_.reset();
    throw;
  }
  if (closed_ && held_rows_ == 0) table_.reset();
}

std::shared_ptr<SharedTable> OpenTable::ref() {
  table();
  return table_;
}

SharedTable& OpenTable::table() {
  if (closed()) throw TableClosedError("table '" + name_ + "' is closed");  // gear_jax.TableClosedError
  return *table_;
}

void OpenTable::AwaitAdmission(SharedTable& table, RateOp op, int64_t n, double timeout_s,
                               const std::function<void()>& each_poll) const {
  const TableHeader* h = table.header();
  const uint32_t* creator_closed = &h->closed;
  int64_t next_creator_check = 0;
  table.rate_limiter().Await(op, n, timeout_s, [&] {
    each_poll();
    table.CheckCounts(/*force=*/false);  // a writer killed mid-insert leaves `size` off until a recount
    // A creator killed (SIGKILL, an OOM kill) never closes its table, and the learner that would move
    // the counts is usually that creator: the wait would last forever. A table made to outlive its
    // creator (persistent) keeps waiting for whoever takes the creator's place.
    const int64_t now = MonotonicNs();
    if (now >= next_creator_check) {
      next_creator_check = now + kCreatorCheckNs;
      const int32_t creator = h->creator_pid;
      if (h->persistent == 0 && creator != CurrentPid() && !PidMayBeAlive(h, creator)) {
        throw TableClosedError("the creator of table '" + table.name() + "' (pid " + std::to_string(creator) +
                               ") died while " +
                               (op == RateOp::kInsert ? std::string("an insert") : std::string("a sample")) +
                               " waited for its rate limiter: nothing will admit it; attach to the table "
                               "of the creator that replaces it");
      }
    }
    return closed() || __atomic_load_n(creator_closed, __ATOMIC_SEQ_CST) != 0;
  });
}

std::unique_ptr<OpenTable> CreateTable(const std::string& name, int64_t capacity, int32_t max_steps,
                                       const std::vector<int64_t>& step_bytes, const std::string& spec_json,
                                       uint64_t spec_hash, bool pin, bool reuse, bool outlive_creator,
                                       const RateLimiterState& rate_limiter, int64_t step_capacity,
                                       const SamplingRules& rules) {
  TablePlan plan = PlanTable(capacity, max_steps, step_bytes, spec_json, step_capacity);
  plan.layout.persistent = outlive_creator ? 1u : 0u;
  plan.layout.rate_limiter = rate_limiter;  // written with the header, before its magic (WriteHeader)
  if (rules.max_times_sampled > kMaxTimesSampledLimit) {
    throw std::invalid_argument("max_times_sampled=" + std::to_string(rules.max_times_sampled) +
                                " is more than " + std::to_string(kMaxTimesSampledLimit));
  }
  plan.layout.max_times_sampled = rules.max_times_sampled;
  if (rules.queue) {
    if (rate_limiter.enabled != 0) throw std::invalid_argument("a queue takes no rate limiter of its own");
    if (step_capacity > 0) throw std::invalid_argument("a step ring cannot be a queue");
    if (capacity < 2) throw std::invalid_argument("a queue needs a capacity of at least 2 rows");
    // Inserts wait while inserts - consumed rows would pass the capacity: one sample per insert, an
    // offset of one row (min_size_to_sample) and a tolerance of capacity - 1 rows put max_diff at it.
    plan.layout.rate_limiter = MakeRateLimiter(1, 1.0, static_cast<double>(capacity - 1), capacity);
    plan.layout.rate_limiter.queue = 1;
  }
  // First the tables whose processes are all gone (dead_tables.h; at most once a second).
  SweepDeadTables(/*force=*/false);
  DropParkedTables();  // lets the pool reuse memory they still held
  TablePool& pool = TablePool::Get();
  if (reuse) {
    if (std::optional<PooledTable> entry = pool.Take(plan.total_bytes, spec_hash)) {
      std::shared_ptr<SharedTable> table;
      try {
        table = SharedTable::Reopen(*entry->table, entry->pool_name, name, plan, spec_json, spec_hash, pin);
      } catch (const PoolEntryLost&) {
        entry.reset();  // its name is gone (removed by hand, say): useless; make the table afresh
      } catch (...) {
        pool.Return(std::move(*entry));
        throw;
      }
      if (table) {
        const bool same_spec = entry->spec_hash == spec_hash;
        pool.CountReuse(same_spec);
        return std::make_unique<OpenTable>(std::move(table), same_spec ? entry->handle : 0);
      }
    }
  }
  try {
    return std::make_unique<OpenTable>(SharedTable::Create(name, plan, spec_json, spec_hash, pin), 0);
  } catch (const OutOfSpaceError&) {
    const bool swept = !SweepDeadTables(/*force=*/true).empty();
    if (pool.Stats().tables == 0 && !swept) throw;
    pool.Clear();
  }
  return std::make_unique<OpenTable>(SharedTable::Create(name, plan, spec_json, spec_hash, pin), 0);
}

std::unique_ptr<OpenTable> AttachTable(const std::string& name, bool pin) {
  return std::make_unique<OpenTable>(SharedTable::Attach(name, pin), 0);
}

}  // namespace gear
