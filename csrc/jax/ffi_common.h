// ffi_common.h — pieces every dualemb XLA FFI handler shares.
//
// Conventions of the handlers (see dualemb/jax/_ffi.py for the Python side):
//  * The first operand is the table's handle: float32[4], the table's 63-bit id in 16-bit
//    chunks, low first, each an exact integer. It is a runtime operand, not an attribute, so one
//    compiled program serves every table of the same shape (the id is data, not code). Floats
//    rather than integers so that a table may sit in a pytree given to jax.grad (which refuses
//    integer inputs); a chunk that is not an integer in range means something changed the
//    handle (e.g. an optimizer's weight decay applied to a params tree holding the table), and
//    is refused rather than read as another id.
//  * The second operand is the table's version token (float32, any shape — vmap may add a batch
//    axis; element 0 is read). Mutating handlers return the next version (every element set to
//    version + 1, modulo 2**24 so that it stays exact). The token is how the Python side orders
//    side-effecting calls: XLA keeps data dependences, not the program order of side effects.
//  * Keys arrive as int64, int32, or uint32 pairs [..., 2] (the (low, high) halves of int64 keys,
//    used in JAX's default 32-bit mode, where int64 arrays do not exist). On little-endian
//    machines a pair is the int64's memory, so pairs are read in place. Keys are converted to the
//    table's key dtype here; int64 keys that do not fit an int32 table are an error, never
//    truncated.
//  * Row buffers (values, deltas, exported values and slots) are in the table's value dtype
//    (DE_VALUE_*), declared by the Python side from the handle's static value_dtype. Each
//    handler checks the buffer's element type against the table's value dtype when it runs and
//    fails naming both if they differ (a step compiled for a float32 table given the handle of
//    a float16 table): bytes are never reinterpreted. Gradients are float32 whatever the dtype.
//  * Errors from the core become ffi::Error with the core's message; a failed call leaves the
//    table unchanged (the core's contract).
#ifndef DUALEMB_JAX_FFI_COMMON_H_
#define DUALEMB_JAX_FFI_COMMON_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "dualemb_core.h"
#include "xla/ffi/api/ffi.h"

namespace dualemb_jax {

namespace ffi = xla::ffi;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "uint32 key pairs are read as int64 in place: little-endian only");

// The core's last error as an ffi::Error, prefixed with what was being done.
inline ffi::Error CoreError(const char* what) {
  return ffi::Error::InvalidArgument(std::string("dualemb ") + what + ": " + de_last_error());
}

struct TableDims {
  int64_t dim = 0;
  int32_t key_dtype = DE_KEY_INT64;
  int32_t num_slots = 0;
  int32_t value_dtype = DE_VALUE_FLOAT32;
};

inline ffi::Error GetDims(int64_t table_id, TableDims* out) {
  if (de_table_dims(table_id, &out->dim, &out->key_dtype, &out->num_slots) != 0 ||
      de_value_dtype(table_id, &out->value_dtype) != 0)
    return ffi::Error::InvalidArgument(
        "dualemb: unknown table id " + std::to_string(table_id) +
        " (destroyed, or not created or loaded in this process; create it or load its checkpoint "
        "first)");
  return ffi::Error::Success();
}

// The XLA element type that holds a value dtype's rows (DE_VALUE_* order).
inline ffi::DataType XlaValueType(int32_t value_dtype) {
  switch (value_dtype) {
    case DE_VALUE_FLOAT32: return ffi::DataType::F32;
    case DE_VALUE_FLOAT16: return ffi::DataType::F16;
    case DE_VALUE_BFLOAT16: return ffi::DataType::BF16;
    case DE_VALUE_FLOAT64: return ffi::DataType::F64;
    case DE_VALUE_INT8: return ffi::DataType::S8;
    case DE_VALUE_INT32: return ffi::DataType::S32;
    case DE_VALUE_INT64: return ffi::DataType::S64;
    default: return ffi::DataType::INVALID;
  }
}

inline const char* ValueDtypeName(int32_t value_dtype) {
  static const char* const kNames[] = {"float32", "float16", "bfloat16", "float64",
                                       "int8",    "int32",   "int64",    "string"};
  // string (7) has no XLA element type: every row buffer mismatches it, so it is refused.
  return value_dtype >= 0 && value_dtype < 8 ? kNames[value_dtype] : "unknown";
}

// The dtype name of an XLA element type, for messages.
inline const char* XlaTypeName(ffi::DataType t) {
  for (int32_t v = 0; v < 7; ++v)
    if (XlaValueType(v) == t) return ValueDtypeName(v);
  switch (t) {
    case ffi::DataType::PRED: return "bool";
    case ffi::DataType::S16: return "int16";
    case ffi::DataType::U8: return "uint8";
    case ffi::DataType::U32: return "uint32";
    default: return "another dtype";
  }
}

// Checks that a row buffer (`what`: "rows", "deltas", "slots") is in the table's value dtype.
inline ffi::Error CheckValueType(const TableDims& dims, int64_t table_id, ffi::DataType got,
                                 const char* what) {
  if (got == XlaValueType(dims.value_dtype)) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(
      std::string("dualemb: ") + what + " are " + XlaTypeName(got) + " but table " +
      std::to_string(table_id) + " stores " + ValueDtypeName(dims.value_dtype) +
      " values (the handle's value_dtype does not match the table it names; make the handle "
      "with dualemb.jax.attach or load, which read the table's dtype)");
}

// Bytes of one element of the table's value dtype.
inline size_t ValueBytes(const TableDims& dims) {
  return ffi::ByteWidth(XlaValueType(dims.value_dtype));
}

// The core's helper threads of one handler call run on XLA's intra-op thread pool (the pool
// that runs the program's other operations), as the TF kernels hand theirs to TF's runner
// (csrc/tf/common.h). With the core's own pool instead, every call that XLA runs beside another
// (independent per-table lookups and updates) fanned out onto the core's workers as well: two
// pools of busy threads on the same cores. On 2 cores the 26-table dim-64 per-table step ran
// 6-11% faster with the helpers on XLA's pool (docs/benchmarks.md, "One pool of threads"). The
// pool is valid for this call only, so the scheduler is set for the call's duration on the
// calling thread and the previous one restored after it; a task that XLA cannot schedule runs
// inline (ffi::ThreadPool::Schedule), which the core's parallel_for allows.
class ScopedXlaPool {
 public:
  explicit ScopedXlaPool(ffi::ThreadPool* pool) {
    de_set_thread_scheduler(&Schedule, pool, &prev_fn_, &prev_context_);
  }
  ~ScopedXlaPool() { de_set_thread_scheduler(prev_fn_, prev_context_, nullptr, nullptr); }
  ScopedXlaPool(const ScopedXlaPool&) = delete;
  ScopedXlaPool& operator=(const ScopedXlaPool&) = delete;

 private:
  static void Schedule(void* pool, void (*task)(void*), void* arg) {
    static_cast<ffi::ThreadPool*>(pool)->Schedule([task, arg] { task(arg); });
  }
  de_scheduler_fn prev_fn_ = nullptr;
  void* prev_context_ = nullptr;
};

// OnXlaPool<Impl>::Call: the handler Impl with XLA's thread pool as its first parameter (bind
// it with .Ctx<ffi::ThreadPool>() first), running Impl with the core's helpers on that pool.
template <auto Impl>
struct OnXlaPool;
template <class... A, ffi::Error (*Impl)(A...)>
struct OnXlaPool<Impl> {
  static ffi::Error Call(ffi::ThreadPool pool, A... args) {
    ScopedXlaPool on_xla_pool(&pool);
    return Impl(std::move(args)...);
  }
};

using Handle = ffi::Buffer<ffi::F32>;
using Version = ffi::Buffer<ffi::F32>;
using NextVersion = ffi::ResultBuffer<ffi::F32>;

// Decodes `n` float chunks (16 bits each, low first) into an unsigned integer; false if a chunk
// is not an exact integer in [0, 65535].
inline bool DecodeChunks(const float* chunks, int n, uint64_t* out) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) {
    const float c = chunks[i];
    if (!(c >= 0.0f && c <= 65535.0f) || std::floor(c) != c) return false;
    v |= static_cast<uint64_t>(c) << (16 * i);
  }
  *out = v;
  return true;
}

// The table id in 4 float chunks; false if they are not the chunks of a 63-bit id.
inline bool DecodeTableId(const float* chunks, int64_t* id) {
  uint64_t v = 0;
  if (!DecodeChunks(chunks, 4, &v) || (v >> 63) != 0) return false;
  *id = static_cast<int64_t>(v);
  return true;
}

// The table id a handle operand names. A handle holds exactly one table: under jax.vmap an
// unbatched handle arrives as [1, 4]; a batch of several tables is refused (one call serves one
// table).
inline ffi::Error ReadTableId(Handle handle, int64_t* id) {
  if (handle.element_count() != 4)
    return ffi::Error::InvalidArgument(
        "dualemb: a table handle is float32[4] naming one table, got " +
        std::to_string(handle.element_count()) +
        " values (vmapping over a batch of tables is not supported)");
  if (!DecodeTableId(handle.typed_data(), id))
    return ffi::Error::InvalidArgument(
        "dualemb: corrupted table handle (its values are not the 16-bit chunks of a table id): "
        "something changed the table's leaves, e.g. an optimizer update or a dtype cast "
        "applied to a pytree that holds the table; keep tables out of what optimizers update");
  return ffi::Error::Success();
}

// The core's 1-based step from a table's step leaf (its int32 count in two float chunks, see
// dualemb/jax/table.py): count + 1. A count whose chunks are not exact integers (changed by
// something that treated them as parameters) is refused: it would otherwise give a silently
// wrong bias correction or schedule. `op` names the call in the error.
inline ffi::Error ReadStep(const float* chunks, const char* op, int64_t* step) {
  uint64_t count = 0;
  if (!DecodeChunks(chunks, 2, &count) || count > 0x7FFFFFFEu)
    return ffi::Error::InvalidArgument(
        std::string("dualemb ") + op +
        ": corrupted step count (the table's step leaf is not the 16-bit chunks of a count): "
        "something changed the table's leaves, e.g. an optimizer update applied to a pytree "
        "that holds the table");
  *step = static_cast<int64_t>(count) + 1;
  return ffi::Error::Success();
}

// Reads the version token (element 0; 0 for an empty buffer).
inline float ReadVersion(Version version) {
  return version.element_count() ? version.typed_data()[0] : 0.0f;
}

// The token after `v`: v + 1, wrapping at 2**24 (where float32 stops counting by ones). Only
// the data dependence matters, not the value.
inline float NextVersionValue(float v) {
  const float next = v + 1.0f;
  return next >= 16777216.0f || !(next >= 0.0f) ? 0.0f : next;
}

// Writes the token after `version` into every element of `out`.
inline void WriteVersion(NextVersion out, float version) {
  const float value = NextVersionValue(version);
  float* p = out->typed_data();
  const size_t n = out->element_count();
  for (size_t i = 0; i < n; ++i) p[i] = value;
}

// Keys of one call, in the table's key dtype (converted into `storage` when needed).
struct Keys {
  const void* data = nullptr;
  int64_t n = 0;
  std::vector<int64_t> storage64;
  std::vector<int32_t> storage32;
};

// Number of keys a key buffer holds (pairs count once), or -1 for an unsupported layout.
inline int64_t CountKeys(ffi::AnyBuffer keys) {
  switch (keys.element_type()) {
    case ffi::DataType::S64:
    case ffi::DataType::S32:
      return static_cast<int64_t>(keys.element_count());
    case ffi::DataType::U32: {
      auto dims = keys.dimensions();
      if (dims.size() == 0 || dims.back() != 2) return -1;
      return static_cast<int64_t>(keys.element_count() / 2);
    }
    default:
      return -1;
  }
}

inline ffi::Error DecodeKeys(ffi::AnyBuffer keys, int32_t table_key_dtype, Keys* out) {
  const int64_t n = CountKeys(keys);
  if (n < 0)
    return ffi::Error::InvalidArgument(
        "dualemb: keys must be int64, int32, or uint32 pairs [..., 2] (from dualemb.jax.ids)");
  out->n = n;
  const bool src64 = keys.element_type() != ffi::DataType::S32;  // S64 or U32 pairs
  if (table_key_dtype == DE_KEY_INT64) {
    if (src64) {
      out->data = keys.untyped_data();
    } else {
      const int32_t* src = static_cast<const int32_t*>(keys.untyped_data());
      out->storage64.assign(src, src + n);
      out->data = out->storage64.data();
    }
    return ffi::Error::Success();
  }
  if (!src64) {
    out->data = keys.untyped_data();
    return ffi::Error::Success();
  }
  const int64_t* src = static_cast<const int64_t*>(keys.untyped_data());
  out->storage32.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    if (src[i] < std::numeric_limits<int32_t>::min() ||
        src[i] > std::numeric_limits<int32_t>::max())
      return ffi::Error::InvalidArgument("dualemb: key " + std::to_string(src[i]) +
                                         " does not fit the table's int32 key dtype");
    out->storage32[i] = static_cast<int32_t>(src[i]);
  }
  out->data = out->storage32.data();
  return ffi::Error::Success();
}

// InvalidArgument unless a buffer of `count` values (`what`: "rows", "gradients") holds keys x
// dim of them.
inline ffi::Error CheckRowCount(int64_t count, int64_t n, int64_t dim, const char* what) {
  if (count == n * dim) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(std::string("dualemb: ") + what + " hold " +
                                     std::to_string(count) + " values, expected keys (" +
                                     std::to_string(n) + ") x dim (" + std::to_string(dim) + ")");
}

// What a call on one table's keys works with: the table, its dims, the keys in its key dtype.
struct TableCall {
  int64_t table_id = 0;
  TableDims dims;
  Keys k;
};

// Reads the handle's id, looks the table up and decodes its keys; checks that `rows` (if >= 0)
// holds n * dim values.
inline ffi::Error Prepare(Handle handle, ffi::AnyBuffer keys, int64_t rows_count,
                          const char* rows_name, TableCall* c) {
  if (auto e = ReadTableId(handle, &c->table_id); e.failure()) return e;
  if (auto e = GetDims(c->table_id, &c->dims); e.failure()) return e;
  if (auto e = DecodeKeys(keys, c->dims.key_dtype, &c->k); e.failure()) return e;
  if (rows_count < 0) return ffi::Error::Success();
  return CheckRowCount(rows_count, c->k.n, c->dims.dim, rows_name);
}

// Prepare for a call with a row buffer in the table's value dtype (`what`: "rows", "deltas"):
// n * dim values of that dtype.
inline ffi::Error PrepareRows(Handle handle, ffi::AnyBuffer keys, ffi::AnyBuffer rows,
                              const char* what, TableCall* c) {
  if (auto e = Prepare(handle, keys, static_cast<int64_t>(rows.element_count()), what, c);
      e.failure())
    return e;
  return CheckValueType(c->dims, c->table_id, rows.element_type(), what);
}

// InvalidArgument with `message` unless a buffer of `count` entries has one per key.
inline ffi::Error CheckPerKey(size_t count, const TableCall& c, const char* message) {
  if (static_cast<int64_t>(count) == c.k.n) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(message);
}

// The optional last result of find / find_or_insert: `exists` [n] (bool), or nothing, or an
// empty buffer (both: the caller does not want it). Leaving the result out is what the Python
// side does on the CPU: XLA gives results nobody reads one shared buffer, and the calls writing
// it are then run one after another although they are independent (26 lookups of 26 tables in a
// chain). *out is null where exists is not wanted.
inline ffi::Error OptionalExists(const ffi::RemainingRets& rets, const TableCall& c,
                                 const char* message, uint8_t** out) {
  *out = nullptr;
  if (rets.size() == 0) return ffi::Error::Success();
  if (rets.size() > 1) return ffi::Error::InvalidArgument(message);
  auto exists = rets.get<ffi::Buffer<ffi::PRED>>(0);
  if (exists.has_error()) return exists.error();
  const size_t count = (*exists)->element_count();
  if (count == 0) return ffi::Error::Success();
  if (auto e = CheckPerKey(count, c, message); e.failure()) return e;
  *out = reinterpret_cast<uint8_t*>((*exists)->typed_data());
  return ffi::Error::Success();
}

// The end of a write: the core's error if its return code `rc` says it failed (the table is
// unchanged), else the next version token after `version`.
inline ffi::Error Written(int rc, const char* op, NextVersion next, float version) {
  if (rc != 0) return CoreError(op);
  WriteVersion(next, version);
  return ffi::Error::Success();
}

}  // namespace dualemb_jax

#endif  // DUALEMB_JAX_FFI_COMMON_H_
