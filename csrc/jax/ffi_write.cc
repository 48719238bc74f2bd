// ffi_write.cc — handlers that change a table: find_or_insert, insert_or_assign (plain and
// masked), accum, erase. Each returns the next version token.
#include <cstring>
#include <vector>

#include "ffi_common.h"
#include "ffi_handlers.h"

namespace dualemb_jax {
namespace {

// find_or_insert: like find (exists optional the same way), but missing keys are inserted with
// their initializer row.
ffi::Error FindOrInsertImpl(Handle handle, Version version, ffi::AnyBuffer keys,
                            NextVersion next, ffi::Result<ffi::AnyBuffer> values,
                            ffi::RemainingRets rest) {
  TableCall c;
  if (auto e = PrepareRows(handle, keys, *values, "rows", &c); e.failure()) return e;
  uint8_t* exists = nullptr;
  if (auto e = OptionalExists(rest, c, "dualemb find_or_insert: exists needs one entry per key",
                              &exists);
      e.failure())
    return e;
  return Written(de_find_or_insert(c.table_id, c.dims.key_dtype, c.k.data, c.k.n,
                                   values->untyped_data(), exists, nullptr),
                 "find_or_insert", next, ReadVersion(version));
}

// insert_or_assign: writes rows (the last of duplicate keys wins).
ffi::Error InsertImpl(Handle handle, Version version, ffi::AnyBuffer keys,
                      ffi::AnyBuffer values, NextVersion next) {
  TableCall c;
  if (auto e = PrepareRows(handle, keys, values, "rows", &c); e.failure()) return e;
  return Written(de_insert_or_assign(c.table_id, c.dims.key_dtype, c.k.data, c.k.n,
                                     values.untyped_data(), nullptr),
                 "insert_or_assign", next, ReadVersion(version));
}

// insert_or_assign of the rows whose mask entry is true (the others are not touched). Used to
// write back padded batches (e.g. the unique keys of a batch, padded to a static length).
ffi::Error InsertMaskedImpl(Handle handle, Version version, ffi::AnyBuffer keys,
                            ffi::AnyBuffer values, ffi::Buffer<ffi::PRED> mask,
                            NextVersion next) {
  TableCall c;
  if (auto e = PrepareRows(handle, keys, values, "rows", &c); e.failure()) return e;
  if (auto e = CheckPerKey(mask.element_count(), c,
                           "dualemb insert: mask needs one entry per key");
      e.failure())
    return e;
  const bool* m = mask.typed_data();
  const size_t kbytes = c.dims.key_dtype == DE_KEY_INT64 ? 8 : 4;
  const size_t row_bytes = ValueBytes(c.dims) * static_cast<size_t>(c.dims.dim);
  const char* src = static_cast<const char*>(values.untyped_data());
  std::vector<char> kbuf(kbytes * c.k.n);
  std::vector<char> vbuf(row_bytes * static_cast<size_t>(c.k.n));
  int64_t out = 0;
  for (int64_t i = 0; i < c.k.n; ++i) {
    if (!m[i]) continue;
    std::memcpy(kbuf.data() + out * kbytes, static_cast<const char*>(c.k.data) + i * kbytes,
                kbytes);
    std::memcpy(vbuf.data() + out * row_bytes, src + i * row_bytes, row_bytes);
    ++out;
  }
  const int rc = out == 0 ? 0
                          : de_insert_or_assign(c.table_id, c.dims.key_dtype, kbuf.data(), out,
                                                vbuf.data(), nullptr);
  return Written(rc, "insert_or_assign", next, ReadVersion(version));
}

// accum (TFRA's rule): absent && !exists -> insert delta; present && exists -> row += delta.
ffi::Error AccumImpl(Handle handle, Version version, ffi::AnyBuffer keys,
                     ffi::AnyBuffer deltas, ffi::Buffer<ffi::PRED> exists,
                     NextVersion next) {
  TableCall c;
  if (auto e = PrepareRows(handle, keys, deltas, "deltas", &c); e.failure()) return e;
  if (auto e = CheckPerKey(exists.element_count(), c,
                           "dualemb accum: exists needs one entry per key");
      e.failure())
    return e;
  return Written(de_accum(c.table_id, c.dims.key_dtype, c.k.data, c.k.n, deltas.untyped_data(),
                          reinterpret_cast<const uint8_t*>(exists.typed_data()), nullptr),
                 "accum", next, ReadVersion(version));
}

// erase: removes keys (with their slots); absent keys are ignored.
ffi::Error EraseImpl(Handle handle, Version version, ffi::AnyBuffer keys, NextVersion next) {
  TableCall c;
  if (auto e = Prepare(handle, keys, -1, "", &c); e.failure()) return e;
  return Written(de_erase(c.table_id, c.dims.key_dtype, c.k.data, c.k.n), "erase", next,
                 ReadVersion(version));
}

}  // namespace
}  // namespace dualemb_jax

using namespace dualemb_jax;  // NOLINT

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_find_or_insert, OnXlaPool<FindOrInsertImpl>::Call,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_insert_or_assign, OnXlaPool<InsertImpl>::Call,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_insert_masked, OnXlaPool<InsertMaskedImpl>::Call,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_accum, OnXlaPool<AccumImpl>::Call,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_erase, OnXlaPool<EraseImpl>::Call,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
