// common.h — shared pieces of the fused sparse optimizers (csrc/core/optimizers/*.cc).
//
// Conventions every optimizer follows, so that a dualemb row trained with flavor=keras equals the
// same row of a dense variable trained by keras.optimizers.X (Keras 3, TF backend), and
// flavor=optax equals optax.X applied to a jnp array:
//  * All per-element arithmetic is float32, in the framework's operation order (no fused
//    multiply-add: the core is built without -march, and without -ffast-math).
//  * Constants the framework computes in Python double and then casts (e.g. Keras Adam's
//    `1 - self.beta_1`, Optax's `(1 - decay)`) are computed in double and rounded once; constants
//    it computes on float32 tensors (e.g. Keras Lion's `1.0 - ops.cast(beta_1)`) in float32.
//  * Scalars depending on (lr, step) are computed once per batch in prepare(), into StepArgs::c.
//    Powers beta^t are float32(beta) raised to float32(t), correctly rounded (the frameworks'
//    own float32 pow is within one ulp of that).
//  * The per-element math is in optimizer_math.h (DE_HD: the GPU table runs the same functions);
//    each class here fills its kernels::OptimizerKernel and runs those functions in its loops.
//  * flavor=keras: every optimizer takes Keras 3's generic decoupled `weight_decay`
//    (BaseOptimizer._apply_weight_decay: w = w - (w*weight_decay)*lr, before the step), applied
//    when the spec gives it (Keras applies it whenever it is not None); AdamW's defaults to 0.004.
//    flavor=optax keeps Optax's own definitions (adamw, lion, adadelta take weight_decay).
#ifndef DUALEMB_OPTIMIZERS_COMMON_H_
#define DUALEMB_OPTIMIZERS_COMMON_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "config.h"
#include "optimizer.h"

// Per-element loops are compiled twice, for AVX2 and for baseline x86-64, and the loader picks
// one per machine. Both give the same bits: no FMA either way (-ffp-contract=off), and add, mul,
// div and sqrt are correctly rounded in every instruction set.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define DUALEMB_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DUALEMB_SIMD_CLONES
#endif

namespace dualemb {
namespace optimizers {

enum class Flavor { kKeras, kOptax };

inline const char* flavor_name(Flavor f) { return f == Flavor::kKeras ? "keras" : "optax"; }

// Admissible values of a real hyper-parameter: [lo, hi], either end open.
struct Range {
  double lo, hi;
  bool lo_open, hi_open;
};
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr Range kUnit{0.0, 1.0, false, false};         // [0, 1]
constexpr Range kUnitOpenHigh{0.0, 1.0, false, true};  // [0, 1)
constexpr Range kNonNegative{0.0, kInf, false, true};  // [0, inf)
constexpr Range kNonPositive{-kInf, 0.0, true, false}; // (-inf, 0]

// Reads the hyper-parameters of one spec, checks their ranges, rejects names it was not asked
// for, and gives the canonical spec: the JSON object of the name, the flavor and every
// hyper-parameter read (each as given, or its default).
class HyperParams {
 public:
  HyperParams(const Config& cfg, const std::string& name, Flavor flavor);

  double real(const std::string& key, double fallback, Range range);
  bool flag(const std::string& key, bool fallback);
  // Throws std::invalid_argument naming the first entry of the spec that was not read.
  // Returns the canonical spec JSON {"flavor":..,"name":..,<hyper-parameters>}.
  std::string finish() const;
  // "optimizer 'adam' (flavor=keras)", for error messages.
  const std::string& context() const { return context_; }
  [[noreturn]] void fail(const std::string& what) const;

 private:
  const Config& cfg_;
  std::string context_;
  std::set<std::string> known_;
};

// Keras' weight decay over a row (kernels::keras_weight_decay per element).
inline void decay_loop(float* __restrict w, int64_t dim, float wd, float lr) {
  for (int64_t i = 0; i < dim; ++i) w[i] = kernels::keras_weight_decay(w[i], wd, lr);
}

// The common parts of every optimizer: slot names and initial values, and the canonical spec.
class OptimizerBase : public Optimizer {
 public:
  int num_slots() const override { return static_cast<int>(slot_names_.size()); }
  std::vector<std::string> slot_names() const override { return slot_names_; }
  float slot_initial_value(int slot) const override;
  std::string spec() const override { return spec_; }
  kernels::OptimizerKernel kernel() const override {
    kernels::OptimizerKernel k = k_;
    k.num_slots = num_slots();
    return k;
  }

 protected:
  void add_slot(const std::string& name, float initial) {
    slot_names_.push_back(name);
    slot_init_.push_back(initial);
  }
  void set_spec(const std::string& spec) { spec_ = spec; }
  // Validates (lr, step) and fills the common fields of StepArgs.
  StepArgs start(float lr, int64_t step) const;
  // Keras 3's decoupled weight decay, which every Keras optimizer takes (BaseOptimizer's
  // weight_decay): read when the spec has "weight_decay" (then described too), else none.
  // AdamW reads its own (default 0.004) and calls set_keras_weight_decay.
  void read_keras_weight_decay(const Config& cfg, HyperParams& hp);
  void set_keras_weight_decay(float wd) {
    k_.keras_decay = true;
    k_.keras_wd = wd;
  }
  // Applies that decay to a row before the update (w = w - (w * wd) * lr), when set: the same
  // expression, per element, that kernels::apply_element applies first.
  void decay_row(float* row, int64_t dim, float lr) const {
    if (!k_.keras_decay) return;
    decay_loop(row, dim, k_.keras_wd, lr);
  }

  // The optimizer as plain data; each constructor fills the members its kind reads.
  kernels::OptimizerKernel k_;

 private:
  std::vector<std::string> slot_names_;
  std::vector<float> slot_init_;
  std::string spec_;
};

// float32(base) ** float32(step), rounded once to float32.
inline float pow_step(float base, int64_t step) {
  return static_cast<float>(
      std::pow(static_cast<double>(base), static_cast<double>(static_cast<float>(step))));
}

using Factory = std::unique_ptr<Optimizer> (*)(const Config& cfg, const std::string& name,
                                               Flavor flavor);

// One factory per optimizer family (each in its own .cc). `name` is the canonical name.
std::unique_ptr<Optimizer> make_sgd(const Config& cfg, const std::string& name, Flavor flavor);
std::unique_ptr<Optimizer> make_adagrad(const Config& cfg, const std::string& name, Flavor flavor);
// adam, adamw (both flavors; amsgrad=true selects Keras' amsgrad / optax.amsgrad).
std::unique_ptr<Optimizer> make_adam(const Config& cfg, const std::string& name, Flavor flavor);
std::unique_ptr<Optimizer> make_adamax(const Config& cfg, const std::string& name, Flavor flavor);
// optax.nadam = optax.adam(nesterov=True): lives in adam.cc, called by make_nadam.
std::unique_ptr<Optimizer> make_optax_nadam(const Config& cfg);
std::unique_ptr<Optimizer> make_nadam(const Config& cfg, const std::string& name, Flavor flavor);
std::unique_ptr<Optimizer> make_rmsprop(const Config& cfg, const std::string& name, Flavor flavor);
std::unique_ptr<Optimizer> make_ftrl(const Config& cfg, const std::string& name, Flavor flavor);
std::unique_ptr<Optimizer> make_adadelta(const Config& cfg, const std::string& name,
                                         Flavor flavor);
std::unique_ptr<Optimizer> make_lion(const Config& cfg, const std::string& name, Flavor flavor);

}  // namespace optimizers
}  // namespace dualemb

#endif  // DUALEMB_OPTIMIZERS_COMMON_H_
