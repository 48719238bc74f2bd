// ffi_write.cc — handlers that change a table: find_or_insert, insert_or_assign (plain and
// masked), accum, erase. Each returns the next version token.
#include <cstring>
#include <vector>

#include "ffi_common.h"
#include "ffi_handlers.h"

namespace dualemb_jax {
namespace {

// find_or_insert: like find, but missing keys are inserted with their initializer row.
ffi::Error FindOrInsertImpl(Handle handle, Version version, ffi::AnyBuffer keys,
                            NextVersion next, ffi::Result<ffi::AnyBuffer> values,
                            ffi::ResultBuffer<ffi::PRED> exists) {
  const float v = ReadVersion(version);
  int64_t table_id = 0;
  TableDims dims;
  Keys k;
  if (auto e = Prepare(handle, keys, &table_id, &dims, &k, values->element_count(), "rows"); e.failure())
    return e;
  if (auto e = CheckValueType(dims, table_id, values->element_type(), "rows"); e.failure())
    return e;
  if (static_cast<int64_t>(exists->element_count()) != k.n)
    return ffi::Error::InvalidArgument("dualemb find_or_insert: exists needs one entry per key");
  if (de_find_or_insert(table_id, dims.key_dtype, k.data, k.n, values->untyped_data(),
                        reinterpret_cast<uint8_t*>(exists->typed_data()), nullptr) != 0)
    return CoreError("find_or_insert");
  WriteVersion(next, v);
  return ffi::Error::Success();
}

// insert_or_assign: writes rows (the last of duplicate keys wins).
ffi::Error InsertImpl(Handle handle, Version version, ffi::AnyBuffer keys,
                      ffi::AnyBuffer values, NextVersion next) {
  const float v = ReadVersion(version);
  int64_t table_id = 0;
  TableDims dims;
  Keys k;
  if (auto e = Prepare(handle, keys, &table_id, &dims, &k, values.element_count(), "rows"); e.failure())
    return e;
  if (auto e = CheckValueType(dims, table_id, values.element_type(), "rows"); e.failure())
    return e;
  if (de_insert_or_assign(table_id, dims.key_dtype, k.data, k.n, values.untyped_data(),
                          nullptr) != 0)
    return CoreError("insert_or_assign");
  WriteVersion(next, v);
  return ffi::Error::Success();
}

// insert_or_assign of the rows whose mask entry is true (the others are not touched). Used to
// write back padded batches (e.g. the unique keys of a batch, padded to a static length).
ffi::Error InsertMaskedImpl(Handle handle, Version version, ffi::AnyBuffer keys,
                            ffi::AnyBuffer values, ffi::Buffer<ffi::PRED> mask,
                            NextVersion next) {
  const float v = ReadVersion(version);
  int64_t table_id = 0;
  TableDims dims;
  Keys k;
  if (auto e = Prepare(handle, keys, &table_id, &dims, &k, values.element_count(), "rows"); e.failure())
    return e;
  if (auto e = CheckValueType(dims, table_id, values.element_type(), "rows"); e.failure())
    return e;
  if (static_cast<int64_t>(mask.element_count()) != k.n)
    return ffi::Error::InvalidArgument("dualemb insert: mask needs one entry per key");
  const bool* m = mask.typed_data();
  const size_t kbytes = dims.key_dtype == DE_KEY_INT64 ? 8 : 4;
  const int64_t dim = dims.dim;
  std::vector<char> kbuf(kbytes * k.n);
  const size_t row_bytes = ValueBytes(dims) * static_cast<size_t>(dim);
  const char* src = static_cast<const char*>(values.untyped_data());
  std::vector<char> vbuf(row_bytes * static_cast<size_t>(k.n));
  int64_t out = 0;
  for (int64_t i = 0; i < k.n; ++i) {
    if (!m[i]) continue;
    std::memcpy(kbuf.data() + out * kbytes, static_cast<const char*>(k.data) + i * kbytes,
                kbytes);
    std::memcpy(vbuf.data() + out * row_bytes, src + i * row_bytes, row_bytes);
    ++out;
  }
  if (out > 0 && de_insert_or_assign(table_id, dims.key_dtype, kbuf.data(), out, vbuf.data(),
                                     nullptr) != 0)
    return CoreError("insert_or_assign");
  WriteVersion(next, v);
  return ffi::Error::Success();
}

// accum (TFRA's rule): absent && !exists -> insert delta; present && exists -> row += delta.
ffi::Error AccumImpl(Handle handle, Version version, ffi::AnyBuffer keys,
                     ffi::AnyBuffer deltas, ffi::Buffer<ffi::PRED> exists,
                     NextVersion next) {
  const float v = ReadVersion(version);
  int64_t table_id = 0;
  TableDims dims;
  Keys k;
  if (auto e = Prepare(handle, keys, &table_id, &dims, &k, deltas.element_count(), "deltas"); e.failure())
    return e;
  if (auto e = CheckValueType(dims, table_id, deltas.element_type(), "deltas"); e.failure())
    return e;
  if (static_cast<int64_t>(exists.element_count()) != k.n)
    return ffi::Error::InvalidArgument("dualemb accum: exists needs one entry per key");
  if (de_accum(table_id, dims.key_dtype, k.data, k.n, deltas.untyped_data(),
               reinterpret_cast<const uint8_t*>(exists.typed_data()), nullptr) != 0)
    return CoreError("accum");
  WriteVersion(next, v);
  return ffi::Error::Success();
}

// erase: removes keys (with their slots); absent keys are ignored.
ffi::Error EraseImpl(Handle handle, Version version, ffi::AnyBuffer keys, NextVersion next) {
  const float v = ReadVersion(version);
  int64_t table_id = 0;
  TableDims dims;
  Keys k;
  if (auto e = Prepare(handle, keys, &table_id, &dims, &k, -1, ""); e.failure()) return e;
  if (de_erase(table_id, dims.key_dtype, k.data, k.n) != 0) return CoreError("erase");
  WriteVersion(next, v);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace dualemb_jax

using namespace dualemb_jax;  // NOLINT

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_find_or_insert, FindOrInsertImpl,
                              ffi::Ffi::Bind()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::PRED>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_insert_or_assign, InsertImpl,
                              ffi::Ffi::Bind()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_insert_masked, InsertMaskedImpl,
                              ffi::Ffi::Bind()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_accum, AccumImpl,
                              ffi::Ffi::Bind()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_erase, EraseImpl,
                              ffi::Ffi::Bind()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
