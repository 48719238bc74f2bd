// common.h — helpers shared by the dualemb TensorFlow kernels (csrc/tf/*.cc).
//
// A table is a TF resource: `TableResource` owns one core table (one owner reference in the core
// registry, dualemb_core.h) and releases it when TensorFlow destroys the resource, i.e. when the
// last handle tensor referring to it is gone (handles are anonymous and ref-counted, like TF's
// anonymous hash tables). Every table op takes the handle as its first input, so one op serves
// any number of tables and runs on the device the handle names. The kernels only check shapes and
// dtypes, then call the C ABI of libdualemb_core.so with the resource's core id. A core error
// becomes an InvalidArgument status carrying the core's message, and the core guarantees that a
// failed call left the table unchanged.
#ifndef DUALEMB_TF_COMMON_H_
#define DUALEMB_TF_COMMON_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "dualemb_core.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_base.h"
#include "tensorflow/core/framework/resource_mgr.h"
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
  if (dt == ::tensorflow::DT_STRING) return DE_KEY_STRING;
  return -1;
}

inline const char* KeyDtypeName(int32_t kd) {
  return kd == DE_KEY_INT64 ? "int64" : kd == DE_KEY_INT32 ? "int32" : "string";
}

// A keys tensor as the core's `const void* keys`: the tensor's data for integer keys; for
// DT_STRING a de_string_keys over a packed copy of its tstrings (dualemb_core.h, "String keys").
// Points into itself: use it in place, never copy it.
class CoreKeys {
 public:
  explicit CoreKeys(const Tensor& keys) {
    if (keys.dtype() != ::tensorflow::DT_STRING) {
      ptr_ = keys.data();
      return;
    }
    auto flat = keys.flat<::tensorflow::tstring>();
    offsets_.reserve(flat.size() + 1);
    offsets_.push_back(0);
    for (int64_t i = 0; i < flat.size(); ++i) {
      bytes_.append(flat(i).data(), flat(i).size());
      offsets_.push_back(static_cast<int64_t>(bytes_.size()));
    }
    view_ = {bytes_.data(), offsets_.data()};
    ptr_ = &view_;
  }
  CoreKeys(const CoreKeys&) = delete;
  CoreKeys& operator=(const CoreKeys&) = delete;
  const void* ptr() const { return ptr_; }

 private:
  const void* ptr_ = nullptr;
  std::string bytes_;
  std::vector<int64_t> offsets_;
  de_string_keys view_{};
};

// A DT_STRING tensor of a string-valued table's rows as the core's `const void* values`: the
// same packed layout as string keys (de_string_values is de_string_keys).
using CoreStrings = CoreKeys;

// Collects the strings a core call returns for a string-valued table (de_string_values_out,
// dualemb_core.h "String values"); CopyTo then fills a DT_STRING tensor with them.
class CoreStringsOut {
 public:
  explicit CoreStringsOut(int64_t elements) : offsets_(static_cast<size_t>(elements) + 1) {
    out_ = {&CoreStringsOut::Reserve, this, offsets_.data()};
  }
  CoreStringsOut(const CoreStringsOut&) = delete;
  CoreStringsOut& operator=(const CoreStringsOut&) = delete;
  void* ptr() { return &out_; }
  // The first `elements` strings into `t` (flat order).
  void CopyTo(Tensor* t, int64_t elements) const {
    auto flat = t->flat<::tensorflow::tstring>();
    for (int64_t e = 0; e < elements; ++e)
      flat(e).assign(bytes_.data() + offsets_[e], offsets_[e + 1] - offsets_[e]);
  }

 private:
  static char* Reserve(void* self, int64_t total) {
    try {  // called inside the core call: NULL reports out of memory
      auto* me = static_cast<CoreStringsOut*>(self);
      me->bytes_.resize(static_cast<size_t>(total));
      return me->bytes_.data();
    } catch (...) {
      return nullptr;
    }
  }
  std::string bytes_;
  std::vector<int64_t> offsets_;
  de_string_values_out out_{};
};

// The core's value dtype code (DE_VALUE_*) for a TF dtype; -1 for a dtype no table stores.
inline int32_t CoreValueDtype(DataType dt) {
  switch (dt) {
    case ::tensorflow::DT_FLOAT: return DE_VALUE_FLOAT32;
    case ::tensorflow::DT_HALF: return DE_VALUE_FLOAT16;
    case ::tensorflow::DT_BFLOAT16: return DE_VALUE_BFLOAT16;
    case ::tensorflow::DT_DOUBLE: return DE_VALUE_FLOAT64;
    case ::tensorflow::DT_INT8: return DE_VALUE_INT8;
    case ::tensorflow::DT_INT32: return DE_VALUE_INT32;
    case ::tensorflow::DT_INT64: return DE_VALUE_INT64;
    case ::tensorflow::DT_STRING: return DE_VALUE_STRING;
    default: return -1;
  }
}

// The name of a DE_VALUE_* code (the config's "value_dtype" names).
inline const char* ValueDtypeName(int32_t vd) {
  static const char* const kNames[] = {"float32", "float16", "bfloat16", "float64",
                                       "int8",    "int32",   "int64",    "string"};
  return vd >= 0 && vd < 8 ? kNames[vd] : "unknown";
}

// Reads input `index` as an integer scalar.
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

// While alive, batched core calls made by this thread take their helper threads from the
// executor's runner (TF's inter-op pool) instead of the core's own pool. Inside a tf.function the
// kernel runs on an inter-op thread while the pool's other threads spin waiting for work; with
// the core's own helpers beside them, two spinning threads and two working ones share the cores
// and a graph-mode call ran several times slower than the same call made eagerly. Handing the
// helpers to the runner puts the spinning threads to work instead.
class ScopedRunnerHelpers {
 public:
  explicit ScopedRunnerHelpers(OpKernelContext* ctx) {
    Runner* runner = ctx->runner();
    set_ = runner != nullptr && static_cast<bool>(*runner);
    if (set_) de_set_thread_scheduler(&Schedule, runner, &prev_fn_, &prev_ctx_);
  }
  ~ScopedRunnerHelpers() {
    if (set_) de_set_thread_scheduler(prev_fn_, prev_ctx_, nullptr, nullptr);
  }
  ScopedRunnerHelpers(const ScopedRunnerHelpers&) = delete;
  ScopedRunnerHelpers& operator=(const ScopedRunnerHelpers&) = delete;

 private:
  using Runner = std::function<void(std::function<void()>)>;
  static void Schedule(void* runner, void (*task)(void*), void* arg) {
    (*static_cast<Runner*>(runner))([task, arg] { task(arg); });
  }
  bool set_ = false;
  de_scheduler_fn prev_fn_ = nullptr;
  void* prev_ctx_ = nullptr;
};

// A table's shape facts, read from the core (also validates that the table exists).
struct TableDims {
  int64_t dim = 0;
  int32_t key_dtype = 0;
  int32_t value_dtype = 0;  // DE_VALUE_*: the dtype of every row and slot buffer
  int32_t num_slots = 0;
};

inline absl::Status GetDims(const std::string& op, int64_t id, TableDims* d) {
  if (de_table_dims(id, &d->dim, &d->key_dtype, &d->num_slots) != 0 ||
      de_value_dtype(id, &d->value_dtype) != 0)
    return absl::InvalidArgumentError(op + ": " + de_last_error());
  return absl::OkStatus();
}

// One core table owned by TensorFlow. It holds one owner reference of the core table `id` (taken
// by whoever made it: a fresh de_table_create, or de_table_retain when attaching to an existing
// id) and drops it when TF destroys the resource.
class TableResource : public ::tensorflow::ResourceBase {
 public:
  explicit TableResource(int64_t id) : id_(id) {}
  ~TableResource() override {
    // Fails only if the table was destroyed explicitly (de_table_destroy) already: nothing to do.
    de_table_release(id_);
  }
  TableResource(const TableResource&) = delete;
  TableResource& operator=(const TableResource&) = delete;

  int64_t id() const { return id_; }
  std::string DebugString() const override {
    return "dualemb table " + std::to_string(id_);
  }
  int64_t MemoryUsed() const override {
    int64_t bytes = 0;
    return de_memory_bytes(id_, &bytes) == 0 ? bytes : 0;
  }

  // The table's dim, key and value dtypes (num_slots left 0), asked from the core once: they never
  // change, and asking costs a server round trip on a Redis table. Ops that need the slot count,
  // which changes when an optimizer is attached, call GetDims instead.
  absl::Status FixedDims(const std::string& op, TableDims* d) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!have_dims_) {
      TableDims fresh;
      TF_RETURN_IF_ERROR(GetDims(op, id_, &fresh));
      dim_ = fresh.dim;
      key_dtype_ = fresh.key_dtype;
      value_dtype_ = fresh.value_dtype;
      have_dims_ = true;
    }
    d->dim = dim_;
    d->key_dtype = key_dtype_;
    d->value_dtype = value_dtype_;
    d->num_slots = 0;
    return absl::OkStatus();
  }

 private:
  const int64_t id_;
  std::mutex mu_;
  bool have_dims_ = false;
  int64_t dim_ = 0;
  int32_t key_dtype_ = 0;
  int32_t value_dtype_ = 0;
};

// The table whose handle is input `index`. The input tensor holds a reference to the resource
// for the whole Compute call; `table` holds another while it lives.
inline absl::Status TableInput(OpKernelContext* ctx, int index,
                               ::tensorflow::core::RefCountPtr<TableResource>* table) {
  absl::Status s = ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, index),
                                                table);
  if (!s.ok())
    return absl::InvalidArgumentError(ctx->op_kernel().name() +
                                      ": input " + std::to_string(index) +
                                      " is not a dualemb table handle: " +
                                      std::string(s.message()));
  return absl::OkStatus();
}

// The core id of the table whose handle is input `index`.
inline absl::Status TableIdInput(OpKernelContext* ctx, int index, int64_t* id) {
  ::tensorflow::core::RefCountPtr<TableResource> table;
  TF_RETURN_IF_ERROR(TableInput(ctx, index, &table));
  *id = table->id();
  return absl::OkStatus();
}

// Input 0 of every table op is the table handle: reads its core id, dim, key and value dtypes (d->num_slots
// is left 0: see TableResource::FixedDims).
inline absl::Status TableOf(OpKernelContext* ctx, int64_t* id, TableDims* d) {
  ::tensorflow::core::RefCountPtr<TableResource> table;
  TF_RETURN_IF_ERROR(TableInput(ctx, 0, &table));
  *id = table->id();
  return table->FixedDims(ctx->op_kernel().name(), d);
}

// Sets output `index` to an int64 scalar.
inline absl::Status OutputScalar(OpKernelContext* ctx, int index, int64_t value) {
  Tensor* out = nullptr;
  absl::Status s = ctx->allocate_output(index, TensorShape({}), &out);
  if (s.ok()) out->scalar<int64_t>()() = value;
  return s;
}

// Checks that `keys` have the table's key dtype.
inline absl::Status CheckKeys(const std::string& op, const TableDims& d, const Tensor& keys) {
  const int32_t kd = CoreKeyDtype(keys.dtype());
  if (kd != d.key_dtype)
    return absl::InvalidArgumentError(
        op + ": keys have dtype " + ::tensorflow::DataTypeString(keys.dtype()) +
        " but the table's key dtype is " + KeyDtypeName(d.key_dtype));
  return absl::OkStatus();
}

// Checks that the op's value dtype (its Tvalue attr: the dtype of the row buffers it passes as
// void*) is the table's value dtype, so no buffer is ever read or written as another dtype.
inline absl::Status CheckValueDtype(const std::string& op, const TableDims& d, DataType dt) {
  if (CoreValueDtype(dt) != d.value_dtype)
    return absl::InvalidArgumentError(
        op + ": values have dtype " + ::tensorflow::DataTypeString(dt) +
        " but the table's value dtype is " + ValueDtypeName(d.value_dtype));
  return absl::OkStatus();
}

// Checks that `rows` has the table's value dtype (or float32 when `float32_rows`: gradients)
// and shape keys.shape + [dim].
inline absl::Status CheckRows(const std::string& op, const char* what, const TableDims& d,
                              const Tensor& keys, const Tensor& rows, bool float32_rows = false) {
  if (float32_rows) {
    if (rows.dtype() != ::tensorflow::DT_FLOAT)
      return absl::InvalidArgumentError(op + ": " + what + " must be float32, got " +
                                        ::tensorflow::DataTypeString(rows.dtype()));
  } else if (CoreValueDtype(rows.dtype()) != d.value_dtype) {
    return absl::InvalidArgumentError(op + ": " + what + " have dtype " +
                                      ::tensorflow::DataTypeString(rows.dtype()) +
                                      " but the table's value dtype is " +
                                      ValueDtypeName(d.value_dtype));
  }
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
