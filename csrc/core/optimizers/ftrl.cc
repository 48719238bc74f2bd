// ftrl.cc — FTRL-Proximal, Keras only.
//
// keras.optimizers.Ftrl(learning_rate_power=-0.5, initial_accumulator_value=0.1,
// l1_regularization_strength=0, l2_regularization_strength=0,
// l2_shrinkage_regularization_strength=0, beta=0) — slots "accumulator", "linear":
//   l2_reg = l2 + beta/(2*lr);  p = -learning_rate_power                    (float32 scalars)
//   g2 = g + (2*l2_shrinkage)*w;  na = a + g*g
//   linear += g2 - ((na^p - a^p)/lr)*w
//   quadratic = na^p/lr + 2*l2_reg
//   w = (clip(linear, -l1, l1) - linear)/quadratic;  a = na
// x^0.5 is computed with sqrt and x^0 as 1 (TF's pow(x, 0.5) is within an ulp of sqrt); any other
// power costs a powf per element.
// optax 0.2.8 has no FTRL, so flavor=optax is rejected.
#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>

#include "optimizers/common.h"

namespace dualemb {
namespace optimizers {
namespace {

class KerasFtrl final : public OptimizerBase {
 public:
  explicit KerasFtrl(const Config& cfg) {
    HyperParams hp(cfg, "ftrl", Flavor::kKeras);
    const double lr_power = hp.real("learning_rate_power", -0.5, kNonPositive);
    const float init = static_cast<float>(hp.real("initial_accumulator_value", 0.1, kNonNegative));
    l1_ = static_cast<float>(hp.real("l1_regularization_strength", 0.0, kNonNegative));
    l2_ = static_cast<float>(hp.real("l2_regularization_strength", 0.0, kNonNegative));
    const double l2s = hp.real("l2_shrinkage_regularization_strength", 0.0, kNonNegative);
    beta_ = static_cast<float>(hp.real("beta", 0.0, kNonNegative));
    read_keras_weight_decay(cfg, hp);
    set_spec(hp.finish());
    power_ = static_cast<float>(-lr_power);
    add_slot("accumulator", init);
    add_slot("linear", 0.f);
    k_.kind = kernels::OptKind::kKerasFtrl;
    k_.power = power_;
    k_.two_l2s = static_cast<float>(2.0 * l2s);  // Keras: `2 * self.l2_shrinkage...` in Python
    k_.l1 = l1_;
    k_.variant = power_ == 0.5f ? 1 : power_ == 0.f ? 0 : 2;
  }

  StepArgs prepare(float lr, int64_t step) const override {
    StepArgs a = start(lr, step);
    if (!(lr > 0.f))
      throw std::invalid_argument(
          "optimizer 'ftrl' (flavor=keras): learning rate must be > 0, got " + format_double(lr));
    const float l2_reg = l2_ + beta_ / (2.f * lr);
    a.c[0] = 2.f * l2_reg;
    return a;
  }

  void apply(float* row, float* slots, const float* grad, int64_t dim,
             const StepArgs& args) const override {
    const float two_l2 = static_cast<float>(args.c[0]);
    decay_row(row, dim, args.lr);
    if (k_.variant == 1)
      kernel<1>(row, slots, slots + dim, grad, dim, args.lr, two_l2);
    else if (k_.variant == 0)
      kernel<0>(row, slots, slots + dim, grad, dim, args.lr, two_l2);
    else
      kernel<2>(row, slots, slots + dim, grad, dim, args.lr, two_l2);
  }

 private:
  template <int kPow>
  DUALEMB_SIMD_CLONES void kernel(float* __restrict w, float* __restrict acc,
                                  float* __restrict lin, const float* __restrict g, int64_t dim,
                                  float lr, float two_l2) const {
    const kernels::OptimizerKernel k = k_;
    for (int64_t i = 0; i < dim; ++i)
      kernels::keras_ftrl<kPow>(k, lr, two_l2, w[i], acc[i], lin[i], g[i]);
  }

  float power_, l1_, l2_, beta_;
};

}  // namespace

std::unique_ptr<Optimizer> make_ftrl(const Config& cfg, const std::string& name, Flavor flavor) {
  (void)name;
  if (flavor == Flavor::kOptax)
    throw std::invalid_argument(
        "optimizer 'ftrl' has no flavor=optax: optax 0.2.8 has no FTRL optimizer (use "
        "flavor=keras for keras.optimizers.Ftrl)");
  return std::make_unique<KerasFtrl>(cfg);
}

}  // namespace optimizers
}  // namespace dualemb
