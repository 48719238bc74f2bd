// dualemb_cuda.h — the C ABI of libdualemb_cuda.so, the GPU table (gpu_table.h).
//
// Loaded only when a GPU table is made (dualemb/core/_cuda.py with ctypes; later the core's table
// facade with dlopen): libdualemb_core.so and every Python module import on a machine with no GPU
// and no CUDA driver. Every call returns 0, or -1 with dec_last_error() naming the problem (out
// of GPU memory, no CUDA device, bad config, ...). `dec_*` take device pointers and a
// cudaStream_t (as void*); `dec_*_host` take host arrays and stage them (tests, small tools).
// Not yet run on a GPU.
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

DEC_API int dec_table_create(const char* config, void** out);
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

DEC_API int dec_find_host(void* table, const int64_t* keys, int64_t n, float* values,
                          uint8_t* exists);
DEC_API int dec_find_or_insert_host(void* table, const int64_t* keys, int64_t n, float* values,
                                    uint8_t* exists);
DEC_API int dec_insert_or_assign_host(void* table, const int64_t* keys, int64_t n,
                                      const float* values);
DEC_API int dec_apply_gradients_host(void* table, const int64_t* keys, int64_t n,
                                     const float* grads, float lr, int64_t step);
DEC_API int dec_erase_host(void* table, const int64_t* keys, int64_t n);
DEC_API int dec_export_host(void* table, int64_t offset, int64_t limit, int64_t* keys,
                            float* values, float* slots, int64_t* last_update,
                            int64_t* update_count, int64_t* written);

DEC_API int dec_malloc(void** p, size_t bytes);
DEC_API int dec_free(void* p);
DEC_API int dec_memcpy(void* dst, const void* src, size_t bytes, int kind);  // cudaMemcpyKind
DEC_API int dec_synchronize(void);
DEC_API int dec_copy_bandwidth(size_t bytes, int iterations, double* bytes_per_s);

#ifdef __cplusplus
}
#endif

#endif  // DUALEMB_CUDA_DUALEMB_CUDA_H_
