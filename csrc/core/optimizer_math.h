// optimizer_math.h — the per-element math of every fused optimizer, for the CPU core and the GPU
// table alike (DE_HD functions over plain floats; de_hd.h).
//
// One function per optimizer update updates one element j of a row: the value w = row[j], its
// slots (slot s at slots[s * dim + j]) and the summed gradient g = grad[j]. The CPU optimizers
// (csrc/core/optimizers/*.cc) run them in their vectorized per-row loops; the GPU table runs them
// one element per thread through apply_element(), which dispatches on the POD OptimizerKernel
// (no virtual call in device code). Each formula, and the framework it reproduces, is documented
// in the optimizer's .cc file; the expressions here are written in exactly that evaluation order
// (the frameworks' float32 order), and nothing may reorder or contract them (-ffp-contract=off,
// --fmad=false).
//
// Scalars that depend only on (lr, step) are computed once per batch on the host by
// Optimizer::prepare() (csrc/core/optimizer.h) and reach the math as StepScalars.
#ifndef DUALEMB_OPTIMIZER_MATH_H_
#define DUALEMB_OPTIMIZER_MATH_H_

#include <cstdint>

#include "de_hd.h"

namespace dualemb {
namespace kernels {

// Which update an OptimizerKernel describes: optimizer family x flavor.
enum class OptKind : int32_t {
  kKerasSgd,
  kOptaxSgd,
  kKerasAdagrad,
  kOptaxAdagrad,
  kKerasAdam,  // adam, adamw, amsgrad (the weight decay is keras_decay)
  kOptaxAdam,  // adam, adamw, amsgrad, nadam (= adam with nesterov)
  kKerasAdamax,
  kOptaxAdamax,
  kKerasNadam,
  kKerasRmsprop,
  kOptaxRmsprop,
  kKerasFtrl,
  kKerasAdadelta,
  kOptaxAdadelta,
  kKerasLion,
  kOptaxLion,
};

// Everything the per-element math of one optimizer reads, as plain data (copied to the device
// as a kernel argument). Each kind reads only some members; the others stay zero.
struct OptimizerKernel {
  OptKind kind = OptKind::kKerasSgd;
  int32_t num_slots = 0;
  // Keras 3's generic decoupled weight decay (BaseOptimizer._apply_weight_decay), applied to
  // the value before the update when the spec sets weight_decay: w = w - (w * weight_decay) * lr.
  bool keras_decay = false;
  float keras_wd = 0.f;
  // Variant flags.
  bool momentum = false;     // sgd: momentum != 0; keras rmsprop: momentum > 0
  bool nesterov = false;     // sgd, optax adam
  bool amsgrad = false;      // adam
  bool decay = false;        // optax adamw / adadelta / lion: the optimizer's own weight decay
  bool centered = false;     // rmsprop
  bool eps_in_sqrt = true;   // adagrad (keras), rmsprop
  int32_t variant = 0;  // ftrl: 0 x^0, 1 sqrt, 2 powf; optax rmsprop: 0 no trace, 1, 2 nesterov
  // Hyper-parameters, float32 as the math uses them.
  float b1 = 0.f, b2 = 0.f, omb1 = 0.f, omb2 = 0.f;  // beta_1/2 (or b1/b2) and 1 - beta
  float eps = 0.f, eps_root = 0.f;
  float wd = 0.f;  // the optimizer's own weight decay (optax adamw, adadelta, lion)
  float momentum_value = 0.f;
  float rho = 0.f, omr = 0.f;  // rmsprop rho / optax decay, adadelta rho; and 1 - rho
  float l1 = 0.f, two_l2s = 0.f, power = 0.f;  // ftrl
};

// Per-batch scalars: the learning rate, its negation (Optax scales by -lr), and the
// optimizer-specific constants Optimizer::prepare() derived from (lr, step) (see each .cc).
struct StepScalars {
  float lr = 0.f;
  float nlr = 0.f;
  float c[5] = {0.f, 0.f, 0.f, 0.f, 0.f};
};

// ---- Keras' generic weight decay --------------------------------------------------------------
DE_HD inline float keras_weight_decay(float w, float wd, float lr) { return w - (w * wd) * lr; }

// ---- SGD ----------------------------------------------------------------------------------------
DE_HD inline void keras_sgd(float lr, float& w, float g) { w = w - g * lr; }
DE_HD inline void optax_sgd(float nlr, float& w, float g) { w = w + g * nlr; }

template <bool kNesterov>
DE_HD inline void keras_sgd_momentum(float mom, float lr, float& w, float& m, float g) {
  const float mi = m * mom - g * lr;
  m = mi;
  if (kNesterov)
    w = w + (mi * mom - g * lr);
  else
    w = w + mi;
}

template <bool kNesterov>
DE_HD inline void optax_sgd_momentum(float mom, float nlr, float& w, float& t, float g) {
  const float ti = g + mom * t;
  t = ti;
  const float u = kNesterov ? g + mom * ti : ti;
  w = w + u * nlr;
}

// ---- Adagrad ------------------------------------------------------------------------------------
template <bool kEpsInSqrt>
DE_HD inline void keras_adagrad(float eps, float lr, float& w, float& a, float g) {
  const float ai = a + g * g;
  a = ai;
  w = w - (lr * g) / (kEpsInSqrt ? hd::sqrt_rn(ai + eps) : hd::sqrt_rn(ai) + eps);
}

DE_HD inline void optax_adagrad(float eps, float nlr, float& w, float& s, float g) {
  const float si = g * g + s;
  s = si;
  const float inv = si > 0.f ? 1.f / hd::sqrt_rn(si + eps) : 0.f;
  w = w + (inv * g) * nlr;
}

// ---- Adam, AdamW, AMSGrad
// ------------------------------------------------------------------------- alpha =
// StepScalars.c[0] (KerasAdam::prepare). Weight decay (AdamW) is keras_decay, before.
// keras_adam_moments / keras_adam_step are also the dense parameters' Keras Adam in JAX
// (csrc/jax/ffi_dense.cc: the Optax update is -step), so both follow Keras' float32 path.
DE_HD inline void keras_adam_moments(float omb1, float omb2, float& m, float& v, float g) {
  m = m + (g - m) * omb1;
  v = v + (g * g - v) * omb2;
}
DE_HD inline float keras_adam_step(float alpha, float eps, float m, float v) {
  return (m * alpha) / (hd::sqrt_rn(v) + eps);
}

template <bool kAms>
DE_HD inline void keras_adam(const OptimizerKernel& k, float alpha, float& w, float& m, float& v,
                             float& vh, float g) {
  float mi = m, vi = v;
  keras_adam_moments(k.omb1, k.omb2, mi, vi, g);
  m = mi;
  v = vi;
  if (kAms) {
    vi = hd::max_of(vh, vi);
    vh = vi;
  }
  w = w - keras_adam_step(alpha, k.eps, mi, vi);
}

// c[0] = 1/(1-b1^t), c[1] = 1/(1-b2^t), c[2] = 1/(1-b1^(t+1)) (OptaxAdam::prepare).
template <bool kNesterov, bool kAms, bool kDecay>
DE_HD inline void optax_adam(const OptimizerKernel& k, const StepScalars& s, float& w, float& mu,
                             float& nu, float& nm, float g) {
  const float mi = k.omb1 * g + k.b1 * mu;
  const float ni = k.omb2 * (g * g) + k.b2 * nu;
  mu = mi;
  nu = ni;
  const float mh = kNesterov ? k.b1 * (mi * s.c[2]) + k.omb1 * (g * s.c[0]) : mi * s.c[0];
  float nh = ni * s.c[1];
  if (kAms) {
    nh = hd::max_of(nm, nh);
    nm = nh;
  }
  float u = mh / (hd::sqrt_rn(nh + k.eps_root) + k.eps);
  if (kDecay) u = u + k.wd * w;
  w = w + u * s.nlr;
}

// ---- Adamax -------------------------------------------------------------------------------------
// keras: bc1 = c[0] = 1 - beta_1^t;  optax: inv_bc1 = c[1] = 1 / bc1.
DE_HD inline void keras_adamax(const OptimizerKernel& k, float lr, float bc1, float& w, float& m,
                               float& u, float g) {
  const float mi = m + (g - m) * k.omb1;
  const float ui = hd::max_of(k.b2 * u, hd::abs_of(g));
  m = mi;
  u = ui;
  w = w - (lr * mi) / (bc1 * (ui + k.eps));
}

DE_HD inline void optax_adamax(const OptimizerKernel& k, float nlr, float inv_bc1, float& w,
                               float& mu, float& nu, float g) {
  const float mi = k.omb1 * g + k.b1 * mu;
  const float ni = hd::max_of(hd::abs_of(g) + k.eps, k.b2 * nu);
  mu = mi;
  nu = ni;
  w = w + ((mi * inv_bc1) / ni) * nlr;
}

// ---- Nadam (Keras)
// -------------------------------------------------------------------------------- c[0] = u_{t+1},
// c[1] = 1 - U_{t+1}, c[2] = 1 - u_t, c[3] = 1 - U_t, c[4] = 1 - beta_2^t (KerasNadam::prepare).
DE_HD inline void keras_nadam(const OptimizerKernel& k, const StepScalars& s, float& w, float& m,
                              float& v, float g) {
  const float mi = m + (g - m) * k.omb1;
  const float vi = v + (g * g - v) * k.omb2;
  m = mi;
  v = vi;
  const float mh = (s.c[0] * mi) / s.c[1] + (s.c[2] * g) / s.c[3];
  const float vh = vi / s.c[4];
  w = w - (mh * s.lr) / (hd::sqrt_rn(vh) + k.eps);
}

// ---- RMSprop ------------------------------------------------------------------------------------
template <bool kCentered, bool kMomentum, bool kEpsInSqrt>
DE_HD inline void keras_rmsprop(const OptimizerKernel& k, float lr, float& w, float& v, float& mo,
                                float& a, float g) {
  const float vi = k.rho * v + k.omr * (g * g);
  v = vi;
  float den;
  if (kCentered) {
    const float ai = k.rho * a + k.omr * g;
    a = ai;
    den = kEpsInSqrt ? (vi - ai * ai) + k.eps : vi - ai * ai;
  } else {
    den = kEpsInSqrt ? vi + k.eps : vi;
  }
  const float inc = (lr * g) / (kEpsInSqrt ? hd::sqrt_rn(den) : hd::sqrt_rn(den) + k.eps);
  if (kMomentum) {
    const float mi = k.momentum_value * mo + inc;
    mo = mi;
    w = w - mi;
  } else {
    w = w - inc;
  }
}

// ibc = c[0] = 1/(1 - decay^t) with bias_correction, else 1. kTrace: 0 none, 1, 2 Nesterov.
template <bool kCentered, bool kEpsInSqrt, int kTrace>
DE_HD inline void optax_rmsprop(const OptimizerKernel& k, float nlr, float ibc, float& w, float& mu,
                                float& nu, float& tr, float g) {
  const float ni = k.omr * (g * g) + k.rho * nu;
  nu = ni;
  float var = ni * ibc;
  if (kCentered) {
    const float mi = k.omr * g + k.rho * mu;
    mu = mi;
    const float mh = mi * ibc;
    var = var - mh * mh;
  }
  const float sc = kEpsInSqrt ? 1.f / hd::sqrt_rn(var + k.eps) : 1.f / (hd::sqrt_rn(var) + k.eps);
  float u = (sc * g) * nlr;
  if (kTrace != 0) {
    const float t = u + k.momentum_value * tr;
    tr = t;
    u = kTrace == 2 ? u + k.momentum_value * t : t;
  }
  w = w + u;
}

// ---- FTRL (Keras)
// --------------------------------------------------------------------------------- kPow: 0 -> x^0
// = 1, 1 -> sqrt(x), 2 -> powf(x, p). powf is libm's on the host and CUDA's on the device: the one
// place where the two may differ (by an ulp; only for learning_rate_power other than -0.5 and 0).
template <int kPow>
DE_HD inline float ftrl_power(float x, float p) {
  if (kPow == 0) return 1.f;
  if (kPow == 1) return hd::sqrt_rn(x);
#if defined(__CUDA_ARCH__)
  return powf(x, p);
#else
  return std::pow(x, p);
#endif
}

// two_l2 = c[0] = 2 * (l2 + beta / (2 * lr)) (KerasFtrl::prepare).
template <int kPow>
DE_HD inline void keras_ftrl(const OptimizerKernel& k, float lr, float two_l2, float& w, float& acc,
                             float& lin, float g) {
  const float wi = w, ai = acc;
  const float g2 = g + k.two_l2s * wi;
  const float na = ai + g * g;
  const float pn = ftrl_power<kPow>(na, k.power);
  const float li = lin + (g2 - ((pn - ftrl_power<kPow>(ai, k.power)) / lr) * wi);
  lin = li;
  const float quadratic = pn / lr + two_l2;
  const float clipped = hd::min_of(hd::max_of(li, -k.l1), k.l1);
  w = (clipped - li) / quadratic;
  acc = na;
}

// ---- Adadelta -----------------------------------------------------------------------------------
DE_HD inline void keras_adadelta(const OptimizerKernel& k, float lr, float& w, float& ag,
                                 float& adv, float g) {
  const float agi = k.rho * ag + k.omr * (g * g);
  ag = agi;
  const float d = -((hd::sqrt_rn(adv + k.eps) * g) / hd::sqrt_rn(agi + k.eps));
  adv = k.rho * adv + k.omr * (d * d);
  w = w + lr * d;
}

template <bool kDecay>
DE_HD inline void optax_adadelta(const OptimizerKernel& k, float nlr, float& w, float& eg,
                                 float& ex, float g) {
  float gi = g;
  if (kDecay) gi = gi + k.wd * w;
  const float egi = k.omr * (gi * gi) + k.rho * eg;
  eg = egi;
  const float u = (hd::sqrt_rn(ex + k.eps) / hd::sqrt_rn(egi + k.eps)) * gi;
  ex = k.omr * (u * u) + k.rho * ex;
  w = w + u * nlr;
}

// ---- Lion ---------------------------------------------------------------------------------------
// Both frameworks' sign(): -1, 0 or +1.
DE_HD inline float sign_of(float x) { return x > 0.f ? 1.f : (x < 0.f ? -1.f : 0.f); }

DE_HD inline void keras_lion(const OptimizerKernel& k, float lr, float& w, float& m, float g) {
  const float mi = m;
  w = w - lr * sign_of(mi * k.b1 + g * k.omb1);
  m = mi * k.b2 + g * k.omb2;
}

template <bool kDecay>
DE_HD inline void optax_lion(const OptimizerKernel& k, float nlr, float& w, float& mu, float g) {
  const float mi = mu;
  float u = sign_of(k.omb1 * g + k.b1 * mi);
  mu = k.omb2 * g + k.b2 * mi;
  if (kDecay) u = u + k.wd * w;
  w = w + u * nlr;
}

// ---- One element of any optimizer, dispatched on the POD
// ----------------------------------------- Updates row[j] and its slots (slot s at slots[s * dim +
// j]) with the summed gradient grad[j]: what Optimizer::apply(row, slots, grad, dim, args) does to
// element j. The GPU table's kernel; csrc/cuda/tests checks on the CPU that it equals every CPU
// optimizer's apply() bit for bit.
DE_HD inline void apply_element(const OptimizerKernel& k, const StepScalars& s, float* row,
                                float* slots, const float* grad, int64_t dim, int64_t j) {
  float w = row[j];
  const float g = grad[j];
  float* sl = slots + j;
  float unused = 0.f;
  float& s0 = k.num_slots > 0 ? sl[0] : unused;
  float& s1 = k.num_slots > 1 ? sl[dim] : unused;
  float& s2 = k.num_slots > 2 ? sl[2 * dim] : unused;
  if (k.keras_decay) w = keras_weight_decay(w, k.keras_wd, s.lr);
  switch (k.kind) {
    case OptKind::kKerasSgd:
      if (!k.momentum)
        keras_sgd(s.lr, w, g);
      else if (k.nesterov)
        keras_sgd_momentum<true>(k.momentum_value, s.lr, w, s0, g);
      else
        keras_sgd_momentum<false>(k.momentum_value, s.lr, w, s0, g);
      break;
    case OptKind::kOptaxSgd:
      if (!k.momentum)
        optax_sgd(s.nlr, w, g);
      else if (k.nesterov)
        optax_sgd_momentum<true>(k.momentum_value, s.nlr, w, s0, g);
      else
        optax_sgd_momentum<false>(k.momentum_value, s.nlr, w, s0, g);
      break;
    case OptKind::kKerasAdagrad:
      if (k.eps_in_sqrt)
        keras_adagrad<true>(k.eps, s.lr, w, s0, g);
      else
        keras_adagrad<false>(k.eps, s.lr, w, s0, g);
      break;
    case OptKind::kOptaxAdagrad: optax_adagrad(k.eps, s.nlr, w, s0, g); break;
    case OptKind::kKerasAdam:
      if (k.amsgrad)
        keras_adam<true>(k, s.c[0], w, s0, s1, s2, g);
      else
        keras_adam<false>(k, s.c[0], w, s0, s1, s2, g);
      break;
    case OptKind::kOptaxAdam:
      if (k.amsgrad)
        optax_adam<false, true, false>(k, s, w, s0, s1, s2, g);
      else if (k.nesterov && k.decay)
        optax_adam<true, false, true>(k, s, w, s0, s1, s2, g);
      else if (k.nesterov)
        optax_adam<true, false, false>(k, s, w, s0, s1, s2, g);
      else if (k.decay)
        optax_adam<false, false, true>(k, s, w, s0, s1, s2, g);
      else
        optax_adam<false, false, false>(k, s, w, s0, s1, s2, g);
      break;
    case OptKind::kKerasAdamax: keras_adamax(k, s.lr, s.c[0], w, s0, s1, g); break;
    case OptKind::kOptaxAdamax: optax_adamax(k, s.nlr, s.c[1], w, s0, s1, g); break;
    case OptKind::kKerasNadam: keras_nadam(k, s, w, s0, s1, g); break;
    case OptKind::kKerasRmsprop: {
      // slots: velocity, [momentum], [average_gradient]
      float& a = k.momentum ? s2 : s1;
      const int v = (k.centered ? 1 : 0) | (k.momentum ? 2 : 0) | (k.eps_in_sqrt ? 4 : 0);
      switch (v) {
        case 0: keras_rmsprop<false, false, false>(k, s.lr, w, s0, s1, a, g); break;
        case 1: keras_rmsprop<true, false, false>(k, s.lr, w, s0, s1, a, g); break;
        case 2: keras_rmsprop<false, true, false>(k, s.lr, w, s0, s1, a, g); break;
        case 3: keras_rmsprop<true, true, false>(k, s.lr, w, s0, s1, a, g); break;
        case 4: keras_rmsprop<false, false, true>(k, s.lr, w, s0, s1, a, g); break;
        case 5: keras_rmsprop<true, false, true>(k, s.lr, w, s0, s1, a, g); break;
        case 6: keras_rmsprop<false, true, true>(k, s.lr, w, s0, s1, a, g); break;
        default: keras_rmsprop<true, true, true>(k, s.lr, w, s0, s1, a, g); break;
      }
      break;
    }
    case OptKind::kOptaxRmsprop: {
      // slots: [mu], nu, [trace]
      float& mu = s0;
      float& nu = k.centered ? s1 : s0;
      float& tr = k.centered ? s2 : s1;
      const float ibc = s.c[0];
      const int v = (k.centered ? 1 : 0) | (k.eps_in_sqrt ? 2 : 0);
#define DE_RMS_(C, E)                                        \
  if (k.variant == 0)                                        \
    optax_rmsprop<C, E, 0>(k, s.nlr, ibc, w, mu, nu, tr, g); \
  else if (k.variant == 2)                                   \
    optax_rmsprop<C, E, 2>(k, s.nlr, ibc, w, mu, nu, tr, g); \
  else                                                       \
    optax_rmsprop<C, E, 1>(k, s.nlr, ibc, w, mu, nu, tr, g);
      switch (v) {
        case 0: DE_RMS_(false, false) break;
        case 1: DE_RMS_(true, false) break;
        case 2: DE_RMS_(false, true) break;
        default: DE_RMS_(true, true) break;
      }
#undef DE_RMS_
      break;
    }
    case OptKind::kKerasFtrl:
      if (k.variant == 1)
        keras_ftrl<1>(k, s.lr, s.c[0], w, s0, s1, g);
      else if (k.variant == 0)
        keras_ftrl<0>(k, s.lr, s.c[0], w, s0, s1, g);
      else
        keras_ftrl<2>(k, s.lr, s.c[0], w, s0, s1, g);
      break;
    case OptKind::kKerasAdadelta: keras_adadelta(k, s.lr, w, s0, s1, g); break;
    case OptKind::kOptaxAdadelta:
      if (k.decay)
        optax_adadelta<true>(k, s.nlr, w, s0, s1, g);
      else
        optax_adadelta<false>(k, s.nlr, w, s0, s1, g);
      break;
    case OptKind::kKerasLion: keras_lion(k, s.lr, w, s0, g); break;
    case OptKind::kOptaxLion:
      if (k.decay)
        optax_lion<true>(k, s.nlr, w, s0, g);
      else
        optax_lion<false>(k, s.nlr, w, s0, g);
      break;
  }
  row[j] = w;
}

}  // namespace kernels
}  // namespace dualemb

#endif  // DUALEMB_OPTIMIZER_MATH_H_
