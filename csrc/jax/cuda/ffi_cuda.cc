// ffi_cuda.cc — the CUDA-platform XLA FFI handlers: find, find_or_insert and apply_gradients on
// a GPU table (libdualemb_cuda.so), on device buffers and XLA's stream, with no host round trip
// of the keys, rows or gradients and no Python per call.
//
// The conventions are the CPU handlers' (ffi_common.h): operand 0 is the table handle
// (float32[4], the id's 16-bit chunks), operand 1 the version token, mutating calls return the
// next token. Here the handle names a table of the GPU registry (dec_table_by_id), and the
// handle, the token, lr and the step count are device buffers: they are copied back (a few
// bytes, one synchronisation of XLA's stream each) because the id and the scalars steer host
// code. The next token is written on the device, stream-ordered.
//
// Keys: int64 or uint32 pairs [..., 2] (the same bytes); int32 ids are refused with a clear
// error (the GPU table's keys are int64: pass int64 ids or dualemb.jax.ids pairs). Rows and
// gradients are float32 (the GPU table's only value dtype; XLA checks the buffers' types).
// Not yet run on a GPU.
#include <cstdint>
#include <string>

#include "dualemb_cuda.h"
#include "ffi_common.h"
#include "ffi_handlers.h"

namespace dualemb_jax {
namespace {

using Stream = ffi::PlatformStream<void*>;

// The GPU library's last error as an ffi::Error (out of GPU memory: RESOURCE_EXHAUSTED).
ffi::Error GpuError(const char* what) {
  const std::string msg = std::string("dualemb ") + what + " (GPU table): " + dec_last_error();
  if (dec_last_error_kind() == 2) return ffi::Error(ffi::ErrorCode::kResourceExhausted, msg);
  return ffi::Error::InvalidArgument(msg);
}

// The table a device handle names, its dim, and the version token (0 for an empty token).
ffi::Error Resolve(void* stream, Handle handle, Version version, void** table, int64_t* dim,
                   float* v, const char* what) {
  if (handle.element_count() != 4)
    return ffi::Error::InvalidArgument(
        "dualemb: a table handle is float32[4] naming one table, got " +
        std::to_string(handle.element_count()) +
        " values (vmapping over a batch of tables is not supported)");
  float chunks[4];
  if (dec_read_f32(handle.typed_data(), 4, chunks, stream) != 0) return GpuError(what);
  uint64_t id = 0;
  if (!DecodeChunks(chunks, 4, &id) || (id >> 63) != 0)
    return ffi::Error::InvalidArgument(
        "dualemb: corrupted table handle (its values are not the 16-bit chunks of a table id)");
  if (dec_table_by_id(static_cast<int64_t>(id), table) != 0) return GpuError(what);
  if (dec_dim(*table, dim) != 0) return GpuError(what);
  *v = 0.0f;
  if (version.element_count() && dec_read_f32(version.typed_data(), 1, v, stream) != 0)
    return GpuError(what);
  return ffi::Error::Success();
}

// The keys as device int64 (int64 or uint32 pairs: the same bytes), and their count.
ffi::Error DeviceKeys(ffi::AnyBuffer keys, const int64_t** out, int64_t* n) {
  const int64_t count = CountKeys(keys);
  if (count < 0 || keys.element_type() == ffi::DataType::S32)
    return ffi::Error::InvalidArgument(
        "dualemb: a GPU table takes int64 ids or uint32 pairs [..., 2] (dualemb.jax.ids); "
        "int32 ids are not supported on the GPU table");
  *out = static_cast<const int64_t*>(keys.untyped_data());
  *n = count;
  return ffi::Error::Success();
}

ffi::Error CheckRows(int64_t got, int64_t n, int64_t dim, const char* name) {
  if (got == n * dim) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(std::string("dualemb: ") + name + " hold " +
                                     std::to_string(got) + " values, expected keys (" +
                                     std::to_string(n) + ") x dim (" + std::to_string(dim) + ")");
}

ffi::Error WriteNext(void* stream, NextVersion next, float v) {
  if (dec_fill_f32(next->typed_data(), static_cast<int64_t>(next->element_count()),
                   NextVersionValue(v), stream) != 0)
    return GpuError("version");
  return ffi::Error::Success();
}

ffi::Error FindCuda(void* stream, Handle handle, Version version, ffi::AnyBuffer keys,
                    ffi::ResultBuffer<ffi::F32> rows, ffi::ResultBuffer<ffi::PRED> exists) {
  void* t = nullptr;
  int64_t dim = 0, n = 0;
  float v = 0;
  const int64_t* k = nullptr;
  if (auto e = Resolve(stream, handle, version, &t, &dim, &v, "find"); e.failure()) return e;
  if (auto e = DeviceKeys(keys, &k, &n); e.failure()) return e;
  if (auto e = CheckRows(static_cast<int64_t>(rows->element_count()), n, dim, "rows"); e.failure())
    return e;
  uint8_t* ex = exists->element_count() == static_cast<size_t>(n) && n
                    ? reinterpret_cast<uint8_t*>(exists->typed_data())
                    : nullptr;
  if (dec_find(t, k, n, rows->typed_data(), ex, stream) != 0) return GpuError("find");
  return ffi::Error::Success();
}

ffi::Error FindOrInsertCuda(void* stream, Handle handle, Version version, ffi::AnyBuffer keys,
                            NextVersion next, ffi::ResultBuffer<ffi::F32> rows,
                            ffi::ResultBuffer<ffi::PRED> exists) {
  void* t = nullptr;
  int64_t dim = 0, n = 0, evicted = 0;
  float v = 0;
  const int64_t* k = nullptr;
  if (auto e = Resolve(stream, handle, version, &t, &dim, &v, "find_or_insert"); e.failure())
    return e;
  if (auto e = DeviceKeys(keys, &k, &n); e.failure()) return e;
  if (auto e = CheckRows(static_cast<int64_t>(rows->element_count()), n, dim, "rows"); e.failure())
    return e;
  if (static_cast<int64_t>(exists->element_count()) != n)
    return ffi::Error::InvalidArgument("dualemb find_or_insert: exists must have one per key");
  if (dec_find_or_insert(t, k, n, rows->typed_data(),
                         reinterpret_cast<uint8_t*>(exists->typed_data()), stream, &evicted) != 0)
    return GpuError("find_or_insert");
  return WriteNext(stream, next, v);
}

ffi::Error ApplyGradientsCuda(void* stream, Handle handle, Version version, ffi::AnyBuffer keys,
                              ffi::Buffer<ffi::F32> grads, ffi::Buffer<ffi::F32> lr,
                              ffi::Buffer<ffi::F32> step_code, NextVersion next) {
  void* t = nullptr;
  int64_t dim = 0, n = 0, evicted = 0;
  float v = 0;
  const int64_t* k = nullptr;
  if (auto e = Resolve(stream, handle, version, &t, &dim, &v, "apply_gradients"); e.failure())
    return e;
  if (auto e = DeviceKeys(keys, &k, &n); e.failure()) return e;
  if (auto e = CheckRows(static_cast<int64_t>(grads.element_count()), n, dim, "gradients");
      e.failure())
    return e;
  if (lr.element_count() != 1 || step_code.element_count() != 2)
    return ffi::Error::InvalidArgument(
        "dualemb apply_gradients: lr must be a scalar and the step count float32[2]");
  float host_lr = 0.0f, chunks[2] = {0.0f, 0.0f};
  if (dec_read_f32(lr.typed_data(), 1, &host_lr, stream) != 0 ||
      dec_read_f32(step_code.typed_data(), 2, chunks, stream) != 0)
    return GpuError("apply_gradients");
  uint64_t count = 0;
  if (!DecodeChunks(chunks, 2, &count) || count > 0x7FFFFFFEu)
    return ffi::Error::InvalidArgument(
        "dualemb apply_gradients: corrupted step count (the table's step leaf is not the "
        "16-bit chunks of a count)");
  if (dec_apply_gradients(t, k, n, grads.typed_data(), host_lr, static_cast<int64_t>(count) + 1,
                          stream, &evicted) != 0)
    return GpuError("apply_gradients");
  return WriteNext(stream, next, v);
}

}  // namespace
}  // namespace dualemb_jax

using namespace dualemb_jax;  // NOLINT

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_find_cuda, FindCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::PRED>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_find_or_insert_cuda, FindOrInsertCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::PRED>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(dualemb_apply_gradients_cuda, ApplyGradientsCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Handle>()
                                  .Arg<Version>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
