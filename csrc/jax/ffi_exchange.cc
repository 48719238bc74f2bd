// ffi_exchange.cc — handlers of the sharded path (dualemb/jax/sharded.py): the exchange
// buffer's capacity check, and the fused optimizer step on the first `count` keys of a
// received buffer (the rest is padding that must not be inserted or trained).
#include <cstring>
#include <string>

#include "ffi_common.h"
#include "ffi_handlers.h"

namespace dualemb_jax {
namespace {

// exchange_check: returns `payload` unchanged if `needed` (the largest number of ids one device
// sends to one shard, already reduced over the mesh axis so that every device fails together,
// before any of them enters the all-to-all) fits `capacity`; fails otherwise. The ids are
// never dropped: the step fails with the knob's name instead.
ffi::Error ExchangeCheckImpl(ffi::Buffer<ffi::S32> needed, ffi::Buffer<ffi::S32> capacity,
                             ffi::AnyBuffer payload, ffi::Result<ffi::AnyBuffer> out) {
  if (needed.element_count() != 1 || capacity.element_count() != 1 ||
      out->size_bytes() != payload.size_bytes())
    return ffi::Error::InvalidArgument("dualemb exchange_check: bad operands");
  const int32_t n = needed.typed_data()[0];
  const int32_t c = capacity.typed_data()[0];
  if (n > c)
    return ffi::Error::InvalidArgument(
        "dualemb sharded exchange overflow: " + std::to_string(n) +
        " distinct ids of one device's batch belong to one shard, but the exchange buffer "
        "holds capacity_per_shard=" + std::to_string(c) +
        " ids per destination; create the sharded table with a larger capacity_per_shard "
        "(at most the local batch size is always enough; see docs/scaling_jax.md). Nothing "
        "was written.");
  if (payload.size_bytes())
    std::memcpy(out->untyped_data(), payload.untyped_data(), payload.size_bytes());
  return ffi::Error::Success();
}

// apply_gradients_first: dualemb_apply_gradients on keys[:count], grads[:count].
ffi::Error ApplyFirstImpl(Handle handle, Version version, ffi::AnyBuffer keys,
                          ffi::Buffer<ffi::F32> grads, ffi::Buffer<ffi::F32> lr,
                          ffi::Buffer<ffi::F32> step_code, ffi::Buffer<ffi::S32> count,
                          NextVersion next) {
  TableCall c;
  if (auto e = Prepare(handle, keys, grads.element_count(), "gradients", &c); e.failure())
    return e;
  if (lr.element_count() != 1 || step_code.element_count() != 2 || count.element_count() != 1)
    return ffi::Error::InvalidArgument(
        "dualemb apply_gradients_first: lr and count must be scalars, the step float32[2]");
  const int64_t n = count.typed_data()[0];
  if (n < 0 || n > c.k.n)
    return ffi::Error::InvalidArgument("dualemb apply_gradients_first: count " +
                                       std::to_string(n) + " outside [0, " +
                                       std::to_string(c.k.n) + "]");
  int64_t step = 0;
  if (auto e = ReadStep(step_code.typed_data(), "apply_gradients", &step); e.failure()) return e;
  const int rc = n == 0 ? 0
                        : de_apply_gradients(c.table_id, c.dims.key_dtype, c.k.data, n,
                                             grads.typed_data(), lr.typed_data()[0], step,
                                             nullptr);
  return Written(rc, "apply_gradients", next, ReadVersion(version));
}

}  // namespace
}  // namespace dualemb_jax

using namespace dualemb_jax;  // NOLINT

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_exchange_check, ExchangeCheckImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_apply_gradients_first, OnXlaPool<ApplyFirstImpl>::Call,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
