// init_math.h — initial values as a pure function of (seed, key, column), for the CPU core and
// the GPU table alike (DE_HD functions; de_hd.h).
//
// Standard normals come from Box-Muller with the core's own float32 log and sin/cos polynomials
// instead of libm's or CUDA's: plain + - * / (and a correctly rounded sqrt) give the same bits on
// every x86-64 machine and on the GPU (no FMA contraction on either side). Accuracy ~1e-7
// relative, far below what initial values need; tails reach 6.66 sigma.
//
// The CPU Initializer (initializer.cc, normal.cc) computes whole rows with vectorized loops over
// these functions; the GPU table calls initial_value() per element through the POD InitKernel.
#ifndef DUALEMB_INIT_MATH_H_
#define DUALEMB_INIT_MATH_H_

#include <cstdint>

#include "de_hd.h"
#include "random.h"

namespace dualemb {
namespace kernels {

// ln(x) for x in (0, 1]: x = m * 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(t),
// t = (m - 1) / (m + 1), |t| < 0.172, series to t^9 (error < 2e-9).
DE_HD inline float log_unit(float x) {
  const uint32_t bits = hd::bits_of(x);
  int32_t e = static_cast<int32_t>((bits >> 23) & 0xff) - 127;
  float m = hd::float_of((bits & 0x7fffffu) | 0x3f800000u);
  const bool big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  e = big ? e + 1 : e;
  const float t = (m - 1.f) / (m + 1.f);
  const float t2 = t * t;
  const float p =
      t * (2.f + t2 * (0.6666666667f + t2 * (0.4f + t2 * (0.2857142857f + t2 * 0.2222222222f))));
  return p + static_cast<float>(e) * 0.69314718056f;
}

// cos and sin of 2*pi*u for u in [0, 1): reduce to theta in [-pi/4, pi/4] plus a quadrant.
DE_HD inline void cos_sin_turn(float u, float* c, float* s) {
  const float x = u * 4.f;
  const int q = static_cast<int>(x + 0.5f);
  const float th = (x - static_cast<float>(q)) * 1.57079632679f;
  const float t2 = th * th;
  const float sn =
      th *
      (1.f + t2 * (-1.6666666667e-1f +
                   t2 * (8.3333333333e-3f + t2 * (-1.9841269841e-4f + t2 * 2.7557319224e-6f))));
  const float cs =
      1.f +
      t2 * (-0.5f + t2 * (4.1666666667e-2f + t2 * (-1.3888888889e-3f + t2 * 2.4801587302e-5f)));
  const int qq = q & 3;
  *c = qq == 0 ? cs : qq == 1 ? -sn : qq == 2 ? -cs : sn;
  *s = qq == 0 ? sn : qq == 1 ? cs : qq == 2 ? -sn : -cs;
}

DE_HD inline float u1_of(uint64_t bits) {  // (0, 1], 32 bits of resolution near 0
  return (static_cast<float>(static_cast<uint32_t>(bits >> 32)) + 0.5f) * 2.3283064365386963e-10f;
}
DE_HD inline float u2_of(uint64_t bits) {  // [0, 1)
  return static_cast<float>(static_cast<uint32_t>(bits) >> 8) * (1.0f / 16777216.0f);
}

// Box-Muller radius sqrt(-2 ln u1) of 64 random bits.
DE_HD inline float normal_radius(uint64_t bits) {
  return hd::sqrt_rn(-2.f * log_unit(u1_of(bits)));
}

// The standard normal pair (r cos, r sin) of 64 random bits.
DE_HD inline void normal_pair(uint64_t bits, float* z0, float* z1) {
  const float r = normal_radius(bits);
  float c, s;
  cos_sin_turn(u2_of(bits), &c, &s);
  *z0 = r * c;
  *z1 = r * s;
}

// Uniform initializer's value of column j: lo + span * u, u in (0, 1) from the high 32 bits.
DE_HD inline float uniform_value(uint64_t stream, int64_t j, float lo, float span) {
  const float u = unit_open(static_cast<uint32_t>(draw(stream, static_cast<uint64_t>(j)) >> 32));
  return lo + span * u;
}

// Truncated normal (Keras' TruncatedNormal): draws beyond two standard deviations are redrawn
// from further counters of the same stream (pair j + attempt * dim), so the row stays a pure
// function of (seed, key).
DE_HD inline float truncated_normal_value(uint64_t stream, int64_t j, int64_t dim, float mean,
                                          float sd) {
  float z0 = 0.f, z1;
  for (uint64_t attempt = 0; attempt < 1000; ++attempt) {
    normal_pair(draw(stream, static_cast<uint64_t>(j) + attempt * static_cast<uint64_t>(dim)), &z0,
                &z1);
    if (hd::abs_of(z0) <= 2.f) break;
    if (hd::abs_of(z1) <= 2.f) {
      z0 = z1;
      break;
    }
  }
  return mean + sd * z0;
}

// Everything initial_value() reads, as plain data. `vector` points to dim floats (kVector): host
// memory for the CPU, device memory once the GPU table has copied it.
struct InitKernel {
  enum Kind : int32_t { kZeros, kConstant, kVector, kNormal, kTruncatedNormal, kUniform };
  Kind kind = kZeros;
  int64_t dim = 1;
  uint64_t seed = 0;
  float a = 0.f;  // constant value, mean, or minval
  float b = 0.f;  // stddev, or maxval - minval (computed in double, rounded once)
  const float* vector = nullptr;
};

// The initial value of column j of key's row: exactly what Initializer::fill writes there.
DE_HD inline float initial_value(const InitKernel& p, uint64_t key, int64_t j) {
  switch (p.kind) {
    case InitKernel::kZeros: return 0.f;
    case InitKernel::kConstant: return p.a;
    case InitKernel::kVector: return p.vector[j];
    case InitKernel::kUniform: return uniform_value(key_stream(p.seed, key), j, p.a, p.b);
    case InitKernel::kNormal: {
      // Column j is half j % 2 of the pair drawn from counter j / 2 (as normal.cc's fill_normal).
      float z0, z1;
      normal_pair(draw(key_stream(p.seed, key), static_cast<uint64_t>(j / 2)), &z0, &z1);
      return p.a + p.b * ((j & 1) ? z1 : z0);
    }
    case InitKernel::kTruncatedNormal:
      return truncated_normal_value(key_stream(p.seed, key), j, p.dim, p.a, p.b);
  }
  return 0.f;
}

}  // namespace kernels
}  // namespace dualemb

#endif  // DUALEMB_INIT_MATH_H_
