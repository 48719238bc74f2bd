// normal.h — fast, deterministic standard normals for initializers (CPU rows).
//
// The math (Box-Muller over the core's own log and sin/cos polynomials) lives in init_math.h,
// shared with the GPU table; this is the vectorized whole-row loop the CPU table runs.
#ifndef DUALEMB_NORMAL_H_
#define DUALEMB_NORMAL_H_

#include <cstdint>

namespace dualemb {

// out[j] = mean + stddev * z_j for j < n, where (z_{2p}, z_{2p+1}) is the Box-Muller pair made
// from draw(stream, p) (kernels::normal_pair). Pure function of (stream, n); equal bit for bit
// to kernels::initial_value() of a normal InitKernel, column by column.
void fill_normal(uint64_t stream, float mean, float stddev, float* out, int64_t n);

}  // namespace dualemb

#endif  // DUALEMB_NORMAL_H_
