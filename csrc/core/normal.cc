#include "normal.h"

#include "init_math.h"
#include "random.h"

namespace dualemb {
namespace {

constexpr int kBlock = 32;  // pairs per vectorized block

}  // namespace

// Cloned for AVX2 (picked at load time); no FMA in either clone, so both give the same bits.
// The loop is split in blocks (draws, then the math, then the interleaved stores) so that gcc
// vectorizes the polynomials; each element is still kernels::normal_pair's expression.
__attribute__((target_clones("avx2", "default")))
void fill_normal(uint64_t stream, float mean, float stddev, float* out, int64_t n) {
  using kernels::cos_sin_turn;
  using kernels::log_unit;
  const int64_t pairs = (n + 1) / 2;
  float u1[kBlock], u2[kBlock], z0[kBlock], z1[kBlock];
  for (int64_t base = 0; base < pairs; base += kBlock) {
    const int m = static_cast<int>(pairs - base < kBlock ? pairs - base : kBlock);
    for (int i = 0; i < m; ++i) {
      const uint64_t b = draw(stream, static_cast<uint64_t>(base + i));
      u1[i] = kernels::u1_of(b);
      u2[i] = kernels::u2_of(b);
    }
    for (int i = 0; i < m; ++i) {
      const float r = hd::sqrt_rn(-2.f * log_unit(u1[i]));
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
