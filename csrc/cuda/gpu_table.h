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
// Capacity ("capacity", "evict_policy" in the config, as on the CPU): after every write that
// leaves more than `capacity` rows, the rows are ranked exactly as restrict ranks them
// (semantics/restrict_ranking.h: score, ties to the smaller key) and the worst are erased; the
// write returns how many. The ranking runs on the host over the rows' metadata (keys, stamps,
// counts copied back): the shared code, the same O(size) per evicting write as the CPU core; its
// scratch is allocated before the write, so a failure still leaves the table unchanged.
//
// Run on an H200 (2026-11-28: tests/gpu 51 of 52, csrc/cuda/README.md). What is missing compared
// with the CPU table: value dtypes other than float32, and the facade adapter (README.md).
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
#include "storage/storage.h"

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
  // Attaches the fused optimizer (make_optimizer's JSON spec; "" detaches), as the CPU does:
  // the same optimizer again keeps the slots, another gives every row its initial slots.
  void set_optimizer(const std::string& spec);
  // Makes room for `rows` rows in all (a rehash now rather than during later writes).
  void reserve(int64_t rows, cudaStream_t stream);

  // All pointers are device pointers unless named _host. values: [n, dim]; exists: [n] (may be
  // null). Every write that may insert returns the number of rows the capacity evicted.
  void find(const int64_t* keys, int64_t n, float* values, uint8_t* exists, cudaStream_t stream);
  // Returns the number of keys inserted (synchronizes the stream).
  int64_t find_or_insert(const int64_t* keys, int64_t n, float* values, uint8_t* exists,
                         cudaStream_t stream);
  // Duplicate keys: the last occurrence in batch order wins, as on the CPU.
  int64_t insert_or_assign(const int64_t* keys, int64_t n, const float* values,
                           cudaStream_t stream);
  // TFRA's accum rule (semantics/row_updates.h accum_action), each key's positions taken in
  // batch order as the CPU does: absent && !exists -> insert the delta as the row; present &&
  // exists -> row += delta; otherwise ignored. With `old` (may be null: accum_rows) the delta of
  // an added position is deltas - old, rounded to float32 before the add. exists: [n] uint8.
  int64_t accum(const int64_t* keys, int64_t n, const float* deltas, const float* old,
                const uint8_t* exists, cudaStream_t stream);
  // Inserts or overwrites rows with their slots [n, num_slots, dim] (may be null: new rows get
  // the optimizer's initial slots, existing ones keep theirs) and metadata (may be null: this
  // call's stamp, count 0). Duplicate keys: the last occurrence wins. The clock moves past every
  // imported stamp (semantics/row_updates.h clock_after_import).
  int64_t import_rows(const int64_t* keys, int64_t n, const float* values, const float* slots,
                      const int64_t* last_update, const int64_t* update_count, cudaStream_t stream);
  // Keeps the num_reserved best rows (semantics/restrict_ranking.h), erases the others; returns
  // how many were erased. keys_host / scores_host: the custom scores (host memory, n entries;
  // NaN refused before anything changes).
  int64_t restrict_rows(int64_t num_reserved, RestrictBy by, const int64_t* keys_host,
                        const float* scores_host, int64_t n, cudaStream_t stream);
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
  void set_clock(int64_t c) { clock_ = c; }
  int64_t evicted_total() const { return evicted_total_; }
  int64_t capacity() const { return capacity_; }
  int64_t capacity_slots() const { return static_cast<int64_t>(num_buckets_) * 16; }

 private:
  struct Arrays;   // the device arrays of one bucket layout
  class Ranking;  // restrict's scratch and steps (gpu_table.cu)
  int64_t width() const { return dim_ * (1 + num_slots()); }
  // Makes room for `extra` more rows (rehash into a bigger layout when past max_load): the new
  // layout is allocated completely before the old one is touched.
  void reserve_for(int64_t extra, cudaStream_t stream);
  // The ranking scratch a write that ends with `rows_after` rows needs for its capacity
  // eviction (null when it needs none); made before the write changes anything.
  std::unique_ptr<Ranking> eviction_for(int64_t rows_after, cudaStream_t stream) const;
  // Erases the rows past the capacity with the scratch eviction_for made; returns how many.
  int64_t evict(Ranking* ranking, cudaStream_t stream);
  // Every write's inserting half: locates the batch's distinct keys (ukeys, u_count) into
  // uslot, makes room for the missing ones that `want` selects (may be null: all), makes the
  // eviction scratch, copies the located slots to `before` (may be null) and only then claims
  // slots for them with their initial rows; *stamp is this write's clock stamp. Returns the rows
  // inserted.
  int64_t insert_distinct(const int64_t* ukeys, int64_t u_count, int64_t* uslot,
                          const uint8_t* want, int64_t* before, std::unique_ptr<Ranking>* ranking,
                          int64_t* stamp, cudaStream_t stream);
  // Positions of the keys' slots (-1 missing), into a device buffer of n int64.
  void locate(const int64_t* keys, int64_t n, int64_t* slots, cudaStream_t stream) const;

  int64_t dim_ = 0;
  double max_load_ = 0.75;
  uint64_t num_buckets_ = 0;
  int64_t size_ = 0;  // rows, tracked on the host (every insert/erase reports its count)
  int64_t tombstones_ = 0;  // erased slots not yet reused (a rehash drops them)
  int64_t capacity_ = 0;    // 0: unlimited
  RestrictBy evict_policy_ = RestrictBy::kRecency;
  int64_t evicted_total_ = 0;
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
