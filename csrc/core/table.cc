#include "table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "config.h"
#include "hash.h"
#include "memory_block.h"
#include "row_bytes.h"
#include "thread_pool.h"
#include "value_dtype.h"
#include "semantics/duplicates.h"
#include "semantics/row_updates.h"
#include "storage/table_options.h"

namespace dualemb {
namespace {

constexpr int64_t kReadTask = 4096;      // keys per task of a parallel read
// apply_gradients keeps its per-shard work buffers between calls up to this many bytes per table
// (a 4,096-key batch at dim 64 needs ~1.3 MiB, most of it reserved for repeated keys' sums).
constexpr size_t kKeptStepScratchBytes = size_t{4} << 20;
// A batch runs on the calling thread alone unless keys x (dim + 16) reaches this: waking the
// pool's helpers (once per parallel phase; apply_gradients has two) costs more than a smaller
// batch wins back (the crossovers: docs/benchmarks.md, "Measurements behind the code"). Inside a
// framework (TF's inter-op pool running several tables' ops at once) one thread per small op is
// also what keeps the cores for the other ops. The +16 stands for the per-key hashing and
// probing.
constexpr int64_t kParallelWork = int64_t{1} << 18;

inline bool worth_parallel(int64_t n, int64_t floats_per_key) {
  return n * (floats_per_key + 16) >= kParallelWork;
}

// The caller's buffers of an export (each may be null: not wanted); put() writes one row.
struct ExportOut {
  int64_t* keys;
  unsigned char* values;
  unsigned char* slots;  // null, or ns slots per row
  int64_t* last_update;
  int64_t* update_count;
  uint8_t* stepped;
  size_t rb;   // bytes of one row's values (a slot has as many)
  int64_t ns;  // slots per row

  void put(int64_t i, const unsigned char* row, const RowMeta& m) const {
    if (keys) keys[i] = m.key;
    if (values) std::memcpy(values + i * rb, row, rb);
    if (slots && ns) std::memcpy(slots + i * ns * rb, row + rb, rb * ns);
    if (last_update) last_update[i] = m.last_update;
    if (update_count) update_count[i] = m.count;
    if (stepped) stepped[i] = m.stepped() ? 1 : 0;
  }
};

}  // namespace

Table::Table(const std::string& config_text) {
  Config c = Config::parse(config_text, "table config");
  c.check_known(table_option_names(), "table config");
  // Given explicitly, the backend is echoed by describe(); absent, describe() leaves it out.
  if (c.has("backend") && c.get_string("backend", "memory") != "memory")
    throw std::invalid_argument("table config: the in-memory table got backend '" +
                                c.get_string("backend", "") + "'");
  TableOptions o = read_table_options(c);
  dim_ = o.dim;
  key_dtype_ = o.key_dtype;
  value_dtype_ = o.value_dtype;
  value_size_ = o.value_size;
  new_values_ = NewRowValues(o);
  capacity_ = o.capacity;
  evict_policy_ = o.evict_policy;
  num_threads_ = o.num_threads;
  refuse_unused(c);
  config_json_ = c.echo();  // every member read above, as given or defaulted
  int64_t shift = chunk_shift_for(dim_);
  for (int i = 0; i < kNumShards; ++i) shards_.emplace_back(new Shard(dim_, value_size_, shift));
}

void Table::require_trainable() const {
  if (!value_dtype_trainable(value_dtype_))
    throw std::invalid_argument(std::string("a table of value dtype ") +
                                value_dtype_name(value_dtype_) +
                                " cannot be trained; training needs float32, float16 or "
                                "bfloat16 values");
}

int64_t Table::chunk_shift_for(int64_t width) const {
  // About 256 KiB of values per chunk, between 16 and 4096 rows.
  int64_t bytes = width * static_cast<int64_t>(value_size_) + static_cast<int64_t>(sizeof(RowMeta)),
          shift = 4;
  while (shift < 12 && (bytes << (shift + 1)) <= (256 << 10)) ++shift;
  return shift;
}

int Table::num_slots() const { return optimizer_ ? optimizer_->num_slots() : 0; }

std::string Table::describe() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  // Canonical JSON (config.h): the members are already in sorted order, and both parts are
  // canonical texts themselves.
  return "{\"config\":" + config_json_ + ",\"optimizer\":" +
         (optimizer_ ? optimizer_->spec() : std::string("null")) + "}";
}

std::vector<std::string> Table::slot_names() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return optimizer_ ? optimizer_->slot_names() : std::vector<std::string>{};
}

void Table::set_optimizer(const std::string& spec) {
  std::shared_ptr<const Optimizer> opt;
  if (!spec.empty()) {
    require_trainable();
    opt = make_optimizer(spec);  // throws before anything changes
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  int old_slots = num_slots();
  int new_slots = opt ? opt->num_slots() : 0;
  std::shared_ptr<const Optimizer> old = std::move(optimizer_);
  optimizer_ = std::move(opt);
  // Same optimizer, numbers compared by value: {"epsilon": 0} equals {"epsilon": 0.0}.
  bool same = old && optimizer_ && same_optimizer_state(old->spec(), optimizer_->spec());
  if (old_slots != new_slots && evicted_.mode == 2 && evicted_.size() > 0) {
    optimizer_ = std::move(old);
    throw std::invalid_argument(
        "set_optimizer: captured evicted rows (with their slots) are waiting; take them "
        "(take_evicted) before changing the slot count");
  }
  if (old_slots != new_slots || !same) {
    try {
      rebuild_rows(dim_ * (1 + new_slots));
    } catch (...) {
      optimizer_ = std::move(old);
      throw;
    }
  }
  ++clock_;  // a change of optimizer is a write (checkpoint saves detect it)
}

void Table::rebuild_rows(int64_t new_width) {
  // Builds every shard's new storage first, so an allocation failure changes nothing.
  int64_t shift = chunk_shift_for(new_width);
  long double need = 0;
  for (auto& sp : shards_)
    need += RowStore(new_width, value_size_, shift).bytes_for(sp->rows.size());
  check_request("adding the optimizer's slot columns", need);
  std::vector<RowStore> fresh;
  fresh.reserve(shards_.size());
  for (auto& sp : shards_) {
    RowStore& old = sp->rows;
    RowStore r(new_width, value_size_, shift);
    r.reserve(old.size());
    for (int64_t i = 0; i < old.size(); ++i) {
      int64_t j = r.push_back();
      unsigned char* dst = r.row(j);
      std::memcpy(dst, old.row(i), row_bytes());
      init_slots(dst);
      r.meta(j) = old.meta(i);
      r.meta(j).set_stepped(false);  // fresh slots: the new optimizer has stepped no row yet
    }
    fresh.push_back(std::move(r));
  }
  for (size_t s = 0; s < shards_.size(); ++s) shards_[s]->rows = std::move(fresh[s]);
  // Every row's slots were re-initialised: every row changed. (Capture rows take the new width.)
  for (auto& sp : shards_)
    for (int64_t i = 0; i < sp->rows.size(); ++i)
      set_change_gen(sp->rows.meta(i), changes_.write_gen);
  if (evicted_.mode == 2) evicted_.row_bytes = new_width * static_cast<int64_t>(value_size_);
}

void Table::group_by_shard(const int64_t* keys, int64_t n, Grouping* g) const {
  g->hashes.reset(new uint64_t[static_cast<size_t>(n)]);
  g->order.reset(new int64_t[static_cast<size_t>(n)]);
  int64_t counts[kNumShards] = {0};
  for (int64_t i = 0; i < n; ++i) {
    uint64_t h = hash_key(keys[i]);
    g->hashes[i] = h;
    ++counts[shard_of(h)];
  }
  int64_t pos[kNumShards];
  g->start[0] = 0;
  for (int s = 0; s < kNumShards; ++s) {
    pos[s] = g->start[s];
    g->start[s + 1] = g->start[s] + counts[s];
  }
  for (int64_t i = 0; i < n; ++i) g->order[pos[shard_of(g->hashes[i])]++] = i;
}

template <class Fn>
void Table::for_each_shard(const Grouping& g, Fn&& fn) {
  int64_t total = g.start[kNumShards];
  std::function<void(int64_t)> task = [&](int64_t s) {
    if (g.start[s + 1] > g.start[s]) fn(static_cast<int>(s));
  };
  parallel_for(kNumShards, worth_parallel(total, dim_) ? threads() : 1, task);
}

template <class Fn, class After>
void Table::for_each_key(const Grouping& g, const int64_t* keys, Fn&& fn, After&& after_shard) {
  // Blocks of kBlock keys: prefetch their index slots, probe and prefetch their rows, then run
  // fn. A key missing at probe time is probed again right before fn, since an earlier key of
  // the same block may have inserted it.
  constexpr int kBlock = 16;
  for_each_shard(g, [&](int si) {
    Shard& s = *shards_[si];
    int64_t r[kBlock];
    const int64_t end = g.start[si + 1];
    for (int64_t b = g.start[si]; b < end; b += kBlock) {
      const int m = static_cast<int>(std::min<int64_t>(kBlock, end - b));
      for (int j = 0; j < m; ++j) s.index.prefetch(g.hashes[g.order[b + j]]);
      for (int j = 0; j < m; ++j) {
        const int64_t i = g.order[b + j];
        r[j] = s.index.find(keys[i], g.hashes[i]);
        if (r[j] >= 0) s.rows.prefetch(r[j]);
      }
      for (int j = 0; j < m; ++j) {
        const int64_t i = g.order[b + j];
        fn(si, s, i, g.hashes[i], r[j] >= 0 ? r[j] : s.index.find(keys[i], g.hashes[i]));
      }
    }
    after_shard(si);
  });
}

void Table::grow_shards(const int64_t* rows_after) {
  // Phase 1 allocates every shard's larger index and missing chunks (shards in parallel);
  // phase 2 adopts them and cannot fail. A std::bad_alloc in phase 1 frees what it allocated
  // and leaves every shard as it was.
  struct Growth {
    std::unique_ptr<KeyIndex> index;
    std::vector<Block> chunks;
  };
  bool any = false;
  for (int si = 0; si < kNumShards && !any; ++si) {
    const Shard& s = *shards_[si];
    any = s.index.needs_growth(rows_after[si]) || rows_after[si] > s.rows.capacity();
  }
  if (!any) return;
  std::vector<Growth> plan(kNumShards);
  parallel_for(kNumShards, threads(), [&](int64_t si) {
    Shard& s = *shards_[si];
    if (s.index.needs_growth(rows_after[si]))
      plan[si].index.reset(new KeyIndex(s.index.grown_copy(rows_after[si])));
    plan[si].chunks = s.rows.chunks_for(rows_after[si]);
  });
  for (int si = 0; si < kNumShards; ++si) {
    Shard& s = *shards_[si];
    if (plan[si].index) s.index = std::move(*plan[si].index);
    s.rows.adopt(plan[si].chunks);
  }
}

void Table::prepare_inserts(const Grouping& g, int64_t n_rows_for_eviction) {
  // Everything a write may allocate is allocated here, before the first row changes: index and
  // row room for every key of the batch being new, and the eviction ranking buffer. A
  // std::bad_alloc from here leaves the table as it was.
  int64_t after[kNumShards];
  for (int si = 0; si < kNumShards; ++si) {
    after[si] = shards_[si]->rows.size() + (g.start[si + 1] - g.start[si]);
    if (after[si] >= static_cast<int64_t>(KeyIndex::kEmpty))
      throw std::length_error("a shard of this table would pass its limit of 2^32 - 1 rows");
  }
  const int64_t size = size_locked();
  if (capacity_ > 0 && size + n_rows_for_eviction > capacity_)
    evict_scratch_.reserve(size + n_rows_for_eviction);
  grow_shards(after);
}

int64_t Table::insert_new(Shard& s, int64_t key, uint64_t h, int64_t stamp) {
  // Index room first, then the row, then the index entry: whichever allocation fails, no row
  // is left without its index entry. (Batched writes have made room in prepare_inserts.)
  const int64_t after = s.rows.size() + 1;
  if (after >= static_cast<int64_t>(KeyIndex::kEmpty))
    throw std::length_error("a shard of this table is full (2^32 - 1 rows)");
  s.index.grow_to(after);
  int64_t r = s.rows.push_back();
  s.index.insert(key, h, static_cast<uint32_t>(r), r + 1);
  s.rows.meta(r).key = key;
  s.rows.meta(r).last_update = stamp;
  s.rows.meta(r).count = 0;
  s.rows.meta(r).unused = 0;  // not stepped (bit 31), change generation set below
  set_change_gen(s.rows.meta(r), changes_.write_gen);
  init_slots(s.rows.row(r));
  return r;
}

void Table::erase_row(Shard& s, int64_t row) {
  int64_t key = s.rows.meta(row).key;
  s.index.erase(key, hash_key(key));
  int64_t last = s.rows.size() - 1;
  if (row != last) {
    int64_t moved = s.rows.meta(last).key;
    s.index.update(moved, hash_key(moved), static_cast<uint32_t>(row));
  }
  s.rows.move_last_into(row);
}

void Table::find(const int64_t* keys, int64_t n, void* values_out, uint8_t* exists) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  // Blocks of kBlock keys in three passes (hash + prefetch the index slot, probe + prefetch
  // the row's lines, copy), so up to kBlock cache misses are in flight at once instead of one.
  // A small row's size is a compile-time constant (row_bytes.h): its copy is a few inline moves
  // instead of a memcpy call.
  constexpr int kBlock = 16;
  unsigned char* values = static_cast<unsigned char*>(values_out);
  with_row_bytes(row_bytes(), [&](auto rb) {
    auto range = [&](int64_t begin, int64_t end) {
      // Locals, not the captured references: the row copies store through char pointers, which
      // may alias anything, so the compiler would reload captured pointers after every copy.
      unsigned char* const out_rows = values;
      uint8_t* const out_exists = exists;
      uint64_t h[kBlock];
      const Shard* sh[kBlock];
      const unsigned char* row[kBlock];  // null: the key is missing
      for (int64_t b = begin; b < end; b += kBlock) {
        const int m = static_cast<int>(std::min<int64_t>(kBlock, end - b));
        for (int j = 0; j < m; ++j) {
          h[j] = hash_key(keys[b + j]);
          sh[j] = shards_[shard_of(h[j])].get();
          sh[j]->index.prefetch(h[j]);
        }
        for (int j = 0; j < m; ++j) {
          const int64_t r = sh[j]->index.find(keys[b + j], h[j]);
          row[j] = r >= 0 ? sh[j]->rows.row(r) : nullptr;
          if (row[j]) prefetch_bytes(row[j], rb);
        }
        for (int j = 0; j < m; ++j) {
          unsigned char* out = out_rows + (b + j) * rb;
          if (row[j]) {
            std::memcpy(out, row[j], rb);
          } else {
            fill_initial(static_cast<uint64_t>(keys[b + j]), out);
          }
          if (out_exists) out_exists[b + j] = row[j] != nullptr;
        }
      }
    };
    if (!worth_parallel(n, dim_) || threads() == 1) {
      range(0, n);
      return;
    }
    int64_t tasks = (n + kReadTask - 1) / kReadTask;
    parallel_for(tasks, threads(),
                 [&](int64_t t) { range(t * kReadTask, std::min(n, (t + 1) * kReadTask)); });
  });
}

void Table::initial_values(const int64_t* keys, int64_t n, void* values) const {
  new_values_.fill(keys, n, values);
}

template <class Fn>
int64_t Table::write_each_key(const int64_t* keys, int64_t n, Fn&& fn) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  Grouping g;
  group_by_shard(keys, n, &g);
  prepare_inserts(g, n);
  const int64_t stamp = ++clock_;
  for_each_key(g, keys,
               [&](int, Shard& s, int64_t i, uint64_t h, int64_t r) { fn(s, i, h, r, stamp); });
  return enforce_capacity();
}

void Table::mark_written(RowMeta& m, int64_t stamp) const {
  m.last_update = stamp;
  set_change_gen(m, changes_.write_gen);
  bump_count(m.count);
}

int64_t Table::find_or_insert(const int64_t* keys, int64_t n, void* values_out, uint8_t* exists) {
  unsigned char* values = static_cast<unsigned char*>(values_out);
  const size_t rb = row_bytes();
  return write_each_key(keys, n, [&](Shard& s, int64_t i, uint64_t h, int64_t r, int64_t stamp) {
    if (exists) exists[i] = r >= 0 && !stamped_by_this_call(s.rows.meta(r).last_update, stamp);
    if (r < 0) {
      r = insert_new(s, keys[i], h, stamp);
      fill_initial(static_cast<uint64_t>(keys[i]), s.rows.row(r));
    }
    std::memcpy(values + i * rb, s.rows.row(r), rb);
  });
}

int64_t Table::insert_or_assign(const int64_t* keys, int64_t n, const void* values_in) {
  const unsigned char* values = static_cast<const unsigned char*>(values_in);
  // A small row's size as a compile-time constant: its copy is inline moves (row_bytes.h).
  return with_row_bytes(row_bytes(), [&](auto rb) {
    return write_each_key(keys, n,
                          [&](Shard& s, int64_t i, uint64_t h, int64_t r, int64_t stamp) {
                            if (r < 0) r = insert_new(s, keys[i], h, stamp);
                            RowMeta& m = s.rows.meta(r);  // the row's address, computed once
                            std::memcpy(RowStore::elements(m), values + i * rb, rb);
                            mark_written(m, stamp);
                          });
  });
}

int64_t Table::accum(const int64_t* keys, int64_t n, const void* deltas_in,
                     const uint8_t* exists) {
  return accum_impl(keys, n, deltas_in, nullptr, exists);
}

int64_t Table::accum_rows(const int64_t* keys, int64_t n, const void* old_values,
                          const void* new_values, const uint8_t* exists) {
  return accum_impl(keys, n, new_values, old_values, exists);
}

// With `old_in`, `rows_in` holds the new rows and a present key gets += (new - old), each
// difference rounded to the dtype first: the same bits as accum of precomputed deltas, in one
// pass and without a buffer of deltas.
int64_t Table::accum_impl(const int64_t* keys, int64_t n, const void* rows_in,
                          const void* old_in, const uint8_t* exists) {
  const unsigned char* rows = static_cast<const unsigned char*>(rows_in);
  const unsigned char* old = static_cast<const unsigned char*>(old_in);
  const size_t rb = row_bytes();
  return write_each_key(keys, n, [&](Shard& s, int64_t i, uint64_t h, int64_t r, int64_t stamp) {
    const unsigned char* d = rows + i * rb;
    switch (accum_action(r >= 0, exists[i])) {
      case AccumAction::kInsert:
        r = insert_new(s, keys[i], h, stamp);
        std::memcpy(s.rows.row(r), d, rb);
        break;
      case AccumAction::kAdd:
        if (old)
          add_difference(value_dtype_, s.rows.row(r), d, old + i * rb, dim_);
        else
          add_values(value_dtype_, s.rows.row(r), d, dim_);
        break;
      case AccumAction::kIgnore:
        return;
    }
    mark_written(s.rows.meta(r), stamp);
  });
}

void Table::erase(const int64_t* keys, int64_t n) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  ++clock_;
  Grouping g;
  group_by_shard(keys, n, &g);
  for_each_shard(g, [&](int si) {
    Shard& s = *shards_[si];
    for (int64_t p = g.start[si]; p < g.start[si + 1]; ++p) {
      int64_t i = g.order[p];
      int64_t r = s.index.find(keys[i], g.hashes[i]);
      if (r >= 0) erase_row(s, r);
    }
    s.index.shrink_for(s.rows.size());
  });
}

void Table::clear() {
  std::unique_lock<std::shared_mutex> lock(mu_);
  // The fresh (minimum-size) indexes are allocated first; then every chunk and index array is
  // freed, so memory goes back to the OS and memory_bytes() drops to the empty table's.
  std::vector<KeyIndex> fresh(shards_.size());
  ++clock_;
  for (size_t i = 0; i < shards_.size(); ++i) {
    shards_[i]->rows.clear();
    shards_[i]->index = std::move(fresh[i]);
  }
}

int64_t Table::size_locked() const {
  int64_t n = 0;
  for (const auto& s : shards_) n += s->rows.size();
  return n;
}

int64_t Table::size() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return size_locked();
}

void Table::reserve(int64_t n) {
  if (n < 0) throw std::invalid_argument("reserve needs n >= 0, got " + std::to_string(n));
  std::unique_lock<std::shared_mutex> lock(mu_);
  // Room for n keys spread over the shards by hash, with 1/8 slack for uneven shards.
  const int64_t per_shard = n / kNumShards + n / (kNumShards * 8) + 16;
  // The whole request is checked against the machine's memory before anything is allocated,
  // so an absurd n fails with a message instead of the OOM killer.
  const long double need =
      kNumShards * (shards_[0]->rows.bytes_for(per_shard) + KeyIndex::bytes_for(per_shard));
  check_request(("reserve(" + std::to_string(n) + ")").c_str(), need);
  if (per_shard >= static_cast<int64_t>(KeyIndex::kEmpty))
    throw std::length_error("reserve(" + std::to_string(n) +
                            ") exceeds the table's limit of 2^32 - 1 rows per shard");
  int64_t after[kNumShards];
  for (int si = 0; si < kNumShards; ++si) after[si] = per_shard;
  grow_shards(after);  // allocates everything before adopting anything
}

int64_t Table::apply_gradients(const int64_t* keys, int64_t n, const float* grads, float lr,
                               int64_t step) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  require_trainable();
  if (!optimizer_)
    throw std::invalid_argument("apply_gradients: this table has no optimizer attached");
  const StepArgs args = optimizer_->prepare(lr, step);
  const Optimizer& opt = *optimizer_;
  Grouping g;
  group_by_shard(keys, n, &g);
  // Per shard: the distinct keys' rows and gradients. A gradient is read in place unless its key
  // repeats, in which case the sum is built in `summed` (reserved for as many sums as the shard
  // has keys, so it never reallocates). All of it is allocated before any row changes, into the
  // table's step scratch (table.h), which keeps its buffers between calls while they are small.
  // The distinct entries are written with plain stores: the per-key loop has no capacity checks
  // or out-of-line push_back calls (which GCC stopped inlining once this function grew).
  using Work = StepScratch;
  using Distinct = StepDistinct;
  std::vector<Work>& work = step_scratch_;
  if (work.size() != static_cast<size_t>(kNumShards)) work.resize(kNumShards);
  const bool widen = value_dtype_ != DE_VALUE_FLOAT32;
  // Buffers kept from an earlier call are released if this one throws before any row changes
  // (bad_alloc: the scratch is then in no state worth keeping).
  try {
    for_each_shard(g, [&](int si) {
      const int64_t cnt = g.start[si + 1] - g.start[si];
      Work& w = work[si];
      w.dedup.reserve(cnt);
      if (cnt > w.distinct_cap) {
        w.distinct_cap = 0;
        w.distinct.reset(new Distinct[cnt]);  // default-initialised: not written until used
        w.distinct_cap = cnt;
      }
      w.count = 0;
      w.ready = false;
      w.summed.clear();
      w.summed.reserve(static_cast<size_t>(cnt) * dim_);  // untouched until a key repeats
      if (widen) w.widened.resize(static_cast<size_t>(width()));
    });
  } catch (...) {
    StepScratches().swap(step_scratch_);
    throw;
  }
  prepare_inserts(g, n);
  const int64_t stamp = ++clock_;
  const uint32_t gen = changes_.write_gen;
  auto dedup = [&](int si, Shard& s, int64_t i, uint64_t h, int64_t r) {
    Work& w = work[si];
    if (!w.ready) {
      w.dedup.init();
      w.ready = true;
    }
    const float* gi = grads + i * dim_;
    bool fresh = false;
    const int64_t u = w.dedup.get(keys[i], h, w.count, &fresh);
    if (fresh) {
      if (r < 0) {
        r = insert_new(s, keys[i], h, stamp);
        fill_initial(static_cast<uint64_t>(keys[i]), s.rows.row(r));
      }
      w.distinct[w.count++] = Distinct{r, gi, -1};
      return;
    }
    Distinct& d = w.distinct[u];
    if (d.sum_at < 0) {
      d.sum_at = static_cast<int64_t>(w.summed.size());
      w.summed.insert(w.summed.end(), d.grad, d.grad + dim_);  // within capacity
    }
    add_gradient(w.summed.data() + d.sum_at, gi, dim_);
  };
  // Applied per shard right after its gradients are summed: its rows, prefetched while probing,
  // are still in cache. float32 rows are stepped in place. float16/bfloat16: the row and its
  // slots are widened into a float32 scratch row, stepped by the same float32 kernel, and
  // rounded back (Keras' float32 arithmetic on low-precision variables); the scratch is per
  // shard, allocated with the rest of the work up front. The dtype is dispatched once per shard,
  // so the per-key loop above is compiled once for every dtype.
  auto update = [&](int si) {
    Shard& s = *shards_[si];
    Work& w = work[si];
    const Distinct* distinct = w.distinct.get();
    const float* summed = w.summed.data();
    if (!widen) {
      for (int64_t u = 0; u < w.count; ++u) {
        const Distinct& d = distinct[u];
        float* row = s.rows.row_as<float>(d.row);
        opt.apply(row, row + dim_, d.sum_at < 0 ? d.grad : summed + d.sum_at, dim_, args);
        RowMeta& meta = s.rows.meta(d.row);
        meta.last_update = stamp;
        bump_count(meta.count);
        // Stepped also for an all-zero gradient: TFRA writes its slots too.
        set_change_gen_stepped(meta, gen);
      }
    } else {
      const int64_t width = s.rows.width();
      float* scratch = w.widened.data();
      for (int64_t u = 0; u < w.count; ++u) {
        const Distinct& d = distinct[u];
        unsigned char* row = s.rows.row(d.row);
        values_to_floats(value_dtype_, row, scratch, width);
        opt.apply(scratch, scratch + dim_, d.sum_at < 0 ? d.grad : summed + d.sum_at, dim_, args);
        floats_to_values(value_dtype_, scratch, row, width);
        RowMeta& meta = s.rows.meta(d.row);
        meta.last_update = stamp;
        bump_count(meta.count);
        // Stepped also for an all-zero gradient: TFRA writes its slots too.
        set_change_gen_stepped(meta, gen);
      }
    }
  };
  for_each_key(g, keys, dedup, update);
  // Keep the buffers for the next call unless a large batch made them big (a model holds many
  // tables; a large batch's allocations are few per key anyway).
  size_t kept = 0;
  for (const Work& w : work) kept += w.bytes();
  if (kept > kKeptStepScratchBytes) StepScratches().swap(step_scratch_);
  return enforce_capacity();
}

int64_t Table::enforce_capacity() {
  if (capacity_ <= 0) return 0;
  int64_t removed = restrict_locked(capacity_, evict_policy_, nullptr, nullptr, 0);
  evicted_total_ += removed;
  return removed;
}

int64_t Table::restrict(int64_t num_reserved, RestrictBy by, const int64_t* keys,
                        const float* scores, int64_t n) {
  if (by == RestrictBy::kCustom) check_restrict_scores(keys, scores, n);
  std::unique_lock<std::shared_mutex> lock(mu_);
  const int64_t removed = restrict_locked(num_reserved, by, keys, scores, n);
  ++clock_;
  return removed;
}

int64_t Table::restrict_locked(int64_t num_reserved, RestrictBy by, const int64_t* keys,
                               const float* scores, int64_t n) {
  const int64_t total = size_locked();
  if (total <= num_reserved) return 0;
  // The cut between kept and erased rows. All allocation happens here (the custom scores' map,
  // the ranking buffer), before the first row is erased.
  const RestrictScorer scorer(by, keys, scores, n);
  auto rank = [&](const Shard& s, int64_t r) {
    const RowMeta& m = s.rows.meta(r);
    return scorer.rank(m.key, m.last_update, m.count);
  };
  std::vector<Ranked>& all = evict_scratch_;
  all.clear();
  if (num_reserved > 0) {
    all.reserve(total);
    for (const auto& s : shards_)
      for (int64_t r = 0; r < s->rows.size(); ++r) all.push_back(rank(*s, r));
  }
  const RestrictCut cut(all, num_reserved);
  evicted_.reserve_more(total - num_reserved);  // before the first erase: capture cannot fail
  // Give a large ranking buffer back; keep a small one for the next capacity write.
  if (all.capacity() > (size_t(1) << 16)) std::vector<Ranked>().swap(all);
  int64_t removed = 0;
  for (auto& sp : shards_) {
    Shard& s = *sp;
    // Walk backwards: erase_row moves the last row (already decided: kept) into the hole.
    for (int64_t r = s.rows.size() - 1; r >= 0; --r) {
      if (cut.keeps_none() || !cut.keeps(rank(s, r))) {
        if (evicted_.mode) evicted_.add(s.rows.meta(r), s.rows.row(r));
        erase_row(s, r);
        ++removed;
      }
    }
    s.index.shrink_for(s.rows.size());
  }
  return removed;
}

int64_t Table::export_rows(int64_t offset, int64_t limit, int64_t* keys, void* values_out,
                           void* slots_out, int slots_given, int64_t* last_update,
                           int64_t* update_count, uint8_t* stepped) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const int64_t ns = num_slots();
  check_slot_count(slots_given, static_cast<int>(ns));
  const ExportOut out{keys, static_cast<unsigned char*>(values_out),
                      static_cast<unsigned char*>(slots_out), last_update, update_count, stepped,
                      row_bytes(), ns};
  int64_t written = 0, base = 0;
  for (const auto& sp : shards_) {
    const RowStore& rows = sp->rows;
    const int64_t sz = rows.size();
    if (written >= limit) break;
    if (offset >= base + sz) {
      base += sz;
      continue;
    }
    for (int64_t r = std::max<int64_t>(0, offset - base); r < sz && written < limit; ++r)
      out.put(written++, rows.row(r), rows.meta(r));
    base += sz;
  }
  return written;
}

int64_t Table::import_rows(const int64_t* keys, int64_t n, const void* values_in,
                           const void* slots_in, int slots_given, const int64_t* last_update,
                           const int64_t* update_count, const uint8_t* stepped) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  check_slot_count(slots_given, static_cast<int>(num_slots()));
  Grouping g;
  group_by_shard(keys, n, &g);
  prepare_inserts(g, n);
  return import_grouped(g, keys, n, values_in, slots_in, last_update, update_count, stepped);
}

int64_t Table::replace_rows(const int64_t* keys, int64_t n, const void* values_in,
                            const void* slots_in, int slots_given, const int64_t* last_update,
                            const int64_t* update_count, const uint8_t* stepped) {
  // clear() then import_rows(), under one lock (no reader sees the table empty in between) and
  // into the memory the table holds: clear() unmaps every chunk and index array (memory goes
  // back to the OS), so the import after it faulted all of its pages in afresh, a third of a
  // tf.train.Checkpoint restore of a 1M x 64 table (docs/benchmarks.md, "Regressions since the
  // turn-2 main"). Each shard keeps the chunks its share of the rows needs and its index array
  // when that has the size an index grown for the share from empty would get, so the table
  // ends exactly as clear() + import_rows() leave it (same rows, order, clock, memory).
  std::unique_lock<std::shared_mutex> lock(mu_);
  check_slot_count(slots_given, static_cast<int>(num_slots()));
  Grouping g;
  group_by_shard(keys, n, &g);
  // Everything that may fail is allocated before a shard changes: a fresh index where the
  // kept array has the wrong size, and the chunks a shard lacks.
  std::vector<KeyIndex> fresh(shards_.size());
  std::vector<std::vector<Block>> chunks(shards_.size());
  for (size_t si = 0; si < shards_.size(); ++si) {
    const int64_t share = g.start[si + 1] - g.start[si];
    if (share >= static_cast<int64_t>(KeyIndex::kEmpty))
      throw std::length_error("a shard of this table would pass its limit of 2^32 - 1 rows");
    Shard& s = *shards_[si];
    if (!s.index.empties_in_place(share)) fresh[si] = KeyIndex::empty_for(share);
    chunks[si] = s.rows.chunks_for(share);
  }
  ++clock_;  // clear()'s tick
  for (size_t si = 0; si < shards_.size(); ++si) {
    Shard& s = *shards_[si];
    const int64_t share = g.start[si + 1] - g.start[si];
    if (s.index.empties_in_place(share)) s.index.empty_in_place();
    else s.index = std::move(fresh[si]);
    s.rows.clear_keeping(share);
    s.rows.adopt(chunks[si]);
    s.rows.shrink_chunk_table();
  }
  prepare_inserts(g, n);  // the room is there: at most the eviction buffer is allocated
  return import_grouped(g, keys, n, values_in, slots_in, last_update, update_count, stepped);
}

int64_t Table::import_grouped(const Grouping& g, const int64_t* keys, int64_t n,
                              const void* values_in, const void* slots_in,
                              const int64_t* last_update, const int64_t* update_count,
                              const uint8_t* stepped) {
  const unsigned char* values = static_cast<const unsigned char*>(values_in);
  const unsigned char* slots = static_cast<const unsigned char*>(slots_in);
  const size_t rb = row_bytes();
  const int64_t ns = num_slots();
  const int64_t stamp = ++clock_;
  // Without stepped flags, rows given slots count as stepped where those slots differ from the
  // initial slots (what slot views showed before the flag existed: an old checkpoint shows the
  // same keys after loading as before saving); rows without given slots keep their flag.
  std::vector<unsigned char> initial;
  if (!stepped && slots && ns) {
    initial.resize(rb * (1 + ns));
    init_slots(initial.data());
  }
  for_each_key(g, keys, [&](int, Shard& s, int64_t i, uint64_t h, int64_t r) {
    if (r < 0) r = insert_new(s, keys[i], h, stamp);
    unsigned char* row = s.rows.row(r);
    std::memcpy(row, values + i * rb, rb);
    if (slots && ns) std::memcpy(row + rb, slots + i * ns * rb, rb * ns);
    RowMeta& meta = s.rows.meta(r);
    meta.last_update = last_update ? last_update[i] : stamp;
    meta.count = update_count ? imported_count(update_count[i]) : 0;
    set_change_gen(meta, changes_.write_gen);
    if (stepped)
      meta.set_stepped(stepped[i] != 0 && ns > 0);
    else if (!initial.empty())
      meta.set_stepped(std::memcmp(row + rb, initial.data() + rb, rb * ns) != 0);
  });
  if (last_update) clock_ = clock_after_import(clock_, last_update, n);
  return enforce_capacity();
}

int64_t Table::changes_begin() {
  std::unique_lock<std::shared_mutex> lock(mu_);
  return changes_.begin();
}

void Table::changes_commit(int64_t token, const std::string& label) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  changes_.commit(token, label);
}

std::string Table::changes_label() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return changes_.label;
}

int64_t Table::count_changed() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& sp : shards_)
    for (int64_t r = 0; r < sp->rows.size(); ++r) n += changes_.changed(sp->rows.meta(r));
  return n;
}

int64_t Table::export_changed(int64_t* cursor, int64_t limit, int64_t* keys, void* values_out,
                              void* slots_out, int slots_given, int64_t* last_update,
                              int64_t* update_count, uint8_t* stepped) const {
  if (*cursor < 0 || limit < 0) throw std::invalid_argument("cursor and limit must be >= 0");
  std::shared_lock<std::shared_mutex> lock(mu_);
  const int64_t ns = num_slots();
  check_slot_count(slots_given, static_cast<int>(ns));
  const ExportOut out{keys, static_cast<unsigned char*>(values_out),
                      static_cast<unsigned char*>(slots_out), last_update, update_count, stepped,
                      row_bytes(), ns};
  int64_t written = 0, base = 0, pos = *cursor;
  for (const auto& sp : shards_) {
    const RowStore& rows = sp->rows;
    const int64_t sz = rows.size();
    if (pos >= base + sz) {
      base += sz;
      continue;
    }
    for (int64_t r = pos - base; r < sz && written < limit; ++r, ++pos) {
      const RowMeta& m = rows.meta(r);
      if (changes_.changed(m)) out.put(written++, rows.row(r), m);
    }
    if (written >= limit) break;
    base += sz;
  }
  *cursor = pos;
  return written;
}

void Table::capture_evicted(int mode) {
  if (mode < 0 || mode > 2)
    throw std::invalid_argument("capture_evicted: mode must be 0 (off), 1 (keys) or 2 (rows)");
  std::unique_lock<std::shared_mutex> lock(mu_);
  evicted_.reset(mode, width() * static_cast<int64_t>(value_size_));
}

int64_t Table::take_evicted(int64_t limit, int64_t* keys, void* values_out, void* slots_out,
                            int slots_given, int64_t* last_update, int64_t* update_count,
                            int64_t* remaining) {
  if (limit < 0) throw std::invalid_argument("limit must be >= 0");
  unsigned char* values = static_cast<unsigned char*>(values_out);
  unsigned char* slots = static_cast<unsigned char*>(slots_out);
  const size_t rb = row_bytes();
  std::unique_lock<std::shared_mutex> lock(mu_);
  const int64_t ns = num_slots();
  check_slot_count(slots_given, static_cast<int>(ns));
  if ((values || (slots && ns)) && evicted_.mode != 2)
    throw std::invalid_argument("take_evicted: rows were not captured (capture mode 2 keeps them)");
  const int64_t m = std::min(limit, evicted_.size());
  for (int64_t i = 0; i < m; ++i) {
    if (keys) keys[i] = evicted_.keys[i];
    if (last_update) last_update[i] = evicted_.last_update[i];
    if (update_count) update_count[i] = evicted_.update_count[i];
    const unsigned char* row = evicted_.rows.data() + i * evicted_.row_bytes;
    if (values) std::memcpy(values + i * rb, row, rb);
    if (slots && ns) std::memcpy(slots + i * ns * rb, row + rb, rb * ns);
  }
  evicted_.keys.erase(evicted_.keys.begin(), evicted_.keys.begin() + m);
  evicted_.last_update.erase(evicted_.last_update.begin(), evicted_.last_update.begin() + m);
  evicted_.update_count.erase(evicted_.update_count.begin(), evicted_.update_count.begin() + m);
  if (evicted_.mode == 2)
    evicted_.rows.erase(evicted_.rows.begin(), evicted_.rows.begin() + m * evicted_.row_bytes);
  if (remaining) *remaining = evicted_.size();
  return m;
}

size_t Table::memory_bytes() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  size_t b = 0;
  for (const auto& s : shards_) b += s->rows.bytes() + s->index.bytes();
  return b;
}

std::shared_ptr<Storage> Table::clone() const {
  // A shared hold excludes every writer (writes take the lock exclusively) and lets lookups go
  // on while the rows are copied.
  std::shared_lock<std::shared_mutex> lock(mu_);
  long double need = 0;
  for (const auto& s : shards_)
    need += s->rows.bytes_for(s->rows.size()) + s->index.bytes();
  check_request("copying the table (clone)", need);
  std::shared_ptr<Table> copy(new Table(*this));
  std::vector<Ranked>().swap(copy->evict_scratch_);  // a scratch buffer, not state
  return copy;
}

}  // namespace dualemb
