// kernels_io.cc — export (paged) and import of whole rows: keys, values, slots and metadata.
// Used by checkpointing (dualemb/tf/saving/) and Variable.export().
#include <algorithm>

#include <vector>

#include "common.h"

namespace dualemb_tf {
namespace {

using ::tensorflow::DEVICE_CPU;

class ExportOp : public OpKernel {
 public:
  explicit ExportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tkey", &key_type_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tvalue", &value_type_));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t id, offset, limit, size = 0;
    OP_REQUIRES_OK(ctx, TableIdInput(ctx, 0, &id));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, "offset", &offset));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 2, "limit", &limit));
    OP_REQUIRES(ctx, offset >= 0,
                absl::InvalidArgumentError(name() + ": offset must be >= 0"));
    TableDims d;
    OP_REQUIRES_OK(ctx, GetDims(name(), id, &d));
    OP_REQUIRES(ctx, CoreKeyDtype(key_type_) == d.key_dtype,
                absl::InvalidArgumentError(name() + ": the op exports " +
                                           ::tensorflow::DataTypeString(key_type_) +
                                           " keys but the table's key dtype is " +
                                           KeyDtypeName(d.key_dtype)));
    OP_REQUIRES_OK(ctx, CheckValueDtype(name(), d, value_type_));
    OP_REQUIRES(ctx, dim_ < 0 || dim_ == d.dim,
                absl::InvalidArgumentError(name() + ": the op was built for dim " +
                                           std::to_string(dim_) + " but the table has dim " +
                                           std::to_string(d.dim)));
    DE_CORE_CALL(ctx, de_size(id, &size));
    int64_t rows = std::max<int64_t>(0, size - offset);
    if (limit >= 0) rows = std::min(rows, limit);

    Tensor keys, values, slots, last, count, stepped;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(key_type_, TensorShape({rows}), &keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(value_type_, TensorShape({rows, d.dim}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(value_type_, TensorShape({rows, d.num_slots, d.dim}),
                                           &slots));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({rows}), &last));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({rows}), &count));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_BOOL, TensorShape({rows}), &stepped));
    // bool is one byte holding 0 or 1: the core's uint8 flags are valid bools.
    static_assert(sizeof(bool) == 1, "TF bool tensors must be one byte per element");
    uint8_t* stepped_ptr = reinterpret_cast<uint8_t*>(stepped.flat<bool>().data());
    int64_t got = 0;
    // A string table's rows come back through a CoreStringsOut, copied into `values` after.
    const bool string_values = d.value_dtype == DE_VALUE_STRING;
    CoreStringsOut string_rows(string_values ? rows * d.dim : 0);
    if (rows > 0 && string_values) {
      DE_CORE_CALL(ctx, de_export(id, offset, rows, d.key_dtype, keys.data(), string_rows.ptr(),
                                  nullptr, 0, last.flat<int64_t>().data(),
                                  count.flat<int64_t>().data(), stepped_ptr, &got));
      string_rows.CopyTo(&values, got * d.dim);
    } else if (rows > 0 && d.key_dtype == DE_KEY_STRING) {
      // String keys come as bytes + offsets; the byte buffer grows until the page fits whole.
      std::vector<char> bytes(static_cast<size_t>(std::max<int64_t>(4096, 32 * rows)));
      std::vector<int64_t> offs(static_cast<size_t>(rows) + 1);
      for (;;) {
        de_string_keys_out out{bytes.data(), static_cast<int64_t>(bytes.size()), offs.data(), 0};
        DE_CORE_CALL(ctx, de_export(id, offset, rows, d.key_dtype, &out,
                                    values.data(), d.num_slots ? slots.data() : nullptr,
                                    d.num_slots, last.flat<int64_t>().data(),
                                    count.flat<int64_t>().data(), stepped_ptr, &got));
        if (out.needed == 0) break;
        bytes.resize(bytes.size() * 2 + static_cast<size_t>(out.needed));
      }
      auto k = keys.flat<::tensorflow::tstring>();
      for (int64_t i = 0; i < got; ++i) k(i).assign(bytes.data() + offs[i], offs[i + 1] - offs[i]);
    } else if (rows > 0) {
      DE_CORE_CALL(ctx, de_export(id, offset, rows, d.key_dtype, keys.data(),
                                  values.data(), d.num_slots ? slots.data() : nullptr,
                                  d.num_slots, last.flat<int64_t>().data(),
                                  count.flat<int64_t>().data(), stepped_ptr, &got));
    }
    // The table may have shrunk between size and export (a concurrent erase): keep what was read.
    ctx->set_output(0, got == rows ? keys : keys.Slice(0, got));
    ctx->set_output(1, got == rows ? values : values.Slice(0, got));
    ctx->set_output(2, got == rows ? slots : slots.Slice(0, got));
    ctx->set_output(3, got == rows ? last : last.Slice(0, got));
    ctx->set_output(4, got == rows ? count : count.Slice(0, got));
    ctx->set_output(5, got == rows ? stepped : stepped.Slice(0, got));
  }

 private:
  int64_t dim_;
  DataType key_type_;
  DataType value_type_;
};

class ImportOp : public OpKernel {
 public:
  explicit ImportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("clear", &clear_));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t id;
    TableDims d;
    OP_REQUIRES_OK(ctx, TableIdInput(ctx, 0, &id));
    OP_REQUIRES_OK(ctx, GetDims(name(), id, &d));  // with the current slot count
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    const Tensor& slots = ctx->input(3);
    const Tensor& last = ctx->input(4);
    const Tensor& count = ctx->input(5);
    OP_REQUIRES(ctx, keys.dims() == 1,
                absl::InvalidArgumentError(name() + ": keys must be a vector, got shape " +
                                           keys.shape().DebugString()));
    OP_REQUIRES_OK(ctx, CheckKeys(name(), d, keys));
    OP_REQUIRES_OK(ctx, CheckRows(name(), "values", d, keys, values));
    const int64_t n = keys.NumElements();
    const void* slot_ptr = nullptr;
    if (slots.NumElements() > 0 || (slots.dims() == 3 && slots.dim_size(1) > 0)) {
      TensorShape want({n, d.num_slots, d.dim});
      OP_REQUIRES(ctx, slots.shape() == want,
                  absl::InvalidArgumentError(name() + ": slots have shape " +
                                             slots.shape().DebugString() + ", expected " +
                                             want.DebugString() + " [n, num_slots, dim]"));
      OP_REQUIRES(ctx, slots.dtype() == values.dtype(),
                  absl::InvalidArgumentError(name() + ": slots have dtype " +
                                             ::tensorflow::DataTypeString(slots.dtype()) +
                                             ", expected the values' " +
                                             ::tensorflow::DataTypeString(values.dtype())));
      slot_ptr = slots.data();
    }
    auto meta = [&](const Tensor& t, const char* what, const int64_t** ptr) -> absl::Status {
      if (t.NumElements() == 0 && n != 0) return absl::OkStatus();  // left out
      if (t.dims() != 1 || t.NumElements() != n)
        return absl::InvalidArgumentError(name() + ": " + what + " has shape " +
                                          t.shape().DebugString() + ", expected [" +
                                          std::to_string(n) + "] or empty");
      *ptr = n ? t.flat<int64_t>().data() : nullptr;
      return absl::OkStatus();
    };
    const int64_t* last_ptr = nullptr;
    const int64_t* count_ptr = nullptr;
    OP_REQUIRES_OK(ctx, meta(last, "last_update", &last_ptr));
    OP_REQUIRES_OK(ctx, meta(count, "update_count", &count_ptr));
    // `stepped` is an optional list input (0 or 1 tensors), so graphs saved before it load.
    const uint8_t* stepped_ptr = nullptr;
    if (ctx->num_inputs() > 6) {
      const Tensor& stepped = ctx->input(6);
      OP_REQUIRES(ctx, stepped.dims() == 1 && stepped.NumElements() == n,
                  absl::InvalidArgumentError(name() + ": stepped has shape " +
                                             stepped.shape().DebugString() + ", expected [" +
                                             std::to_string(n) + "]"));
      stepped_ptr = n ? reinterpret_cast<const uint8_t*>(stepped.flat<bool>().data()) : nullptr;
    }
    const bool string_values = d.value_dtype == DE_VALUE_STRING;
    OP_REQUIRES(ctx, !(string_values && slot_ptr),
                absl::InvalidArgumentError(name() + ": a table of value dtype string has no "
                                           "optimizer slots"));
    CoreStrings string_rows(string_values ? values
                                          : Tensor(::tensorflow::DT_STRING, TensorShape({0})));
    ScopedRunnerHelpers helpers(ctx);
    int64_t evicted = 0;
    const void* row_ptr = string_values ? string_rows.ptr() : values.data();
    if (clear_ && n == 0) {
      DE_CORE_CALL(ctx, de_clear(id));
    } else if (clear_) {
      // One call: the core refills the table's own memory (de_clear would unmap it and the
      // import fault it all in again: docs/benchmarks.md, "Regressions since the turn-2 main").
      DE_CORE_CALL(ctx, de_replace(id, d.key_dtype, CoreKeys(keys).ptr(), n, row_ptr, slot_ptr,
                                   d.num_slots, last_ptr, count_ptr, stepped_ptr, &evicted));
    } else if (n > 0) {
      DE_CORE_CALL(ctx, de_import(id, d.key_dtype, CoreKeys(keys).ptr(), n, row_ptr, slot_ptr,
                                  d.num_slots, last_ptr, count_ptr, stepped_ptr, &evicted));
    }
    OP_REQUIRES_OK(ctx, OutputScalar(ctx, 0, evicted));
  }

 private:
  bool clear_;
};

// One kernel per op, for every key dtype its Tkey attr allows (csrc/tf/ops.cc kKeyDtypeAttr):
// no TypeConstraint, as no kernel is specialised by key dtype (they read it at run time).
REGISTER_KERNEL_BUILDER(Name("DualembExport").Device(DEVICE_CPU), ExportOp);
REGISTER_KERNEL_BUILDER(Name("DualembImport").Device(DEVICE_CPU), ImportOp);

}  // namespace
}  // namespace dualemb_tf
