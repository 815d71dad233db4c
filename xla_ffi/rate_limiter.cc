#include "xla_ffi/rate_limiter.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "xla_ffi/shared_table.h"

namespace gear {
namespace {

constexpr int64_t kFirstSleepNs = 50'000;       // the backoff of a wait starts at 50 us
constexpr int64_t kLongestSleepNs = 1'000'000;  // and doubles up to 1 ms

template <typename T>
T Load(const T* p) {
  return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}

// A number as a message shows it: integers without a fraction.
std::string Num(double v) {
  std::ostringstream out;
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    out << static_cast<int64_t>(v);
  } else {
    out << v;
  }
  return out.str();
}

}  // namespace

RateLimiterState MakeRateLimiter(int64_t min_size_to_sample, double samples_per_insert, double error_buffer,
                                 int64_t capacity) {
  auto refuse = [](const std::string& why) { throw std::invalid_argument("rate limiter: " + why); };
  if (min_size_to_sample < 1 || min_size_to_sample > capacity) {
    refuse("min_size_to_sample must be in [1, capacity]");
  }
  if (!std::isfinite(samples_per_insert) || samples_per_insert < 0) {
    refuse("samples_per_insert must be > 0 (0: no ratio)");
  }
  if (!std::isfinite(error_buffer) || error_buffer < 0 || (samples_per_insert == 0 && error_buffer != 0) ||
      (samples_per_insert > 0 && 2 * error_buffer < samples_per_insert + 1)) {
    refuse("error_buffer must be >= (samples_per_insert + 1) / 2 with a ratio, 0 without");
  }
  RateLimiterState state{};
  state.enabled = 1;
  state.min_size_to_sample = min_size_to_sample;
  state.samples_per_insert = samples_per_insert;
  state.error_buffer = error_buffer;
  const double offset = samples_per_insert * static_cast<double>(min_size_to_sample);
  state.min_diff = offset - error_buffer;
  state.max_diff = offset + error_buffer;
  return state;
}

RateLimiterCounts RateLimiter::Counts() const {
  RateLimiterCounts c;
  // Both counters as they were at one instant: samples, inserts, samples, inserts until the two reads of
  // each agree (then both held their values between the second and the third read). A few tries at
  // most; counts read apart could show a diff past a bound that no instant had.
  for (int tries = 0; tries < 8; ++tries) {
    c.samples = Load(&state_->samples);
    c.inserts = Load(&state_->inserts);
    if (Load(&state_->samples) == c.samples && Load(&state_->inserts) == c.inserts) break;
  }
  c.size = Load(size_);
  c.diff = static_cast<double>(c.inserts) * state_->samples_per_insert - static_cast<double>(c.samples);
  return c;
}

bool RateLimiter::Allows(RateOp op, int64_t n) const {
  if (!enabled()) return op == RateOp::kInsert || Load(size_) >= 1;
  const RateLimiterCounts c = Counts();
  const double ratio = state_->samples_per_insert;
  if (op == RateOp::kInsert) return ratio == 0 || c.diff + static_cast<double>(n) * ratio <= state_->max_diff;
  return c.size >= state_->min_size_to_sample &&
         (ratio == 0 || c.diff - static_cast<double>(n) >= state_->min_diff);
}

bool RateLimiter::TryAdmit(RateOp op, int64_t n) {
  if (!enabled()) return Allows(op, n);
  const double ratio = state_->samples_per_insert;
  const uint64_t count = static_cast<uint64_t>(n);
  if (op == RateOp::kSample && Load(size_) < state_->min_size_to_sample) return false;
  uint64_t* counter = op == RateOp::kInsert ? &state_->inserts : &state_->samples;
  if (ratio == 0) {  // no ratio: only the size condition, checked above
    __atomic_fetch_add(counter, count, __ATOMIC_SEQ_CST);
    if (op == RateOp::kInsert) AddAdmitted(n);
    return true;
  }
  uint64_t seen = Load(counter);
  while (true) {
    // The other counter is read after this one: it only moves the way that keeps this bound (inserts
    // raise diff, samples lower it), so a value older than the compare-and-swap is on the safe side.
    if (op == RateOp::kInsert) {
      const double diff =
          static_cast<double>(seen + count) * ratio - static_cast<double>(Load(&state_->samples));
      if (diff > state_->max_diff) return false;
    } else {
      const double diff =
          static_cast<double>(Load(&state_->inserts)) * ratio - static_cast<double>(seen + count);
      if (diff < state_->min_diff) return false;
    }
    if (__atomic_compare_exchange_n(counter, &seen, seen + count, /*weak=*/false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST)) {
      if (op == RateOp::kInsert) AddAdmitted(n);
      return true;
    }
  }
}

std::string RateLimiter::Refusal(RateOp op, int64_t n, const RateLimiterCounts& now) const {
  const double ratio = state_->samples_per_insert;
  if (!enabled() || ratio == 0) return {};
  if (state_->queue != 0) {  // a queue holds at most max_diff (its capacity) rows not consumed
    if (op != RateOp::kInsert || static_cast<double>(n) <= state_->max_diff) return {};
    return "an insert of " + std::to_string(n) + " rows into the queue '" + *name_ + "' of capacity " +
           Num(state_->max_diff) + " can never fit; insert at most that many rows at a time";
  }
  const double tolerance = state_->max_diff - state_->min_diff;  // 2 x error_buffer
  const double need = op == RateOp::kInsert ? static_cast<double>(n) * ratio : static_cast<double>(n);
  if (need <= tolerance) return {};
  std::ostringstream out;
  if (op == RateOp::kInsert) {
    // Samples never take diff below min_diff, so such a batch fits only while diff is still below
    // max_diff - need (< min_diff): while the table fills, before sampling starts.
    if (now.diff + need <= state_->max_diff) return {};
    out << "an insert of " << n << " rows into table '" << *name_ << "' needs " << n
        << " x samples_per_insert = " << Num(need) << " samples of room, more than the rate limiter's whole "
        << "tolerance (2 x error_buffer = " << Num(tolerance) << "); such a batch goes in only while the "
        << "table fills, and this one never can (inserts=" << now.inserts << ", samples=" << now.samples
        << ", diff=" << Num(now.diff) << ", max_diff=" << Num(state_->max_diff) << "): insert at most "
        << static_cast<int64_t>(std::floor(tolerance / ratio)) << " rows at a time, or create the table "
        << "with error_buffer >= " << Num(need / 2);
  } else {
    out << "await_samples(" << n << ") on table '" << *name_ << "' can never proceed: a sample of n needs "
        << "diff - n >= min_diff while inserts keep diff <= max_diff, so n must be <= 2 x error_buffer = "
        << Num(tolerance) << "; sample at most " << static_cast<int64_t>(std::floor(tolerance))
        << " at a time, or create the table with error_buffer >= " << Num(need / 2);
  }
  return out.str();
}

std::string RateLimiter::TimeoutMessage(RateOp op, int64_t n, double timeout_s) const {
  const RateLimiterCounts c = Counts();
  const double ratio = state_->samples_per_insert;
  std::ostringstream out;
  out << (op == RateOp::kInsert ? "an insert of " + std::to_string(n) + " rows into"
                                : "await_samples(" + std::to_string(n) + ") on")
      << " table '" << *name_ << "' waited " << timeout_s << " s for the rate limiter (inserts=" << c.inserts
      << ", samples=" << c.samples << ", size=" << c.size;
  if (ratio != 0) {
    out << ", diff = inserts x " << Num(ratio) << " - samples = " << Num(c.diff)
        << ", min_diff=" << Num(state_->min_diff) << ", max_diff=" << Num(state_->max_diff);
  }
  out << "). ";
  if (op == RateOp::kInsert && state_->queue != 0) {
    out << "The queue is full (" << c.inserts - c.samples << " of its " << Num(state_->max_diff)
        << " rows inserted and not consumed): consumers must dequeue first (gj.dequeue); start them or speed "
           "them up, or pass a longer timeout";
  } else if (op == RateOp::kInsert) {
    out << "It needs diff + " << n << " x " << Num(ratio)
        << " <= max_diff: the learner must sample more first "
        << "(it declares its samples with table.await_samples); start it or speed it up, or pass a longer "
           "timeout";
  } else {
    out << "It needs size >= " << (enabled() ? state_->min_size_to_sample : 1);
    if (ratio != 0) out << " and diff - " << n << " >= min_diff";
    out << ": the actors must insert more first; start them or speed them up, or pass a longer timeout";
  }
  return out.str();
}

void RateLimiter::AddAdmitted(int64_t delta) {
  if (admitted_ == nullptr || table_ == nullptr) return;
  const int slot = table_->WriterSlot();
  if (slot >= 0) __atomic_fetch_add(&admitted_[slot], static_cast<uint64_t>(delta), __ATOMIC_SEQ_CST);
}

void RateLimiter::Backoff(int64_t* step_ns) {
  *step_ns = *step_ns == 0 ? kFirstSleepNs : std::min(2 * *step_ns, kLongestSleepNs);
  timespec ts{0, static_cast<long>(*step_ns)};
  nanosleep(&ts, nullptr);
}

}  // namespace gear
