// dualemb_cuda.h — the C ABI of libdualemb_cuda.so, the GPU table (gpu_table.h).
//
// Loaded only when a GPU table is made (dualemb/core/_cuda.py with ctypes; later the core's table
// facade with dlopen): libdualemb_core.so and every Python module import on a machine with no GPU
// and no CUDA driver. Every call returns 0, or -1 with dec_last_error() naming the problem (out
// of GPU memory, no CUDA device, bad config, ...). `dec_*` take device pointers and a
// cudaStream_t (as void*); `dec_*_host` take host arrays and stage them (tests, small tools).
// Run on an H200, 2026-11-28 (csrc/cuda/README.md).
#ifndef DUALEMB_CUDA_DUALEMB_CUDA_H_
#define DUALEMB_CUDA_DUALEMB_CUDA_H_

#include <stddef.h>
#include <stdint.h>

#define DEC_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

DEC_API const char* dec_last_error(void);
// 1 bad input, 2 out of GPU memory (the table is unchanged), 3 other (CUDA error, no driver).
DEC_API int dec_last_error_kind(void);
DEC_API int dec_device_count(int* count);
DEC_API int dec_device_name(char* buf, size_t buflen);

// Every table gets a process-wide id (random, 63 bits) when it is made, so that code holding
// only an id — the CUDA XLA FFI handlers, given a JAX table handle — reaches it. A call must
// not race the destroy of its table.
DEC_API int dec_table_create(const char* config, void** out);
DEC_API int dec_table_id(void* table, int64_t* id);
DEC_API int dec_table_by_id(int64_t id, void** out);
DEC_API int dec_table_destroy(void* table);
DEC_API int dec_set_optimizer(void* table, const char* spec);
DEC_API int dec_size(void* table, int64_t* out);
DEC_API int dec_num_slots(void* table, int* out);
DEC_API int dec_clear(void* table);

DEC_API int dec_find(void* table, const int64_t* keys, int64_t n, float* values, uint8_t* exists,
                     void* stream);
DEC_API int dec_find_or_insert(void* table, const int64_t* keys, int64_t n, float* values,
                               uint8_t* exists, void* stream, int64_t* evicted);
DEC_API int dec_insert_or_assign(void* table, const int64_t* keys, int64_t n, const float* values,
                                 void* stream, int64_t* evicted);
DEC_API int dec_apply_gradients(void* table, const int64_t* keys, int64_t n, const float* grads,
                                float lr, int64_t step, void* stream, int64_t* evicted);

// TFRA's accum (old may be NULL; see GpuTable::accum) and paged import (slots, last_update,
// update_count may be NULL), on device pointers.
DEC_API int dec_accum(void* table, const int64_t* keys, int64_t n, const float* deltas,
                      const float* old_values, const uint8_t* exists, void* stream,
                      int64_t* evicted);
DEC_API int dec_import(void* table, const int64_t* keys, int64_t n, const float* values,
                       const float* slots, const int64_t* last_update, const int64_t* update_count,
                       void* stream, int64_t* evicted);
// policy: 0 recency, 1 frequency, 2 custom (keys/scores: host arrays of n; may be NULL when
// n is 0). *removed: rows erased.
DEC_API int dec_restrict(void* table, int64_t num_reserved, int policy, const int64_t* keys,
                         const float* scores, int64_t n, int64_t* removed);
DEC_API int dec_get_clock(void* table, int64_t* out);
DEC_API int dec_set_clock(void* table, int64_t clock);
DEC_API int dec_evicted_total(void* table, int64_t* out);
DEC_API int dec_dim(void* table, int64_t* out);
DEC_API int dec_reserve(void* table, int64_t rows);

DEC_API int dec_find_host(void* table, const int64_t* keys, int64_t n, float* values,
                          uint8_t* exists);
DEC_API int dec_find_or_insert_host(void* table, const int64_t* keys, int64_t n, float* values,
                                    uint8_t* exists, int64_t* evicted);
DEC_API int dec_insert_or_assign_host(void* table, const int64_t* keys, int64_t n,
                                      const float* values, int64_t* evicted);
DEC_API int dec_apply_gradients_host(void* table, const int64_t* keys, int64_t n,
                                     const float* grads, float lr, int64_t step, int64_t* evicted);
DEC_API int dec_accum_host(void* table, const int64_t* keys, int64_t n, const float* deltas,
                           const float* old_values, const uint8_t* exists, int64_t* evicted);
DEC_API int dec_import_host(void* table, const int64_t* keys, int64_t n, const float* values,
                            const float* slots, const int64_t* last_update,
                            const int64_t* update_count, int64_t* evicted);
DEC_API int dec_erase_host(void* table, const int64_t* keys, int64_t n);
DEC_API int dec_export_host(void* table, int64_t offset, int64_t limit, int64_t* keys,
                            float* values, float* slots, int64_t* last_update,
                            int64_t* update_count, int64_t* written);

DEC_API int dec_malloc(void** p, size_t bytes);
DEC_API int dec_free(void* p);
DEC_API int dec_memcpy(void* dst, const void* src, size_t bytes, int kind);  // cudaMemcpyKind
DEC_API int dec_synchronize(void);
// For the XLA FFI handlers: device floats to the host (synchronizing `stream`), and a device
// float buffer filled with one value (stream-ordered).
DEC_API int dec_read_f32(const float* device, int64_t n, float* host, void* stream);
DEC_API int dec_fill_f32(float* device, int64_t n, float value, void* stream);
DEC_API int dec_copy_bandwidth(size_t bytes, int iterations, double* bytes_per_s);

#ifdef __cplusplus
}
#endif

#endif  // DUALEMB_CUDA_DUALEMB_CUDA_H_
