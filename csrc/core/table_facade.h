// table_facade.h — one table as the C ABI sees it: every batched operation, once.
//
// The registry (registry.h) holds a TableFacade per table id. The facade owns the storage backend
// and the layers every backend gets for free, and exposes each operation of dualemb_core.h as one
// method, so an extern "C" function only checks its pointers, looks the facade up, calls one
// method and turns exceptions into error codes (c_api.cc). What the facade does:
//  * checks the key dtype of a batch against the table's, and widens int32 keys to the int64 the
//    backends take (per batch, on the caller's thread; never a per-key virtual call);
//  * string keys: routes the batch through a StringKeyTable (string_key_table.h), which maps each
//    string to an int64 id and calls the backend with the ids;
//  * string values: the backend is wrapped in a StringValueStorage (string_value_storage.h), a
//    Storage itself, so the facade calls it like any other;
//  * the checks every backend shares (num_reserved, restrict policy, step >= 1, offsets).
// Semantics inside the rows (duplicate gradients summed in batch order, restrict ranking, new-row
// initialisation, TFRA's accum rule) are in semantics/, used by every backend's own loops.
//
// Adding a storage backend (a Redis-like server, a GPU table, ...) is adding a Storage, never a
// branch here:
//  1. Implement Storage (storage/storage.h) over int64 keys, rows in the table's value dtype, one
//     virtual call per batch. Read the shared config with read_table_options + refuse_unused
//     (storage/table_options.h), adding the backend's own members to check_known.
//  2. Build every per-key rule from semantics/: NewRowValues and fill_new_slots for new rows,
//     add_gradient / sum_gradients_by_group for duplicates, RestrictScorer and RestrictCut for
//     restrict and capacity eviction, accum_action, stamped_by_this_call, bump_count,
//     imported_count, clock_after_import, check_slot_count. Then the same inputs give the same
//     bits in every backend.
//  3. A failed call leaves the table unchanged and throws naming the problem (std::bad_alloc or
//     OutOfMemory for memory, std::invalid_argument for input).
//  4. Register it in make_storage (storage/factory.cc) under its "backend" name, refusing there
//     what it cannot hold (string keys need the in-process StringKeys map beside the rows).
//  5. Test it against the in-memory table on the same inputs, bit for bit (the model:
//     tests/redis/test_redis_table.py), string keys and values included where the factory allows
//     them.
#ifndef DUALEMB_TABLE_FACADE_H_
#define DUALEMB_TABLE_FACADE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "storage/storage.h"
#include "string_key_table.h"

namespace dualemb {

// One batch of keys as the C ABI passes it: DE_KEY_INT64 (int64_t[n]), DE_KEY_INT32
// (int32_t[n]) or DE_KEY_STRING (a de_string_keys holding n strings).
struct KeyBatch {
  int32_t dtype;
  const void* data;
  int64_t n;
};

class TableFacade;

// One table's share of a multi-table call (TableFacade::*_many, de_*_many): the table, its
// batch of keys, and the buffers of the per-table call it stands for.
struct TableBatch {
  std::shared_ptr<TableFacade> table;
  int64_t id = 0;                // for messages
  KeyBatch keys{0, nullptr, 0};
  void* values = nullptr;        // find, find_or_insert: n * dim rows out
  uint8_t* exists = nullptr;     // find, find_or_insert: may be null
  const float* grads = nullptr;  // apply_gradients: n * dim
  float lr = 0.0f;               // apply_gradients
  int64_t step = 0;              // apply_gradients: 1-based update count
  int64_t evicted = 0;           // out: what the per-table call returns
};

class TableFacade {
 public:
  // Builds the backend the config names (storage/factory.h) and the layers it needs. Throws
  // std::invalid_argument naming a bad config.
  explicit TableFacade(const std::string& config);
  // A copy of the table as of the call (Storage::clone): the string-key map and the rows are
  // copied under one hold of the map's lock. Throws for a backend that cannot be copied.
  std::unique_ptr<TableFacade> clone() const;
  TableFacade(const TableFacade&) = delete;
  TableFacade& operator=(const TableFacade&) = delete;

  int64_t dim() const { return rows_->dim(); }
  int key_dtype() const { return rows_->key_dtype(); }
  int value_dtype() const { return rows_->value_dtype(); }
  int num_slots() const { return rows_->num_slots(); }
  std::string describe() const { return rows_->describe(); }
  std::vector<std::string> slot_names() const { return rows_->slot_names(); }
  void set_optimizer(const std::string& spec) { rows_->set_optimizer(spec); }
  void set_num_threads(int n);
  // Threads a batched call of this table may use (0 = all cores): the config's num_threads, or
  // what set_num_threads set last.
  int num_threads() const { return num_threads_; }

  // The operations of dualemb_core.h (de_find, ...), with its semantics; values cross as the
  // C ABI passes them (raw rows of the value dtype, or the string-value structs).
  void find(const KeyBatch& keys, void* values, uint8_t* exists) const;
  int64_t find_or_insert(const KeyBatch& keys, void* values, uint8_t* exists);
  int64_t insert_or_assign(const KeyBatch& keys, const void* values);
  int64_t accum(const KeyBatch& keys, const void* deltas, const uint8_t* exists);
  int64_t accum_rows(const KeyBatch& keys, const void* old_values, const void* new_values,
                     const uint8_t* exists);
  void erase(const KeyBatch& keys);
  void clear();
  int64_t size() const { return rows_->size(); }
  void reserve(int64_t n);
  int64_t apply_gradients(const KeyBatch& keys, const float* grads, float lr, int64_t step);
  // `policy` is DE_RESTRICT_*; keys and scores are read only for DE_RESTRICT_CUSTOM.
  int64_t restrict(int64_t num_reserved, int32_t policy, const KeyBatch& keys, const float* scores);
  // `keys` (may be null) is a buffer of `key_dtype`: int64_t/int32_t[limit] or a
  // de_string_keys_out. `num_slots` is what `slots` (may be null) was sized for.
  int64_t export_rows(int64_t offset, int64_t limit, int32_t key_dtype, void* keys, void* values,
                      void* slots, int32_t num_slots, int64_t* last_update, int64_t* update_count,
                      uint8_t* stepped) const;
  int64_t import_rows(const KeyBatch& keys, const void* values, const void* slots,
                      int32_t num_slots, const int64_t* last_update, const int64_t* update_count,
                      const uint8_t* stepped);
  // clear() + import_rows() (the backend may do it in one step: Storage::replace_rows).
  int64_t replace_rows(const KeyBatch& keys, const void* values, const void* slots,
                       int32_t num_slots, const int64_t* last_update, const int64_t* update_count,
                       const uint8_t* stepped);
  void initial_values(const KeyBatch& keys, void* values) const;

  // Change tracking (change_tracking.h) and evicted-row capture; the backend's, refused where it
  // has none. export_changed takes its keys buffer like export_rows.
  int64_t changes_begin() { return rows_->changes_begin(); }
  void changes_commit(int64_t token, const std::string& label) {
    rows_->changes_commit(token, label);
  }
  std::string changes_label() const { return rows_->changes_label(); }
  int64_t count_changed() const { return rows_->count_changed(); }
  int64_t export_changed(int64_t* cursor, int64_t limit, int32_t key_dtype, void* keys,
                         void* values, void* slots, int32_t num_slots, int64_t* last_update,
                         int64_t* update_count, uint8_t* stepped) const;
  // Refused for string keys and string values (their strings leave with the rows).
  void capture_evicted(int mode);
  int64_t take_evicted(int64_t limit, int32_t key_dtype, void* keys, void* values, void* slots,
                       int32_t num_slots, int64_t* last_update, int64_t* update_count,
                       int64_t* remaining);

  // Multi-table operations (table_facade_many.cc): each is the per-table method above on every
  // batch, with the same results bit for bit (each table's batch runs the per-table code), the
  // tables spread over the core's thread pool. Rules:
  //  * Everything that can be checked before a row changes is checked for every batch first
  //    (key dtype and count, buffers, step >= 1, a trainable value dtype and an optimizer): a
  //    bad batch throws std::invalid_argument naming its position and table id, and no table
  //    changes.
  //  * A table listed several times gets its batches one after the other, in list order (as
  //    the per-table calls would); distinct tables run in parallel, each atomically under its
  //    own lock, like concurrent per-table calls, on as many threads as the most generous
  //    table's num_threads allows (all cores if any table has 0).
  //  * A failure while running (out of memory, a shard's row limit) leaves that table
  //    unchanged, like its per-table call; other tables of the call may have been updated.
  //    The first such error is rethrown, naming the table.
  static void find_many(std::vector<TableBatch>& batches);
  static void find_or_insert_many(std::vector<TableBatch>& batches);
  static void apply_gradients_many(std::vector<TableBatch>& batches);

  int64_t clock() const { return rows_->clock(); }
  void set_clock(int64_t c) { rows_->set_clock(c); }
  int64_t evicted_total() const { return rows_->evicted_total(); }
  size_t memory_bytes() const { return rows_->memory_bytes(); }
  // The string-key map's entries and bytes; throws for a table without string keys.
  void string_key_stats(int64_t* entries, int64_t* key_bytes) const;

 private:
  TableFacade() = default;  // clone()
  // Throws std::invalid_argument unless `dtype` is the table's key dtype.
  void check_key_dtype(int32_t dtype) const;
  // Throws std::invalid_argument for a negative count or a key dtype not the table's.
  void check_batch(const KeyBatch& keys) const;
  const StringKeyTable& strings() const;
  // Throws std::invalid_argument unless the table can run apply_gradients (a trainable value
  // dtype and an optimizer attached).
  void check_trainable() const;

  std::shared_ptr<Storage> rows_;            // the backend (wrapped for string values)
  std::unique_ptr<StringKeyTable> strings_;  // string-keyed tables only
  int num_threads_ = 0;
};

}  // namespace dualemb

#endif  // DUALEMB_TABLE_FACADE_H_
