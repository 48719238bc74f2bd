#include "normal.h"

#include <cmath>
#include <cstring>

#include "random.h"

namespace dualemb {
namespace {

constexpr int kBlock = 32;  // pairs per vectorized block

// ln(x) for x in (0, 1]: x = m * 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(t),
// t = (m - 1) / (m + 1), |t| < 0.172, series to t^9 (error < 2e-9).
inline float log_unit(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  int32_t e = static_cast<int32_t>((bits >> 23) & 0xff) - 127;
  uint32_t mb = (bits & 0x7fffffu) | 0x3f800000u;
  float m;
  std::memcpy(&m, &mb, 4);
  const bool big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  e = big ? e + 1 : e;
  const float t = (m - 1.f) / (m + 1.f);
  const float t2 = t * t;
  const float p = t * (2.f + t2 * (0.6666666667f + t2 * (0.4f + t2 * (0.2857142857f +
                                                                       t2 * 0.2222222222f))));
  return p + static_cast<float>(e) * 0.69314718056f;
}

// cos and sin of 2*pi*u for u in [0, 1): reduce to theta in [-pi/4, pi/4] plus a quadrant.
inline void cos_sin_turn(float u, float* c, float* s) {
  const float x = u * 4.f;
  const int q = static_cast<int>(x + 0.5f);
  const float th = (x - static_cast<float>(q)) * 1.57079632679f;
  const float t2 = th * th;
  const float sn = th * (1.f + t2 * (-1.6666666667e-1f + t2 * (8.3333333333e-3f +
                                     t2 * (-1.9841269841e-4f + t2 * 2.7557319224e-6f))));
  const float cs = 1.f + t2 * (-0.5f + t2 * (4.1666666667e-2f + t2 * (-1.3888888889e-3f +
                                t2 * 2.4801587302e-5f)));
  const int qq = q & 3;
  *c = qq == 0 ? cs : qq == 1 ? -sn : qq == 2 ? -cs : sn;
  *s = qq == 0 ? sn : qq == 1 ? cs : qq == 2 ? -sn : -cs;
}

inline float u1_of(uint64_t bits) {  // (0, 1], 32 bits of resolution near 0
  return (static_cast<float>(static_cast<uint32_t>(bits >> 32)) + 0.5f) * 2.3283064365386963e-10f;
}
inline float u2_of(uint64_t bits) {  // [0, 1)
  return static_cast<float>(static_cast<uint32_t>(bits) >> 8) * (1.0f / 16777216.0f);
}

}  // namespace

void normal_pair_fast(uint64_t bits, float* z0, float* z1) {
  const float r = std::sqrt(-2.f * log_unit(u1_of(bits)));
  float c, s;
  cos_sin_turn(u2_of(bits), &c, &s);
  *z0 = r * c;
  *z1 = r * s;
}

// Cloned for AVX2 (picked at load time); no FMA in either clone, so both give the same bits.
__attribute__((target_clones("avx2", "default")))
void fill_normal(uint64_t stream, float mean, float stddev, float* out, int64_t n) {
  const int64_t pairs = (n + 1) / 2;
  float u1[kBlock], u2[kBlock], z0[kBlock], z1[kBlock];
  for (int64_t base = 0; base < pairs; base += kBlock) {
    const int m = static_cast<int>(pairs - base < kBlock ? pairs - base : kBlock);
    for (int i = 0; i < m; ++i) {
      const uint64_t b = draw(stream, static_cast<uint64_t>(base + i));
      u1[i] = u1_of(b);
      u2[i] = u2_of(b);
    }
    for (int i = 0; i < m; ++i) {
      const float r = std::sqrt(-2.f * log_unit(u1[i]));
      float c, s;
      cos_sin_turn(u2[i], &c, &s);
      z0[i] = mean + stddev * (r * c);
      z1[i] = mean + stddev * (r * s);
    }
    float* o = out + 2 * base;
    const int64_t left = n - 2 * base;
    if (left >= 2 * m) {
      for (int i = 0; i < m; ++i) {
        o[2 * i] = z0[i];
        o[2 * i + 1] = z1[i];
      }
    } else {
      for (int i = 0; 2 * i < left; ++i) {
        o[2 * i] = z0[i];
        if (2 * i + 1 < left) o[2 * i + 1] = z1[i];
      }
    }
  }
}

}  // namespace dualemb
