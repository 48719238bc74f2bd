// ffi_common.h — pieces every dualemb XLA FFI handler shares.
//
// Conventions of the handlers (see dualemb/jax/_ffi.py for the Python side):
//  * The table is named by the static attribute `table_id` (int64).
//  * The first operand is the table's version token (int32, any shape — vmap may add a batch
//    axis; element 0 is read). Mutating handlers return the next version (every element set to
//    version + 1). The token is how the Python side orders side-effecting calls: XLA keeps data
//    dependences, not the program order of side effects.
//  * Keys arrive as int64, int32, or uint32 pairs [..., 2] (the (low, high) halves of int64 keys,
//    used in JAX's default 32-bit mode, where int64 arrays do not exist). On little-endian
//    machines a pair is the int64's memory, so pairs are read in place. Keys are converted to the
//    table's key dtype here; int64 keys that do not fit an int32 table are an error, never
//    truncated.
//  * Errors from the core become ffi::Error with the core's message; a failed call leaves the
//    table unchanged (the core's contract).
#ifndef DUALEMB_JAX_FFI_COMMON_H_
#define DUALEMB_JAX_FFI_COMMON_H_

#include <cstdint>
#include <limits>
#include <string>
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
};

inline ffi::Error GetDims(int64_t table_id, TableDims* out) {
  if (de_table_dims(table_id, &out->dim, &out->key_dtype, &out->num_slots) != 0)
    return ffi::Error::InvalidArgument(
        "dualemb: unknown table id " + std::to_string(table_id) +
        " (not created or loaded in this process; create it or load its checkpoint first)");
  return ffi::Error::Success();
}

// Reads the version token (element 0; 0 for an empty buffer).
inline int32_t ReadVersion(ffi::Buffer<ffi::S32> version) {
  return version.element_count() ? version.typed_data()[0] : 0;
}

inline void WriteVersion(ffi::Result<ffi::Buffer<ffi::S32>> out, int32_t value) {
  int32_t* p = out->typed_data();
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

// Looks the table up and decodes its keys; checks that `rows` (if >= 0) holds n * dim floats.
inline ffi::Error Prepare(int64_t table_id, ffi::AnyBuffer keys, TableDims* dims, Keys* k,
                          int64_t rows_count, const char* rows_name) {
  if (auto e = GetDims(table_id, dims); e.failure()) return e;
  if (auto e = DecodeKeys(keys, dims->key_dtype, k); e.failure()) return e;
  if (rows_count >= 0 && rows_count != k->n * dims->dim)
    return ffi::Error::InvalidArgument(
        std::string("dualemb: ") + rows_name + " hold " + std::to_string(rows_count) +
        " values, expected keys (" + std::to_string(k->n) + ") x dim (" +
        std::to_string(dims->dim) + ")");
  return ffi::Error::Success();
}

}  // namespace dualemb_jax

#endif  // DUALEMB_JAX_FFI_COMMON_H_
