// kernels_train.cc — the fused optimizer step and restriction (eviction by score).
#include "common.h"

namespace dualemb_tf {
namespace {

using ::tensorflow::DEVICE_CPU;

class ApplyGradientsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    int64_t id, step;
    TableDims d;
    OP_REQUIRES_OK(ctx, TableOf(ctx, &id, &d));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 4, "step", &step));
    const Tensor& lr = ctx->input(3);
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(lr.shape()),
                absl::InvalidArgumentError(name() + ": learning_rate must be a scalar"));
    const Tensor& keys = ctx->input(1);
    const Tensor& grads = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckKeys(name(), d, keys));
    OP_REQUIRES_OK(ctx, CheckRows(name(), "gradients", d, keys, grads,
                                  /*float32_rows=*/true));
    ScopedRunnerHelpers helpers(ctx);
    int64_t evicted = 0;
    if (keys.NumElements() > 0) {
      DE_CORE_CALL(ctx, de_apply_gradients(id, d.key_dtype, CoreKeys(keys).ptr(), keys.NumElements(),
                                           grads.flat<float>().data(), lr.scalar<float>()(), step,
                                           &evicted));
    }
    OP_REQUIRES_OK(ctx, OutputScalar(ctx, 0, evicted));
  }
};

class RestrictOp : public OpKernel {
 public:
  explicit RestrictOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("policy", &policy_));
    OP_REQUIRES(ctx, policy_ >= DE_RESTRICT_RECENCY && policy_ <= DE_RESTRICT_CUSTOM,
                absl::InvalidArgumentError("policy must be 0 (recency), 1 (frequency) or 2 (custom)"));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t id, num_reserved;
    TableDims d;
    OP_REQUIRES_OK(ctx, TableOf(ctx, &id, &d));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, "num_reserved", &num_reserved));
    OP_REQUIRES(ctx, num_reserved >= 0,
                absl::InvalidArgumentError(name() + ": num_reserved must be >= 0, got " +
                                           std::to_string(num_reserved)));
    const Tensor& keys = ctx->input(2);
    const Tensor& scores = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckKeys(name(), d, keys));
    OP_REQUIRES(ctx, scores.NumElements() == keys.NumElements(),
                absl::InvalidArgumentError(name() + ": scores must have one entry per key"));
    ScopedRunnerHelpers helpers(ctx);
    int64_t removed = 0;
    const bool custom = policy_ == DE_RESTRICT_CUSTOM;
    CoreKeys core_keys(keys);
    DE_CORE_CALL(ctx, de_restrict(id, num_reserved, policy_, d.key_dtype,
                                  custom ? core_keys.ptr() : nullptr,
                                  custom ? scores.flat<float>().data() : nullptr,
                                  custom ? keys.NumElements() : 0, &removed));
    OP_REQUIRES_OK(ctx, OutputScalar(ctx, 0, removed));
  }

 private:
  int policy_;
};

// One kernel per op, for every key dtype its Tkey attr allows (csrc/tf/ops.cc kKeyDtypeAttr):
// no TypeConstraint, as no kernel is specialised by key dtype (they read it at run time).
REGISTER_KERNEL_BUILDER(Name("DualembApplyGradients").Device(DEVICE_CPU),
                        ApplyGradientsOp);
REGISTER_KERNEL_BUILDER(Name("DualembRestrict").Device(DEVICE_CPU), RestrictOp);

}  // namespace
}  // namespace dualemb_tf
