// kernels_many.cc — the multi-table ops: one op looks up, or trains, the tables of a step.
//
// A Keras model with F embedding tables otherwise runs F ops per step for each operation, each
// paying TF's per-op overhead and running alone. These check every table's inputs the way the
// per-table kernels do (kernels_lookup.cc, kernels_train.cc), each error prefixed with the table
// it is about, then make one core call (de_find_many, de_apply_gradients_many), which checks
// again before any table changes and runs the tables in parallel, each with its per-table code:
// the results equal the per-table ops' bit for bit.
#include <memory>
#include <string>
#include <vector>

#include "common.h"

namespace dualemb_tf {
namespace {

using ::tensorflow::DEVICE_CPU;

// "<op>: table i of N" — the prefix of every error about one table.
std::string TableName(const std::string& op, int i, int n) {
  return op + ": table " + std::to_string(i) + " of " + std::to_string(n);
}

// Prefixes a failed status with the table it is about (in place of the op name that the
// per-table checks of common.h start their messages with).
absl::Status ForTable(const absl::Status& s, const std::string& op, int i, int n) {
  if (s.ok()) return s;
  std::string message(s.message());
  if (message.compare(0, op.size() + 2, op + ": ") == 0) message.erase(0, op.size() + 2);
  return absl::InvalidArgumentError(TableName(op, i, n) + ": " + message);
}

// The tables of inputs [0, n): their core ids and fixed dims, each checked to be a table handle.
absl::Status TablesOf(OpKernelContext* ctx, int n, std::vector<int64_t>* ids,
                      std::vector<TableDims>* dims) {
  const std::string& op = ctx->op_kernel().name();
  ids->resize(n);
  dims->resize(n);
  for (int i = 0; i < n; ++i) {
    ::tensorflow::core::RefCountPtr<TableResource> table;
    TF_RETURN_IF_ERROR(ForTable(TableInput(ctx, i, &table), op, i, n));
    (*ids)[i] = table->id();
    TF_RETURN_IF_ERROR(ForTable(table->FixedDims(op, &(*dims)[i]), op, i, n));
  }
  return absl::OkStatus();
}

// The core's batch of table i (keys from `keys`, whose CoreKeys `core_keys` keeps alive).
de_table_batch Batch(int64_t id, const TableDims& d, const Tensor& keys,
                     const CoreKeys& core_keys) {
  de_table_batch b{};
  b.id = id;
  b.key_dtype = d.key_dtype;
  b.keys = core_keys.ptr();
  b.n = keys.NumElements();
  return b;
}

// Runs `call` on the batches of the tables that have keys (a table without keys changes
// nothing, as its per-table op skips the core call); `index[j]` is batch j's table among the
// op's `n`. The core names a failing batch by its position among the batches: the error names
// the op's table instead.
absl::Status RunMany(const std::string& op, int (*call)(de_table_batch*, int64_t),
                     std::vector<de_table_batch>* batches, const std::vector<int>& index, int n) {
  if (batches->empty()) return absl::OkStatus();
  const int64_t m = static_cast<int64_t>(batches->size());
  if (call(batches->data(), m) == 0) return absl::OkStatus();
  std::string message = de_last_error();
  for (int64_t j = 0; j < m; ++j) {
    const std::string core_name = "table " + std::to_string(j) + " of " + std::to_string(m) +
                                  " (id " + std::to_string((*batches)[j].id) + ")";
    const size_t at = message.find(core_name);
    if (at == std::string::npos) continue;
    message.replace(at, core_name.size(),
                    "table " + std::to_string(index[j]) + " of " + std::to_string(n) + " (id " +
                        std::to_string((*batches)[j].id) + ")");
    break;
  }
  return absl::InvalidArgumentError(op + ": " + message);
}

class FindManyOp : public OpKernel {
 public:
  explicit FindManyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dims", &dims_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("insert_missing", &insert_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tvalues", &value_types_));
    OP_REQUIRES(ctx,
                static_cast<int>(dims_.size()) == n_ && static_cast<int>(value_types_.size()) == n_,
                absl::InvalidArgumentError(name() + ": dims and Tvalues need one entry per table"));
  }

  void Compute(OpKernelContext* ctx) override {
    const int n = n_;
    std::vector<int64_t> ids;
    std::vector<TableDims> dims;
    OP_REQUIRES_OK(ctx, TablesOf(ctx, n, &ids, &dims));
    std::vector<std::unique_ptr<CoreKeys>> core_keys(n);
    std::vector<de_table_batch> batches;
    std::vector<int> index;
    batches.reserve(n);
    for (int i = 0; i < n; ++i) {
      const TableDims& d = dims[i];
      const Tensor& keys = ctx->input(n + i);
      OP_REQUIRES_OK(ctx, ForTable(CheckKeys(name(), d, keys), name(), i, n));
      OP_REQUIRES_OK(ctx, ForTable(CheckValueDtype(name(), d, value_types_[i]), name(), i, n));
      OP_REQUIRES(
          ctx, d.dim == dims_[i],
          absl::InvalidArgumentError(TableName(name(), i, n) + ": the op was built for dim " +
                                     std::to_string(dims_[i]) + " but the table has dim " +
                                     std::to_string(d.dim)));
      TensorShape rows_shape = keys.shape();
      rows_shape.AddDim(d.dim);
      Tensor* values = nullptr;
      Tensor* exists = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, rows_shape, &values));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(n + i, keys.shape(), &exists));
      if (keys.NumElements() == 0) continue;
      core_keys[i] = std::make_unique<CoreKeys>(keys);
      de_table_batch b = Batch(ids[i], d, keys, *core_keys[i]);
      b.values = values->data();
      b.exists = reinterpret_cast<uint8_t*>(exists->flat<bool>().data());
      batches.push_back(b);
      index.push_back(i);
    }
    ScopedRunnerHelpers helpers(ctx);
    OP_REQUIRES_OK(
        ctx, RunMany(name(), insert_ ? de_find_or_insert_many : de_find_many, &batches, index, n));
    std::vector<int64_t> evicted(n, 0);
    for (size_t j = 0; j < batches.size(); ++j) evicted[index[j]] = batches[j].evicted;
    for (int i = 0; i < n; ++i) OP_REQUIRES_OK(ctx, OutputScalar(ctx, 2 * n + i, evicted[i]));
  }

 private:
  int n_;
  std::vector<int64_t> dims_;
  bool insert_;
  std::vector<DataType> value_types_;
};

class ApplyGradientsManyOp : public OpKernel {
 public:
  explicit ApplyGradientsManyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int n = n_;
    std::vector<int64_t> ids;
    std::vector<TableDims> dims;
    OP_REQUIRES_OK(ctx, TablesOf(ctx, n, &ids, &dims));
    int64_t step;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 3 * n + 1, "step", &step));
    const Tensor& lr = ctx->input(3 * n);
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(lr.shape()),
                absl::InvalidArgumentError(name() + ": learning_rate must be a scalar"));
    std::vector<std::unique_ptr<CoreKeys>> core_keys(n);
    std::vector<de_table_batch> batches;
    std::vector<int> index;
    batches.reserve(n);
    for (int i = 0; i < n; ++i) {
      const Tensor& keys = ctx->input(n + i);
      const Tensor& grads = ctx->input(2 * n + i);
      OP_REQUIRES_OK(ctx, ForTable(CheckKeys(name(), dims[i], keys), name(), i, n));
      OP_REQUIRES_OK(ctx, ForTable(CheckRows(name(), "gradients", dims[i], keys, grads,
                                             /*float32_rows=*/true),
                                   name(), i, n));
      if (keys.NumElements() == 0) continue;
      core_keys[i] = std::make_unique<CoreKeys>(keys);
      de_table_batch b = Batch(ids[i], dims[i], keys, *core_keys[i]);
      b.grads = grads.flat<float>().data();
      b.lr = lr.scalar<float>()();
      b.step = step;
      batches.push_back(b);
      index.push_back(i);
    }
    ScopedRunnerHelpers helpers(ctx);
    OP_REQUIRES_OK(ctx, RunMany(name(), de_apply_gradients_many, &batches, index, n));
    std::vector<int64_t> evicted(n, 0);
    for (size_t j = 0; j < batches.size(); ++j) evicted[index[j]] = batches[j].evicted;
    for (int i = 0; i < n; ++i) OP_REQUIRES_OK(ctx, OutputScalar(ctx, i, evicted[i]));
  }

 private:
  int n_;
};

// One kernel per op, for every key dtype its Tkey attr allows (csrc/tf/ops.cc kKeyDtypeAttr).
REGISTER_KERNEL_BUILDER(Name("DualembFindMany").Device(DEVICE_CPU), FindManyOp);
REGISTER_KERNEL_BUILDER(Name("DualembApplyGradientsMany").Device(DEVICE_CPU), ApplyGradientsManyOp);

}  // namespace
}  // namespace dualemb_tf
