// random.h — the counter-based generator behind the initializers (splitmix64's finalizer).
// Stateless: draw(stream, i) depends only on its arguments, which is what makes initial rows
// a pure function of (seed, key). DE_HD: the GPU table draws the same numbers (de_hd.h).
#ifndef DUALEMB_RANDOM_H_
#define DUALEMB_RANDOM_H_

#include <cstdint>

#include "de_hd.h"

namespace dualemb {

DE_HD inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The per-(seed, key) stream; draw(stream, i) is its i-th 64-bit output.
DE_HD inline uint64_t key_stream(uint64_t seed, uint64_t key) {
  return mix64(key ^ mix64(seed + 0x9E3779B97F4A7C15ULL));
}
DE_HD inline uint64_t draw(uint64_t stream, uint64_t i) {
  return mix64(stream + (i + 1) * 0xD1B54A32D192ED03ULL);
}

// Uniform in the open interval (0, 1) from 32 random bits.
DE_HD inline float unit_open(uint32_t bits) {
  return (static_cast<float>(bits >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

}  // namespace dualemb

#endif  // DUALEMB_RANDOM_H_
