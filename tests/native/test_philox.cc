// kernels/philox.h: the generator every selection draws from, on the CPU and the GPU alike.
#include <boost/test/unit_test.hpp>

#include <cstdint>

#include "kernels/philox.h"

namespace gear {
namespace {

void ExpectWords(const Philox4& got, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  BOOST_TEST(got.v[0] == a);
  BOOST_TEST(got.v[1] == b);
  BOOST_TEST(got.v[2] == c);
  BOOST_TEST(got.v[3] == d);
}

BOOST_AUTO_TEST_SUITE(philox)

// The known-answer vectors of Random123 (kat_vectors, philox4x32_10): the generator is Philox-4x32-10
// itself, not a variant.
BOOST_AUTO_TEST_CASE(matches_the_random123_known_answers) {
  ExpectWords(Philox4x32(0, 0, 0, 0, 0, 0), 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u);
  ExpectWords(Philox4x32(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu),
              0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu);
  ExpectWords(Philox4x32(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u),
              0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u);
}

BOOST_AUTO_TEST_CASE(uniform_doubles_lie_in_the_unit_interval_and_depend_on_every_input) {
  const double base = UniformDouble(1, 2, 3, 0, Draw::kSelect);
  BOOST_TEST(base == UniformDouble(1, 2, 3, 0, Draw::kSelect));  // a counter, not a state
  BOOST_TEST(base != UniformDouble(9, 2, 3, 0, Draw::kSelect));
  BOOST_TEST(base != UniformDouble(1, 9, 3, 0, Draw::kSelect));
  BOOST_TEST(base != UniformDouble(1, 2, 4, 0, Draw::kSelect));
  BOOST_TEST(base != UniformDouble(1, 2, 3, 1, Draw::kSelect));
  BOOST_TEST(base != UniformDouble(1, 2, 3, 0, Draw::kWindowStart));
  BOOST_TEST(base != UniformDouble(1, 2, 3, 0, Draw::kFallback));
  // 2^16 picks: every value in [0, 1), their mean within 5 standard errors (sd 1/sqrt(12 n)) of 1/2,
  // and each of 16 bins within 5 standard errors of n / 16.
  constexpr int kPicks = 1 << 16;
  double sum = 0;
  int bins[16] = {};
  for (uint32_t i = 0; i < kPicks; ++i) {
    const double u = UniformDouble(0x1234u, 0x5678u, i, 0, Draw::kSelect);
    BOOST_REQUIRE(u >= 0.0);
    BOOST_REQUIRE(u < 1.0);
    sum += u;
    ++bins[static_cast<int>(u * 16)];
  }
  BOOST_TEST(sum / kPicks == 0.5, boost::test_tools::tolerance(5 * 0.2887 / 256 / 0.5));
  for (int bin : bins) BOOST_TEST(std::abs(bin - kPicks / 16) < 5 * 62);  // sd = sqrt(n p (1 - p)) ~ 62
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace
}  // namespace gear
