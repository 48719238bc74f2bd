// sgd.cc — SGD with optional (Nesterov) momentum.
//
// keras.optimizers.SGD(momentum, nesterov) — slot "momentum" (only when momentum != 0):
//   m = m*momentum - g*lr;  nesterov: w += m*momentum - g*lr;  else: w += m
//   (no momentum: w -= g*lr)
// optax.sgd(lr, momentum, nesterov) = chain(trace(momentum, nesterov), scale(-lr)), slot "trace":
//   t = g + momentum*t;  u = nesterov ? g + momentum*t : t;  w += u*(-lr)
// The two differ when lr changes between steps: Keras folds lr into the momentum buffer, Optax
// scales the trace afterwards. The per-element math is in optimizer_math.h. Optax momentum=None is momentum=0 here (no slot; the update is the
// same as optax.sgd(momentum=0.0)).
#include <memory>
#include <string>

#include "optimizers/common.h"

namespace dualemb {
namespace optimizers {
namespace {

class Sgd final : public OptimizerBase {
 public:
  Sgd(const Config& cfg, const std::string& name, Flavor flavor) : flavor_(flavor) {
    HyperParams hp(cfg, name, flavor);
    momentum_ = static_cast<float>(hp.real("momentum", 0.0, kUnit));
    nesterov_ = hp.flag("nesterov", false);
    if (flavor == Flavor::kKeras) read_keras_weight_decay(cfg, hp);
    set_spec(hp.finish());
    if (momentum_ != 0.f) add_slot(flavor == Flavor::kKeras ? "momentum" : "trace", 0.f);
    k_.kind = flavor == Flavor::kKeras ? kernels::OptKind::kKerasSgd : kernels::OptKind::kOptaxSgd;
    k_.momentum = momentum_ != 0.f;
    k_.nesterov = nesterov_;
    k_.momentum_value = momentum_;
  }

  StepArgs prepare(float lr, int64_t step) const override { return start(lr, step); }

  void apply(float* row, float* slots, const float* grad, int64_t dim,
             const StepArgs& args) const override {
    decay_row(row, dim, args.lr);
    if (momentum_ == 0.f) {
      if (flavor_ == Flavor::kKeras)
        plain_keras(row, grad, dim, args.lr);
      else
        plain_optax(row, grad, dim, -args.lr);
    } else if (flavor_ == Flavor::kKeras) {
      if (nesterov_)
        momentum_keras<true>(row, slots, grad, dim, args.lr, momentum_);
      else
        momentum_keras<false>(row, slots, grad, dim, args.lr, momentum_);
    } else {
      if (nesterov_)
        momentum_optax<true>(row, slots, grad, dim, -args.lr, momentum_);
      else
        momentum_optax<false>(row, slots, grad, dim, -args.lr, momentum_);
    }
  }

 private:
  static void plain_keras(float* __restrict w, const float* __restrict g, int64_t dim, float lr) {
    for (int64_t i = 0; i < dim; ++i) kernels::keras_sgd(lr, w[i], g[i]);
  }
  static void plain_optax(float* __restrict w, const float* __restrict g, int64_t dim,
                          float nlr) {
    for (int64_t i = 0; i < dim; ++i) kernels::optax_sgd(nlr, w[i], g[i]);
  }
  template <bool kNesterov>
  static void momentum_keras(float* __restrict w, float* __restrict m, const float* __restrict g,
                             int64_t dim, float lr, float mom) {
    for (int64_t i = 0; i < dim; ++i) kernels::keras_sgd_momentum<kNesterov>(mom, lr, w[i], m[i], g[i]);
  }
  template <bool kNesterov>
  static void momentum_optax(float* __restrict w, float* __restrict t, const float* __restrict g,
                             int64_t dim, float nlr, float mom) {
    for (int64_t i = 0; i < dim; ++i) kernels::optax_sgd_momentum<kNesterov>(mom, nlr, w[i], t[i], g[i]);
  }

  Flavor flavor_;
  float momentum_;
  bool nesterov_;
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(const Config& cfg, const std::string& name, Flavor flavor) {
  return std::make_unique<Sgd>(cfg, name, flavor);
}

}  // namespace optimizers
}  // namespace dualemb
