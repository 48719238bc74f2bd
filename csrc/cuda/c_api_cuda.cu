// c_api_cuda.cu — the C ABI of libdualemb_cuda.so (dualemb_cuda.h): GpuTable behind POD calls,
// so that Python (ctypes, dualemb/core/_cuda.py) and later the core's facade can load the library
// only when a GPU table is made. Errors: every call returns 0, or -1 with dec_last_error() set
// (per thread), never throws across the boundary.
#include "dualemb_cuda.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "gpu_table.h"

using dualemb::gpu::GpuTable;

namespace {

thread_local std::string g_error;
thread_local int g_error_kind = 0;

// Error kinds (dec_last_error_kind): 1 bad input (std::invalid_argument), 2 out of GPU memory,
// 3 anything else (a CUDA error, a bug).
template <class Fn>
int guarded(Fn&& fn) {
  try {
    fn();
    return 0;
  } catch (const std::invalid_argument& e) {
    g_error = e.what();
    g_error_kind = 1;
  } catch (const std::exception& e) {
    g_error = e.what();
    g_error_kind = g_error.find("out of GPU memory") != std::string::npos ? 2 : 3;
  } catch (...) {
    g_error = "unknown error";
    g_error_kind = 3;
  }
  return -1;
}

// id -> table, and table -> id (dec_table_id).
std::mutex g_registry_mu;
std::unordered_map<int64_t, GpuTable*> g_by_id;
std::unordered_map<const GpuTable*, int64_t> g_id_of;

int64_t register_table(GpuTable* t) {
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(g_registry_mu);
  int64_t id = 0;
  do {
    id = static_cast<int64_t>(rng() >> 1);
  } while (id == 0 || g_by_id.count(id));
  g_by_id[id] = t;
  g_id_of[t] = id;
  return id;
}

void unregister_table(const GpuTable* t) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = g_id_of.find(t);
  if (it == g_id_of.end()) return;
  g_by_id.erase(it->second);
  g_id_of.erase(it);
}

__global__ void fill_kernel(float* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

GpuTable* table(void* h) {
  if (!h) throw std::invalid_argument("GPU table: null handle");
  return static_cast<GpuTable*>(h);
}

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

// Host-pointer convenience: stage arrays through device buffers (tests; the FFI handlers pass
// device pointers directly).
struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) {
    if (bytes) ok(cudaMalloc(&p, bytes), "GPU table: out of GPU memory staging a batch");
  }
  ~Dev() { cudaFree(p); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};
void h2d(void* d, const void* h, size_t bytes) {
  if (bytes && h) ok(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "copy to GPU");
}
void d2h(void* h, const void* d, size_t bytes) {
  if (bytes && h) ok(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), "copy from GPU");
}

}  // namespace

extern "C" {

DEC_API const char* dec_last_error(void) { return g_error.c_str(); }
DEC_API int dec_last_error_kind(void) { return g_error_kind; }

DEC_API int dec_device_count(int* count) {
  return guarded([&] {
    int n = 0;
    ok(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    *count = n;
  });
}

DEC_API int dec_device_name(char* buf, size_t buflen) {
  return guarded([&] {
    cudaDeviceProp prop;
    int dev = 0;
    ok(cudaGetDevice(&dev), "cudaGetDevice");
    ok(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    std::snprintf(buf, buflen, "%s (sm_%d%d)", prop.name, prop.major, prop.minor);
  });
}

DEC_API int dec_table_create(const char* config, void** out) {
  return guarded([&] {
    std::unique_ptr<GpuTable> t(new GpuTable(config));
    register_table(t.get());
    *out = t.release();
  });
}

DEC_API int dec_table_destroy(void* h) {
  return guarded([&] {
    unregister_table(table(h));
    delete table(h);
  });
}

DEC_API int dec_table_id(void* h, int64_t* id) {
  return guarded([&] {
    const GpuTable* t = table(h);
    std::lock_guard<std::mutex> lock(g_registry_mu);
    auto it = g_id_of.find(t);
    if (it == g_id_of.end()) throw std::invalid_argument("GPU table: not registered");
    *id = it->second;
  });
}

DEC_API int dec_table_by_id(int64_t id, void** out) {
  return guarded([&] {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    auto it = g_by_id.find(id);
    if (it == g_by_id.end())
      throw std::invalid_argument("unknown GPU table id " + std::to_string(id) +
                                  " (destroyed, or a host table: make it with "
                                  "dualemb.jax.create(..., placement=\"gpu\"))");
    *out = it->second;
  });
}

DEC_API int dec_set_optimizer(void* h, const char* spec) {
  return guarded([&] { table(h)->set_optimizer(spec); });
}

DEC_API int dec_size(void* h, int64_t* out) {
  return guarded([&] { *out = table(h)->size(nullptr); });
}

DEC_API int dec_num_slots(void* h, int* out) {
  return guarded([&] { *out = table(h)->num_slots(); });
}

DEC_API int dec_clear(void* h) {
  return guarded([&] { table(h)->clear(nullptr); });
}

// ---- device pointers, on a stream -------------------------------------------------------------
DEC_API int dec_find(void* h, const int64_t* keys, int64_t n, float* values, uint8_t* exists,
                     void* stream) {
  return guarded(
      [&] { table(h)->find(keys, n, values, exists, static_cast<cudaStream_t>(stream)); });
}
DEC_API int dec_find_or_insert(void* h, const int64_t* keys, int64_t n, float* values,
                               uint8_t* exists, void* stream, int64_t* evicted) {
  return guarded([&] {
    *evicted = table(h)->find_or_insert(keys, n, values, exists, static_cast<cudaStream_t>(stream));
  });
}
DEC_API int dec_insert_or_assign(void* h, const int64_t* keys, int64_t n, const float* values,
                                 void* stream, int64_t* evicted) {
  return guarded([&] {
    *evicted = table(h)->insert_or_assign(keys, n, values, static_cast<cudaStream_t>(stream));
  });
}
DEC_API int dec_apply_gradients(void* h, const int64_t* keys, int64_t n, const float* grads,
                                float lr, int64_t step, void* stream, int64_t* evicted) {
  return guarded([&] {
    *evicted =
        table(h)->apply_gradients(keys, n, grads, lr, step, static_cast<cudaStream_t>(stream));
  });
}

DEC_API int dec_accum(void* h, const int64_t* keys, int64_t n, const float* deltas,
                      const float* old_values, const uint8_t* exists, void* stream,
                      int64_t* evicted) {
  return guarded([&] {
    *evicted =
        table(h)->accum(keys, n, deltas, old_values, exists, static_cast<cudaStream_t>(stream));
  });
}
DEC_API int dec_import(void* h, const int64_t* keys, int64_t n, const float* values,
                       const float* slots, const int64_t* last_update, const int64_t* update_count,
                       void* stream, int64_t* evicted) {
  return guarded([&] {
    *evicted = table(h)->import_rows(keys, n, values, slots, last_update, update_count,
                                     static_cast<cudaStream_t>(stream));
  });
}

// ---- host-side calls ---------------------------------------------------------------------------
DEC_API int dec_restrict(void* h, int64_t num_reserved, int policy, const int64_t* keys,
                         const float* scores, int64_t n, int64_t* removed) {
  return guarded([&] {
    if (policy < 0 || policy > 2)
      throw std::invalid_argument(
          "restrict: policy must be 0 (recency), 1 (frequency) or 2 "
          "(custom), got " +
          std::to_string(policy));
    if (n > 0 && (!keys || !scores))
      throw std::invalid_argument("restrict: custom scores need keys and scores");
    *removed = table(h)->restrict_rows(num_reserved, static_cast<dualemb::RestrictBy>(policy), keys,
                                       scores, n, nullptr);
  });
}
DEC_API int dec_get_clock(void* h, int64_t* out) {
  return guarded([&] { *out = table(h)->clock(); });
}
DEC_API int dec_set_clock(void* h, int64_t clock) {
  return guarded([&] { table(h)->set_clock(clock); });
}
DEC_API int dec_evicted_total(void* h, int64_t* out) {
  return guarded([&] { *out = table(h)->evicted_total(); });
}
DEC_API int dec_dim(void* h, int64_t* out) {
  return guarded([&] { *out = table(h)->dim(); });
}
DEC_API int dec_reserve(void* h, int64_t rows) {
  return guarded([&] { table(h)->reserve(rows, nullptr); });
}

// ---- host pointers (staged) ---------------------------------------------------------------------
DEC_API int dec_find_host(void* h, const int64_t* keys, int64_t n, float* values, uint8_t* exists) {
  return guarded([&] {
    GpuTable* t = table(h);
    Dev k(8 * n), v(4 * n * t->dim()), e(n);
    h2d(k.p, keys, 8 * n);
    t->find(k.as<int64_t>(), n, v.as<float>(), e.as<uint8_t>(), nullptr);
    d2h(values, v.p, 4 * n * t->dim());
    d2h(exists, e.p, n);
  });
}
DEC_API int dec_find_or_insert_host(void* h, const int64_t* keys, int64_t n, float* values,
                                    uint8_t* exists, int64_t* evicted) {
  return guarded([&] {
    GpuTable* t = table(h);
    Dev k(8 * n), v(4 * n * t->dim()), e(n);
    h2d(k.p, keys, 8 * n);
    *evicted = t->find_or_insert(k.as<int64_t>(), n, v.as<float>(), e.as<uint8_t>(), nullptr);
    d2h(values, v.p, 4 * n * t->dim());
    d2h(exists, e.p, n);
  });
}
DEC_API int dec_insert_or_assign_host(void* h, const int64_t* keys, int64_t n, const float* values,
                                      int64_t* evicted) {
  return guarded([&] {
    GpuTable* t = table(h);
    Dev k(8 * n), v(4 * n * t->dim());
    h2d(k.p, keys, 8 * n);
    h2d(v.p, values, 4 * n * t->dim());
    *evicted = t->insert_or_assign(k.as<int64_t>(), n, v.as<float>(), nullptr);
  });
}
DEC_API int dec_apply_gradients_host(void* h, const int64_t* keys, int64_t n, const float* grads,
                                     float lr, int64_t step, int64_t* evicted) {
  return guarded([&] {
    GpuTable* t = table(h);
    Dev k(8 * n), g(4 * n * t->dim());
    h2d(k.p, keys, 8 * n);
    h2d(g.p, grads, 4 * n * t->dim());
    *evicted = t->apply_gradients(k.as<int64_t>(), n, g.as<float>(), lr, step, nullptr);
  });
}
DEC_API int dec_accum_host(void* h, const int64_t* keys, int64_t n, const float* deltas,
                           const float* old_values, const uint8_t* exists, int64_t* evicted) {
  return guarded([&] {
    GpuTable* t = table(h);
    const size_t rows = 4 * n * t->dim();
    Dev k(8 * n), d(rows), o(old_values ? rows : 0), e(n);
    h2d(k.p, keys, 8 * n);
    h2d(d.p, deltas, rows);
    h2d(o.p, old_values, rows);
    h2d(e.p, exists, n);
    *evicted = t->accum(k.as<int64_t>(), n, d.as<float>(), old_values ? o.as<float>() : nullptr,
                        e.as<uint8_t>(), nullptr);
  });
}
DEC_API int dec_import_host(void* h, const int64_t* keys, int64_t n, const float* values,
                            const float* slots, const int64_t* last_update,
                            const int64_t* update_count, int64_t* evicted) {
  return guarded([&] {
    GpuTable* t = table(h);
    const size_t rows = 4 * n * t->dim(), slot_bytes = rows * t->num_slots();
    const bool with_slots = slots && slot_bytes;
    Dev k(8 * n), v(rows), s(with_slots ? slot_bytes : 0), lu(last_update ? 8 * n : 0),
        uc(update_count ? 8 * n : 0);
    h2d(k.p, keys, 8 * n);
    h2d(v.p, values, rows);
    if (with_slots) h2d(s.p, slots, slot_bytes);
    h2d(lu.p, last_update, 8 * n);
    h2d(uc.p, update_count, 8 * n);
    *evicted =
        t->import_rows(k.as<int64_t>(), n, v.as<float>(), with_slots ? s.as<float>() : nullptr,
                       last_update ? lu.as<int64_t>() : nullptr,
                       update_count ? uc.as<int64_t>() : nullptr, nullptr);
  });
}
DEC_API int dec_erase_host(void* h, const int64_t* keys, int64_t n) {
  return guarded([&] {
    GpuTable* t = table(h);
    Dev k(8 * n);
    h2d(k.p, keys, 8 * n);
    t->erase(k.as<int64_t>(), n, nullptr);
  });
}
DEC_API int dec_export_host(void* h, int64_t offset, int64_t limit, int64_t* keys, float* values,
                            float* slots, int64_t* last_update, int64_t* update_count,
                            int64_t* written) {
  return guarded([&] {
    GpuTable* t = table(h);
    const int64_t d = t->dim(), ns = t->num_slots();
    Dev k(8 * limit), v(4 * limit * d), s(4 * limit * d * ns), lu(8 * limit), uc(8 * limit);
    const int64_t m = t->export_rows(offset, limit, k.as<int64_t>(), v.as<float>(),
                                     slots && ns ? s.as<float>() : nullptr, lu.as<int64_t>(),
                                     uc.as<int64_t>(), nullptr);
    d2h(keys, k.p, 8 * m);
    d2h(values, v.p, 4 * m * d);
    if (slots) d2h(slots, s.p, 4 * m * d * ns);
    d2h(last_update, lu.p, 8 * m);
    d2h(update_count, uc.p, 8 * m);
    *written = m;
  });
}

// ---- device memory for benchmarks -------------------------------------------------------------
DEC_API int dec_malloc(void** p, size_t bytes) {
  return guarded([&] { ok(cudaMalloc(p, bytes), "cudaMalloc"); });
}
DEC_API int dec_free(void* p) {
  return guarded([&] { ok(cudaFree(p), "cudaFree"); });
}
DEC_API int dec_memcpy(void* dst, const void* src, size_t bytes, int kind) {
  return guarded(
      [&] { ok(cudaMemcpy(dst, src, bytes, static_cast<cudaMemcpyKind>(kind)), "cudaMemcpy"); });
}
DEC_API int dec_synchronize(void) {
  return guarded([&] { ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); });
}
DEC_API int dec_read_f32(const float* device, int64_t n, float* host, void* stream) {
  return guarded([&] {
    if (n <= 0) return;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    ok(cudaMemcpyAsync(host, device, sizeof(float) * n, cudaMemcpyDeviceToHost, s),
       "copy from GPU");
    ok(cudaStreamSynchronize(s), "copy from GPU");
  });
}
DEC_API int dec_fill_f32(float* device, int64_t n, float value, void* stream) {
  return guarded([&] {
    if (n <= 0) return;
    const int64_t blocks = (n + 255) / 256;
    fill_kernel<<<static_cast<int>(blocks > 4096 ? 4096 : blocks), 256, 0,
                  static_cast<cudaStream_t>(stream)>>>(device, n, value);
    ok(cudaGetLastError(), "fill");
  });
}
// Device-to-device copy bandwidth in bytes/s (read + write counted: 2 * bytes per copy), the
// bound bench_gpu.py divides by.
DEC_API int dec_copy_bandwidth(size_t bytes, int iterations, double* bytes_per_s) {
  return guarded([&] {
    Dev a(bytes), b(bytes);
    cudaEvent_t t0, t1;
    ok(cudaEventCreate(&t0), "event");
    ok(cudaEventCreate(&t1), "event");
    ok(cudaMemcpy(b.p, a.p, bytes, cudaMemcpyDeviceToDevice), "warm-up copy");
    ok(cudaEventRecord(t0), "event");
    for (int i = 0; i < iterations; ++i)
      ok(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice), "copy");
    ok(cudaEventRecord(t1), "event");
    ok(cudaEventSynchronize(t1), "event");
    float ms = 0.f;
    ok(cudaEventElapsedTime(&ms, t0, t1), "event");
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    *bytes_per_s = 2.0 * static_cast<double>(bytes) * iterations / (ms * 1e-3);
  });
}

}  // extern "C"
