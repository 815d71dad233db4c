// Philox-4x32-10 (Salmon et al., SC'11): a counter-based generator, identical on the CPU and the GPU.
// The seed comes from the JAX key (two 32-bit words drawn in the Python wrapper); the counter names the
// pick, the attempt and the purpose of a draw, so every backend draws the same numbers for the same key.
#pragma once

#include <cstdint>

#include "table_view.h"

namespace gear {

struct Philox4 {
  uint32_t v[4];
};

GEAR_HD uint32_t MulHiLo32(uint32_t a, uint32_t b, uint32_t* hi) {
  uint64_t product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(product >> 32);
  return static_cast<uint32_t>(product);
}

GEAR_HD Philox4 Philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    uint32_t lo0 = MulHiLo32(kMul0, c0, &hi0);
    uint32_t lo1 = MulHiLo32(kMul1, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Purposes of a draw (third counter word), so that streams never overlap.
enum class Draw : uint32_t { kSelect = 0, kWindowStart = 1, kFallback = 2, kShuffle = 3 };

// A uniform double in [0, 1) with 53 random bits, for pick `index`, attempt `attempt`.
GEAR_HD double UniformDouble(uint32_t seed0, uint32_t seed1, uint32_t index, uint32_t attempt, Draw purpose) {
  Philox4 r =
      Philox4x32(index, attempt, static_cast<uint32_t>(purpose), 0x67656172u /* "gear" */, seed0, seed1);
  uint64_t bits = (static_cast<uint64_t>(r.v[0]) << 21) ^ static_cast<uint64_t>(r.v[1] >> 11);
  bits &= (uint64_t{1} << 53) - 1;
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
}

}  // namespace gear
