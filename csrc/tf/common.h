// common.h — helpers shared by the dualemb TensorFlow kernels (csrc/tf/*.cc).
//
// Every op takes the core table id as its first input (an int64 scalar), so one op serves any
// number of tables; the kernels only check shapes and dtypes, then call the C ABI of
// libdualemb_core.so (dualemb_core.h). A core error becomes an InvalidArgument status carrying
// the core's message, and the core guarantees that a failed call left the table unchanged.
#ifndef DUALEMB_TF_COMMON_H_
#define DUALEMB_TF_COMMON_H_

#include <cstdint>
#include <string>

#include "dualemb_core.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace dualemb_tf {

using ::tensorflow::DataType;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// Status of a core call: OK, or InvalidArgument("<op>: <core message>").
inline absl::Status CoreStatus(int rc, const char* op) {
  if (rc == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(std::string(op) + ": " + de_last_error());
}

#define DE_CORE_CALL(ctx, call) OP_REQUIRES_OK(ctx, ::dualemb_tf::CoreStatus((call), name().c_str()))

// The core's key dtype code for a TF dtype (int32 / int64); -1 otherwise.
inline int32_t CoreKeyDtype(DataType dt) {
  if (dt == ::tensorflow::DT_INT64) return DE_KEY_INT64;
  if (dt == ::tensorflow::DT_INT32) return DE_KEY_INT32;
  return -1;
}

inline const char* KeyDtypeName(int32_t kd) { return kd == DE_KEY_INT64 ? "int64" : "int32"; }

// Reads input `index` as an int64 scalar table id.
inline absl::Status ScalarInput(OpKernelContext* ctx, int index, const char* what, int64_t* out) {
  const Tensor& t = ctx->input(index);
  if (!::tensorflow::TensorShapeUtils::IsScalar(t.shape()))
    return absl::InvalidArgumentError(std::string(what) + " must be a scalar, got shape " +
                                      t.shape().DebugString());
  if (t.dtype() == ::tensorflow::DT_INT64) {
    *out = t.scalar<int64_t>()();
  } else if (t.dtype() == ::tensorflow::DT_INT32) {
    *out = t.scalar<int32_t>()();
  } else {
    return absl::InvalidArgumentError(std::string(what) + " must be an integer scalar");
  }
  return absl::OkStatus();
}

// A table's shape facts, read from the core (also validates that the table exists).
struct TableDims {
  int64_t dim = 0;
  int32_t key_dtype = 0;
  int32_t num_slots = 0;
};

inline absl::Status GetDims(const std::string& op, int64_t id, TableDims* d) {
  if (de_table_dims(id, &d->dim, &d->key_dtype, &d->num_slots) != 0)
    return absl::InvalidArgumentError(op + ": " + de_last_error());
  return absl::OkStatus();
}

// Checks that `keys` have the table's key dtype.
// Input 0 of every table op is the table id: reads it and the table's dims.
inline absl::Status TableOf(OpKernelContext* ctx, int64_t* id, TableDims* d) {
  absl::Status s = ScalarInput(ctx, 0, "table_id", id);
  if (!s.ok()) return s;
  return GetDims(ctx->op_kernel().name(), *id, d);
}

// Sets output `index` to an int64 scalar.
inline absl::Status OutputScalar(OpKernelContext* ctx, int index, int64_t value) {
  Tensor* out = nullptr;
  absl::Status s = ctx->allocate_output(index, TensorShape({}), &out);
  if (s.ok()) out->scalar<int64_t>()() = value;
  return s;
}

inline absl::Status CheckKeys(const std::string& op, const TableDims& d, const Tensor& keys) {
  const int32_t kd = CoreKeyDtype(keys.dtype());
  if (kd != d.key_dtype)
    return absl::InvalidArgumentError(
        op + ": keys have dtype " + ::tensorflow::DataTypeString(keys.dtype()) +
        " but the table's key dtype is " + KeyDtypeName(d.key_dtype));
  return absl::OkStatus();
}

// Checks that `rows` is float32 with shape keys.shape + [dim].
inline absl::Status CheckRows(const std::string& op, const char* what, const TableDims& d,
                              const Tensor& keys, const Tensor& rows) {
  if (rows.dtype() != ::tensorflow::DT_FLOAT)
    return absl::InvalidArgumentError(op + ": " + what + " must be float32, got " +
                                      ::tensorflow::DataTypeString(rows.dtype()));
  TensorShape want = keys.shape();
  want.AddDim(d.dim);
  if (rows.shape() != want)
    return absl::InvalidArgumentError(op + ": " + what + " have shape " +
                                      rows.shape().DebugString() + ", expected keys.shape + [dim] = " +
                                      want.DebugString());
  return absl::OkStatus();
}

}  // namespace dualemb_tf

#endif  // DUALEMB_TF_COMMON_H_
