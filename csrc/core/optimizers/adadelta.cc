// adadelta.cc — Adadelta.
//
// keras.optimizers.Adadelta(rho=0.95, epsilon=1e-7) — slots "accumulated_grad",
// "accumulated_delta_var":
//   ag = rho*ag + (1-rho)*g*g;  d = -((sqrt(adv + eps)*g) / sqrt(ag + eps))
//   adv = rho*adv + (1-rho)*d*d;  w += lr*d
// optax.adadelta(lr, rho=0.9, eps=1e-6, weight_decay=0.0) — slots "e_g", "e_x":
//   g := g + weight_decay*w (only when weight_decay != 0; optax's add_decayed_weights comes first)
//   e_g = (1-rho)*g*g + rho*e_g;  u = (sqrt(e_x + eps)/sqrt(e_g + eps))*g
//   e_x = (1-rho)*u*u + rho*e_x;  w += u*(-lr)
// Note optax.adadelta(learning_rate=None) skips scale_by_learning_rate altogether (so it does not
// even flip the sign); here the learning rate always comes with the call, so that form does not
// exist.
#include <cmath>
#include <memory>
#include <string>

#include "optimizers/common.h"

namespace dualemb {
namespace optimizers {
namespace {

class Adadelta final : public OptimizerBase {
 public:
  Adadelta(const Config& cfg, const std::string& name, Flavor flavor) : flavor_(flavor) {
    HyperParams hp(cfg, name, flavor);
    const bool keras = flavor == Flavor::kKeras;
    const double rho = hp.real("rho", keras ? 0.95 : 0.9, kUnit);
    const float eps = static_cast<float>(hp.real(keras ? "epsilon" : "eps", keras ? 1e-7 : 1e-6,
                                                 kNonNegative));
    // Keras' weight_decay is its generic decoupled decay; optax.adadelta's is added to g.
    if (keras)
      read_keras_weight_decay(cfg, hp);
    else
      wd_ = static_cast<float>(hp.real("weight_decay", 0.0, kNonNegative));
    set_spec(hp.finish());
    k_.kind = keras ? kernels::OptKind::kKerasAdadelta : kernels::OptKind::kOptaxAdadelta;
    k_.rho = static_cast<float>(rho);
    k_.omr = static_cast<float>(1.0 - rho);
    k_.eps = eps;
    k_.wd = wd_;
    k_.decay = wd_ != 0.f;
    add_slot(keras ? "accumulated_grad" : "e_g", 0.f);
    add_slot(keras ? "accumulated_delta_var" : "e_x", 0.f);
  }

  StepArgs prepare(float lr, int64_t step) const override { return start(lr, step); }

  void apply(float* row, float* slots, const float* grad, int64_t dim,
             const StepArgs& args) const override {
    decay_row(row, dim, args.lr);
    if (flavor_ == Flavor::kKeras)
      keras(row, slots, slots + dim, grad, dim, args.lr);
    else if (wd_ != 0.f)
      optax<true>(row, slots, slots + dim, grad, dim, -args.lr);
    else
      optax<false>(row, slots, slots + dim, grad, dim, -args.lr);
  }

 private:
  void keras(float* __restrict w, float* __restrict ag, float* __restrict adv,
             const float* __restrict g, int64_t dim, float lr) const {
    const kernels::OptimizerKernel k = k_;
    for (int64_t i = 0; i < dim; ++i) kernels::keras_adadelta(k, lr, w[i], ag[i], adv[i], g[i]);
  }
  template <bool kDecay>
  void optax(float* __restrict w, float* __restrict eg, float* __restrict ex,
             const float* __restrict g, int64_t dim, float nlr) const {
    const kernels::OptimizerKernel k = k_;
    for (int64_t i = 0; i < dim; ++i)
      kernels::optax_adadelta<kDecay>(k, nlr, w[i], eg[i], ex[i], g[i]);
  }

  Flavor flavor_;
  float wd_ = 0.f;
};

}  // namespace

std::unique_ptr<Optimizer> make_adadelta(const Config& cfg, const std::string& name,
                                         Flavor flavor) {
  return std::make_unique<Adadelta>(cfg, name, flavor);
}

}  // namespace optimizers
}  // namespace dualemb
