// gpu_table.h — a dynamic embedding table resident in GPU memory (libdualemb_cuda.so).
//
// A peer of the CPU core's Storage backends (csrc/core/storage/storage.h): the same batched
// operations and semantics, on device pointers and a cudaStream_t. Keys int64; values float32
// (the trainable dtype; other value dtypes stay on the CPU tables). Per key: the row
// [value (dim) | slot 0 (dim) | ...] — the CPU layout — and metadata (last-update clock stamp,
// update count).
//
// Semantics shared with the CPU table (dualemb_core.h documents them):
//  * find does not insert; missing keys get their initial row, a pure function of (seed, key)
//    computed by the same DE_HD functions as the CPU (init_math.h), and exists = 0.
//  * apply_gradients sums duplicate ids in batch order (stable sort by key, then segment sums:
//    bucket_math.h; no float atomics), inserts missing keys with their initial row and slots,
//    then runs kernels::apply_element (optimizer_math.h) — the CPU optimizers' element math.
//  * A failed call leaves the table unchanged: every allocation a call may need (a rehash
//    included) is made before the first write, and a cudaMalloc failure throws
//    std::runtime_error("... out of GPU memory ...") with the table as it was.
//  * Capacity grows by rehash past max_load (default 0.75) of the slots.
// Every call is stream-ordered on `stream` and synchronizes it before returning where it must
// report a count (size, the number of inserted rows) — see each method.
//
// Not yet run on a GPU (prepared on a machine with nvcc 13 and no GPU). What is missing compared
// with the CPU table: accum, import, restrict / capacity eviction, value dtypes other than
// float32, and the facade adapter (README.md).
#ifndef DUALEMB_CUDA_GPU_TABLE_H_
#define DUALEMB_CUDA_GPU_TABLE_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "init_math.h"
#include "initializer.h"
#include "optimizer.h"
#include "optimizer_math.h"

namespace dualemb {
namespace gpu {

class GpuTable {
 public:
  // config: the CPU table's JSON subset {"dim", "initializer" and its members, "capacity_hint",
  // "max_load"}; an unknown member throws std::invalid_argument naming it. Allocates on the
  // current CUDA device.
  explicit GpuTable(const std::string& config);
  ~GpuTable();
  GpuTable(const GpuTable&) = delete;
  GpuTable& operator=(const GpuTable&) = delete;

  int64_t dim() const { return dim_; }
  int num_slots() const { return optimizer_ ? optimizer_->num_slots() : 0; }
  // Attaches the fused optimizer (make_optimizer's JSON spec). Only on an empty table (existing
  // rows would need slot columns).
  void set_optimizer(const std::string& spec);

  // All pointers are device pointers. values: [n, dim]; exists: [n] (may be null).
  void find(const int64_t* keys, int64_t n, float* values, uint8_t* exists, cudaStream_t stream);
  // Returns the number of keys inserted (synchronizes the stream).
  int64_t find_or_insert(const int64_t* keys, int64_t n, float* values, uint8_t* exists,
                         cudaStream_t stream);
  // Duplicate keys: the last occurrence in batch order wins, as on the CPU.
  int64_t insert_or_assign(const int64_t* keys, int64_t n, const float* values,
                           cudaStream_t stream);
  void erase(const int64_t* keys, int64_t n, cudaStream_t stream);
  void clear(cudaStream_t stream);
  int64_t size(cudaStream_t stream) const;
  // grads: [n, dim] float32. Returns the number of rows inserted for keys first seen here.
  int64_t apply_gradients(const int64_t* keys, int64_t n, const float* grads, float lr,
                          int64_t step, cudaStream_t stream);
  // Rows [offset, offset + limit) of the slot order (a page; stable while the table does not
  // change). keys [limit], values [limit, dim], slots [limit, num_slots, dim] (may be null),
  // last_update / update_count [limit] (may be null). Returns the rows written.
  int64_t export_rows(int64_t offset, int64_t limit, int64_t* keys, float* values, float* slots,
                      int64_t* last_update, int64_t* update_count, cudaStream_t stream) const;

  int64_t clock() const { return clock_; }
  int64_t capacity_slots() const { return static_cast<int64_t>(num_buckets_) * 16; }

 private:
  struct Arrays;  // the device arrays of one bucket layout
  int64_t width() const { return dim_ * (1 + num_slots()); }
  // Makes room for `extra` more rows (rehash into a bigger layout when past max_load): the new
  // layout is allocated completely before the old one is touched.
  void reserve_for(int64_t extra, cudaStream_t stream);
  // Positions of the keys' slots (-1 missing), into a device buffer of n int64.
  void locate(const int64_t* keys, int64_t n, int64_t* slots, cudaStream_t stream) const;

  int64_t dim_ = 0;
  double max_load_ = 0.75;
  uint64_t num_buckets_ = 0;
  int64_t size_ = 0;  // rows, tracked on the host (every insert/erase reports its count)
  int64_t clock_ = 0;
  Initializer init_;
  float* d_init_vector_ = nullptr;  // the vector initializer's values on the device
  kernels::InitKernel init_kernel_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Arrays> arrays_;
};

}  // namespace gpu
}  // namespace dualemb

#endif  // DUALEMB_CUDA_GPU_TABLE_H_
