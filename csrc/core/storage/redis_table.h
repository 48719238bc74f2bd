// redis_table.h — a table whose rows live in Redis (standalone, Sentinel or Cluster).
//
// Layout (docs/redis.md): a table is identified by (name, model_tag, shard) and the Redis db;
// its Redis keys share one Cluster hash tag, so a table lives in one slot and every batch is one
// MULTI/EXEC transaction on one node:
//   de:{<name>/<model_tag>/<shard>}:meta   hash: dim, key_dtype, clock, optimizer, opt_gen
//   de:{<name>/<model_tag>/<shard>}:b<i>   hash, i < storage_slice: field = key (8 bytes, LE),
//                                          value = row (16-byte header + floats, see .cc)
// Writes are optimistic transactions: WATCH meta, read the rows, compute here (the same
// initializer and optimizer code as the in-memory table), then MULTI / HSET / HDEL / EXEC; every
// write bumps meta's clock, so a concurrent write makes EXEC fail and the batch is redone.
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
                      int slots_given, int64_t* last_update,
                      int64_t* update_count) const override;
  int64_t import_rows(const int64_t* keys, int64_t n, const void* values, const void* slots,
                      int slots_given, const int64_t* last_update,
                      const int64_t* update_count) override;
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
  // Runs a write: `compute(rows, stamp)` changes the rows of `keys` (read under WATCH) and may
  // add keys to erase; the result is written in one MULTI/EXEC with the clock set to `stamp`.
  // Redone when a concurrent write wins; MOVED answers redirect and redo.
  template <class Compute>
  void write_batch(const int64_t* keys, int64_t n, bool read_rows, Compute&& compute);
  std::vector<RedisReply> run(const std::vector<RedisCommand>& cmds) const;
  std::vector<RedisReply> transaction(const std::vector<RedisCommand>& cmds) const;
  void refresh_meta(const redisReply* clock, const redisReply* gen, const redisReply* spec) const;
  RedisCommand meta_read() const;
  void init_meta();
  std::string bucket_key(uint64_t hash) const;
  int width() const { return static_cast<int>(dim_ * (1 + num_slots_locked())); }
  int num_slots_locked() const { return optimizer_ ? optimizer_->num_slots() : 0; }
  // Every key of bucket b, sorted (HSCAN), for paged export.
  std::vector<int64_t> bucket_keys(int b) const;

  int64_t dim_;
  int key_dtype_;
  NewRowValues new_values_;
  std::string config_json_;
  std::string prefix_;  // de:{name/tag/shard}
  std::vector<std::string> buckets_;
  std::string meta_key_;
  int64_t keys_sending_size_;

  mutable std::mutex mu_;  // one connection per table: calls take turns
  std::unique_ptr<RedisConnection> conn_;  // const calls use it too
  mutable Meta meta_;
  mutable std::unique_ptr<Optimizer> optimizer_;
  // Export's snapshot: per bucket its sorted keys, valid while the clock stays export_clock_.
  mutable int64_t export_clock_ = -1;
  mutable std::map<int, std::vector<int64_t>> export_keys_;
};

}  // namespace dualemb

#endif  // DUALEMB_HAVE_HIREDIS
#endif  // DUALEMB_STORAGE_REDIS_TABLE_H_
