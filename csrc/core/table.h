// table.h — one dynamic embedding table: key -> [value | optimizer slots] + metadata.
//
// The table is split into kNumShards shards by key hash. One reader-writer lock guards the whole
// table: reads share it, writes take it exclusively. Inside one batched call, reads split the
// batch into ranges and writes split it by shard, so both run on several cores without finer
// locking, and a batch is applied atomically with respect to other callers.
#ifndef DUALEMB_TABLE_H_
#define DUALEMB_TABLE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <functional>
#include <vector>

#include "change_tracking.h"
#include "copy_members.h"
#include "hash.h"
#include "key_index.h"
#include "optimizer.h"
#include "row_store.h"
#include "semantics/duplicates.h"
#include "semantics/new_rows.h"
#include "semantics/restrict_ranking.h"
#include "storage/storage.h"

namespace dualemb {

// The in-memory backend of Storage (storage/storage.h), and the default.
class Table final : public Storage {
 public:
  // Throws std::invalid_argument for a bad config (names the problem).
  explicit Table(const std::string& config);

  int64_t dim() const override { return dim_; }
  int key_dtype() const override { return key_dtype_; }
  int value_dtype() const override { return value_dtype_; }
  int num_slots() const override;
  // {"config":{...},"optimizer":{...}|null} as canonical JSON (config.h).
  std::string describe() const override;
  std::vector<std::string> slot_names() const override;
  void set_optimizer(const std::string& spec) override;
  void set_num_threads(int n) override { num_threads_ = n; }

  // All keys are int64 here; the C ABI widens int32 keys at the boundary.
  // Values, deltas and slots are in the table's value dtype; gradients are float32.
  void find(const int64_t* keys, int64_t n, void* values, uint8_t* exists) const override;
  int64_t find_or_insert(const int64_t* keys, int64_t n, void* values,
                         uint8_t* exists) override;
  int64_t insert_or_assign(const int64_t* keys, int64_t n, const void* values) override;
  int64_t accum(const int64_t* keys, int64_t n, const void* deltas,
                const uint8_t* exists) override;
  int64_t accum_rows(const int64_t* keys, int64_t n, const void* old_values,
                     const void* new_values, const uint8_t* exists) override;
  void erase(const int64_t* keys, int64_t n) override;
  void clear() override;
  int64_t size() const override;
  void reserve(int64_t n) override;
  int64_t apply_gradients(const int64_t* keys, int64_t n, const float* grads, float lr,
                          int64_t step) override;
  int64_t restrict(int64_t num_reserved, RestrictBy by, const int64_t* keys, const float* scores,
                   int64_t n) override;
  // `slots_given` is the slot count the caller sized `slots` for (-1: no slots buffer); a
  // mismatch with the table's (checked under the lock) throws.
  int64_t export_rows(int64_t offset, int64_t limit, int64_t* keys, void* values, void* slots,
                      int slots_given, int64_t* last_update, int64_t* update_count,
                      uint8_t* stepped) const override;
  int64_t import_rows(const int64_t* keys, int64_t n, const void* values, const void* slots,
                      int slots_given, const int64_t* last_update,
                      const int64_t* update_count, const uint8_t* stepped) override;
  int64_t replace_rows(const int64_t* keys, int64_t n, const void* values, const void* slots,
                       int slots_given, const int64_t* last_update, const int64_t* update_count,
                       const uint8_t* stepped) override;
  void initial_values(const int64_t* keys, int64_t n, void* values) const override;

  // Change tracking and evicted-row capture (change_tracking.h, storage.h).
  int64_t changes_begin() override;
  void changes_commit(int64_t token, const std::string& label) override;
  std::string changes_label() const override;
  int64_t count_changed() const override;
  int64_t export_changed(int64_t* cursor, int64_t limit, int64_t* keys, void* values, void* slots,
                         int slots_given, int64_t* last_update, int64_t* update_count,
                         uint8_t* stepped) const override;
  void capture_evicted(int mode) override;
  int64_t take_evicted(int64_t limit, int64_t* keys, void* values, void* slots, int slots_given,
                       int64_t* last_update, int64_t* update_count, int64_t* remaining) override;

  int64_t clock() const override { return clock_.load(); }
  void set_clock(int64_t c) override { clock_.store(c); }
  int64_t evicted_total() const override { return evicted_total_.load(); }
  size_t memory_bytes() const override;
  // A copy of the whole table (rows, slots, metadata, index, optimizer, clock), taken under the
  // table's lock: the state as of the call. Throws std::bad_alloc (OutOfMemory), unchanged.
  std::shared_ptr<Storage> clone() const override;

 private:
  // The copy clone() makes: every member by its own copy (copy_members.h), so members added
  // later are copied too. Only clone() calls it, with the source's lock held.
  Table(const Table&) = default;
  Table& operator=(const Table&) = delete;

  struct Shard {
    Shard(int64_t width, size_t elem_size, int64_t chunk_shift)
        : rows(width, elem_size, chunk_shift) {}
    KeyIndex index;
    RowStore rows;
  };
  // Batch positions grouped by shard, in batch order within each shard.
  // The buffers are left uninitialised (group_by_shard writes every element): zero-filling
  // them cost a pass of 16 bytes per key over memory about to be written anyway.
  struct Grouping {
    std::unique_ptr<int64_t[]> order;  // positions, shard-major
    int64_t start[kNumShards + 1];
    std::unique_ptr<uint64_t[]> hashes;  // per position
  };
  void group_by_shard(const int64_t* keys, int64_t n, Grouping* g) const;
  // Runs fn(shard index) for every shard that has keys in g, in parallel.
  template <class Fn>
  void for_each_shard(const Grouping& g, Fn&& fn);
  // Runs fn(shard index, shard, batch position i, hash, row or -1) for every key, shards in
  // parallel, batch order within a shard, with prefetching. fn may insert rows, not erase them.
  // after_shard(shard index) runs on the same thread once a shard's keys are done, while its
  // rows are still in cache.
  template <class Fn, class After>
  void for_each_key(const Grouping& g, const int64_t* keys, Fn&& fn, After&& after_shard);
  template <class Fn>
  void for_each_key(const Grouping& g, const int64_t* keys, Fn&& fn) {
    for_each_key(g, keys, fn, [](int) {});
  }
  // A write that may insert the batch's keys, under the exclusive lock: allocates all it may
  // need first (prepare_inserts), runs fn(shard, batch position i, hash, row or -1, stamp) for
  // every key as for_each_key does, then evicts past the capacity; returns how many it evicted.
  template <class Fn>
  int64_t write_each_key(const int64_t* keys, int64_t n, Fn&& fn);
  // Marks row meta `m` written at `stamp` by a plain write (not an optimizer step).
  void mark_written(RowMeta& m, int64_t stamp) const;

  // import_rows' writes, under the exclusive lock, after prepare_inserts(g, n).
  int64_t import_grouped(const Grouping& g, const int64_t* keys, int64_t n, const void* values,
                         const void* slots, const int64_t* last_update,
                         const int64_t* update_count, const uint8_t* stepped);
  // Gives shard i room for rows_after[i] rows, all or nothing.
  void grow_shards(const int64_t* rows_after);
  // Allocates all a write of the grouped keys may need (see table.cc), before it changes rows.
  void prepare_inserts(const Grouping& g, int64_t n_rows_for_eviction);
  // Inserts a new row for key (hash h) in shard s with its initial value and slots.
  int64_t insert_new(Shard& s, int64_t key, uint64_t h, int64_t stamp);
  void init_slots(unsigned char* row) const {
    fill_new_slots(row, dim_, value_dtype_, optimizer_.get());
  }
  // Writes key's initial row (dim elements of the value dtype) to out.
  void fill_initial(uint64_t key, unsigned char* out) const { new_values_.fill(key, out); }
  // Throws std::invalid_argument if this table's value dtype cannot be trained.
  void require_trainable() const;
  size_t row_bytes() const { return value_size_ * static_cast<size_t>(dim_); }
  void erase_row(Shard& s, int64_t row);
  void rebuild_rows(int64_t new_width);
  int64_t accum_impl(const int64_t* keys, int64_t n, const void* rows_in, const void* old_in,
                     const uint8_t* exists);
  // Evicts by the configured policy down to the capacity; caller holds the lock exclusively.
  int64_t enforce_capacity();
  int64_t restrict_locked(int64_t num_reserved, RestrictBy by, const int64_t* keys,
                          const float* scores, int64_t n);
  int64_t size_locked() const;
  int threads() const { return num_threads_; }
  int64_t chunk_shift_for(int64_t width) const;
  int64_t width() const { return dim_ * (1 + num_slots()); }

  int64_t dim_;
  int key_dtype_;
  int value_dtype_;    // DE_VALUE_*
  size_t value_size_;  // bytes per element
  NewRowValues new_values_;
  std::string config_json_;  // canonical JSON of the config as given, defaults filled in
  int64_t capacity_ = 0;
  RestrictBy evict_policy_ = RestrictBy::kRecency;
  int num_threads_ = 0;
  // Immutable once made (set_optimizer replaces it), so a clone shares it.
  std::shared_ptr<const Optimizer> optimizer_;
  ParallelCopiedPtrs<Shard> shards_;  // a clone copies the shards in parallel
  mutable FreshSharedMutex mu_;
  CopiedAtomic<int64_t> clock_{0};
  CopiedAtomic<int64_t> evicted_total_{0};
  std::vector<Ranked> evict_scratch_;  // restrict's ranking buffer; guarded by mu_ (exclusive)
  // apply_gradients' work buffers, one per shard, kept between calls while they are small
  // (table.cc: kKeptStepScratchBytes): allocating and freeing them (4 per shard) on every call
  // showed in the step's profile (docs/benchmarks.md, "Measurements behind the code").
  // Guarded by mu_ (exclusive); a clone starts without them.
  struct StepDistinct {
    int64_t row;
    const float* grad;  // the key's gradient in the batch (read in place while it does not repeat)
    int64_t sum_at;     // offset of its sum in `summed`, or -1
  };
  struct StepScratch {
    DedupMap dedup;
    std::unique_ptr<StepDistinct[]> distinct;  // one entry per distinct key, `count` in use
    int64_t distinct_cap = 0;
    int64_t count = 0;
    std::vector<float> summed;   // sums of repeated keys' gradients
    std::vector<float> widened;  // float16/bfloat16 tables: one row and its slots as float32
    bool ready = false;          // dedup initialised for this batch
    size_t bytes() const {
      return dedup.bytes() + static_cast<size_t>(distinct_cap) * sizeof(StepDistinct) +
             (summed.capacity() + widened.capacity()) * sizeof(float);
    }
  };
  // Scratch, not state: a copy (clone) starts empty.
  struct StepScratches : std::vector<StepScratch> {
    StepScratches() = default;
    StepScratches(const StepScratches&) : std::vector<StepScratch>() {}
    StepScratches& operator=(const StepScratches&) = delete;
  };
  StepScratches step_scratch_;
  ChangeMark changes_;        // guarded by mu_; write_gen is stamped by every write
  EvictedCapture evicted_;    // guarded by mu_ (exclusive)
};

}  // namespace dualemb

#endif  // DUALEMB_TABLE_H_
