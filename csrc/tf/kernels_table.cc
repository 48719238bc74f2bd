// kernels_table.cc — table lifecycle and whole-table ops: handle (create / attach), id, clear,
// size, set_optimizer, describe, clock, and the library's build info.
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

// Sets output 0 to an anonymous ref-counted handle of a new TableResource, which takes over the
// owner reference the caller holds on core table `id` (released if this fails).
void OutputTableHandle(OpKernelContext* ctx, int64_t id) {
  auto* resource = new TableResource(id);
  Tensor* out = nullptr;
  ::tensorflow::AllocatorAttributes on_host;
  on_host.set_on_host(true);
  absl::Status s = ctx->allocate_output(0, TensorShape({}), &out, on_host);
  if (!s.ok()) {
    resource->Unref();  // releases the core table
    ctx->CtxFailure(s);
    return;
  }
  // The handle owns the resource's initial reference; the device makes ops that take the handle
  // run where the table lives.
  out->scalar<::tensorflow::ResourceHandle>()() =
      ::tensorflow::ResourceHandle::MakeRefCountingHandle<TableResource>(resource,
                                                                         ctx->device()->name());
}

// A fresh core table with `optimizer` attached; *id receives its id (one owner reference).
absl::Status CreateCoreTable(const std::string& op, const std::string& config,
                             const std::string& optimizer, int64_t* id) {
  if (de_table_create(0, config.c_str(), id) != 0)
    return absl::InvalidArgumentError(op + ": " + de_last_error());
  if (!optimizer.empty() && de_set_optimizer(*id, optimizer.c_str()) != 0) {
    const std::string msg = de_last_error();
    de_table_release(*id);  // leave no half-made table behind
    return absl::InvalidArgumentError(op + ": " + msg);
  }
  return absl::OkStatus();
}

class TableHandleOp : public OpKernel {
 public:
  explicit TableHandleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("container", &container_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("session_name", &session_name_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::string config, optimizer;
    OP_REQUIRES_OK(ctx, StringScalar(ctx, 0, "config", &config));
    OP_REQUIRES_OK(ctx, StringScalar(ctx, 1, "optimizer", &optimizer));
    if (session_name_.empty()) {
      int64_t id = 0;
      OP_REQUIRES_OK(ctx, CreateCoreTable(name(), config, optimizer, &id));
      OutputTableHandle(ctx, id);
      return;
    }
    // Named: the resource manager owns the table; later runs find it there.
    auto* rm = ctx->resource_manager();
    const std::string container = container_.empty() ? rm->default_container() : container_;
    TableResource* table = nullptr;
    OP_REQUIRES_OK(ctx, rm->LookupOrCreate<TableResource>(
                            container, session_name_, &table, [&](TableResource** out) {
                              int64_t id = 0;
                              TF_RETURN_IF_ERROR(CreateCoreTable(name(), config, optimizer, &id));
                              *out = new TableResource(id);
                              return absl::OkStatus();
                            }));
    table->Unref();  // LookupOrCreate's reference; the resource manager keeps its own
    Tensor* out = nullptr;
    ::tensorflow::AllocatorAttributes on_host;
    on_host.set_on_host(true);
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out, on_host));
    out->scalar<::tensorflow::ResourceHandle>()() =
        ::tensorflow::MakeResourceHandle<TableResource>(ctx, container, session_name_);
  }

 private:
  std::string container_;
  std::string session_name_;
};

class TableAttachOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    int64_t id;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 0, "table_id", &id));
    // The kernels pass float32 row buffers: a table of another value dtype would be misread.
    int32_t value_dtype = -1;
    DE_CORE_CALL(ctx, de_value_dtype(id, &value_dtype));
    OP_REQUIRES(ctx, value_dtype == DE_VALUE_FLOAT32,
                ::tensorflow::errors::InvalidArgument(
                    "table ", id, " stores values of dtype code ", value_dtype,
                    " (not float32); the dualemb.tf ops read and write float32 rows"));
    DE_CORE_CALL(ctx, de_table_retain(id));
    OutputTableHandle(ctx, id);
  }
};

class TableIdOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    int64_t id;
    OP_REQUIRES_OK(ctx, TableIdInput(ctx, 0, &id));
    OutputInt64(ctx, id);
  }
};

class ClearOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    int64_t id;
    OP_REQUIRES_OK(ctx, TableIdInput(ctx, 0, &id));
    DE_CORE_CALL(ctx, de_clear(id));
  }
};

class SizeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    int64_t id, n = 0;
    OP_REQUIRES_OK(ctx, TableIdInput(ctx, 0, &id));
    DE_CORE_CALL(ctx, de_size(id, &n));
    OutputInt64(ctx, n);
  }
};

class SetOptimizerOp : public OpKernel {
 public:
  explicit SetOptimizerOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("empty_detaches", &empty_detaches_));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t id;
    std::string spec;
    OP_REQUIRES_OK(ctx, TableIdInput(ctx, 0, &id));
    OP_REQUIRES_OK(ctx, StringScalar(ctx, 1, "spec", &spec));
    if (spec.empty() && !empty_detaches_) return;
    DE_CORE_CALL(ctx, de_set_optimizer(id, spec.c_str()));
  }

 private:
  bool empty_detaches_;
};

class DescribeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    int64_t id;
    OP_REQUIRES_OK(ctx, TableIdInput(ctx, 0, &id));
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
    OP_REQUIRES_OK(ctx, TableIdInput(ctx, 0, &id));
    DE_CORE_CALL(ctx, de_get_clock(id, &clock));
    OutputInt64(ctx, clock);
  }
};

class SetClockOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    int64_t id, clock;
    OP_REQUIRES_OK(ctx, TableIdInput(ctx, 0, &id));
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

REGISTER_KERNEL_BUILDER(Name("DualembTableHandle").Device(DEVICE_CPU), TableHandleOp);
REGISTER_KERNEL_BUILDER(Name("DualembTableAttach").Device(DEVICE_CPU), TableAttachOp);
REGISTER_KERNEL_BUILDER(Name("DualembTableId").Device(DEVICE_CPU), TableIdOp);
REGISTER_KERNEL_BUILDER(Name("DualembClear").Device(DEVICE_CPU), ClearOp);
REGISTER_KERNEL_BUILDER(Name("DualembSize").Device(DEVICE_CPU), SizeOp);
REGISTER_KERNEL_BUILDER(Name("DualembSetOptimizer").Device(DEVICE_CPU), SetOptimizerOp);
REGISTER_KERNEL_BUILDER(Name("DualembDescribe").Device(DEVICE_CPU), DescribeOp);
REGISTER_KERNEL_BUILDER(Name("DualembGetClock").Device(DEVICE_CPU), GetClockOp);
REGISTER_KERNEL_BUILDER(Name("DualembSetClock").Device(DEVICE_CPU), SetClockOp);
REGISTER_KERNEL_BUILDER(Name("DualembBuildInfo").Device(DEVICE_CPU), BuildInfoOp);

}  // namespace
}  // namespace dualemb_tf
