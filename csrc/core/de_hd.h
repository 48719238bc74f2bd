// de_hd.h — what lets one header of per-key math compile for both the CPU core (g++) and the
// GPU table (nvcc), giving the same bits on both.
//
// DE_HD marks a function callable from host and device code (`__host__ __device__` under nvcc,
// nothing under a plain C++ compiler). The helpers below are the only elementary operations the
// per-key math uses besides + - * /, each chosen to be correctly rounded (or exact) on both sides:
//  * sqrt: the host's std::sqrt(float) (sqrtss) and the device's __fsqrt_rn are both the IEEE
//    square root, whatever -use_fast_math / -prec-sqrt an including target passes;
//  * max/min: std::max/std::min's exact semantics (a NaN in the first argument is kept), which
//    fmaxf/fminf do not have;
//  * bit casts between float and uint32.
// Both compilers must be told not to contract a*b+c into an FMA: -ffp-contract=off for g++ (and
// for nvcc's host compiler, -Xcompiler), --fmad=false for nvcc's device code (CMakeLists.txt).
#ifndef DUALEMB_DE_HD_H_
#define DUALEMB_DE_HD_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DE_HD __host__ __device__
#else
#define DE_HD
#endif

namespace dualemb {
namespace hd {

DE_HD inline float sqrt_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// std::max(a, b): b if a < b, else a.
DE_HD inline float max_of(float a, float b) { return a < b ? b : a; }
// std::min(a, b): b if b < a, else a.
DE_HD inline float min_of(float a, float b) { return b < a ? b : a; }

DE_HD inline float abs_of(float x) {
#if defined(__CUDA_ARCH__)
  return fabsf(x);
#else
  return std::fabs(x);
#endif
}

DE_HD inline uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
#endif
}

DE_HD inline float float_of(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, 4);
  return x;
#endif
}

}  // namespace hd
}  // namespace dualemb

#endif  // DUALEMB_DE_HD_H_
