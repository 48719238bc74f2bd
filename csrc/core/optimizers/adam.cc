// adam.cc — Adam, AdamW, AMSGrad (and Optax's Nesterov variants of adam/adamw).
//
// keras.optimizers.Adam(beta_1=0.9, beta_2=0.999, epsilon=1e-7, amsgrad=False), AdamW adds
// weight_decay=0.004. Slots "momentum", "velocity" (+ "velocity_hat" with amsgrad):
//   AdamW (or Adam given weight_decay), first:  w = w - (w*weight_decay)*lr
//   alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)              (float32 scalars)
//   m += (g - m)*(1 - beta_1);  v += (g*g - v)*(1 - beta_2)
//   amsgrad: vh = max(vh, v), v := vh
//   w -= (m*alpha) / (sqrt(v) + epsilon)
// optax.adam(b1=0.9, b2=0.999, eps=1e-8, eps_root=0, nesterov=False), optax.adamw(... ,
// weight_decay=1e-4, nesterov=False), optax.amsgrad(b1, b2, eps, eps_root, bias_correction_mu=True,
// bias_correction_nu=True). Slots "mu", "nu" (+ "nu_max" with amsgrad):
//   mu = (1-b1)*g + b1*mu;  nu = (1-b2)*g*g + b2*nu
//   mu_hat = mu/(1-b1^t)   [nesterov: b1*(mu/(1-b1^(t+1))) + (1-b1)*(g/(1-b1^t))]
//   nu_hat = nu/(1-b2^t)
//   (XLA evaluates these divisions by a scalar as x * (1/scalar); so does this file)
//   amsgrad: nu_max = max(nu_max, nu_hat) (optax keeps the max of the *bias-corrected* nu; Keras of
//   the raw v), nu_hat := nu_max
//   u = mu_hat / (sqrt(nu_hat + eps_root) + eps);  adamw: u += weight_decay*w;  w += u*(-lr)
// Spec: name=adam with amsgrad=true selects optax.amsgrad; name=amsgrad is an alias of that
// (canonical name adam). optax.adam(nesterov=True) is optax.nadam (also name=nadam, flavor=optax).
#include <algorithm>
#include <memory>
#include <string>

#include "optimizers/common.h"

namespace dualemb {
namespace optimizers {
namespace {

class KerasAdam final : public OptimizerBase {
 public:
  KerasAdam(const Config& cfg, const std::string& name) {
    const bool adamw = name == "adamw";
    HyperParams hp(cfg, adamw ? "adamw" : "adam", Flavor::kKeras);
    // AdamW is Adam with Keras' generic weight decay, which AdamW defaults to 0.004.
    if (adamw)
      set_keras_weight_decay(static_cast<float>(hp.real("weight_decay", 0.004, kNonNegative)));
    else
      read_keras_weight_decay(cfg, hp);
    const double b1 = hp.real("beta_1", 0.9, kUnitOpenHigh);
    const double b2 = hp.real("beta_2", 0.999, kUnitOpenHigh);
    eps_ = static_cast<float>(hp.real("epsilon", 1e-7, kNonNegative));
    amsgrad_ = hp.flag("amsgrad", name == "amsgrad");
    if (name == "amsgrad" && !amsgrad_) hp.fail("name=amsgrad contradicts amsgrad=false");
    set_spec(hp.finish());
    b1_ = static_cast<float>(b1);
    b2_ = static_cast<float>(b2);
    k_.kind = kernels::OptKind::kKerasAdam;
    k_.omb1 = static_cast<float>(1.0 - b1);  // Keras: `1 - self.beta_1` in Python, then cast
    k_.omb2 = static_cast<float>(1.0 - b2);
    k_.eps = eps_;
    k_.amsgrad = amsgrad_;
    add_slot("momentum", 0.f);
    add_slot("velocity", 0.f);
    if (amsgrad_) add_slot("velocity_hat", 0.f);
  }

  StepArgs prepare(float lr, int64_t step) const override {
    StepArgs a = start(lr, step);
    const float b1p = pow_step(b1_, step), b2p = pow_step(b2_, step);
    a.c[0] = (lr * std::sqrt(1.f - b2p)) / (1.f - b1p);  // alpha
    return a;
  }

  void apply(float* row, float* slots, const float* grad, int64_t dim,
             const StepArgs& args) const override {
    const float alpha = static_cast<float>(args.c[0]);
    float* m = slots;
    float* v = slots + dim;
    float* vh = slots + 2 * dim;
    decay_row(row, dim, args.lr);
    if (amsgrad_)
      kernel<true>(row, m, v, vh, grad, dim, alpha);
    else
      kernel<false>(row, m, v, vh, grad, dim, alpha);
  }

 private:
  template <bool kAms>
  DUALEMB_SIMD_CLONES void kernel(float* __restrict w, float* __restrict m, float* __restrict v,
                                  float* __restrict vh, const float* __restrict g, int64_t dim,
                                  float alpha) const {
    const kernels::OptimizerKernel k = k_;
    float unused = 0.f;
    for (int64_t i = 0; i < dim; ++i)
      kernels::keras_adam<kAms>(k, alpha, w[i], m[i], v[i], kAms ? vh[i] : unused, g[i]);
  }

  float b1_, b2_, eps_;
  bool amsgrad_;
};

class OptaxAdam final : public OptimizerBase {
 public:
  // name: adam, amsgrad, adamw, or nadam (= adam with nesterov=true, no amsgrad).
  OptaxAdam(const Config& cfg, const std::string& name) {
    const bool adamw = name == "adamw";
    const bool nadam = name == "nadam";
    HyperParams hp(cfg, (adamw || nadam) ? name : "adam", Flavor::kOptax);
    const double b1 = hp.real("b1", 0.9, kUnitOpenHigh);
    const double b2 = hp.real("b2", 0.999, kUnitOpenHigh);
    const float eps = static_cast<float>(hp.real("eps", 1e-8, kNonNegative));
    const float eps_root = static_cast<float>(hp.real("eps_root", 0.0, kNonNegative));
    const float wd = adamw ? static_cast<float>(hp.real("weight_decay", 1e-4, kNonNegative)) : 0.f;
    nesterov_ = nadam ? true : hp.flag("nesterov", false);
    amsgrad_ = false;
    bc_mu_ = bc_nu_ = true;
    if (!adamw && !nadam) {
      amsgrad_ = hp.flag("amsgrad", name == "amsgrad");
      if (name == "amsgrad" && !amsgrad_) hp.fail("name=amsgrad contradicts amsgrad=false");
      if (amsgrad_) {
        if (nesterov_)
          hp.fail("nesterov=true cannot be combined with amsgrad=true (no such optax optimizer)");
        bc_mu_ = hp.flag("bias_correction_mu", true);
        bc_nu_ = hp.flag("bias_correction_nu", true);
      } else if (cfg.has("bias_correction_mu") || cfg.has("bias_correction_nu")) {
        hp.fail("bias_correction_mu/bias_correction_nu need amsgrad=true (optax.amsgrad)");
      }
    }
    set_spec(hp.finish());
    b1_ = static_cast<float>(b1);
    b2_ = static_cast<float>(b2);
    decay_ = adamw && wd != 0.f;
    k_.kind = kernels::OptKind::kOptaxAdam;
    k_.b1 = b1_;
    k_.b2 = b2_;
    k_.omb1 = static_cast<float>(1.0 - b1);  // Optax: `(1 - decay)` in Python, weakly typed
    k_.omb2 = static_cast<float>(1.0 - b2);
    k_.eps = eps;
    k_.eps_root = eps_root;
    k_.wd = wd;
    k_.nesterov = nesterov_;
    k_.amsgrad = amsgrad_;
    k_.decay = decay_;
    add_slot("mu", 0.f);
    add_slot("nu", 0.f);
    if (amsgrad_) add_slot("nu_max", 0.f);
  }

  // XLA turns `x / scalar` into `x * (1 / scalar)`, so the bias corrections are reciprocals.
  StepArgs prepare(float lr, int64_t step) const override {
    StepArgs a = start(lr, step);
    a.c[0] = bc_mu_ ? 1.f / (1.f - pow_step(b1_, step)) : 1.f;
    a.c[1] = bc_nu_ ? 1.f / (1.f - pow_step(b2_, step)) : 1.f;
    a.c[2] = 1.f / (1.f - pow_step(b1_, step + 1));
    return a;
  }

  void apply(float* row, float* slots, const float* grad, int64_t dim,
             const StepArgs& args) const override {
    const kernels::StepScalars s = step_scalars(args);
    if (amsgrad_)
      kernel<false, true, false>(row, slots, grad, dim, s);
    else if (nesterov_)
      decay_ ? kernel<true, false, true>(row, slots, grad, dim, s)
             : kernel<true, false, false>(row, slots, grad, dim, s);
    else
      decay_ ? kernel<false, false, true>(row, slots, grad, dim, s)
             : kernel<false, false, false>(row, slots, grad, dim, s);
  }

 private:
  template <bool kNesterov, bool kAms, bool kDecay>
  DUALEMB_SIMD_CLONES void kernel(float* __restrict w, float* __restrict slots,
                                  const float* __restrict g, int64_t dim,
                                  const kernels::StepScalars& scalars) const {
    float* __restrict mu = slots;
    float* __restrict nu = slots + dim;
    float* __restrict nm = slots + 2 * dim;
    const kernels::OptimizerKernel k = k_;
    const kernels::StepScalars s = scalars;
    float unused = 0.f;
    for (int64_t i = 0; i < dim; ++i)
      kernels::optax_adam<kNesterov, kAms, kDecay>(k, s, w[i], mu[i], nu[i],
                                                   kAms ? nm[i] : unused, g[i]);
  }

  float b1_, b2_;
  bool nesterov_, amsgrad_, bc_mu_, bc_nu_, decay_;
};

}  // namespace

std::unique_ptr<Optimizer> make_adam(const Config& cfg, const std::string& name, Flavor flavor) {
  if (flavor == Flavor::kKeras) return std::make_unique<KerasAdam>(cfg, name);
  return std::make_unique<OptaxAdam>(cfg, name);
}

// optax.nadam = optax.adam(nesterov=True). (Keras Nadam is a different algorithm: nadam.cc.)
std::unique_ptr<Optimizer> make_optax_nadam(const Config& cfg) {
  return std::make_unique<OptaxAdam>(cfg, "nadam");
}

}  // namespace optimizers
}  // namespace dualemb
