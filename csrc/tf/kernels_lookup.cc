// kernels_lookup.cc — find / find_or_insert, insert_or_assign, accum, erase, and the identity
// that carries a lookup's gradient to its anchor.
#include "common.h"

namespace dualemb_tf {
namespace {

using ::tensorflow::DEVICE_CPU;

class FindOp : public OpKernel {
 public:
  explicit FindOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("insert_missing", &insert_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tvalue", &value_type_));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t id;
    TableDims d;
    OP_REQUIRES_OK(ctx, TableOf(ctx, &id, &d));
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeys(name(), d, keys));
    OP_REQUIRES_OK(ctx, CheckValueDtype(name(), d, value_type_));
    OP_REQUIRES(ctx, d.dim == dim_,
                absl::InvalidArgumentError(name() + ": the op was built for dim " +
                                           std::to_string(dim_) + " but the table has dim " +
                                           std::to_string(d.dim)));
    TensorShape rows_shape = keys.shape();
    rows_shape.AddDim(d.dim);
    Tensor* values = nullptr;
    Tensor* exists = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, rows_shape, &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &exists));
    const int64_t n = keys.NumElements();
    int64_t evicted = 0;
    ScopedRunnerHelpers helpers(ctx);
    if (n > 0) {
      // A string table's rows come back through a CoreStringsOut, copied into the tensor after.
      const bool strings = d.value_dtype == DE_VALUE_STRING;
      CoreStringsOut string_rows(strings ? n * d.dim : 0);
      void* out = strings ? string_rows.ptr() : values->data();
      auto* ex = reinterpret_cast<uint8_t*>(exists->flat<bool>().data());
      if (insert_) {
        DE_CORE_CALL(ctx, de_find_or_insert(id, d.key_dtype, CoreKeys(keys).ptr(), n, out, ex, &evicted));
      } else {
        DE_CORE_CALL(ctx, de_find(id, d.key_dtype, CoreKeys(keys).ptr(), n, out, ex));
      }
      if (strings) string_rows.CopyTo(values, n * d.dim);
    }
    OP_REQUIRES_OK(ctx, OutputScalar(ctx, 2, evicted));
  }

 private:
  int64_t dim_;
  bool insert_;
  DataType value_type_;
};

class InsertOrAssignOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    int64_t id;
    TableDims d;
    OP_REQUIRES_OK(ctx, TableOf(ctx, &id, &d));
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckKeys(name(), d, keys));
    OP_REQUIRES_OK(ctx, CheckRows(name(), "values", d, keys, values));
    ScopedRunnerHelpers helpers(ctx);
    int64_t evicted = 0;
    if (keys.NumElements() > 0) {
      const bool strings = d.value_dtype == DE_VALUE_STRING;
      CoreStrings string_rows(strings ? values : Tensor(::tensorflow::DT_STRING, TensorShape({0})));
      DE_CORE_CALL(ctx, de_insert_or_assign(id, d.key_dtype, CoreKeys(keys).ptr(), keys.NumElements(),
                                            strings ? string_rows.ptr() : values.data(), &evicted));
    }
    OP_REQUIRES_OK(ctx, OutputScalar(ctx, 0, evicted));
  }
};

// Variable.accum's two forms share everything but their row inputs: `DualembAccum` takes the
// deltas; `DualembAccumRows` (kFromRows) takes old and new rows and the core computes each delta
// (new - old where exists, else new) as it adds it: computing them with TF ops before the op
// cost a pass over the whole batch, about as much as the accum itself.
template <bool kFromRows>
class AccumOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    static constexpr int kExists = kFromRows ? 4 : 3;  // inputs 2 .. kExists-1 are row tensors
    static constexpr const char* kRowNames[] = {kFromRows ? "old_values" : "deltas", "new_values"};
    int64_t id;
    TableDims d;
    OP_REQUIRES_OK(ctx, TableOf(ctx, &id, &d));
    const Tensor& keys = ctx->input(1);
    const Tensor& exists = ctx->input(kExists);
    OP_REQUIRES_OK(ctx, CheckKeys(name(), d, keys));
    for (int i = 2; i < kExists; ++i)
      OP_REQUIRES_OK(ctx, CheckRows(name(), kRowNames[i - 2], d, keys, ctx->input(i)));
    OP_REQUIRES(ctx, exists.shape() == keys.shape(),
                absl::InvalidArgumentError(name() + ": exists has shape " +
                                           exists.shape().DebugString() + ", expected keys' " +
                                           keys.shape().DebugString()));
    ScopedRunnerHelpers helpers(ctx);
    int64_t evicted = 0;
    const int64_t n = keys.NumElements();
    if (n > 0) {
      const auto* ex = reinterpret_cast<const uint8_t*>(exists.flat<bool>().data());
      if constexpr (kFromRows) {
        DE_CORE_CALL(ctx, de_accum_rows(id, d.key_dtype, CoreKeys(keys).ptr(), n,
                                        ctx->input(2).data(), ctx->input(3).data(), ex,
                                        &evicted));
      } else {
        DE_CORE_CALL(ctx, de_accum(id, d.key_dtype, CoreKeys(keys).ptr(), n,
                                   ctx->input(2).data(), ex, &evicted));
      }
    }
    OP_REQUIRES_OK(ctx, OutputScalar(ctx, 0, evicted));
  }
};

class EraseOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    int64_t id;
    TableDims d;
    OP_REQUIRES_OK(ctx, TableOf(ctx, &id, &d));
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeys(name(), d, keys));
    ScopedRunnerHelpers helpers(ctx);
    if (keys.NumElements() > 0) {
      DE_CORE_CALL(ctx, de_erase(id, d.key_dtype, CoreKeys(keys).ptr(), keys.NumElements()));
    }
  }
};

class RowsWithKeyGradientOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override { ctx->set_output(0, ctx->input(1)); }
};

// One kernel per op, for every key dtype its Tkey attr allows (csrc/tf/ops.cc kKeyDtypeAttr):
// no TypeConstraint, as no kernel is specialised by key dtype (they read it at run time).
REGISTER_KERNEL_BUILDER(Name("DualembRowsWithKeyGradient").Device(DEVICE_CPU),
                        RowsWithKeyGradientOp);
REGISTER_KERNEL_BUILDER(Name("DualembFind").Device(DEVICE_CPU), FindOp);
REGISTER_KERNEL_BUILDER(Name("DualembInsertOrAssign").Device(DEVICE_CPU),
                        InsertOrAssignOp);
REGISTER_KERNEL_BUILDER(Name("DualembAccum").Device(DEVICE_CPU), AccumOp<false>);
REGISTER_KERNEL_BUILDER(Name("DualembAccumRows").Device(DEVICE_CPU), AccumOp<true>);
REGISTER_KERNEL_BUILDER(Name("DualembErase").Device(DEVICE_CPU), EraseOp);

}  // namespace
}  // namespace dualemb_tf
