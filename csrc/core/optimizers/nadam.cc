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

class KerasNadam final : public OptimizerBase {
 public:
  explicit KerasNadam(const Config& cfg) {
    HyperParams hp(cfg, "nadam", Flavor::kKeras);
    const double b1 = hp.real("beta_1", 0.9, kUnitOpenHigh);
    const double b2 = hp.real("beta_2", 0.999, kUnitOpenHigh);
    eps_ = static_cast<float>(hp.real("epsilon", 1e-7, kNonNegative));
    set_spec(hp.finish());
    b1_ = static_cast<float>(b1);
    b2_ = static_cast<float>(b2);
    omb1_ = 1.f - b1_;  // Keras: 1 - ops.cast(beta_1, float32)
    omb2_ = 1.f - b2_;
    u_product_.resize(kTable + 1);
    float u = 1.f;
    u_product_[0] = u;
    for (int64_t s = 1; s <= kTable; ++s) {
      u = (u * b1_) * (1.f - 0.5f * pow_step(0.96f, s));
      u_product_[s] = u;
    }
    add_slot("momentum", 0.f);
    add_slot("velocity", 0.f);
  }

  StepArgs prepare(float lr, int64_t step) const override {
    StepArgs a = start(lr, step);
    const float u_t = b1_ * (1.f - 0.5f * pow_step(0.96f, step));
    const float u_t1 = b1_ * (1.f - 0.5f * pow_step(0.96f, step + 1));
    const float u_prod =
        step <= kTable
            ? u_product_[step]
            : static_cast<float>(static_cast<double>(u_product_[kTable]) *
                                 std::pow(static_cast<double>(b1_),
                                          static_cast<double>(step - kTable)));
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
    kernel(row, slots, slots + dim, grad, dim, args);
  }

 private:
  DUALEMB_SIMD_CLONES void kernel(float* __restrict w, float* __restrict m, float* __restrict v,
              const float* __restrict g, int64_t dim, const StepArgs& args) const {
    const float u_t1 = static_cast<float>(args.c[0]), d1 = static_cast<float>(args.c[1]);
    const float omu = static_cast<float>(args.c[2]), d0 = static_cast<float>(args.c[3]);
    const float bc2 = static_cast<float>(args.c[4]);
    const float omb1 = omb1_, omb2 = omb2_, eps = eps_, lr = args.lr;
    for (int64_t i = 0; i < dim; ++i) {
      const float gi = g[i];
      const float mi = m[i] + (gi - m[i]) * omb1;
      const float vi = v[i] + (gi * gi - v[i]) * omb2;
      m[i] = mi;
      v[i] = vi;
      const float mh = (u_t1 * mi) / d1 + (omu * gi) / d0;
      const float vh = vi / bc2;
      w[i] -= (mh * lr) / (std::sqrt(vh) + eps);
    }
  }

  float b1_, b2_, omb1_, omb2_, eps_;
  std::vector<float> u_product_;  // U(0..kTable), Keras' u_product after step s
};

}  // namespace

std::unique_ptr<Optimizer> make_nadam(const Config& cfg, const std::string& name, Flavor flavor) {
  (void)name;
  if (flavor == Flavor::kKeras) return std::make_unique<KerasNadam>(cfg);
  return make_optax_nadam(cfg);
}

}  // namespace optimizers
}  // namespace dualemb
