// kernels_table.cc — table lifecycle and whole-table ops: create, clear, size, set_optimizer,
// describe, clock, and the library's build info.
#include <string>
#include <vector>

#include "common.h"
// The TensorFlow version is passed by tf_ops.cmake (TF 2.21 headers no longer define it).
#ifndef DUALEMB_TF_VERSION
#error "DUALEMB_TF_VERSION must be defined by the build (csrc/tf/tf_ops.cmake)"
#endif

namespace dualemb_tf {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::tstring;

absl::Status StringScalar(OpKernelContext* ctx, int index, const char* what, std::string* out) {
  const Tensor& t = ctx->input(index);
  if (t.dtype() != ::tensorflow::DT_STRING || !::tensorflow::TensorShapeUtils::IsScalar(t.shape()))
    return absl::InvalidArgumentError(std::string(what) + " must be a string scalar");
  *out = std::string(t.scalar<tstring>()());
  return absl::OkStatus();
}

void OutputInt64(OpKernelContext* ctx, int64_t v) {
  OP_REQUIRES_OK(ctx, OutputScalar(ctx, 0, v));
}

class CreateTableOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    int64_t id;
    std::string config, optimizer;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 0, "table_id", &id));
    OP_REQUIRES_OK(ctx, StringScalar(ctx, 1, "config", &config));
    OP_REQUIRES_OK(ctx, StringScalar(ctx, 2, "optimizer", &optimizer));
    const bool existed = id != 0 && de_table_exists(id) == 1;
    int64_t out_id = 0;
    DE_CORE_CALL(ctx, de_table_create(id, config.c_str(), &out_id));
    if (!optimizer.empty()) {
      if (de_set_optimizer(out_id, optimizer.c_str()) != 0) {
        const std::string msg = de_last_error();
        if (!existed) de_table_destroy(out_id);  // leave no half-made table behind
        ctx->CtxFailure(absl::InvalidArgumentError(name() + ": " + msg));
        return;
      }
    }
    OutputInt64(ctx, out_id);
  }
};

class ClearOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    int64_t id;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 0, "table_id", &id));
    DE_CORE_CALL(ctx, de_clear(id));
  }
};

class SizeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    int64_t id, n = 0;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 0, "table_id", &id));
    DE_CORE_CALL(ctx, de_size(id, &n));
    OutputInt64(ctx, n);
  }
};

class SetOptimizerOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    int64_t id;
    std::string spec;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 0, "table_id", &id));
    OP_REQUIRES_OK(ctx, StringScalar(ctx, 1, "spec", &spec));
    DE_CORE_CALL(ctx, de_set_optimizer(id, spec.c_str()));
  }
};

class DescribeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    int64_t id;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 0, "table_id", &id));
    size_t needed = 0;
    std::vector<char> buf(256);
    DE_CORE_CALL(ctx, de_table_describe(id, buf.data(), buf.size(), &needed));
    if (needed > buf.size()) {
      buf.resize(needed);
      DE_CORE_CALL(ctx, de_table_describe(id, buf.data(), buf.size(), &needed));
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tstring>()() = std::string(buf.data());
  }
};

class GetClockOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    int64_t id, clock = 0;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 0, "table_id", &id));
    DE_CORE_CALL(ctx, de_get_clock(id, &clock));
    OutputInt64(ctx, clock);
  }
};

class SetClockOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    int64_t id, clock;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 0, "table_id", &id));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, "clock", &clock));
    DE_CORE_CALL(ctx, de_set_clock(id, clock));
  }
};

class BuildInfoOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    Tensor* tf_version = nullptr;
    Tensor* core_version = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &tf_version));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &core_version));
    tf_version->scalar<tstring>()() = DUALEMB_TF_VERSION;
    core_version->scalar<tstring>()() = de_version();
  }
};

REGISTER_KERNEL_BUILDER(Name("DualembCreateTable").Device(DEVICE_CPU), CreateTableOp);
REGISTER_KERNEL_BUILDER(Name("DualembClear").Device(DEVICE_CPU), ClearOp);
REGISTER_KERNEL_BUILDER(Name("DualembSize").Device(DEVICE_CPU), SizeOp);
REGISTER_KERNEL_BUILDER(Name("DualembSetOptimizer").Device(DEVICE_CPU), SetOptimizerOp);
REGISTER_KERNEL_BUILDER(Name("DualembDescribe").Device(DEVICE_CPU), DescribeOp);
REGISTER_KERNEL_BUILDER(Name("DualembGetClock").Device(DEVICE_CPU), GetClockOp);
REGISTER_KERNEL_BUILDER(Name("DualembSetClock").Device(DEVICE_CPU), SetClockOp);
REGISTER_KERNEL_BUILDER(Name("DualembBuildInfo").Device(DEVICE_CPU), BuildInfoOp);

}  // namespace
}  // namespace dualemb_tf
