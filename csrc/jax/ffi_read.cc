// ffi_read.cc — handlers that read a table without changing it: find, size, export; and
// `after`, which orders later writes after earlier reads.
// All take the version token so that they run after every write they must see.
#include <algorithm>
#include <cstring>
#include <limits>

#include "ffi_common.h"
#include "ffi_handlers.h"

namespace dualemb_jax {
namespace {

// find: rows of `keys` and, if asked for (OptionalExists), whether each exists; missing keys read
// as their initializer row and are not inserted (TFRA's find).
ffi::Error FindImpl(Handle handle, Version version, ffi::AnyBuffer keys,
                    ffi::Result<ffi::AnyBuffer> values, ffi::RemainingRets rest) {
  (void)ReadVersion(version);
  TableCall c;
  if (auto e = PrepareRows(handle, keys, *values, "rows", &c); e.failure()) return e;
  uint8_t* exists = nullptr;
  if (auto e = OptionalExists(rest, c, "dualemb find: exists must have one entry per key",
                              &exists);
      e.failure())
    return e;
  if (de_find(c.table_id, c.dims.key_dtype, c.k.data, c.k.n, values->untyped_data(), exists) !=
      0)
    return CoreError("find");
  return ffi::Error::Success();
}

// size: number of keys, as int64 or (in JAX's 32-bit mode) int32 saturated at 2**31-1.
ffi::Error SizeImpl(Handle handle, Version version, ffi::Result<ffi::AnyBuffer> out) {
  (void)ReadVersion(version);
  int64_t table_id = 0;
  if (auto e = ReadTableId(handle, &table_id); e.failure()) return e;
  int64_t n = 0;
  if (de_size(table_id, &n) != 0) return CoreError("size");
  if (out->element_type() == ffi::DataType::S64) {
    *static_cast<int64_t*>(out->untyped_data()) = n;
  } else if (out->element_type() == ffi::DataType::S32) {
    *static_cast<int32_t*>(out->untyped_data()) =
        static_cast<int32_t>(std::min<int64_t>(n, std::numeric_limits<int32_t>::max()));
  } else {
    return ffi::Error::InvalidArgument("dualemb size: result must be int32 or int64");
  }
  return ffi::Error::Success();
}

// export: rows [offset, offset + limit) of the table's iteration order (limit = the static
// length of the outputs); `count` receives how many were written (the rest is zero-filled).
// Keys come out as int64, int32 or uint32 pairs, whichever the `keys` result is.
ffi::Error ExportImpl(Handle handle, Version version, ffi::Buffer<ffi::S32> offset,
                      ffi::Result<ffi::AnyBuffer> keys, ffi::Result<ffi::AnyBuffer> values,
                      ffi::Result<ffi::AnyBuffer> slots, ffi::ResultBuffer<ffi::S32> count) {
  (void)ReadVersion(version);
  int64_t table_id = 0;
  if (auto e = ReadTableId(handle, &table_id); e.failure()) return e;
  TableDims dims;
  if (auto e = GetDims(table_id, &dims); e.failure()) return e;
  if (auto e = CheckValueType(dims, table_id, values->element_type(), "values"); e.failure())
    return e;
  if (auto e = CheckValueType(dims, table_id, slots->element_type(), "slots"); e.failure())
    return e;
  const int64_t limit = CountKeys(*keys);
  if (limit < 0) return ffi::Error::InvalidArgument("dualemb export: bad keys result type");
  if (static_cast<int64_t>(values->element_count()) != limit * dims.dim)
    return ffi::Error::InvalidArgument("dualemb export: values must be [limit, dim]");
  const bool want_slots = slots->element_count() != 0;
  if (want_slots &&
      static_cast<int64_t>(slots->element_count()) != limit * dims.num_slots * dims.dim)
    return ffi::Error::InvalidArgument("dualemb export: slots must be [limit, num_slots, dim]");
  const int64_t off = offset.element_count() ? offset.typed_data()[0] : 0;
  if (off < 0) return ffi::Error::InvalidArgument("dualemb export: offset must be >= 0");

  const bool out32 = keys->element_type() == ffi::DataType::S32;
  std::vector<int64_t> k64;
  std::vector<int32_t> k32;
  void* kdst;
  if (dims.key_dtype == DE_KEY_INT64 && !out32) {
    kdst = keys->untyped_data();
  } else if (dims.key_dtype == DE_KEY_INT32 && out32) {
    kdst = keys->untyped_data();
  } else if (dims.key_dtype == DE_KEY_INT32) {
    k32.resize(limit);
    kdst = k32.data();
  } else {
    return ffi::Error::InvalidArgument(
        "dualemb export: an int64 table's keys cannot be exported as int32");
  }
  std::memset(keys->untyped_data(), 0, keys->size_bytes());
  std::memset(values->untyped_data(), 0, values->size_bytes());
  if (want_slots) std::memset(slots->untyped_data(), 0, slots->size_bytes());
  int64_t n = 0;
  if (de_export(table_id, off, limit, dims.key_dtype, kdst, values->untyped_data(),
                want_slots ? slots->untyped_data() : nullptr, dims.num_slots, nullptr, nullptr,
                nullptr, &n) != 0)
    return CoreError("export");
  if (!k32.empty()) {  // int32 table exported as int64 / pairs: widen
    int64_t* dst = static_cast<int64_t*>(keys->untyped_data());
    for (int64_t i = 0; i < n; ++i) dst[i] = k32[i];
  }
  *count->typed_data() = static_cast<int32_t>(n);
  return ffi::Error::Success();
}

// after: returns the version token unchanged, but only once every other operand has been
// computed. XLA cannot see through a custom call, so a write given this token is ordered after
// the reads that produced those operands (an optimization barrier does not do this on CPU: XLA
// removes it).
ffi::Error AfterImpl(Version version, ffi::RemainingArgs, NextVersion out) {
  *out->typed_data() = ReadVersion(version);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace dualemb_jax

using namespace dualemb_jax;  // NOLINT

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_find, OnXlaPool<FindImpl>::Call,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_size, SizeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_export, OnXlaPool<ExportImpl>::Call,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_after, AfterImpl,
                              ffi::Ffi::Bind()
                                  .Arg<Version>()
                                  .RemainingArgs()
                                  .Ret<ffi::Buffer<ffi::F32>>());
