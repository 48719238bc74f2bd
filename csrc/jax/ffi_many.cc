// ffi_many.cc — multi-table handlers: one custom call per step for all of a model's tables.
//
// A model with T tables otherwise makes T lookups and T optimizer calls per step, each a custom
// call of its own; these make one, and the core runs the tables in parallel on its thread pool
// (de_*_many, dualemb_core.h), with the per-table calls' results bit for bit.
//
// Operands: `handles` float32[T, 4] (the tables' handles stacked; [1, T, 4] under vmap),
// `versions` float32[T] (each table's token), then the per-table buffers as T remaining operands
// each (keys; for apply_gradients the keys, then the gradients). Writes return the next tokens
// float32[T] (element j of a batched result holds table j % T's). T is the number of key
// operands. Everything is checked for every table before the core is called, and the core
// checks its part before any table changes (dualemb_core.h, "Multi-table calls"). A write that
// names one table twice is refused: its handles would come back as two tables with one step.
#include <string>
#include <unordered_set>
#include <vector>

#include "ffi_common.h"
#include "ffi_handlers.h"

namespace dualemb_jax {
namespace {

// The tables of a multi-table call, their dims and keys, ready for the core.
struct ManyTables {
  int64_t count = 0;
  std::vector<int64_t> ids;
  std::vector<TableDims> dims;
  std::vector<Keys> keys;
  std::vector<float> versions;
  std::vector<de_table_batch> batches;
};

std::string Nth(int64_t t, int64_t count) {
  return "table " + std::to_string(t) + " of " + std::to_string(count) + ": ";
}

ffi::Error Prefixed(const ffi::Error& e, int64_t t, int64_t count) {
  return ffi::Error::InvalidArgument(Nth(t, count) + e.message());
}

// Reads handles, versions and the first `count` remaining operands (keys); refuses a table named
// twice when `distinct`.
ffi::Error PrepareMany(Handle handles, Version versions, const ffi::RemainingArgs& rest,
                       int64_t count, bool distinct, const char* what, ManyTables* m) {
  m->count = count;
  if (static_cast<int64_t>(handles.element_count()) != 4 * count ||
      static_cast<int64_t>(versions.element_count()) != count)
    return ffi::Error::InvalidArgument(
        std::string("dualemb ") + what + ": expected handles float32[" + std::to_string(count) +
        ", 4] and versions float32[" + std::to_string(count) + "] for " + std::to_string(count) +
        " key operands (vmapping over tables is not supported)");
  m->ids.resize(count);
  m->dims.resize(count);
  m->keys.resize(count);
  m->versions.assign(versions.typed_data(), versions.typed_data() + count);
  m->batches.assign(count, de_table_batch{});
  std::unordered_set<int64_t> seen;
  for (int64_t t = 0; t < count; ++t) {
    if (!DecodeTableId(handles.typed_data() + 4 * t, &m->ids[t]))
      return Prefixed(ffi::Error::InvalidArgument(
                          "dualemb: corrupted table handle (its values are not the 16-bit chunks "
                          "of a table id): keep tables out of what optimizers update"),
                      t, count);
    if (distinct && !seen.insert(m->ids[t]).second)
      return ffi::Error::InvalidArgument(
          std::string("dualemb ") + what + ": " + Nth(t, count) + "table " +
          std::to_string(m->ids[t]) +
          " appears twice; give each table once (concatenate its ids and gradients)");
    if (auto e = GetDims(m->ids[t], &m->dims[t]); e.failure()) return Prefixed(e, t, count);
    auto keys = rest.get<ffi::AnyBuffer>(static_cast<size_t>(t));
    if (keys.has_error()) return Prefixed(keys.error(), t, count);
    if (auto e = DecodeKeys(*keys, m->dims[t].key_dtype, &m->keys[t]); e.failure())
      return Prefixed(e, t, count);
    de_table_batch& b = m->batches[t];
    b.id = m->ids[t];
    b.key_dtype = m->dims[t].key_dtype;
    b.keys = m->keys[t].data;
    b.n = m->keys[t].n;
  }
  return ffi::Error::Success();
}

// Checks a rows result (`rets[index]`) against table t and hands its buffer to the batch.
ffi::Error RowsOut(const ffi::RemainingRets& rets, size_t index, int64_t t, ManyTables* m) {
  auto rows = rets.get<ffi::AnyBuffer>(index);
  if (rows.has_error()) return Prefixed(rows.error(), t, m->count);
  const TableDims& d = m->dims[t];
  if (auto e = CheckRowCount(static_cast<int64_t>((*rows)->element_count()), m->keys[t].n, d.dim,
                             "rows");
      e.failure())
    return Prefixed(e, t, m->count);
  if (auto e = CheckValueType(d, m->ids[t], (*rows)->element_type(), "rows"); e.failure())
    return Prefixed(e, t, m->count);
  m->batches[t].values = (*rows)->untyped_data();
  return ffi::Error::Success();
}

// Hands the exists result `rets[index]` to the batch (an empty one: not wanted, when allowed).
ffi::Error ExistsOut(const ffi::RemainingRets& rets, size_t index, int64_t t, bool optional,
                     ManyTables* m) {
  auto exists = rets.get<ffi::Buffer<ffi::PRED>>(index);
  if (exists.has_error()) return Prefixed(exists.error(), t, m->count);
  const int64_t n = static_cast<int64_t>((*exists)->element_count());
  if (optional && n == 0) return ffi::Error::Success();
  if (n != m->keys[t].n)
    return ffi::Error::InvalidArgument(Nth(t, m->count) +
                                       "dualemb: exists must have one entry per key");
  m->batches[t].exists = reinterpret_cast<uint8_t*>((*exists)->typed_data());
  return ffi::Error::Success();
}

void WriteVersions(NextVersion out, const ManyTables& m) {
  float* p = out->typed_data();
  const size_t n = out->element_count();
  for (size_t j = 0; j < n; ++j) p[j] = NextVersionValue(m.versions[j % m.count]);
}

ffi::Error CheckNext(NextVersion next, const ManyTables& m) {
  if (m.count == 0 || next->element_count() % m.count != 0)
    return ffi::Error::InvalidArgument("dualemb: the next versions need one entry per table");
  return ffi::Error::Success();
}

// find_many: per table, rows (and exists, unless its result is empty) of its keys; reads only.
// Remaining results: T rows, then T exists, or T rows alone (exists not wanted: results nobody
// reads would order this call after other calls with such results, ffi_common.h
// OptionalExists).
ffi::Error FindManyImpl(Handle handles, Version versions, ffi::RemainingArgs keys,
                        ffi::RemainingRets rets) {
  const int64_t count = static_cast<int64_t>(keys.size());
  const int64_t results = static_cast<int64_t>(rets.size());
  if (results != 2 * count && results != count)
    return ffi::Error::InvalidArgument("dualemb find_many: expected rows (and exists) per table");
  ManyTables m;
  if (auto e = PrepareMany(handles, versions, keys, count, false, "find_many", &m); e.failure())
    return e;
  for (int64_t t = 0; t < count; ++t) {
    if (auto e = RowsOut(rets, t, t, &m); e.failure()) return e;
    if (results == 2 * count) {
      if (auto e = ExistsOut(rets, count + t, t, true, &m); e.failure()) return e;
    }
  }
  if (de_find_many(m.batches.data(), count) != 0) return CoreError("find_many");
  return ffi::Error::Success();
}

// find_or_insert_many: next versions, then per table its rows, then per table exists.
ffi::Error FindOrInsertManyImpl(Handle handles, Version versions, ffi::RemainingArgs keys,
                                NextVersion next, ffi::RemainingRets rets) {
  const int64_t count = static_cast<int64_t>(keys.size());
  if (static_cast<int64_t>(rets.size()) != 2 * count)
    return ffi::Error::InvalidArgument(
        "dualemb find_or_insert_many: expected rows and exists per table");
  ManyTables m;
  if (auto e = PrepareMany(handles, versions, keys, count, true, "find_or_insert_many", &m);
      e.failure())
    return e;
  if (auto e = CheckNext(next, m); e.failure()) return e;
  for (int64_t t = 0; t < count; ++t) {
    if (auto e = RowsOut(rets, t, t, &m); e.failure()) return e;
    if (auto e = ExistsOut(rets, count + t, t, false, &m); e.failure()) return e;
  }
  if (de_find_or_insert_many(m.batches.data(), count) != 0) return CoreError("find_or_insert_many");
  WriteVersions(next, m);
  return ffi::Error::Success();
}

// apply_gradients_many: one fused optimizer step per table. `lrs` float32[T]; `step_codes`
// float32[T, 2] (each table's step leaf, see ffi_train.cc); remaining operands: T keys, then T
// gradients (float32, keys x dim each).
ffi::Error ApplyGradientsManyImpl(Handle handles, Version versions, ffi::Buffer<ffi::F32> lrs,
                                  ffi::Buffer<ffi::F32> step_codes, ffi::RemainingArgs rest,
                                  NextVersion next) {
  if (rest.size() % 2 != 0)
    return ffi::Error::InvalidArgument(
        "dualemb apply_gradients_many: expected keys and gradients per table");
  const int64_t count = static_cast<int64_t>(rest.size() / 2);
  ManyTables m;
  if (auto e = PrepareMany(handles, versions, rest, count, true, "apply_gradients_many", &m);
      e.failure())
    return e;
  if (auto e = CheckNext(next, m); e.failure()) return e;
  if (static_cast<int64_t>(lrs.element_count()) != count ||
      static_cast<int64_t>(step_codes.element_count()) != 2 * count)
    return ffi::Error::InvalidArgument(
        "dualemb apply_gradients_many: expected lrs float32[T] and step counts float32[T, 2]");
  for (int64_t t = 0; t < count; ++t) {
    auto grads = rest.get<ffi::Buffer<ffi::F32>>(static_cast<size_t>(count + t));
    if (grads.has_error()) return Prefixed(grads.error(), t, count);
    if (auto e = CheckRowCount(static_cast<int64_t>(grads->element_count()), m.keys[t].n,
                               m.dims[t].dim, "gradients");
        e.failure())
      return Prefixed(e, t, count);
    de_table_batch& b = m.batches[t];
    if (auto e = ReadStep(step_codes.typed_data() + 2 * t, "apply_gradients_many", &b.step);
        e.failure())
      return Prefixed(e, t, count);
    b.grads = grads->typed_data();
    b.lr = lrs.typed_data()[t];
  }
  if (de_apply_gradients_many(m.batches.data(), count) != 0)
    return CoreError("apply_gradients_many");
  WriteVersions(next, m);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace dualemb_jax

using namespace dualemb_jax;  // NOLINT

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_find_many, OnXlaPool<FindManyImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .RemainingArgs()
                                  .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_find_or_insert_many, OnXlaPool<FindOrInsertManyImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .RemainingArgs()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_apply_gradients_many, OnXlaPool<ApplyGradientsManyImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .RemainingArgs()
                                  .Ret<ffi::Buffer<ffi::F32>>());
