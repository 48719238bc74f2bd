// ffi_train.cc — training handlers: the fused optimizer step, and `unique` (the batch's distinct
// keys, used by the generic Optax path to gather and write back each row once).
#include <unordered_map>
#include <vector>

#include "ffi_common.h"
#include "ffi_handlers.h"

namespace dualemb_jax {
namespace {

// apply_gradients: one fused optimizer step (duplicates' gradients summed, missing keys
// inserted first). lr (float32) and the table's step count (ReadStep) are operands so schedules
// work.
ffi::Error ApplyGradientsImpl(Handle handle, Version version, ffi::AnyBuffer keys,
                              ffi::Buffer<ffi::F32> grads, ffi::Buffer<ffi::F32> lr,
                              ffi::Buffer<ffi::F32> step_code, NextVersion next) {
  TableCall c;
  if (auto e = Prepare(handle, keys, grads.element_count(), "gradients", &c); e.failure()) return e;
  if (lr.element_count() != 1 || step_code.element_count() != 2)
    return ffi::Error::InvalidArgument(
        "dualemb apply_gradients: lr must be a scalar and the step count float32[2]");
  int64_t step = 0;
  if (auto e = ReadStep(step_code.typed_data(), "apply_gradients", &step); e.failure()) return e;
  return Written(de_apply_gradients(c.table_id, c.dims.key_dtype, c.k.data, c.k.n,
                                    grads.typed_data(), lr.typed_data()[0], step, nullptr),
                 "apply_gradients", next, ReadVersion(version));
}

// unique: the distinct keys of a batch in first-occurrence order, padded to the batch length
// with the first key; inverse[i] is the position of keys[i] among them; count how many there
// are. Works on the raw key values (int64, int32 or uint32 pairs, returned in the same form), so
// it needs no table.
template <typename K>
void UniqueKeys(const K* keys, int64_t n, K* uniq, int32_t* inverse, int32_t* count) {
  std::unordered_map<K, int32_t> pos;
  pos.reserve(static_cast<size_t>(n) * 2);
  int32_t u = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto it = pos.emplace(keys[i], u);
    if (it.second) uniq[u++] = keys[i];
    inverse[i] = it.first->second;
  }
  for (int64_t i = u; i < n; ++i) uniq[i] = n ? keys[0] : K(0);
  *count = u;
}

ffi::Error UniqueImpl(ffi::AnyBuffer keys, ffi::Result<ffi::AnyBuffer> uniq,
                      ffi::ResultBuffer<ffi::S32> inverse, ffi::ResultBuffer<ffi::S32> count) {
  const int64_t n = CountKeys(keys);
  if (n < 0 || uniq->element_type() != keys.element_type() ||
      uniq->element_count() != keys.element_count() ||
      static_cast<int64_t>(inverse->element_count()) != n)
    return ffi::Error::InvalidArgument("dualemb unique: bad key buffers");
  if (keys.element_type() == ffi::DataType::S32)
    UniqueKeys(static_cast<const int32_t*>(keys.untyped_data()), n,
               static_cast<int32_t*>(uniq->untyped_data()), inverse->typed_data(),
               count->typed_data());
  else
    UniqueKeys(static_cast<const int64_t*>(keys.untyped_data()), n,
               static_cast<int64_t*>(uniq->untyped_data()), inverse->typed_data(),
               count->typed_data());
  return ffi::Error::Success();
}

}  // namespace
}  // namespace dualemb_jax

using namespace dualemb_jax;  // NOLINT

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_apply_gradients, OnXlaPool<ApplyGradientsImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_unique, UniqueImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());
