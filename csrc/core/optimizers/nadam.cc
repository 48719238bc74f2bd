// nadam.cc — Nadam.
//
// keras.optimizers.Nadam(beta_1=0.9, beta_2=0.999, epsilon=1e-7) — slots "momentum", "velocity".
// Keras keeps a float32 variable u_product that each apply() multiplies, before the update, by
// beta_1 * (1 - 0.5 * 0.96^t). It depends on nothing but t, so it is derived here from the step:
// U(0) = 1, U(s) = (U(s-1) * beta_1) * (1 - 0.5*0.96^s), iterated in float32 exactly like Keras for
// t <= kTable (precomputed once per optimizer). Past kTable, 0.5*0.96^s < 2^-25, so Keras' factor
// is float32(beta_1) exactly and U(t) = U(kTable) * beta_1^(t - kTable), rounded once instead of
// once per step. U only enters as 1 - U, and U(kTable) <= 9.0e-7 whatever beta_1 is (the product
// of the (1 - 0.5*0.96^s) factors alone), so the relative difference of ~(t - kTable)*2^-24 in U
// cannot move 1 - U by an ulp before t is around 500,000 (while U keeps shrinking as beta_1^t).
//   u_t = beta_1*(1 - 0.5*0.96^t);  u_t1 = beta_1*(1 - 0.5*0.96^(t+1));  U_t1 = U(t)*u_t1
//   m += (g - m)*(1 - beta_1);  v += (g*g - v)*(1 - beta_2)        ((1 - beta) in float32)
//   m_hat = (u_t1*m)/(1 - U_t1) + ((1 - u_t)*g)/(1 - U(t));  v_hat = v/(1 - beta_2^t)
//   w -= (m_hat*lr) / (sqrt(v_hat) + epsilon)
// schedule_decay=d (default 1, Keras 3) makes the momentum schedule beta_1*(1 - 0.5*0.96^(d*t)),
// d*t rounded to float32: tf_keras' legacy Nadam (OptimizerV2, schedule_decay=0.004), whose
// momentum_cache variable is this U(t). Its update rounds in another order
// (m = beta_1*m + (1-beta_1)*g, m_hat = (1-u_t)*(g/(1-U(t))) + u_t1*(m/(1-U_t1))): same formula,
// last bits may differ. With d < 1 the factor may not be beta_1 yet at kTable, but then U(kTable)
// is far below 2^-25 (log U(kTable) <= -0.5 * sum_{s<=1024} 0.96^(d*s) < -30 for d < 0.4; each
// factor is near beta_1/2 while 0.96^(d*s) is near 1), and 1 - U rounds to 1 in float32 for that
// U and every later, smaller one: the closed form past the table is then exact too. The table
// loop checks that one of the two holds rather than assume it (and would grow the table if not).
// flavor=optax is optax.nadam = optax.adam(nesterov=True) (adam.cc).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "optimizers/common.h"

namespace dualemb {
namespace optimizers {
namespace {

constexpr int64_t kTable = 1024;
constexpr int64_t kTableCap = 1 << 16;  // never reached: see the comment above

class KerasNadam final : public OptimizerBase {
 public:
  explicit KerasNadam(const Config& cfg) {
    HyperParams hp(cfg, "nadam", Flavor::kKeras);
    const double b1 = hp.real("beta_1", 0.9, kUnitOpenHigh);
    const double b2 = hp.real("beta_2", 0.999, kUnitOpenHigh);
    eps_ = static_cast<float>(hp.real("epsilon", 1e-7, kNonNegative));
    schedule_decay_ = static_cast<float>(hp.real("schedule_decay", 1.0, kNonNegative));
    read_keras_weight_decay(cfg, hp);
    set_spec(hp.finish());
    b1_ = static_cast<float>(b1);
    b2_ = static_cast<float>(b2);
    omb1_ = 1.f - b1_;  // Keras: 1 - ops.cast(beta_1, float32)
    omb2_ = 1.f - b2_;
    float u = 1.f;
    u_product_.push_back(u);
    for (int64_t s = 1;; ++s) {
      const float power = schedule_power(s);
      if (s > kTable && (b1_ * (1.f - 0.5f * power) == b1_ || u < 0x1p-25f)) break;
      if (s > kTableCap) hp.fail("schedule_decay gives a momentum schedule too slow to tabulate");
      u = (u * b1_) * (1.f - 0.5f * power);  // Keras 3's order (tf_keras legacy: u * u_t)
      u_product_.push_back(u);
    }
    table_ = static_cast<int64_t>(u_product_.size()) - 1;
    add_slot("momentum", 0.f);
    add_slot("velocity", 0.f);
    k_.kind = kernels::OptKind::kKerasNadam;
    k_.omb1 = omb1_;
    k_.omb2 = omb2_;
    k_.eps = eps_;
  }

  StepArgs prepare(float lr, int64_t step) const override {
    StepArgs a = start(lr, step);
    const float u_t = momentum_factor(step);
    const float u_t1 = momentum_factor(step + 1);
    const float u_prod =
        step <= table_
            ? u_product_[step]
            : static_cast<float>(static_cast<double>(u_product_[table_]) *
                                 std::pow(static_cast<double>(b1_),
                                          static_cast<double>(step - table_)));
    const float u_prod1 = u_prod * u_t1;
    a.c[0] = u_t1;
    a.c[1] = 1.f - u_prod1;
    a.c[2] = 1.f - u_t;
    a.c[3] = 1.f - u_prod;
    a.c[4] = 1.f - pow_step(b2_, step);
    return a;
  }

  void apply(float* row, float* slots, const float* grad, int64_t dim,
             const StepArgs& args) const override {
    decay_row(row, dim, args.lr);
    kernel(row, slots, slots + dim, grad, dim, step_scalars(args));
  }

 private:
  // 0.96^(d*s), d*s in float32 as tf_keras legacy computes it; with d = 1 the exponent is
  // float32(s), as Keras 3 computes it.
  float schedule_power(int64_t s) const {
    const float exponent = schedule_decay_ * static_cast<float>(s);
    return static_cast<float>(
        std::pow(static_cast<double>(0.96f), static_cast<double>(exponent)));
  }
  float momentum_factor(int64_t s) const { return b1_ * (1.f - 0.5f * schedule_power(s)); }

  DUALEMB_SIMD_CLONES void kernel(float* __restrict w, float* __restrict m, float* __restrict v,
                                  const float* __restrict g, int64_t dim,
                                  const kernels::StepScalars& scalars) const {
    const kernels::OptimizerKernel k = k_;
    const kernels::StepScalars s = scalars;
    for (int64_t i = 0; i < dim; ++i) kernels::keras_nadam(k, s, w[i], m[i], v[i], g[i]);
  }

  float b1_, b2_, omb1_, omb2_, eps_, schedule_decay_;
  std::vector<float> u_product_;  // U(0..table_), Keras' u_product after step s
  int64_t table_;
};

}  // namespace

std::unique_ptr<Optimizer> make_nadam(const Config& cfg, const std::string& name, Flavor flavor) {
  (void)name;
  if (flavor == Flavor::kKeras) return std::make_unique<KerasNadam>(cfg);
  return make_optax_nadam(cfg);
}

}  // namespace optimizers
}  // namespace dualemb
