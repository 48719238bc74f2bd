// optimizer.h — the fused sparse optimizers' interface inside the core.
//
// A table row is stored as [value (dim) | slot 0 (dim) | slot 1 (dim) | ...]. The table groups a
// batch's gradients by key (duplicates summed), then calls apply() once per distinct row. Both
// the Keras 3 and the Optax definition of each optimizer are implemented; `flavor` picks one.
// The per-element math is in optimizer_math.h (DE_HD, shared with the GPU table): apply() runs
// it over a row; kernel() describes the same optimizer as plain data for
// kernels::apply_element(), which gives apply()'s bits element by element.
#ifndef DUALEMB_OPTIMIZER_H_
#define DUALEMB_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "optimizer_math.h"

namespace dualemb {

// Scalars that depend only on (lr, step), computed once per batch by prepare().
struct StepArgs {
  float lr = 0.f;
  int64_t step = 1;  // 1-based update count t
  double c[8] = {0, 0, 0, 0, 0, 0, 0, 0};
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual int num_slots() const = 0;
  virtual std::vector<std::string> slot_names() const = 0;
  // Value every slot column of a newly inserted row starts with.
  virtual float slot_initial_value(int slot) const = 0;
  virtual StepArgs prepare(float lr, int64_t step) const = 0;
  // Updates one row in place. row: [dim]; slots: [num_slots * dim]; grad: [dim] (already summed).
  virtual void apply(float* row, float* slots, const float* grad, int64_t dim,
                     const StepArgs& args) const = 0;
  // This optimizer as plain data for kernels::apply_element() (optimizer_math.h).
  virtual kernels::OptimizerKernel kernel() const = 0;
  // Canonical spec, a JSON object (config.h): name, flavor and every hyper-parameter (as given,
  // or its default), so that make_optimizer(spec()) recreates the same optimizer.
  virtual std::string spec() const = 0;
};

// The float32 scalars the per-element math reads (StepArgs' constants rounded as apply() rounds
// them).
inline kernels::StepScalars step_scalars(const StepArgs& a) {
  kernels::StepScalars s;
  s.lr = a.lr;
  s.nlr = -a.lr;
  for (int k = 0; k < 5; ++k) s.c[k] = static_cast<float>(a.c[k]);
  return s;
}

// Parses the JSON spec {"name": "adam", "flavor": "keras", "beta_1": 0.9, ...}. Hyper-parameters
// not given take the flavor's default. Throws std::invalid_argument naming an unknown optimizer, flavor or hyper-parameter,
// or a value out of range.
std::unique_ptr<Optimizer> make_optimizer(const std::string& spec);

}  // namespace dualemb

#endif  // DUALEMB_OPTIMIZER_H_
