// ops.cc — registration of the dualemb TensorFlow ops (their kernels are in kernels_*.cc).
//
// Every op is stateful: Grappler must neither constant-fold a lookup nor reorder it around the
// writes to the same table. A table is a resource (csrc/tf/common.h `TableResource`):
// DualembTableHandle makes a fresh one, DualembTableAttach shares an existing core table by id,
// and the first input of every other table op is the handle, so one op serves any number of
// tables and is placed on the device that holds the table. Rows have shape keys.shape + [dim] and
// the table's value dtype (attr Tvalue, checked by the kernels against the table; its default,
// float, keeps graphs and SavedModels written before value dtypes loading). Gradients and
// restrict scores are float32 whatever the value dtype.
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace dualemb_tf {
namespace {

// Every key dtype a core table takes (DE_KEY_* in dualemb_core.h): the one list of them, as the
// kernels (kernels_*.cc) are registered without a TypeConstraint, for whatever the op allows.
constexpr char kKeyDtypeAttr[] = "Tkey: {int32, int64, string}";
// Every value dtype a core table stores (DE_VALUE_* in dualemb_core.h).
constexpr char kValueDtypeAttr[] =
    "Tvalue: {float, half, bfloat16, double, int8, int32, int64, string} = DT_FLOAT";

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// values: keys.shape + [dim] (dim from the `dim` attr; unknown when < 0).
absl::Status RowsOfKeys(InferenceContext* c, int keys_input, int out_index) {
  int64_t dim;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  ShapeHandle rows;
  TF_RETURN_IF_ERROR(c->Concatenate(
      c->input(keys_input), c->Vector(dim >= 0 ? c->MakeDim(dim) : c->UnknownDim()), &rows));
  c->set_output(out_index, rows);
  return absl::OkStatus();
}

absl::Status ScalarIdInput(InferenceContext* c) {
  ShapeHandle unused;
  return c->WithRank(c->input(0), 0, &unused);
}

}  // namespace

// The attribute is not called shared_name on purpose: the SavedModel loader gives every op with a
// shared_name attribute a name derived from its node name, which would make all the tables of a
// loaded model one table.
REGISTER_OP("DualembTableHandle")
    .Input("config: string")
    .Input("optimizer: string")
    .Output("table: resource")
    .Attr("container: string = ''")
    .Attr("session_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(Creates a fresh core table from a config string (a non-empty `optimizer` spec is
attached). Without session_name (eager and tf.function code): returns an anonymous, ref-counted
handle, and the table is freed when the last handle tensor is gone. With session_name (the graph a
TF1 session runs, e.g. a SavedModel served by a C++ loader): the table is created once in the
device's resource manager under that name, every run gets a handle to it, and it is freed with
the resource manager (when the session closes).)doc");

REGISTER_OP("DualembTableAttach")
    .Input("table_id: int64")
    .Output("table: resource")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(A handle to the existing core table `table_id` (made by any front end in this
process), which keeps it alive until the last such handle is gone. Fails on an unknown id.)doc");

REGISTER_OP("DualembTableId")
    .Input("table: resource")
    .Output("table_id: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("The core table id of a handle (valid while the handle lives).");

REGISTER_OP("DualembFind")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Output("values: Tvalue")
    .Output("exists: bool")
    .Output("evicted: int64")
    .Attr(kKeyDtypeAttr)
    .Attr(kValueDtypeAttr)
    .Attr("dim: int")
    .Attr("insert_missing: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarIdInput(c));
      TF_RETURN_IF_ERROR(RowsOfKeys(c, 1, 0));
      c->set_output(1, c->input(1));
      c->set_output(2, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(Rows of `keys` (missing keys read as their initializer row) and whether each
exists. With insert_missing, missing keys are inserted (find_or_insert); `evicted` is how many
keys a capacity limit evicted for them, like every write op reports (0 without insert_missing).)doc");

REGISTER_OP("DualembInsertOrAssign")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Input("values: Tvalue")
    .Output("evicted: int64")
    .Attr(kKeyDtypeAttr)
    .Attr(kValueDtypeAttr)
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("DualembAccum")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Input("deltas: Tvalue")
    .Input("exists: bool")
    .Output("evicted: int64")
    .Attr(kKeyDtypeAttr)
    .Attr(kValueDtypeAttr)
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

// Variable.accum: the core computes the deltas (new - old where exists, else new) as it adds.
REGISTER_OP("DualembAccumRows")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Input("old_values: Tvalue")
    .Input("new_values: Tvalue")
    .Input("exists: bool")
    .Output("evicted: int64")
    .Attr(kKeyDtypeAttr)
    .Attr(kValueDtypeAttr)
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("DualembErase")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Attr(kKeyDtypeAttr)
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

REGISTER_OP("DualembClear")
    .Input("table: resource")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

REGISTER_OP("DualembSize")
    .Input("table: resource")
    .Output("size: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("DualembApplyGradients")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Input("step: int64")
    .Output("evicted: int64")
    .Attr(kKeyDtypeAttr)
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(One fused optimizer step on the rows of `keys` (gradients of duplicate keys summed;
missing keys inserted from the initializer). `step` is the 1-based update count. Gradients are
float32 whatever the table's value dtype (a float16/bfloat16 row is updated in float32).)doc");

// Multi-table forms (one op for the tables of a step; the core runs them in parallel). Table
// i's keys are keys[i] (one key dtype for all), its rows have its own value dtype (Tvalues[i])
// and dim (dims[i]). Every table is checked before any changes: a bad input in one table fails
// the op naming the table (its position), and no table is changed.
REGISTER_OP("DualembFindMany")
    .Input("tables: N * resource")
    .Input("keys: N * Tkey")
    .Output("values: Tvalues")
    .Output("exists: N * bool")
    .Output("evicted: N * int64")
    .Attr("N: int >= 1")
    .Attr(kKeyDtypeAttr)
    .Attr("Tvalues: list({float, half, bfloat16, double, int8, int32, int64}) >= 1")
    .Attr("dims: list(int)")
    .Attr("insert_missing: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t n;
      std::vector<int64_t> dims;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("dims", &dims));
      if (static_cast<int64_t>(dims.size()) != n)
        return absl::InvalidArgumentError("DualembFindMany: dims must have one entry per table");
      for (int64_t i = 0; i < n; ++i) {
        ShapeHandle unused, rows;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
        const int k = static_cast<int>(n + i);
        TF_RETURN_IF_ERROR(c->Concatenate(
            c->input(k), c->Vector(dims[i] >= 0 ? c->MakeDim(dims[i]) : c->UnknownDim()), &rows));
        c->set_output(static_cast<int>(i), rows);
        c->set_output(static_cast<int>(n + i), c->input(k));
        c->set_output(static_cast<int>(2 * n + i), c->Scalar());
      }
      return absl::OkStatus();
    })
    .Doc(R"doc(DualembFind on N tables in one op (rows of tables[i] for keys[i], dims[i], value
dtype Tvalues[i]); results equal N DualembFind ops bit for bit. String-valued tables are
refused.)doc");

REGISTER_OP("DualembApplyGradientsMany")
    .Input("tables: N * resource")
    .Input("keys: N * Tkey")
    .Input("grads: N * float")
    .Input("learning_rate: float")
    .Input("step: int64")
    .Output("evicted: N * int64")
    .Attr("N: int >= 1")
    .Attr(kKeyDtypeAttr)
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      for (int64_t i = 0; i < n; ++i) c->set_output(static_cast<int>(i), c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(DualembApplyGradients on N tables in one op, one learning rate and step for all
(tables[i] with keys[i], grads[i]); results equal N DualembApplyGradients ops bit for bit (a
table listed twice runs its entries in list order).)doc");

REGISTER_OP("DualembRestrict")
    .Input("table: resource")
    .Input("num_reserved: int64")
    .Input("keys: Tkey")
    .Input("scores: float")
    .Output("removed: int64")
    .Attr(kKeyDtypeAttr)
    .Attr("policy: int = 0")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(Keeps the num_reserved best keys (policy 0 recency, 1 frequency, 2 custom scores
given for `keys`), erasing the rest with their slots. Returns how many were erased.)doc");

REGISTER_OP("DualembExport")
    .Input("table: resource")
    .Input("offset: int64")
    .Input("limit: int64")
    .Output("keys: Tkey")
    .Output("values: Tvalue")
    .Output("slots: Tvalue")
    .Output("last_update: int64")
    .Output("update_count: int64")
    .Output("stepped: bool")
    .Attr(kKeyDtypeAttr)
    .Attr(kValueDtypeAttr)
    .Attr("dim: int = -1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarIdInput(c));
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      auto d = dim >= 0 ? c->MakeDim(dim) : c->UnknownDim();
      auto n = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Matrix(n, d));
      c->set_output(2, c->MakeShape({n, c->UnknownDim(), d}));
      c->set_output(3, c->Vector(n));
      c->set_output(4, c->Vector(n));
      c->set_output(5, c->Vector(n));
      return absl::OkStatus();
    })
    .Doc(R"doc(Rows [offset, offset+limit) of the table's iteration order (limit < 0: to the end):
keys, values [n, dim], slots [n, num_slots, dim] (both in the table's value dtype), last_update,
update_count, stepped (an optimizer step has updated the row's slots: what slot views list).)doc");

REGISTER_OP("DualembImport")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Input("values: Tvalue")
    .Input("slots: Tvalue")
    .Input("last_update: int64")
    .Input("update_count: int64")
    .Input("stepped: Nstepped * bool")
    .Output("evicted: int64")
    .Attr(kKeyDtypeAttr)
    .Attr(kValueDtypeAttr)
    .Attr("clear: bool = false")
    .Attr("Nstepped: int >= 0 = 0")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(Inserts or overwrites rows with optional slots [n, num_slots, dim] and metadata
(pass empty tensors to leave them out), and optionally the stepped flags (a list of 0 or 1 bool
vectors, so that graphs saved before this input still load; left out, rows given slots count as
stepped where those differ from the initial slots). With clear, the table is emptied first.)doc");

REGISTER_OP("DualembSetOptimizer")
    .Input("table: resource")
    .Input("spec: string")
    .Attr("empty_detaches: bool = true")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(Attaches the optimizer `spec` (a no-op when the same one is attached). An empty
spec detaches the optimizer and drops the slots, unless empty_detaches is false: then it leaves
the table as it is (a restore from a checkpoint saved without an optimizer).)doc");

REGISTER_OP("DualembDescribe")
    .Input("table: resource")
    .Output("description: string")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("The table's description, JSON {\"config\": {...}, \"optimizer\": {...} | null}.");

REGISTER_OP("DualembGetClock")
    .Input("table: resource")
    .Output("clock: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("DualembSetClock")
    .Input("table: resource")
    .Input("clock: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

// Not stateful: a pure identity. It exists so that its gradient can be registered once, by name
// (dualemb/tf/trainable.py): tf.custom_gradient in a traced function registers a new gradient
// function in TF's global registry on every trace and never removes it, which kept the traced
// function, and with it every table handle it captured, alive for the life of the process.
REGISTER_OP("DualembRowsWithKeyGradient")
    .Input("anchor: float")
    .Input("rows: Tvalue")
    .Input("keys: Tkey")
    .Output("out: Tvalue")
    .Attr(kKeyDtypeAttr)
    .Attr(kValueDtypeAttr)
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      return absl::OkStatus();
    })
    .Doc(R"doc(Returns `rows` unchanged. Its gradient (registered in Python) sends the rows'
gradient to `anchor` as IndexedSlices indexed by `keys`.)doc");

REGISTER_OP("DualembBuildInfo")
    .Output("tf_version: string")
    .Output("core_version: string")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc("The TensorFlow version this library was compiled against, and the core's version.");

}  // namespace dualemb_tf
