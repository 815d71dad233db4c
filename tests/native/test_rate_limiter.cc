// xla_ffi/rate_limiter.h: the limiter's settings, its admission (check and count in one step) and waits.
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "xla_ffi/rate_limiter.h"

namespace gear {
namespace {

// A limiter over state of its own, as a table's header holds it.
struct Limiter {
  Limiter(int64_t min_size, double samples_per_insert, double error_buffer)
      : state(MakeRateLimiter(min_size, samples_per_insert, error_buffer, /*capacity=*/100)),
        limiter(&state, &size, &name) {}
  RateLimiterState state;
  int64_t size = 0;
  std::string name = "t";
  RateLimiter limiter;
};

BOOST_AUTO_TEST_SUITE(rate_limiter)

BOOST_AUTO_TEST_CASE(settings_no_table_can_keep_are_refused) {
  BOOST_CHECK_THROW(MakeRateLimiter(0, 1.0, 1.0, 100), std::invalid_argument);
  BOOST_CHECK_THROW(MakeRateLimiter(101, 1.0, 1.0, 100), std::invalid_argument);
  BOOST_CHECK_THROW(MakeRateLimiter(1, -1.0, 1.0, 100), std::invalid_argument);
  BOOST_CHECK_THROW(MakeRateLimiter(1, 0.0, 1.0, 100), std::invalid_argument);  // a buffer needs a ratio
  BOOST_CHECK_THROW(MakeRateLimiter(1, 2.0, 1.0, 100), std::invalid_argument);  // < (2 + 1) / 2
  const RateLimiterState s = MakeRateLimiter(2, 2.0, 3.0, 100);
  BOOST_TEST(s.enabled == 1u);
  BOOST_TEST(s.min_diff == 2.0 * 2 - 3.0);
  BOOST_TEST(s.max_diff == 2.0 * 2 + 3.0);
}

BOOST_AUTO_TEST_CASE(inserts_are_admitted_up_to_max_diff_and_counted_only_when_admitted) {
  Limiter l(2, 2.0, 3.0);                              // min_diff 1, max_diff 7
  BOOST_TEST(l.limiter.TryAdmit(RateOp::kInsert, 3));  // diff 6
  BOOST_TEST(l.limiter.Counts().inserts == 3u);
  BOOST_TEST(!l.limiter.Allows(RateOp::kInsert, 1));
  BOOST_TEST(!l.limiter.TryAdmit(RateOp::kInsert, 1));  // diff 8 > 7
  BOOST_TEST(l.limiter.Counts().inserts == 3u);
  BOOST_TEST(l.limiter.Counts().diff == 6.0);
}

BOOST_AUTO_TEST_CASE(samples_wait_for_min_size_and_min_diff) {
  Limiter l(2, 2.0, 3.0);
  BOOST_TEST(l.limiter.TryAdmit(RateOp::kInsert, 3));  // diff 6
  l.size = 1;
  BOOST_TEST(!l.limiter.TryAdmit(RateOp::kSample, 1));  // the table holds fewer than min_size rows
  l.size = 3;
  BOOST_TEST(!l.limiter.TryAdmit(RateOp::kSample, 6));  // diff 0 < 1
  BOOST_TEST(l.limiter.TryAdmit(RateOp::kSample, 5));   // diff 1
  BOOST_TEST(!l.limiter.TryAdmit(RateOp::kSample, 1));
  BOOST_TEST(l.limiter.Counts().samples == 5u);
  BOOST_TEST(l.limiter.TryAdmit(RateOp::kInsert, 3));  // diff 7 again
}

BOOST_AUTO_TEST_CASE(a_table_without_a_limiter_counts_nothing) {
  RateLimiterState state{};
  int64_t size = 0;
  std::string name = "t";
  RateLimiter limiter(&state, &size, &name);
  BOOST_TEST(!limiter.enabled());
  BOOST_TEST(limiter.TryAdmit(RateOp::kInsert, 1000));
  BOOST_TEST(!limiter.TryAdmit(RateOp::kSample, 1));  // nothing to sample
  size = 1;
  BOOST_TEST(limiter.TryAdmit(RateOp::kSample, 1000));
  BOOST_TEST(state.inserts == 0u);
  BOOST_TEST(state.samples == 0u);
}

// Admission is one compare-and-swap per request: writers racing each other never overshoot max_diff
// (a check followed by a separate count would let several pass together).
BOOST_AUTO_TEST_CASE(racing_writers_never_overshoot_max_diff) {
  for (int round = 0; round < 50; ++round) {
    Limiter l(1, 1.0, 40.0);  // max_diff 41: at most 41 inserts of 1 before any sample
    std::atomic<int> admitted{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> writers;
    for (int w = 0; w < 4; ++w) {
      writers.emplace_back([&] {
        while (!go.load()) {
        }
        for (int i = 0; i < 100; ++i) admitted += l.limiter.TryAdmit(RateOp::kInsert, 1);
      });
    }
    go = true;
    for (std::thread& t : writers) t.join();
    BOOST_REQUIRE(admitted.load() == 41);
    BOOST_REQUIRE(l.limiter.Counts().inserts == 41u);
  }
}

BOOST_AUTO_TEST_CASE(waits_end_by_admission_timeout_refusal_or_close) {
  Limiter l(1, 2.0, 3.0);                                          // min_diff -1, max_diff 5
  l.limiter.Await(RateOp::kInsert, 2, 0.0, [] { return false; });  // admitted at once: diff 4
  BOOST_CHECK_THROW(l.limiter.Await(RateOp::kInsert, 1, 0.0, [] { return false; }), RateLimiterTimeoutError);
  BOOST_CHECK_THROW(l.limiter.Await(RateOp::kInsert, 1, 0.01, [] { return false; }), RateLimiterTimeoutError);
  // 4 rows need 8 samples of room, more than the whole tolerance (6): never admissible.
  BOOST_CHECK_THROW(l.limiter.Await(RateOp::kInsert, 4, -1.0, [] { return false; }), RateLimiterRefusal);
  BOOST_CHECK_THROW(l.limiter.Await(RateOp::kInsert, 1, -1.0, [] { return true; }), TableClosedError);
  BOOST_TEST(l.limiter.Counts().inserts == 2u);  // none of the failed waits counted anything
}

BOOST_AUTO_TEST_CASE(a_reservation_gives_back_what_was_not_used) {
  Limiter l(1, 1.0, 10.0);
  BOOST_TEST(l.limiter.TryAdmit(RateOp::kInsert, 5));
  {
    InsertReservation reservation(l.limiter, 5);
    reservation.Use(2);
  }
  BOOST_TEST(l.limiter.Counts().inserts == 2u);
  BOOST_TEST(l.limiter.TryAdmit(RateOp::kInsert, 3));
  {
    InsertReservation kept(l.limiter, 3);
    kept.Keep();
  }
  BOOST_TEST(l.limiter.Counts().inserts == 5u);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace
}  // namespace gear
