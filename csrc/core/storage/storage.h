// storage.h — the interface every table backend implements: the batched operations of the C ABI.
//
// The backend boundary. The table facade (table_facade.h) owns one Storage per table and calls
// it once per batch, so the virtual call costs one indirect jump per batch, never per key.
// Implementations:
//  * Table (csrc/core/table.h): the in-memory hash table (the default, the hot path);
//  * RedisTable (redis_table.h): rows kept in a Redis server or cluster (`"backend": "redis"`);
//  * StringValueStorage (string_value_storage.h): a layer over either for value dtype string.
// Every implementation has the same semantics (dualemb_core.h documents them): find does not
// insert, TFRA's accum rule, duplicate gradients summed in batch order, restrict's ranking,
// initial rows a pure function of (seed, key), and a failed call leaves the table unchanged.
// Those rules are written once, in semantics/, for every backend to use; table_facade.h lists
// the steps of adding a backend.
#ifndef DUALEMB_STORAGE_STORAGE_H_
#define DUALEMB_STORAGE_STORAGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dualemb {

enum class RestrictBy { kRecency = 0, kFrequency = 1, kCustom = 2 };

class Storage {
 public:
  virtual ~Storage() = default;

  virtual int64_t dim() const = 0;
  virtual int key_dtype() const = 0;
  virtual int value_dtype() const = 0;  // DE_VALUE_*
  virtual int num_slots() const = 0;
  // {"config":{...},"optimizer":{...}|null} as canonical JSON (config.h).
  virtual std::string describe() const = 0;
  virtual std::vector<std::string> slot_names() const = 0;
  virtual void set_optimizer(const std::string& spec) = 0;
  virtual void set_num_threads(int n) = 0;

  // All keys are int64 here; the C ABI widens int32 keys at the boundary. Values, deltas and
  // slots are in the table's value dtype; gradients and scores are float32.
  virtual void find(const int64_t* keys, int64_t n, void* values, uint8_t* exists) const = 0;
  virtual int64_t find_or_insert(const int64_t* keys, int64_t n, void* values,
                                 uint8_t* exists) = 0;
  virtual int64_t insert_or_assign(const int64_t* keys, int64_t n, const void* values) = 0;
  virtual int64_t accum(const int64_t* keys, int64_t n, const void* deltas,
                        const uint8_t* exists) = 0;
  // accum with the deltas still to compute: new - old where exists, else new (value_dtype.h
  // accum_deltas). This default computes them into a buffer; Table computes each as it adds.
  virtual int64_t accum_rows(const int64_t* keys, int64_t n, const void* old_values,
                             const void* new_values, const uint8_t* exists);
  virtual void erase(const int64_t* keys, int64_t n) = 0;
  virtual void clear() = 0;
  virtual int64_t size() const = 0;
  virtual void reserve(int64_t n) = 0;
  virtual int64_t apply_gradients(const int64_t* keys, int64_t n, const float* grads, float lr,
                                  int64_t step) = 0;
  virtual int64_t restrict(int64_t num_reserved, RestrictBy by, const int64_t* keys,
                           const float* scores, int64_t n) = 0;
  // `slots_given` is the slot count the caller sized `slots` for (-1: no slots buffer); a
  // mismatch with the table's throws.
  virtual int64_t export_rows(int64_t offset, int64_t limit, int64_t* keys, void* values,
                              void* slots, int slots_given, int64_t* last_update,
                              int64_t* update_count, uint8_t* stepped) const = 0;
  virtual int64_t import_rows(const int64_t* keys, int64_t n, const void* values,
                              const void* slots, int slots_given, const int64_t* last_update,
                              const int64_t* update_count, const uint8_t* stepped) = 0;
  // clear() then import_rows(): the table holds exactly the given rows after it. A backend may
  // do it in one step (Table reuses its memory); this default calls the two.
  virtual int64_t replace_rows(const int64_t* keys, int64_t n, const void* values,
                               const void* slots, int slots_given, const int64_t* last_update,
                               const int64_t* update_count, const uint8_t* stepped);
  virtual void initial_values(const int64_t* keys, int64_t n, void* values) const = 0;

  // Change tracking (change_tracking.h: ChangeMark) for delta checkpoints. A backend without it
  // keeps these defaults: changes_begin returns 0 (nothing tracked; committing 0 does nothing,
  // so full saves work everywhere) and the others throw, naming the reason.
  virtual int64_t changes_begin() { return 0; }
  virtual void changes_commit(int64_t token, const std::string& label);
  virtual std::string changes_label() const;
  virtual int64_t count_changed() const;
  // export_rows over the rows changed since the mark: scans from row position *cursor (0 at
  // first) and writes up to `limit` changed rows; *cursor moves past the last row scanned. Stable
  // while the table is not modified, like export_rows (stepped marks included).
  virtual int64_t export_changed(int64_t* cursor, int64_t limit, int64_t* keys, void* values,
                                 void* slots, int slots_given, int64_t* last_update,
                                 int64_t* update_count, uint8_t* stepped) const;
  // Evicted-row capture (change_tracking.h: EvictedCapture): mode 0 off, 1 keys and metadata,
  // 2 with the rows; take_evicted hands over (and forgets) the oldest `limit` captured rows and
  // sets *remaining to those left. The defaults refuse, naming the reason.
  virtual void capture_evicted(int mode);
  virtual int64_t take_evicted(int64_t limit, int64_t* keys, void* values, void* slots,
                               int slots_given, int64_t* last_update, int64_t* update_count,
                               int64_t* remaining);

  virtual int64_t clock() const = 0;
  virtual void set_clock(int64_t c) = 0;
  virtual int64_t evicted_total() const = 0;
  virtual size_t memory_bytes() const = 0;

  // A copy of the whole table — rows, slots, metadata, index, optimizer, clock — as of the call
  // (taken under the table's lock, so no write is half in it), independent of this one from then
  // on. What a background checkpoint writes while training goes on. Backends whose rows live
  // outside this process (Redis) keep this default, which throws std::invalid_argument.
  virtual std::shared_ptr<Storage> clone() const;
};

}  // namespace dualemb

#endif  // DUALEMB_STORAGE_STORAGE_H_
