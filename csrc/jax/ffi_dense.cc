// ffi_dense.cc — Keras 3's Adam for a model's dense parameters (dualemb.interop.keras_adam).
//
// Not a table call: the Optax transformation that lets a JAX model's dense weights follow
// keras.optimizers.Adam bit for bit. In XLA the same expressions would be fused into one loop
// and `m + (g - m) * c` contracted into a fused multiply-add (XLA's CPU backend always allows
// it, and removes optimization barriers before fusion), which rounds once where Keras rounds
// twice; here the math is the core's (optimizer_math.h), compiled with -ffp-contract=off.
#include "ffi_common.h"
#include "ffi_handlers.h"
#include "optimizer_math.h"

namespace dualemb_jax {
namespace {

// hyper: float32[4] = {alpha, 1 - beta_1, 1 - beta_2, epsilon}, alpha = lr * sqrt(1 - beta_2^t)
// / (1 - beta_1^t) computed by the caller (as Keras does, per step). grads, m, v: one leaf, any
// shape. Results: the Optax update (-step), and the new m and v.
ffi::Error DenseKerasAdamImpl(ffi::Buffer<ffi::F32> hyper, ffi::Buffer<ffi::F32> grads,
                              ffi::Buffer<ffi::F32> m_in, ffi::Buffer<ffi::F32> v_in,
                              ffi::ResultBuffer<ffi::F32> update, ffi::ResultBuffer<ffi::F32> m_out,
                              ffi::ResultBuffer<ffi::F32> v_out) {
  const size_t n = grads.element_count();
  if (hyper.element_count() != 4 || m_in.element_count() != n || v_in.element_count() != n ||
      update->element_count() != n || m_out->element_count() != n || v_out->element_count() != n)
    return ffi::Error::InvalidArgument(
        "dualemb dense_keras_adam: hyper must be float32[4] and the gradient, moments and "
        "results of one shape");
  const float* h = hyper.typed_data();
  const float alpha = h[0], omb1 = h[1], omb2 = h[2], eps = h[3];
  const float* g = grads.typed_data();
  const float* mi = m_in.typed_data();
  const float* vi = v_in.typed_data();
  float* u = update->typed_data();
  float* mo = m_out->typed_data();
  float* vo = v_out->typed_data();
  for (size_t j = 0; j < n; ++j) {
    float m = mi[j], v = vi[j];
    dualemb::kernels::keras_adam_moments(omb1, omb2, m, v, g[j]);
    u[j] = -dualemb::kernels::keras_adam_step(alpha, eps, m, v);
    mo[j] = m;
    vo[j] = v;
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace dualemb_jax

using namespace dualemb_jax;  // NOLINT

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_dense_keras_adam, DenseKerasAdamImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
