// Flow control between the processes that insert into a table and those that sample it: the shared
// state of a table's rate limiter, in the table's header so that every process attached to it sees the
// same settings and counts, and the checks, counts and waits every process applies to it.
//
// Semantics. A limiter has a minimum size and, optionally, a target ratio of samples to inserts with a
// tolerance. With a ratio, `diff = inserts * samples_per_insert - samples` measures how far the learner is
// behind the actors (in samples); offset = samples_per_insert * min_size_to_sample, min_diff = offset -
// error_buffer, max_diff = offset + error_buffer:
//   - n inserts may proceed when diff + n * samples_per_insert <= max_diff (no size condition);
//   - n samples may proceed when the table holds >= min_size_to_sample rows and diff - n >= min_diff.
// Without a ratio only the size condition applies (inserts never wait). A table without a limiter
// (enabled = 0) counts nothing: its inserts pay one load of `enabled`.
//
// Counting is admission. A process admits n inserts (or samples) by one compare-and-swap of `inserts`
// (`samples`) from the value its check read: the check and the count are one step, so however many
// processes insert and sample at once, every admitted insert kept diff <= max_diff and every admitted
// sample kept diff >= min_diff (the other counter only moves the way that keeps the bound: samples only
// lower diff, which an insert's bound welcomes, and inserts only raise it). A check first and a count
// later would let N writers that passed the check together overshoot max_diff by N - 1 batches.
// Waiting paths admit by that compare-and-swap: host inserts and adds before they claim rows, episode
// ends before they publish theirs, the learner's Table.await_samples before its jitted step. Inserts
// give back what a failure left unpublished (InsertReservation); a give-back lowers diff, and so may
// take it below min_diff after samples were admitted against it. Paths that must not wait (the insert
// custom call, inside XLA) count their rows as they publish them, without a check: they may push diff
// past max_diff, which only makes the next host inserts wait longer.
//
// Killed inserters. A process killed between an insert's admission and its publication never publishes
// nor gives back what it was admitted for: `inserts` would run ahead of the rows written for good, and the
// learner would over-sample. So each process also counts, in its writer slot's entry of the header's
// admitted_inserts (counter_window.cc has the slots), what it was admitted for and has not yet published
// (one row at a time, as each row is published) or given back; when the slot's process is found gone (a
// sweep of the writer slots, or a process taking the slot over), that entry is taken out of `inserts`.
// Exact but for a kill between two adjacent atomic steps (an admission's compare-and-swap and its entry,
// a row's publication and its entry, a give-back and its entry: one batch, one row, one batch at most),
// and for a process that found every writer slot taken (counted nowhere, as its counter windows are).
#pragma once

#include <cstdint>
#include <string>

#include "xla_ffi/clock.h"
#include "xla_ffi/native_errors.h"

namespace gear {

struct RateLimiterState {
  // Settings, written by the creator before the header's magic and never changed after.
  uint32_t enabled;  // 0: no limiter (inserts and samples never wait, nothing is counted)
  // Nonzero: the limiter of a queue (Table.create(..., queue=True)), whose samples are the rows consumers
  // took (ConsumePicks) and whose writers never take an unconsumed row (row_protocol.cc).
  uint32_t queue;
  int64_t min_size_to_sample;  // samples wait until the table holds this many rows
  double samples_per_insert;   // 0: no ratio between samples and inserts
  double error_buffer;         // the tolerance around the ratio, in samples (0 without a ratio)
  double min_diff, max_diff;   // bounds of inserts * samples_per_insert - samples
  // Counts since the table was made, raised by every process.
  alignas(64) uint64_t inserts;  // rows admitted (host paths) or published (the insert custom call)
  alignas(64) uint64_t samples;  // samples admitted (Table.await_samples)
};

// The settings for a new table's header. Throws std::invalid_argument for settings no table can keep
// (gear_jax.RateLimiter checks them first, with messages that name the fix).
RateLimiterState MakeRateLimiter(int64_t min_size_to_sample, double samples_per_insert, double error_buffer,
                                 int64_t capacity);

// The counts at one instant (RateLimiter::Counts), and the size of the table just after.
struct RateLimiterCounts {
  uint64_t inserts = 0;
  uint64_t samples = 0;
  int64_t size = 0;  // rows holding a committed trajectory
  double diff = 0;   // inserts * samples_per_insert - samples (0 without a ratio)
};

enum class RateOp { kInsert, kSample };

class SharedTable;  // shared_table.h: the writer slot of this process

// What a table's limiter is checked against: its state and the table's `size` counter (both in the
// header), and the table's name for messages.
class RateLimiter {
 public:
  // `admitted` and `table`: the header's admitted_inserts and the table whose writer slot this process
  // counts its admitted inserts in (null: not counted per process; see "Killed inserters").
  RateLimiter(RateLimiterState* state, const int64_t* size, const std::string* table_name,
              uint64_t* admitted = nullptr, SharedTable* table = nullptr)
      : state_(state), size_(size), name_(table_name), admitted_(admitted), table_(table) {}

  bool enabled() const { return __atomic_load_n(&state_->enabled, __ATOMIC_RELAXED) != 0; }
  const RateLimiterState& settings() const { return *state_; }
  RateLimiterCounts Counts() const;

  // Whether `n` inserts or samples may proceed now (nothing counted). Without a limiter, inserts always
  // may and samples may once the table holds a row.
  bool Allows(RateOp op, int64_t n) const;
  // Admits and counts `n` when they may proceed now: one compare-and-swap of the counter from the value
  // checked (retried while another process moved it and the check still passes). Without a limiter:
  // Allows, nothing counted.
  bool TryAdmit(RateOp op, int64_t n);
  // Waits until TryAdmit(op, n) succeeds: polls it, sleeping 50 us at first, doubling up to 1 ms, so that
  // a wait costs nothing when the limiter admits at once and never spins a core. Calls `closed()`
  // before every poll (it may also throw, to end the wait). Throws RateLimiterTimeoutError after
  // `timeout_s` seconds (< 0: never; 0: one try), TableClosedError once `closed()` is true, and
  // RateLimiterRefusal for a request that can never be admitted (see Refusal). The caller must not
  // hold the GIL or anything a closer needs.
  template <typename Closed>
  void Await(RateOp op, int64_t n, double timeout_s, Closed closed);

  // Counts `n` published rows without a check (the insert custom call, which never waits).
  void CountInserts(int64_t n) {
    if (n > 0) __atomic_fetch_add(&state_->inserts, static_cast<uint64_t>(n), __ATOMIC_SEQ_CST);
  }
  // Takes back `n` admitted inserts that were never published (a failed insert).
  void ReturnInserts(int64_t n) {
    if (n <= 0 || !enabled()) return;
    __atomic_fetch_sub(&state_->inserts, static_cast<uint64_t>(n), __ATOMIC_SEQ_CST);
    AddAdmitted(-n);
  }
  // `n` admitted inserts were published: no longer this process's to give back.
  void NotePublished(int64_t n) {
    if (n > 0 && enabled()) AddAdmitted(-n);
  }
  // Takes a gone process's admitted inserts (an entry of admitted_inserts) out of the count: the caller
  // holds that writer slot (counter_window.cc).
  void TakeBackAdmitted(uint64_t* entry) {
    const uint64_t n = __atomic_exchange_n(entry, uint64_t{0}, __ATOMIC_SEQ_CST);
    if (n != 0) __atomic_fetch_sub(&state_->inserts, n, __ATOMIC_SEQ_CST);
  }

 private:
  // Why `n` can never be admitted, or "" when it can be (now or once others move the counts).
  std::string Refusal(RateOp op, int64_t n, const RateLimiterCounts& now) const;
  std::string TimeoutMessage(RateOp op, int64_t n, double timeout_s) const;
  // Sleeps the next step of the backoff (`step_ns` doubles up to its cap).
  static void Backoff(int64_t* step_ns);
  // Adds `delta` to this process's entry of admitted_inserts (nothing without a writer slot).
  void AddAdmitted(int64_t delta);

  RateLimiterState* state_;
  const int64_t* size_;
  const std::string* name_;
  uint64_t* admitted_;
  SharedTable* table_;
};

// Inserts admitted (and so counted) before their rows are published: the publishing code uses them up
// row by row (Use), and what is left when the reservation goes (an insert that failed midway) is given
// back. A null reservation means rows count as they are published (RateLimiter::CountInserts).
class InsertReservation {
 public:
  InsertReservation(RateLimiter limiter, int64_t rows) : limiter_(limiter), left_(rows) {}
  ~InsertReservation() { limiter_.ReturnInserts(left_); }
  InsertReservation(const InsertReservation&) = delete;
  InsertReservation& operator=(const InsertReservation&) = delete;
  void Use(int64_t rows) {
    left_ -= rows;
    limiter_.NotePublished(rows);
  }
  // The caller settles what is left itself (Python's reservations, given back by gear_jax.table).
  void Keep() { left_ = 0; }

 private:
  RateLimiter limiter_;
  int64_t left_;
};

template <typename Closed>
void RateLimiter::Await(RateOp op, int64_t n, double timeout_s, Closed closed) {
  const int64_t start = MonotonicNs();
  int64_t step_ns = 0;
  while (true) {
    if (closed()) {
      throw TableClosedError("table '" + *name_ + "' was closed while a " +
                             (op == RateOp::kInsert ? std::string("insert") : std::string("sample")) +
                             " waited for its rate limiter");
    }
    if (TryAdmit(op, n)) return;
    const std::string refusal = Refusal(op, n, Counts());
    if (!refusal.empty()) throw RateLimiterRefusal(refusal);
    if (timeout_s >= 0 && static_cast<double>(MonotonicNs() - start) >= timeout_s * 1e9) {
      throw RateLimiterTimeoutError(TimeoutMessage(op, n, timeout_s));
    }
    Backoff(&step_ns);
  }
}

}  // namespace gear
