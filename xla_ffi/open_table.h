// A table as this process opened it (by create or attach): the mapping, its registry handle, and the
// rows this process's writers hold. This is the open-table lifecycle behind gear_jax.Table: close
// hands the creator's memory to the pool of closed tables (table_pool.h) or removes its name; a forked
// child's close only forgets the parent's table.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "xla_ffi/shared_table.h"

namespace gear {

class OpenTable {
 public:
  // Registers `table` under `handle` (> 0: a handle the pool kept for this spec) or a new handle.
  OpenTable(std::shared_ptr<SharedTable> table, int64_t handle);
  ~OpenTable() { Close(); }
  OpenTable(const OpenTable&) = delete;
  OpenTable& operator=(const OpenTable&) = delete;

  // Lets go of the mapping unless a writer of this process still holds a row (it is released when
  // the last one is given back). The creator hands the memory to the pool of closed tables when
  // nothing else can reach it, or removes the name. In a forked child, closing an inherited table
  // only forgets it here: the table is the parent's.
  void Close() noexcept;

  // Row writing by this process's writers, counted so that close knows whether rows are still held.
  int64_t Claim();
  void Commit(int64_t row, int32_t length, float priority, InsertReservation* reserved = nullptr);
  // Works after close too: other processes may still use the table, so the row must not stay held.
  void Abandon(int64_t row);

  // A reference that keeps the mapping while the caller works without the GIL (a concurrent close
  // from another thread then lets go of it only after the caller is done). Throws once closed.
  std::shared_ptr<SharedTable> ref();
  // The table; throws std::runtime_error once closed.
  SharedTable& table();
  // Waits until the rate limiter of `table` (this open's ref(), held by the caller) admits `n` inserts
  // or samples, and counts them (RateLimiter::Await, with `timeout_s`). A close meanwhile, by this open
  // (another thread) or by the table's creator (any process), stops the wait with TableClosedError
  // within a poll: the wait holds no lock, and `table` keeps the memory mapped (and out of the pool of
  // closed tables) until the caller lets go. `each_poll` runs before every poll and may throw to end
  // the wait (rate_limiter_admission.h runs Python's signal handlers there).
  void AwaitAdmission(SharedTable& table, RateOp op, int64_t n, double timeout_s,
                      const std::function<void()>& each_poll) const;

  const std::string& name() const { return name_; }
  bool creator() const { return creator_; }
  int64_t handle() const { return handle_; }
  bool closed() const { return closed_.load(std::memory_order_acquire); }

 private:
  std::shared_ptr<SharedTable> table_;
  std::string name_;
  int64_t handle_;
  bool creator_;
  int32_t opened_by_pid_;
  std::atomic<bool> closed_{false};  // read by waits in other threads (AwaitAdmission)
  int64_t held_rows_ = 0;            // rows claimed through this open and not yet committed or abandoned
};

// Creates a table, in the memory of a closed one from the pool when one fits and `reuse` is set
// (taking its handle too when the spec is the same), else in new shared memory; a full /dev/shm
// empties the pool and retries. See SharedTable::Create for `pin`. Removes the tables of processes
// that are all gone first (dead_tables.h); `outlive_creator` exempts this table from that.
// `rate_limiter` (MakeRateLimiter; zero: none) and `rules` go into the header with the rest of it; a
// queue (rules.queue) takes the limiter that keeps inserts within its room (none other may be given).
std::unique_ptr<OpenTable> CreateTable(const std::string& name, int64_t capacity, int32_t max_steps,
                                       const std::vector<int64_t>& step_bytes, const std::string& spec_json,
                                       uint64_t spec_hash, bool pin, bool reuse, bool outlive_creator,
                                       const RateLimiterState& rate_limiter = RateLimiterState{},
                                       int64_t step_capacity = 0, const SamplingRules& rules = {});

// Attaches to the table `name` created by another open (of any process on the host).
std::unique_ptr<OpenTable> AttachTable(const std::string& name, bool pin);

}  // namespace gear
