// adamax.cc — Adamax.
//
// keras.optimizers.Adamax(beta_1=0.9, beta_2=0.999, epsilon=1e-7) — slots "momentum", "norm":
//   m += (g - m)*(1 - beta_1);  u = max(beta_2*u, |g|)
//   w -= (lr*m) / ((1 - beta_1^t) * (u + epsilon))
// optax.adamax(lr, b1=0.9, b2=0.999, eps=1e-8) — slots "mu", "nu":
//   mu = (1-b1)*g + b1*mu;  nu = max(|g| + eps, b2*nu)     (eps inside the running max)
//   w += ((mu/(1-b1^t)) / nu) * (-lr)
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "optimizers/common.h"

namespace dualemb {
namespace optimizers {
namespace {

class Adamax final : public OptimizerBase {
 public:
  Adamax(const Config& cfg, const std::string& name, Flavor flavor) : flavor_(flavor) {
    HyperParams hp(cfg, name, flavor);
    const bool keras = flavor == Flavor::kKeras;
    const double b1 = hp.real(keras ? "beta_1" : "b1", 0.9, kUnitOpenHigh);
    const double b2 = hp.real(keras ? "beta_2" : "b2", 0.999, kUnit);
    const float eps = static_cast<float>(hp.real(keras ? "epsilon" : "eps", keras ? 1e-7 : 1e-8,
                                                 kNonNegative));
    if (keras) read_keras_weight_decay(cfg, hp);
    set_spec(hp.finish());
    b1_ = static_cast<float>(b1);
    k_.kind = keras ? kernels::OptKind::kKerasAdamax : kernels::OptKind::kOptaxAdamax;
    k_.b1 = b1_;
    k_.b2 = static_cast<float>(b2);
    k_.omb1 = static_cast<float>(1.0 - b1);
    k_.eps = eps;
    add_slot(keras ? "momentum" : "mu", 0.f);
    add_slot(keras ? "norm" : "nu", 0.f);
  }

  StepArgs prepare(float lr, int64_t step) const override {
    StepArgs a = start(lr, step);
    const float bc1 = 1.f - pow_step(b1_, step);
    a.c[0] = bc1;
    a.c[1] = 1.f / bc1;  // optax: XLA evaluates mu / bc1 as mu * (1 / bc1)
    return a;
  }

  void apply(float* row, float* slots, const float* grad, int64_t dim,
             const StepArgs& args) const override {
    decay_row(row, dim, args.lr);
    if (flavor_ == Flavor::kKeras)
      keras(row, slots, slots + dim, grad, dim, args.lr, static_cast<float>(args.c[0]));
    else
      optax(row, slots, slots + dim, grad, dim, -args.lr, static_cast<float>(args.c[1]));
  }

 private:
  void keras(float* __restrict w, float* __restrict m, float* __restrict u,
             const float* __restrict g, int64_t dim, float lr, float bc1) const {
    const kernels::OptimizerKernel k = k_;
    for (int64_t i = 0; i < dim; ++i) kernels::keras_adamax(k, lr, bc1, w[i], m[i], u[i], g[i]);
  }
  void optax(float* __restrict w, float* __restrict mu, float* __restrict nu,
             const float* __restrict g, int64_t dim, float nlr, float inv_bc1) const {
    const kernels::OptimizerKernel k = k_;
    for (int64_t i = 0; i < dim; ++i)
      kernels::optax_adamax(k, nlr, inv_bc1, w[i], mu[i], nu[i], g[i]);
  }

  Flavor flavor_;
  float b1_;
};

}  // namespace

std::unique_ptr<Optimizer> make_adamax(const Config& cfg, const std::string& name,
                                       Flavor flavor) {
  return std::make_unique<Adamax>(cfg, name, flavor);
}

}  // namespace optimizers
}  // namespace dualemb
