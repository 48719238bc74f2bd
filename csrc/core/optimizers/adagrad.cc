// adagrad.cc — Adagrad.
//
// keras.optimizers.Adagrad(initial_accumulator_value=0.1, epsilon=1e-7) — slot "accumulator":
//   a += g*g;  w -= (lr*g) / sqrt(a + epsilon)
// epsilon_in_sqrt=false (default true) is tf_keras' legacy Adagrad (OptimizerV2, TF's
// ResourceApplyAdagradV2 / ResourceSparseApplyAdagradV2 kernels):
//   a += g*g;  w -= (lr*g) / (sqrt(a) + epsilon)
// optax.adagrad(lr, initial_accumulator_value=0.1, eps=1e-7) — slot "sum_of_squares":
//   s = g*g + s;  u = (s > 0 ? rsqrt(s + eps) : 0) * g;  w += u*(-lr)
// (XLA's rsqrt is within 2 ulp of 1/sqrt, which is what is computed here.)
#include <memory>
#include <string>

#include "optimizers/common.h"

namespace dualemb {
namespace optimizers {
namespace {

class Adagrad final : public OptimizerBase {
 public:
  Adagrad(const Config& cfg, const std::string& name, Flavor flavor) : flavor_(flavor) {
    HyperParams hp(cfg, name, flavor);
    const bool keras = flavor == Flavor::kKeras;
    const float init = static_cast<float>(hp.real("initial_accumulator_value", 0.1, kNonNegative));
    eps_ = static_cast<float>(hp.real(keras ? "epsilon" : "eps", 1e-7, kNonNegative));
    if (keras) eps_in_sqrt_ = hp.flag("epsilon_in_sqrt", true);
    if (keras) read_keras_weight_decay(cfg, hp);
    set_spec(hp.finish());
    add_slot(keras ? "accumulator" : "sum_of_squares", init);
    k_.kind = keras ? kernels::OptKind::kKerasAdagrad : kernels::OptKind::kOptaxAdagrad;
    k_.eps = eps_;
    k_.eps_in_sqrt = eps_in_sqrt_;
  }

  StepArgs prepare(float lr, int64_t step) const override { return start(lr, step); }

  void apply(float* row, float* slots, const float* grad, int64_t dim,
             const StepArgs& args) const override {
    decay_row(row, dim, args.lr);
    if (flavor_ == Flavor::kKeras)
      eps_in_sqrt_ ? keras<true>(row, slots, grad, dim, args.lr, eps_)
                   : keras<false>(row, slots, grad, dim, args.lr, eps_);
    else
      optax(row, slots, grad, dim, -args.lr, eps_);
  }

 private:
  template <bool kEpsInSqrt>
  static void keras(float* __restrict w, float* __restrict a, const float* __restrict g,
                    int64_t dim, float lr, float eps) {
    for (int64_t i = 0; i < dim; ++i) kernels::keras_adagrad<kEpsInSqrt>(eps, lr, w[i], a[i], g[i]);
  }
  static void optax(float* __restrict w, float* __restrict s, const float* __restrict g,
                    int64_t dim, float nlr, float eps) {
    for (int64_t i = 0; i < dim; ++i) kernels::optax_adagrad(eps, nlr, w[i], s[i], g[i]);
  }

  Flavor flavor_;
  float eps_;
  bool eps_in_sqrt_ = true;
};

}  // namespace

std::unique_ptr<Optimizer> make_adagrad(const Config& cfg, const std::string& name,
                                        Flavor flavor) {
  return std::make_unique<Adagrad>(cfg, name, flavor);
}

}  // namespace optimizers
}  // namespace dualemb
