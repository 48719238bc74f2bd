// lion.cc — Lion.
//
// keras.optimizers.Lion(beta_1=0.9, beta_2=0.99) — slot "momentum" (Keras: 0 < beta_1 <= 1):
//   w -= lr*sign(m*beta_1 + g*(1 - beta_1));  m = m*beta_2 + g*(1 - beta_2)   (1 - beta in float32)
// optax.lion(lr, b1=0.9, b2=0.99, weight_decay=1e-3) — slot "mu":
//   u = sign((1-b1)*g + b1*mu);  mu = (1-b2)*g + b2*mu;  u += weight_decay*w;  w += u*(-lr)
// Note the different default: optax.lion decays weights (1e-3) by default, Keras Lion does not
// unless given Keras' generic weight_decay (w = w - (w*weight_decay)*lr before the step).
#include <memory>
#include <string>

#include "optimizers/common.h"

namespace dualemb {
namespace optimizers {
namespace {

class Lion final : public OptimizerBase {
 public:
  Lion(const Config& cfg, const std::string& name, Flavor flavor) : flavor_(flavor) {
    HyperParams hp(cfg, name, flavor);
    const bool keras = flavor == Flavor::kKeras;
    const double b1 =
        hp.real(keras ? "beta_1" : "b1", 0.9, keras ? Range{0.0, 1.0, true, false} : kUnit);
    const double b2 = hp.real(keras ? "beta_2" : "b2", 0.99, kUnit);
    wd_ = keras ? 0.f : static_cast<float>(hp.real("weight_decay", 1e-3, kNonNegative));
    if (keras) read_keras_weight_decay(cfg, hp);
    set_spec(hp.finish());
    k_.kind = keras ? kernels::OptKind::kKerasLion : kernels::OptKind::kOptaxLion;
    k_.b1 = static_cast<float>(b1);
    k_.b2 = static_cast<float>(b2);
    if (keras) {  // Keras: 1.0 - ops.cast(beta, float32)
      k_.omb1 = 1.f - k_.b1;
      k_.omb2 = 1.f - k_.b2;
    } else {  // Optax: (1.0 - b1) in Python
      k_.omb1 = static_cast<float>(1.0 - b1);
      k_.omb2 = static_cast<float>(1.0 - b2);
    }
    k_.wd = wd_;
    k_.decay = !keras && wd_ != 0.f;
    add_slot(keras ? "momentum" : "mu", 0.f);
  }

  StepArgs prepare(float lr, int64_t step) const override { return start(lr, step); }

  void apply(float* row, float* slots, const float* grad, int64_t dim,
             const StepArgs& args) const override {
    decay_row(row, dim, args.lr);
    if (flavor_ == Flavor::kKeras)
      keras(row, slots, grad, dim, args.lr);
    else if (wd_ != 0.f)
      optax<true>(row, slots, grad, dim, -args.lr);
    else
      optax<false>(row, slots, grad, dim, -args.lr);
  }

 private:
  void keras(float* __restrict w, float* __restrict m, const float* __restrict g, int64_t dim,
             float lr) const {
    const kernels::OptimizerKernel k = k_;
    for (int64_t i = 0; i < dim; ++i) kernels::keras_lion(k, lr, w[i], m[i], g[i]);
  }
  template <bool kDecay>
  void optax(float* __restrict w, float* __restrict mu, const float* __restrict g, int64_t dim,
             float nlr) const {
    const kernels::OptimizerKernel k = k_;
    for (int64_t i = 0; i < dim; ++i) kernels::optax_lion<kDecay>(k, nlr, w[i], mu[i], g[i]);
  }

  Flavor flavor_;
  float wd_;
};

}  // namespace

std::unique_ptr<Optimizer> make_lion(const Config& cfg, const std::string& name, Flavor flavor) {
  return std::make_unique<Lion>(cfg, name, flavor);
}

}  // namespace optimizers
}  // namespace dualemb
