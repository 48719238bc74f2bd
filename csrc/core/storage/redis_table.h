// redis_table.h — a table whose rows live in Redis (standalone, Sentinel or Cluster).
//
// Layout (docs/redis.md): a table is identified by (name, model_tag, shard) and the Redis db.
// Its meta hash is de:{<name>/<model_tag>/<shard>}:meta (dim, key_dtype, storage_slice, clock,
// optimizer, opt_gen, txn, slice_tags, and while a cross-slot batch runs: pending...). Its rows
// are in `storage_slice` hashes ("slices"); field = key (8 bytes, LE), value = row (16-byte
// header + floats, see .cc); a key's slice is (mix64(key) >> 32) % storage_slice.
//  * One slot (standalone, Sentinel, Cluster with storage_slice 1, and Cluster tables made by
//    dualemb before slices were spread): slice i is de:{<id>}:b<i>, in meta's hash slot, so a
//    batch is one MULTI/EXEC: WATCH meta, read the rows, compute here, then MULTI / HSET / HDEL /
//    EXEC with a new clock (a concurrent write makes EXEC fail and the batch is redone).
//  * Spread (Cluster, storage_slice > 1): slice i is de:{<tag i>}:<id>:b<i>, the tags chosen
//    at creation so the slices fall on different masters and stored in meta. A batch spans
//    nodes: it claims the table in meta, applies each slice with its undo record in one Lua
//    script on that slice's node, and commits in meta; a batch that fails on a node is rolled
//    back (redis_spread.cc; docs/redis.md "Batches over several nodes").
#ifndef DUALEMB_STORAGE_REDIS_TABLE_H_
#define DUALEMB_STORAGE_REDIS_TABLE_H_
#ifdef DUALEMB_HAVE_HIREDIS

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../optimizer.h"
#include "../semantics/new_rows.h"
#include "redis_connection.h"
#include "redis_router.h"
#include "storage.h"

namespace dualemb {

class RedisTable final : public Storage {
 public:
  explicit RedisTable(const std::string& config);

  int64_t dim() const override { return dim_; }
  int key_dtype() const override { return key_dtype_; }
  int value_dtype() const override { return DE_VALUE_FLOAT32; }  // the only one it stores
  int num_slots() const override;
  std::string describe() const override;
  std::vector<std::string> slot_names() const override;
  void set_optimizer(const std::string& spec) override;
  void set_num_threads(int) override {}  // Redis does the work; nothing to parallelise here

  void find(const int64_t* keys, int64_t n, void* values, uint8_t* exists) const override;
  int64_t find_or_insert(const int64_t* keys, int64_t n, void* values,
                         uint8_t* exists) override;
  int64_t insert_or_assign(const int64_t* keys, int64_t n, const void* values) override;
  int64_t accum(const int64_t* keys, int64_t n, const void* deltas,
                const uint8_t* exists) override;
  void erase(const int64_t* keys, int64_t n) override;
  void clear() override;
  int64_t size() const override;
  void reserve(int64_t n) override;
  int64_t apply_gradients(const int64_t* keys, int64_t n, const float* grads, float lr,
                          int64_t step) override;
  int64_t restrict(int64_t num_reserved, RestrictBy by, const int64_t* keys, const float* scores,
                   int64_t n) override;
  int64_t export_rows(int64_t offset, int64_t limit, int64_t* keys, void* values, void* slots,
                      int slots_given, int64_t* last_update, int64_t* update_count,
                      uint8_t* stepped) const override;
  int64_t import_rows(const int64_t* keys, int64_t n, const void* values, const void* slots,
                      int slots_given, const int64_t* last_update,
                      const int64_t* update_count, const uint8_t* stepped) override;
  void initial_values(const int64_t* keys, int64_t n, void* values) const override;

  int64_t clock() const override;
  void set_clock(int64_t c) override;
  int64_t evicted_total() const override { return 0; }  // no capacity: nothing is evicted
  size_t memory_bytes() const override;

  // The rows of one batch, read from Redis and changed here before they are written back.
  struct Rows;

 private:
  // The table's meta hash as last read (clock, optimizer), with the optimizer built from it.
  struct Meta {
    int64_t clock = 0;
    uint32_t opt_gen = 0;
    std::string opt_spec;  // "" = none
  };
  // A consistent read of the slices: meta as read with them, and one reply per command.
  struct Snapshot {
    std::vector<RedisReply> owned;
    const redisReply* meta = nullptr;  // meta_read()'s reply
    std::vector<const redisReply*> replies;
  };
  // The changes a spread batch makes to one slice (fields are 8-byte keys).
  struct SliceChange {
    std::vector<std::string> set;      // field, row, field, row, ...
    std::vector<std::string> del;      // fields erased
    std::vector<std::string> old;      // field, row before the batch: what a rollback restores
    std::vector<std::string> created;  // fields the batch creates: what a rollback erases
    bool empty() const { return set.empty() && del.empty(); }
  };
  // What rolling back (or finishing) an interrupted spread batch achieved.
  struct Recovery {
    bool done = true;
    std::string failed;  // the slices and nodes that could not be reached, and why
  };
  // Runs a write: `compute(rows, stamp)` changes the rows of `keys` (read under WATCH) and may
  // add keys to erase; the result is written in one MULTI/EXEC with the clock set to `stamp`.
  // Redone when a concurrent write wins; MOVED answers redirect and redo.
  template <class Compute>
  void write_batch(const int64_t* keys, int64_t n, bool read_rows, Compute&& compute);
  // Commands on meta's slot (with one slot: every key of the table).
  std::vector<RedisReply> run(const std::vector<RedisCommand>& cmds) const;
  std::vector<RedisReply> run_slice(size_t slice, const std::vector<RedisCommand>& cmds) const;
  std::vector<RedisReply> transaction(const std::vector<RedisCommand>& cmds) const;
  // Reads `cmds` (slice index, command) as one consistent snapshot with meta.
  Snapshot snapshot(const std::vector<std::pair<size_t, RedisCommand>>& cmds) const;
  // Layout: the slices' keys from the meta hash (and at creation, the slice tags).
  void set_layout(const std::string& slice_tags);
  std::string choose_slice_tags() const;
  std::string slice_key(size_t slice, char kind) const;
  // Spread batches (redis_spread.cc). commit_spread returns false when a concurrent writer won
  // the claim (nothing written: redo); it throws when the batch failed, saying what happened.
  // The slice changes of a computed batch (reading the rows it touches but had not read);
  // false when the batch changes no row.
  bool spread_changes(const Rows& rows, std::vector<std::string>& before,
                      std::vector<uint8_t>& stored, std::vector<uint8_t>& known,
                      std::vector<SliceChange>& changes) const;
  bool commit_spread(std::vector<SliceChange>& changes, bool clear_all, RedisCommand meta_update,
                     int64_t txn);
  // Called when meta shows a pending batch: waits while its writer holds the table's lock,
  // rolls it back (or finishes a clear) when the writer is gone; throws when that is impossible.
  void settle() const;
  Recovery recover(const std::string& token, const std::vector<size_t>& slices,
                   bool clear) const;
  std::vector<RedisCommand> spread_script(const char* script, size_t slice,
                                          const std::string& token) const;
  int64_t lease_ms() const;
  void refresh_meta(const redisReply* clock, const redisReply* gen, const redisReply* spec) const;
  RedisCommand meta_read() const;
  void init_meta();
  int width() const { return static_cast<int>(dim_ * (1 + num_slots_locked())); }
  int num_slots_locked() const { return optimizer_ ? optimizer_->num_slots() : 0; }
  // Every key of bucket b, sorted (HSCAN), for paged export.
  std::vector<int64_t> bucket_keys(int b) const;

  int64_t dim_;
  int key_dtype_;
  NewRowValues new_values_;
  std::string config_json_;
  std::string ident_;   // name/tag/shard, escaped
  std::string prefix_;  // de:{name/tag/shard}
  int64_t slices_;      // storage_slice
  std::vector<std::string> buckets_;  // slice i's row hash
  std::vector<std::string> bases_;    // slice i's key prefix (its hash tag)
  std::vector<int> slice_slot_;       // slice i's Cluster hash slot
  bool spread_ = false;               // slices outside meta's slot: spread batches
  std::string meta_key_, lock_key_;
  int meta_slot_ = 0;
  int64_t keys_sending_size_;
  int64_t timeouts_ms_ = 0;  // connect + command timeout: bounds one round trip

  mutable std::mutex mu_;  // one connection per node: calls take turns
  std::unique_ptr<RedisRouter> router_;  // const calls use it too
  mutable Meta meta_;
  mutable std::unique_ptr<Optimizer> optimizer_;
  // Export's snapshot: per bucket its sorted keys, valid while the clock stays export_clock_.
  mutable int64_t export_clock_ = -1;
  mutable std::map<int, std::vector<int64_t>> export_keys_;
};

}  // namespace dualemb

#endif  // DUALEMB_HAVE_HIREDIS
#endif  // DUALEMB_STORAGE_REDIS_TABLE_H_
