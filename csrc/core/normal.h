// normal.h — fast, deterministic standard normals for initializers.
//
// Box-Muller with our own float32 log and sin/cos polynomials instead of libm: plain arithmetic
// that gcc vectorizes, and that gives the same bits on every x86-64 machine (libm's results can
// differ between versions; the core is built with -ffp-contract=off, so no FMA changes rounding).
// Accuracy ~1e-7 relative, far below what initial values need; tails reach 6.66 sigma.
#ifndef DUALEMB_NORMAL_H_
#define DUALEMB_NORMAL_H_

#include <cstdint>

namespace dualemb {

// out[j] = mean + stddev * z_j for j < n, where (z_{2p}, z_{2p+1}) is the Box-Muller pair made
// from draw(stream, p). Pure function of (stream, n).
void fill_normal(uint64_t stream, float mean, float stddev, float* out, int64_t n);

// The single pair from 64 random bits (used for redraws of the truncated normal).
void normal_pair_fast(uint64_t bits, float* z0, float* z1);

}  // namespace dualemb

#endif  // DUALEMB_NORMAL_H_
