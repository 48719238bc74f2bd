// rmsprop.cc — RMSprop (plain, centered, with momentum).
//
// keras.optimizers.RMSprop(rho=0.9, momentum=0.0, epsilon=1e-7, centered=False) — slots
// "velocity", then "momentum" (momentum > 0), then "average_gradient" (centered), Keras' order:
//   v = rho*v + (1-rho)*g*g;  centered: a = rho*a + (1-rho)*g, den = (v - a*a) + epsilon,
//   else den = v + epsilon;  inc = (lr*g)/sqrt(den)
//   momentum: mo = momentum*mo + inc, w -= mo;  else w -= inc
// epsilon_in_sqrt=false (default true) puts epsilon outside the square root,
// inc = (lr*g)/(sqrt(den') + epsilon) with den' = den - epsilon: tf_keras' legacy RMSprop
// (OptimizerV2) without momentum, whose Python update is
// w -= lr*g / (sqrt(v [- a*a]) + epsilon). (With momentum it runs TF's ResourceApplyRMSProp /
// ResourceApplyCenteredRMSProp kernels, which take the square root of v [- a*a] + epsilon.)
// optax.rmsprop(lr, decay=0.9, eps=1e-8, initial_scale=0, eps_in_sqrt=True, centered=False,
// momentum=None, nesterov=False, bias_correction=False) — slots "mu" (centered), "nu", "trace"
// (momentum):
//   nu = (1-decay)*g*g + decay*nu;  centered: mu = (1-decay)*g + decay*mu
//   bias_correction: nu_hat = nu/(1-decay^t), mu_hat = mu/(1-decay^t)
//   s = eps_in_sqrt ? rsqrt(nu_hat [- mu_hat^2] + eps) : 1/(sqrt(nu_hat [- mu_hat^2]) + eps)
//   u = (s*g)*(-lr);  momentum: tr = u + momentum*tr, u = nesterov ? u + momentum*tr : tr
//   w += u
// Differences: Optax's trace holds lr-scaled (negative) updates while Keras' momentum holds
// positive increments; Optax's epsilon default is 1e-8, Keras' 1e-7. Optax momentum=None is
// momentum=0 here.
#include <cmath>
#include <memory>
#include <string>

#include "optimizers/common.h"

namespace dualemb {
namespace optimizers {
namespace {

class KerasRmsprop final : public OptimizerBase {
 public:
  explicit KerasRmsprop(const Config& cfg) {
    HyperParams hp(cfg, "rmsprop", Flavor::kKeras);
    const double rho = hp.real("rho", 0.9, kUnit);
    momentum_ = static_cast<float>(hp.real("momentum", 0.0, kUnit));
    eps_ = static_cast<float>(hp.real("epsilon", 1e-7, kNonNegative));
    centered_ = hp.flag("centered", false);
    eps_in_sqrt_ = hp.flag("epsilon_in_sqrt", true);
    read_keras_weight_decay(cfg, hp);
    set_spec(hp.finish());
    add_slot("velocity", 0.f);
    if (momentum_ > 0.f) add_slot("momentum", 0.f);
    if (centered_) add_slot("average_gradient", 0.f);
    k_.kind = kernels::OptKind::kKerasRmsprop;
    k_.rho = static_cast<float>(rho);
    k_.omr = static_cast<float>(1.0 - rho);
    k_.eps = eps_;
    k_.momentum_value = momentum_;
    k_.momentum = momentum_ > 0.f;
    k_.centered = centered_;
    k_.eps_in_sqrt = eps_in_sqrt_;
  }

  StepArgs prepare(float lr, int64_t step) const override { return start(lr, step); }

  void apply(float* row, float* slots, const float* grad, int64_t dim,
             const StepArgs& args) const override {
    const bool mom = momentum_ > 0.f;
    float* v = slots;
    float* mo = slots + dim;
    float* a = slots + (mom ? 2 : 1) * dim;
    decay_row(row, dim, args.lr);
    if (eps_in_sqrt_)
      dispatch<true>(row, v, mo, a, grad, dim, args.lr, mom);
    else
      dispatch<false>(row, v, mo, a, grad, dim, args.lr, mom);
  }

 private:
  template <bool kEpsInSqrt>
  void dispatch(float* w, float* v, float* mo, float* a, const float* g, int64_t dim, float lr,
                bool mom) const {
    if (centered_)
      mom ? kernel<true, true, kEpsInSqrt>(w, v, mo, a, g, dim, lr)
          : kernel<true, false, kEpsInSqrt>(w, v, mo, a, g, dim, lr);
    else
      mom ? kernel<false, true, kEpsInSqrt>(w, v, mo, a, g, dim, lr)
          : kernel<false, false, kEpsInSqrt>(w, v, mo, a, g, dim, lr);
  }

  template <bool kCentered, bool kMomentum, bool kEpsInSqrt>
  DUALEMB_SIMD_CLONES void kernel(float* __restrict w, float* __restrict v, float* __restrict mo,
                                  float* __restrict a, const float* __restrict g, int64_t dim,
                                  float lr) const {
    const kernels::OptimizerKernel k = k_;
    float unused_mo = 0.f, unused_a = 0.f;
    for (int64_t i = 0; i < dim; ++i)
      kernels::keras_rmsprop<kCentered, kMomentum, kEpsInSqrt>(
          k, lr, w[i], v[i], kMomentum ? mo[i] : unused_mo, kCentered ? a[i] : unused_a, g[i]);
  }

  float momentum_, eps_;
  bool centered_, eps_in_sqrt_;
};

class OptaxRmsprop final : public OptimizerBase {
 public:
  explicit OptaxRmsprop(const Config& cfg) {
    HyperParams hp(cfg, "rmsprop", Flavor::kOptax);
    const double decay = hp.real("decay", 0.9, kUnit);
    eps_ = static_cast<float>(hp.real("eps", 1e-8, kNonNegative));
    const float initial_scale = static_cast<float>(hp.real("initial_scale", 0.0, kNonNegative));
    eps_in_sqrt_ = hp.flag("eps_in_sqrt", true);
    centered_ = hp.flag("centered", false);
    momentum_ = static_cast<float>(hp.real("momentum", 0.0, kUnit));
    nesterov_ = hp.flag("nesterov", false);
    bias_correction_ = hp.flag("bias_correction", false);
    set_spec(hp.finish());
    if (bias_correction_ && decay == 1.0) hp.fail("bias_correction=true needs decay < 1");
    decay_ = static_cast<float>(decay);
    if (centered_) add_slot("mu", 0.f);
    add_slot("nu", initial_scale);
    if (momentum_ != 0.f) add_slot("trace", 0.f);
    k_.kind = kernels::OptKind::kOptaxRmsprop;
    k_.rho = decay_;
    k_.omr = static_cast<float>(1.0 - decay);
    k_.eps = eps_;
    k_.momentum_value = momentum_;
    k_.centered = centered_;
    k_.eps_in_sqrt = eps_in_sqrt_;
    k_.variant = momentum_ == 0.f ? 0 : nesterov_ ? 2 : 1;
  }

  StepArgs prepare(float lr, int64_t step) const override {
    StepArgs a = start(lr, step);
    // XLA evaluates nu / bc as nu * (1 / bc).
    a.c[0] = bias_correction_ ? 1.f / (1.f - pow_step(decay_, step)) : 1.f;
    return a;
  }

  void apply(float* row, float* slots, const float* grad, int64_t dim,
             const StepArgs& args) const override {
    const float ibc = static_cast<float>(args.c[0]);
    float* mu = slots;
    float* nu = slots + (centered_ ? dim : 0);
    float* tr = nu + dim;
    const int variant = (centered_ ? 1 : 0) | (eps_in_sqrt_ ? 2 : 0);
    switch (variant) {
      case 0: dispatch<false, false>(row, mu, nu, tr, grad, dim, -args.lr, ibc); break;
      case 1: dispatch<true, false>(row, mu, nu, tr, grad, dim, -args.lr, ibc); break;
      case 2: dispatch<false, true>(row, mu, nu, tr, grad, dim, -args.lr, ibc); break;
      default: dispatch<true, true>(row, mu, nu, tr, grad, dim, -args.lr, ibc); break;
    }
  }

 private:
  template <bool kCentered, bool kEpsInSqrt>
  void dispatch(float* w, float* mu, float* nu, float* tr, const float* g, int64_t dim, float nlr,
                float ibc) const {
    if (momentum_ == 0.f)
      kernel<kCentered, kEpsInSqrt, 0>(w, mu, nu, tr, g, dim, nlr, ibc);
    else if (nesterov_)
      kernel<kCentered, kEpsInSqrt, 2>(w, mu, nu, tr, g, dim, nlr, ibc);
    else
      kernel<kCentered, kEpsInSqrt, 1>(w, mu, nu, tr, g, dim, nlr, ibc);
  }

  // kTrace: 0 no momentum, 1 momentum, 2 Nesterov momentum.
  template <bool kCentered, bool kEpsInSqrt, int kTrace>
  DUALEMB_SIMD_CLONES void kernel(float* __restrict w, float* __restrict mu, float* __restrict nu,
                                  float* __restrict tr, const float* __restrict g, int64_t dim,
                                  float nlr, float ibc) const {
    const kernels::OptimizerKernel k = k_;
    float unused_mu = 0.f, unused_tr = 0.f;
    for (int64_t i = 0; i < dim; ++i)
      kernels::optax_rmsprop<kCentered, kEpsInSqrt, kTrace>(
          k, nlr, ibc, w[i], kCentered ? mu[i] : unused_mu, nu[i],
          kTrace != 0 ? tr[i] : unused_tr, g[i]);
  }

  float decay_, eps_, momentum_;
  bool eps_in_sqrt_, centered_, nesterov_, bias_correction_;
};

}  // namespace

std::unique_ptr<Optimizer> make_rmsprop(const Config& cfg, const std::string& name,
                                        Flavor flavor) {
  (void)name;
  if (flavor == Flavor::kKeras) return std::make_unique<KerasRmsprop>(cfg);
  return std::make_unique<OptaxRmsprop>(cfg);
}

}  // namespace optimizers
}  // namespace dualemb
