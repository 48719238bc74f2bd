#ifdef DUALEMB_HAVE_HIREDIS
#include "redis_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "../config.h"
#include "../hash.h"
#include "../semantics/duplicates.h"
#include "../semantics/restrict_ranking.h"
#include "../semantics/row_updates.h"
#include "../value_dtype.h"
#include "factory.h"
#include "table_options.h"

namespace dualemb {
namespace {

// A stored row: header {uint32 opt_gen, uint32 update count, int64 last update} then
// dim * (1 + slots) floats, all little-endian (the host order of every supported machine).
// Bit 31 of the opt_gen word is the row's "stepped" flag (de_export); generations stay far
// below it. Rows stored before the flag existed read as not stepped.
constexpr size_t kHeader = 16;
constexpr uint32_t kSteppedBit = uint32_t(1) << 31;
constexpr int kMaxConflicts = 64;   // concurrent writers winning before this one gives up
constexpr int kMaxRedirects = 5;    // Cluster MOVED answers followed per call

std::string field_of(int64_t key) {
  std::string f(8, '\0');
  std::memcpy(&f[0], &key, 8);
  return f;
}

int64_t key_of(const char* p, size_t len, const std::string& where) {
  if (len != 8) throw RedisError(where + " holds a field that is not an 8-byte key");
  int64_t k;
  std::memcpy(&k, p, 8);
  return k;
}

// Percent-escapes the characters that would make two identities print alike ("/", "%") or
// break the Cluster hash tag ("{", "}").
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '%' || c == '/' || c == '{' || c == '}') {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

int64_t as_int(const redisReply* r, int64_t fallback) {
  if (!r || r->type == REDIS_REPLY_NIL) return fallback;
  if (r->type == REDIS_REPLY_INTEGER) return r->integer;
  return std::stoll(reply_text(r));
}

std::pair<std::string, int> parse_address(const std::string& a) {
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == a.size())
    throw std::invalid_argument("redis config: address '" + a + "' is not host:port");
  int port = 0;
  try {
    size_t used = 0;
    port = std::stoi(a.substr(colon + 1), &used);
    if (used != a.size() - colon - 1) throw std::invalid_argument("");
  } catch (const std::exception&) {
    throw std::invalid_argument("redis config: address '" + a + "' has no numeric port");
  }
  if (port <= 0 || port > 65535)
    throw std::invalid_argument("redis config: port of '" + a + "' is out of range");
  return {a.substr(0, colon), port};
}

}  // namespace

std::shared_ptr<Storage> make_redis_storage(const std::string& config) {
  return std::make_shared<RedisTable>(config);
}

struct RedisTable::Rows {
  int64_t width = 0;
  std::vector<int64_t> keys;  // distinct, in first-occurrence order
  std::unordered_map<int64_t, int64_t> index;
  std::vector<uint8_t> present, dirty, erased;
  std::vector<float> data;  // [keys, width]
  std::vector<int64_t> last_update;
  std::vector<uint32_t> count;
  std::vector<uint8_t> stepped;
  int64_t new_clock = 0;
  bool clear_all = false;
  std::vector<std::pair<std::string, std::string>> meta_sets;  // extra meta fields to write

  int64_t add(int64_t key) {
    auto it = index.emplace(key, static_cast<int64_t>(keys.size()));
    if (it.second) {
      keys.push_back(key);
      present.push_back(0);
      dirty.push_back(0);
      erased.push_back(0);
      last_update.push_back(0);
      count.push_back(0);
      stepped.push_back(0);
      data.resize(data.size() + width);
    }
    return it.first->second;
  }
  float* row(int64_t j) { return data.data() + j * width; }
};

RedisTable::RedisTable(const std::string& config_text) {
  Config c = Config::parse(config_text, "table config");
  std::set<std::string> known = table_option_names();
  known.insert("redis");
  c.check_known(known, "table config");
  c.get_string("backend", "redis");
  TableOptions o = read_table_options(c);
  if (o.capacity > 0)
    throw std::invalid_argument(
        "table config: 'capacity' is not supported by the redis backend (Redis keeps every "
        "key; bound the table with restrict, or Redis' own maxmemory policy)");
  if (o.value_dtype != DE_VALUE_FLOAT32)
    throw std::invalid_argument(std::string("table config: value_dtype '") +
                                value_dtype_name(o.value_dtype) +
                                "' is not supported by the redis backend (it stores float32 "
                                "rows); use the in-memory backend for other value dtypes");
  dim_ = o.dim;
  key_dtype_ = o.key_dtype;
  new_values_ = NewRowValues(o);

  Config r = c.get_object("redis", "redis config");
  r.check_known({"mode", "addresses", "master_name", "user", "password", "db", "name",
                 "model_tag", "shard", "storage_slice", "keys_sending_size",
                 "connect_timeout_ms", "command_timeout_ms"},
                "redis config");
  RedisOptions opts;
  const std::string mode = r.get_string("mode", "standalone");
  if (mode == "standalone") opts.mode = RedisOptions::kStandalone;
  else if (mode == "cluster") opts.mode = RedisOptions::kCluster;
  else if (mode == "sentinel") opts.mode = RedisOptions::kSentinel;
  else throw std::invalid_argument("redis config: unknown mode '" + mode +
                                   "' (standalone, cluster, sentinel)");
  for (const auto& a : r.get_strings("addresses", {"127.0.0.1:6379"}))
    opts.addresses.push_back(parse_address(a));
  if (opts.addresses.empty())
    throw std::invalid_argument("redis config: 'addresses' lists no server");
  opts.master_name = r.get_string("master_name", "");
  if (opts.mode == RedisOptions::kSentinel && opts.master_name.empty())
    throw std::invalid_argument("redis config: mode 'sentinel' needs 'master_name'");
  opts.user = r.get_string("user", "");
  opts.password = r.get_string("password", "");
  opts.db = r.get_int("db", 0);
  if (opts.db < 0) throw std::invalid_argument("redis config: 'db' must be >= 0");
  if (opts.mode == RedisOptions::kCluster && opts.db != 0)
    throw std::invalid_argument("redis config: Redis Cluster has only db 0, got 'db' " +
                                std::to_string(opts.db));
  if (!r.has("name")) throw std::invalid_argument("redis config needs 'name' (the table's name)");
  const std::string name = r.get_string("name", "");
  if (name.empty()) throw std::invalid_argument("redis config: 'name' must not be empty");
  const std::string tag = r.get_string("model_tag", "test");
  const int64_t shard = r.get_int("shard", 0);
  if (shard < 0) throw std::invalid_argument("redis config: 'shard' must be >= 0");
  const int64_t slices = r.get_int("storage_slice", 1);
  if (slices < 1 || slices > 65536)
    throw std::invalid_argument("redis config: 'storage_slice' must be in [1, 65536]");
  keys_sending_size_ = r.get_int("keys_sending_size", 1024);
  if (keys_sending_size_ < 1)
    throw std::invalid_argument("redis config: 'keys_sending_size' must be >= 1");
  opts.connect_timeout_ms = r.get_int("connect_timeout_ms", 1000);
  opts.command_timeout_ms = r.get_int("command_timeout_ms", 1000);
  if (opts.connect_timeout_ms < 1 || opts.command_timeout_ms < 1)
    throw std::invalid_argument("redis config: timeouts must be >= 1 ms");
  c.set_echo("redis", r.echo());
  refuse_unused(c);
  config_json_ = c.echo();

  ident_ = escape(name) + "/" + escape(tag) + "/" + std::to_string(shard);
  prefix_ = "de:{" + ident_ + "}";
  meta_key_ = prefix_ + ":meta";
  lock_key_ = prefix_ + ":lock";
  meta_slot_ = redis_key_slot(meta_key_);
  slices_ = slices;
  timeouts_ms_ = opts.connect_timeout_ms + opts.command_timeout_ms;
  router_.reset(new RedisRouter(opts));
  init_meta();
}

std::vector<RedisReply> RedisTable::run(const std::vector<RedisCommand>& cmds) const {
  return router_->run(meta_slot_, cmds);
}

std::vector<RedisReply> RedisTable::run_slice(size_t slice,
                                              const std::vector<RedisCommand>& cmds) const {
  return router_->run(slice_slot_[slice], cmds);
}

// Runs `cmds` as one read-only MULTI/EXEC (a consistent snapshot); returns EXEC's reply.
std::vector<RedisReply> RedisTable::transaction(const std::vector<RedisCommand>& cmds) const {
  std::vector<RedisCommand> all;
  all.reserve(cmds.size() + 3);
  all.push_back({"UNWATCH"});
  all.push_back({"MULTI"});
  for (const auto& c : cmds) all.push_back(c);
  all.push_back({"EXEC"});
  std::vector<RedisReply> replies = run(all);
  RedisReply exec = std::move(replies.back());
  if (!exec || exec->type != REDIS_REPLY_ARRAY || exec->elements != cmds.size()) {
    std::string why = exec && exec->type == REDIS_REPLY_ERROR ? reply_text(exec.get()) : "";
    for (const auto& r : replies)
      if (r && r->type == REDIS_REPLY_ERROR) why += " " + reply_text(r.get());
    throw RedisError("redis at " + router_->where(meta_slot_) + " refused a read: " + why);
  }
  replies.clear();
  replies.push_back(std::move(exec));
  return replies;
}

template <class Fn>
auto with_redirects(Fn&& fn) -> decltype(fn()) {
  for (int i = 0;; ++i) {
    try {
      return fn();
    } catch (const RedisMoved&) {
      if (i >= kMaxRedirects)
        throw RedisError("redis cluster kept redirecting a slot of the table (MOVED) " +
                         std::to_string(kMaxRedirects) + " times; is the cluster resharding, or "
                         "is a cluster node used with a mode other than 'cluster'?");
    }
  }
}

// Fields 0-4 as refresh_meta and init_meta read them; 5: a spread batch in progress (its
// token), 6: the last batch token (txn).
RedisCommand RedisTable::meta_read() const {
  return {"HMGET", meta_key_, "clock", "opt_gen", "optimizer", "dim", "key_dtype", "pending",
          "txn"};
}

void RedisTable::refresh_meta(const redisReply* clock, const redisReply* gen,
                              const redisReply* spec) const {
  meta_.clock = as_int(clock, 0);
  const uint32_t g = static_cast<uint32_t>(as_int(gen, 0));
  const std::string s = reply_text(spec);
  if (g != meta_.opt_gen || s != meta_.opt_spec || (!s.empty() && !optimizer_)) {
    optimizer_ = s.empty() ? nullptr : make_optimizer(s);
    meta_.opt_gen = g;
    meta_.opt_spec = s;
  }
}

void RedisTable::init_meta() {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string kd = key_dtype_ ? "int32" : "int64";
  auto check = [&](const std::vector<RedisReply>& rep) {
    for (const auto& r : rep)
      if (r && r->type == REDIS_REPLY_ERROR)
        throw RedisError("redis at " + router_->where(meta_slot_) + ": " + reply_text(r.get()));
  };
  with_redirects([&] {
    for (int attempt = 0;; ++attempt) {
      auto rep = run({{"WATCH", meta_key_},
                      {"HMGET", meta_key_, "dim", "key_dtype", "storage_slice", "slice_tags"}});
      check(rep);
      const redisReply* m = rep[1].get();
      if (m->element[0]->type == REDIS_REPLY_NIL) {
        // A new table. In a Cluster, several slices are spread over the masters; the tags are
        // stored, so the table keeps its keys whatever the cluster's later shape.
        std::string tags;
        try {
          tags = router_->cluster() && slices_ > 1 ? choose_slice_tags() : "";
        } catch (...) {
          run({{"UNWATCH"}});
          throw;
        }
        RedisCommand set = {"HSET", meta_key_, "dim", std::to_string(dim_), "key_dtype", kd,
                            "storage_slice", std::to_string(slices_)};
        if (!tags.empty()) {
          set.push_back("slice_tags");
          set.push_back(tags);
        }
        auto w = run({{"MULTI"}, set, {"EXEC"}});
        check(w);
        if (w.back()->type == REDIS_REPLY_NIL) {  // another process created it: read that one
          if (attempt + 1 >= kMaxConflicts)
            throw RedisError("redis table " + prefix_ + ": could not create its meta hash");
          continue;
        }
        set_layout(tags);
        break;
      }
      run({{"UNWATCH"}});
      const int64_t d = as_int(m->element[0], dim_);
      const std::string stored_kd = reply_text(m->element[1]);
      if (d != dim_ || stored_kd != kd)
        throw std::invalid_argument("redis table " + prefix_ + " exists with dim " +
                                    std::to_string(d) + " and " + stored_kd + " keys; this "
                                    "config asks for dim " + std::to_string(dim_) + " and " + kd +
                                    " keys");
      // A key's slice depends on storage_slice: another count would look for rows elsewhere.
      const int64_t stored_slices = as_int(m->element[2], -1);
      if (stored_slices >= 0 && stored_slices != slices_)
        throw std::invalid_argument(
            "redis table " + prefix_ + " exists with storage_slice " +
            std::to_string(stored_slices) + "; this config asks for " + std::to_string(slices_) +
            " (a key's slice depends on it: open the table with storage_slice " +
            std::to_string(stored_slices) + ", or save it to a checkpoint and load that into a "
            "table of another name)");
      set_layout(reply_text(m->element[3]));
      if (stored_slices < 0) {
        // Made by a dualemb that did not record storage_slice (every slice in meta's slot): a
        // slice past this config's last one means it was written with more slices.
        auto e = run({{"EXISTS", prefix_ + ":b" + std::to_string(slices_)}});
        check(e);
        if (e[0]->integer != 0)
          throw std::invalid_argument(
              "redis table " + prefix_ + " was written with more than storage_slice " +
              std::to_string(slices_) + " slices (it has " + prefix_ + ":b" +
              std::to_string(slices_) + "); open it with the storage_slice it was written with");
        check(run({{"HSETNX", meta_key_, "storage_slice", std::to_string(slices_)}}));
      }
      break;
    }
    auto rep = run({meta_read()});
    check(rep);
    refresh_meta(rep[0]->element[0], rep[0]->element[1], rep[0]->element[2]);
    return 0;
  });
}

namespace {

// Copies a stored row into `out` (width floats); slots written by another optimizer (opt_gen)
// start from the current optimizer's initial values.
void decode_row(const redisReply* r, int64_t dim, int ns, uint32_t gen, const Optimizer* opt,
                float* out, int64_t* last_update, uint32_t* count, const std::string& where,
                uint8_t* stepped = nullptr) {
  const size_t len = r->len;
  const size_t row_bytes = sizeof(float) * dim;
  if (len < kHeader + row_bytes || (len - kHeader) % row_bytes != 0)
    throw RedisError(where + " holds a row of " + std::to_string(len) + " bytes, not a row of "
                     "this table (dim " + std::to_string(dim) + ")");
  uint32_t g, cnt;
  int64_t lu;
  std::memcpy(&g, r->str, 4);
  const bool was_stepped = (g & kSteppedBit) != 0;
  g &= ~kSteppedBit;
  std::memcpy(&cnt, r->str + 4, 4);
  std::memcpy(&lu, r->str + 8, 8);
  const int64_t stored_cols = static_cast<int64_t>((len - kHeader) / row_bytes);
  std::memcpy(out, r->str + kHeader, row_bytes);
  if (stepped) *stepped = 0;
  if (ns > 0) {
    if (g == gen && stored_cols == 1 + ns) {
      std::memcpy(out + dim, r->str + kHeader + row_bytes, row_bytes * ns);
      if (stepped) *stepped = was_stepped ? 1 : 0;
    } else {
      for (int s = 0; s < ns; ++s)
        std::fill(out + dim * (1 + s), out + dim * (2 + s), opt->slot_initial_value(s));
    }
  }
  if (last_update) *last_update = lu;
  if (count) *count = cnt;
}

std::string encode_row(const float* row, int64_t width, uint32_t gen, uint32_t count,
                       int64_t last_update, bool stepped) {
  std::string v(kHeader + sizeof(float) * width, '\0');
  const uint32_t word = stepped ? (gen | kSteppedBit) : gen;
  std::memcpy(&v[0], &word, 4);
  std::memcpy(&v[4], &count, 4);
  std::memcpy(&v[8], &last_update, 8);
  std::memcpy(&v[kHeader], row, sizeof(float) * width);
  return v;
}

}  // namespace

bool RedisTable::spread_changes(const Rows& rows, std::vector<std::string>& before,
                                std::vector<uint8_t>& stored, std::vector<uint8_t>& known,
                                std::vector<SliceChange>& changes) const {
  changes.assign(buckets_.size(), SliceChange());
  auto slice_of = [&](int64_t k) { return (hash_key(k) >> 32) % buckets_.size(); };
  // Rows the batch touches without having read them (erase, restrict): read them now, still
  // under meta's WATCH, so that a rollback can put them back.
  const size_t n = rows.keys.size();
  before.resize(n);
  stored.resize(n, 0);
  known.resize(n, 0);
  std::vector<std::pair<int, RedisCommand>> reads;
  std::vector<std::vector<size_t>> read_rows;
  std::vector<RedisCommand> open(buckets_.size());
  std::vector<std::vector<size_t>> open_rows(buckets_.size());
  auto flush = [&](size_t b) {
    if (open_rows[b].empty()) return;
    reads.emplace_back(slice_slot_[b], std::move(open[b]));
    read_rows.push_back(std::move(open_rows[b]));
    open[b].clear();
    open_rows[b].clear();
  };
  for (size_t j = 0; j < n; ++j) {
    if (known[j] || !(rows.erased[j] || rows.dirty[j])) continue;
    const size_t b = slice_of(rows.keys[j]);
    if (open[b].empty()) open[b] = {"HMGET", buckets_[b]};
    open[b].push_back(field_of(rows.keys[j]));
    open_rows[b].push_back(j);
    if (static_cast<int64_t>(open_rows[b].size()) >= keys_sending_size_) flush(b);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) flush(b);
  if (!reads.empty()) {
    auto got = router_->run_routed(reads);
    for (size_t c = 0; c < got.size(); ++c) {
      if (got[c]->type != REDIS_REPLY_ARRAY)
        throw RedisError("redis: HMGET " + reads[c].second[1] + " failed: " + reply_text(got[c].get()));
      for (size_t i = 0; i < read_rows[c].size(); ++i) {
        const redisReply* v = got[c]->element[i];
        const size_t j = read_rows[c][i];
        known[j] = 1;
        if (v->type == REDIS_REPLY_STRING) {
          before[j].assign(v->str, v->len);
          stored[j] = 1;
        }
      }
    }
  }
  bool any = rows.clear_all;
  for (size_t j = 0; j < n; ++j) {
    if (!(rows.erased[j] || rows.dirty[j])) continue;
    SliceChange& c = changes[slice_of(rows.keys[j])];
    const std::string f = field_of(rows.keys[j]);
    if (rows.erased[j]) {
      if (!stored[j]) continue;  // erasing a key that is not there changes nothing
      c.del.push_back(f);
    } else {
      c.set.push_back(f);
      c.set.push_back(encode_row(rows.data.data() + j * rows.width, rows.width, meta_.opt_gen,
                                 rows.count[j], rows.last_update[j], rows.stepped[j] != 0));
    }
    if (stored[j]) {
      c.old.push_back(f);
      c.old.push_back(std::move(before[j]));
    } else {
      c.created.push_back(f);
    }
    any = true;
  }
  return any;
}

template <class Compute>
void RedisTable::write_batch(const int64_t* keys, int64_t n, bool read_rows, Compute&& compute) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int attempt = 0;; ++attempt) {
    bool executed = with_redirects([&]() -> bool {
      // Phase 1: WATCH the meta hash (every write changes it), read meta and the batch's rows.
      std::vector<RedisCommand> cmds = {{"WATCH", meta_key_}, meta_read()};
      std::vector<std::vector<int64_t>> by_bucket(buckets_.size());
      std::vector<uint64_t> hashes;
      std::vector<int64_t> distinct;
      {
        std::unordered_map<int64_t, char> seen;
        seen.reserve(n);
        for (int64_t i = 0; i < n; ++i)
          if (seen.emplace(keys[i], 0).second) distinct.push_back(keys[i]);
      }
      std::vector<std::pair<size_t, std::vector<int64_t>>> chunks;  // command index, keys
      // Spread: the rows are read (from their slices' nodes) once meta shows no batch pending.
      std::vector<std::pair<int, RedisCommand>> reads;
      if (read_rows) {
        for (int64_t k : distinct) by_bucket[(hash_key(k) >> 32) % buckets_.size()].push_back(k);
        for (size_t b = 0; b < buckets_.size(); ++b) {
          for (size_t s = 0; s < by_bucket[b].size(); s += keys_sending_size_) {
            const size_t e = std::min(by_bucket[b].size(), s + keys_sending_size_);
            RedisCommand c = {"HMGET", buckets_[b]};
            for (size_t i = s; i < e; ++i) c.push_back(field_of(by_bucket[b][i]));
            chunks.emplace_back(cmds.size() + reads.size(),
                                std::vector<int64_t>(by_bucket[b].begin() + s,
                                                     by_bucket[b].begin() + e));
            if (spread_) reads.emplace_back(slice_slot_[b], std::move(c));
            else cmds.push_back(std::move(c));
          }
        }
      }
      std::vector<RedisReply> rep;
      auto check_read = [&] {
        for (const auto& r : rep)
          if (r->type == REDIS_REPLY_ERROR)
            throw RedisError("redis at " + router_->where(meta_slot_) + ": " + reply_text(r.get()) +
                             "; nothing of this batch was written");
      };
      try {
        rep = run(cmds);
        check_read();
        if (spread_ && rep[1]->element[5]->type != REDIS_REPLY_NIL) {
          // Another writer's batch over several nodes is in progress or was interrupted.
          run({{"UNWATCH"}});
          settle();
          return false;
        }
        if (!reads.empty()) {
          for (auto& r : router_->run_routed(reads)) rep.push_back(std::move(r));
          check_read();
        }
      } catch (const RedisError& e) {
        throw RedisError(std::string(e.what()) + "; nothing of this batch was written");
      }
      try {
        refresh_meta(rep[1]->element[0], rep[1]->element[1], rep[1]->element[2]);
        Rows rows;
        rows.width = width();
        for (int64_t k : distinct) rows.add(k);
        const int ns = num_slots_locked();
        // Spread: each row as stored before the batch (what a rollback restores), once known.
        std::vector<std::string> before(distinct.size());
        std::vector<uint8_t> stored(distinct.size(), 0), known(distinct.size(), read_rows);
        for (const auto& ch : chunks) {
          const redisReply* r = rep[ch.first].get();
          for (size_t i = 0; i < ch.second.size(); ++i) {
            const redisReply* v = r->element[i];
            if (v->type != REDIS_REPLY_STRING) continue;
            const int64_t j = rows.index[ch.second[i]];
            rows.present[j] = 1;
            if (spread_) {
              before[j].assign(v->str, v->len);
              stored[j] = 1;
            }
            decode_row(v, dim_, ns, meta_.opt_gen, optimizer_.get(), rows.row(j),
                       &rows.last_update[j], &rows.count[j],
                       "redis key " + buckets_[(hash_key(ch.second[i]) >> 32) % buckets_.size()],
                       &rows.stepped[j]);
          }
        }
        const int64_t stamp = meta_.clock + 1;
        rows.new_clock = stamp;
        compute(rows, stamp);
        if (spread_) {
          std::vector<SliceChange> changes;
          if (spread_changes(rows, before, stored, known, changes)) {
            RedisCommand m = {"HSET", meta_key_, "clock", std::to_string(rows.new_clock)};
            for (const auto& kv : rows.meta_sets) {
              m.push_back(kv.first);
              m.push_back(kv.second);
            }
            return commit_spread(changes, rows.clear_all, std::move(m),
                                 as_int(rep[1]->element[6], 0));
          }
          // Nothing for the slices: meta alone changes, in the one-slot transaction below.
        }
        // Phase 2: one transaction writes everything, or nothing if meta changed meanwhile.
        std::vector<RedisCommand> w = {{"MULTI"}};
        if (rows.clear_all) {
          RedisCommand del = {"UNLINK"};
          for (const auto& b : buckets_) del.push_back(b);
          w.push_back(std::move(del));
        }
        std::vector<RedisCommand> hset(buckets_.size()), hdel(buckets_.size());
        auto flush = [&](std::vector<RedisCommand>& cmdv, size_t b, size_t per_key) {
          if (cmdv[b].size() > 2) w.push_back(std::move(cmdv[b]));
          cmdv[b].clear();
          (void)per_key;
        };
        for (size_t j = 0; j < rows.keys.size(); ++j) {
          const size_t b = (hash_key(rows.keys[j]) >> 32) % buckets_.size();
          if (rows.erased[j]) {
            if (hdel[b].empty()) hdel[b] = {"HDEL", buckets_[b]};
            hdel[b].push_back(field_of(rows.keys[j]));
            if (static_cast<int64_t>(hdel[b].size() - 2) >= keys_sending_size_) flush(hdel, b, 1);
          } else if (rows.dirty[j]) {
            if (hset[b].empty()) hset[b] = {"HSET", buckets_[b]};
            hset[b].push_back(field_of(rows.keys[j]));
            hset[b].push_back(encode_row(rows.row(j), rows.width, meta_.opt_gen, rows.count[j],
                                         rows.last_update[j], rows.stepped[j] != 0));
            if (static_cast<int64_t>(hset[b].size() - 2) >= 2 * keys_sending_size_)
              flush(hset, b, 2);
          }
        }
        for (size_t b = 0; b < buckets_.size(); ++b) {
          flush(hdel, b, 1);
          flush(hset, b, 2);
        }
        RedisCommand m = {"HSET", meta_key_, "clock", std::to_string(rows.new_clock)};
        for (const auto& kv : rows.meta_sets) {
          m.push_back(kv.first);
          m.push_back(kv.second);
        }
        w.push_back(std::move(m));
        w.push_back({"EXEC"});
        std::vector<RedisReply> done;
        try {
          done = run(w);
        } catch (const RedisError& e) {
          throw RedisError(std::string(e.what()) +
                           "; the batch was sent as one MULTI/EXEC transaction, which Redis "
                           "applies entirely or not at all, but the answer was lost, so which "
                           "one happened is unknown (read the keys back)");
        }
        const redisReply* exec = done.back().get();
        if (exec->type == REDIS_REPLY_NIL) return false;  // a concurrent write won: redo
        if (exec->type == REDIS_REPLY_ERROR) {
          std::string why = reply_text(exec);
          for (const auto& r : done)
            if (r->type == REDIS_REPLY_ERROR && r.get() != exec) why += "; " + reply_text(r.get());
          throw RedisError("redis at " + router_->where(meta_slot_) + " refused the batch: " + why +
                           "; nothing of this batch was written");
        }
        for (size_t i = 0; i < exec->elements; ++i)
          if (exec->element[i]->type == REDIS_REPLY_ERROR)
            throw RedisError("redis at " + router_->where(meta_slot_) +
                             " failed a command of the batch: " +
                             reply_text(exec->element[i]) + " (a Redis key of this table holds "
                             "another type?)");
        return true;
      } catch (...) {
        try {
          run({{"UNWATCH"}});
        } catch (...) {
        }
        throw;
      }
    });
    if (executed) return;
    if (attempt + 1 >= kMaxConflicts)
      throw RedisError("redis table " + prefix_ + ": " + std::to_string(kMaxConflicts) +
                       " concurrent writes won over this batch in a row; nothing of it was "
                       "written");
  }
}

int RedisTable::num_slots() const {
  std::lock_guard<std::mutex> lock(mu_);
  with_redirects([&] {
    auto rep = run({meta_read()});
    refresh_meta(rep[0]->element[0], rep[0]->element[1], rep[0]->element[2]);
    return 0;
  });
  return num_slots_locked();
}

std::vector<std::string> RedisTable::slot_names() const {
  num_slots();
  std::lock_guard<std::mutex> lock(mu_);
  return optimizer_ ? optimizer_->slot_names() : std::vector<std::string>{};
}

std::string RedisTable::describe() const {
  num_slots();
  std::lock_guard<std::mutex> lock(mu_);
  return "{\"config\":" + config_json_ + ",\"optimizer\":" +
         (optimizer_ ? optimizer_->spec() : std::string("null")) + "}";
}

void RedisTable::set_optimizer(const std::string& spec) {
  std::unique_ptr<Optimizer> opt;
  if (!spec.empty()) opt = make_optimizer(spec);  // throws before anything changes
  const std::string canonical = opt ? opt->spec() : "";
  write_batch(nullptr, 0, false, [&](Rows& rows, int64_t) {
    const bool same = canonical.empty() ? meta_.opt_spec.empty()
                                        : !meta_.opt_spec.empty() &&
                                              same_json(meta_.opt_spec, canonical);
    if (same) return;
    rows.meta_sets.push_back({"optimizer", canonical});
    // Only the weight decay changed: the slots keep their meaning (same_optimizer_state).
    if (!canonical.empty() && !meta_.opt_spec.empty() &&
        same_optimizer_state(meta_.opt_spec, canonical))
      return;
    // Rows keep their bytes; slots stamped with an older opt_gen read as initial slots.
    rows.meta_sets.push_back({"opt_gen", std::to_string(meta_.opt_gen + 1)});
  });
}

void RedisTable::find(const int64_t* keys, int64_t n, void* values_out, uint8_t* exists) const {
  float* values = static_cast<float*>(values_out);  // float32 only (see the constructor)
  std::lock_guard<std::mutex> lock(mu_);
  with_redirects([&] {
    std::vector<std::vector<int64_t>> by_bucket(buckets_.size());
    for (int64_t i = 0; i < n; ++i) by_bucket[(hash_key(keys[i]) >> 32) % buckets_.size()].push_back(i);
    std::vector<std::pair<size_t, RedisCommand>> cmds;
    std::vector<std::pair<size_t, size_t>> spans;  // (bucket, start) per command
    for (size_t b = 0; b < buckets_.size(); ++b) {
      for (size_t s = 0; s < by_bucket[b].size(); s += keys_sending_size_) {
        const size_t e = std::min(by_bucket[b].size(), s + keys_sending_size_);
        RedisCommand c = {"HMGET", buckets_[b]};
        for (size_t i = s; i < e; ++i) c.push_back(field_of(keys[by_bucket[b][i]]));
        spans.emplace_back(b, s);
        cmds.emplace_back(b, std::move(c));
      }
    }
    const Snapshot snap = snapshot(cmds);
    refresh_meta(snap.meta->element[0], snap.meta->element[1], snap.meta->element[2]);
    std::vector<float> scratch(width());
    for (size_t c = 0; c < spans.size(); ++c) {
      const redisReply* r = snap.replies[c];
      if (r->type != REDIS_REPLY_ARRAY) throw RedisError("redis: HMGET failed: " + reply_text(r));
      const auto& pos = by_bucket[spans[c].first];
      for (size_t i = 0; i < r->elements; ++i) {
        const int64_t p = pos[spans[c].second + i];
        const redisReply* v = r->element[i];
        const bool found = v->type == REDIS_REPLY_STRING;
        if (found) {
          decode_row(v, dim_, 0, meta_.opt_gen, nullptr, scratch.data(), nullptr, nullptr,
                     "redis key " + buckets_[spans[c].first]);
          std::memcpy(values + p * dim_, scratch.data(), sizeof(float) * dim_);
        } else {
          new_values_.fill(static_cast<uint64_t>(keys[p]), values + p * dim_);
        }
        if (exists) exists[p] = found;
      }
    }
    return 0;
  });
}

void RedisTable::initial_values(const int64_t* keys, int64_t n, void* values) const {
  new_values_.fill(keys, n, values);
}

namespace {
// A new row: initial slots (the values are the caller's to set).
void init_slots(float* row, int64_t dim, const Optimizer* opt) {
  fill_new_slots(row, dim, DE_VALUE_FLOAT32, opt);
}
}  // namespace

int64_t RedisTable::find_or_insert(const int64_t* keys, int64_t n, void* values_out,
                                   uint8_t* exists) {
  float* values = static_cast<float*>(values_out);
  write_batch(keys, n, true, [&](Rows& rows, int64_t stamp) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = rows.index[keys[i]];
      // A row stamped by this call was inserted by an earlier duplicate: it did not exist.
      if (exists)
        exists[i] = rows.present[j] && !stamped_by_this_call(rows.last_update[j], stamp);
      if (!rows.present[j]) {
        float* row = rows.row(j);
        new_values_.fill(static_cast<uint64_t>(keys[i]), row);
        init_slots(row, dim_, optimizer_.get());
        rows.present[j] = rows.dirty[j] = 1;
        rows.last_update[j] = stamp;
        rows.count[j] = 0;
      }
      std::memcpy(values + i * dim_, rows.row(j), sizeof(float) * dim_);
    }
  });
  return 0;
}

int64_t RedisTable::insert_or_assign(const int64_t* keys, int64_t n, const void* values_in) {
  const float* values = static_cast<const float*>(values_in);
  write_batch(keys, n, true, [&](Rows& rows, int64_t stamp) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = rows.index[keys[i]];
      float* row = rows.row(j);
      if (!rows.present[j]) {
        init_slots(row, dim_, optimizer_.get());
        rows.present[j] = 1;
        rows.count[j] = 0;
      }
      std::memcpy(row, values + i * dim_, sizeof(float) * dim_);
      rows.dirty[j] = 1;
      rows.last_update[j] = stamp;
      bump_count(rows.count[j]);
    }
  });
  return 0;
}

int64_t RedisTable::accum(const int64_t* keys, int64_t n, const void* deltas_in,
                          const uint8_t* exists) {
  const float* deltas = static_cast<const float*>(deltas_in);
  write_batch(keys, n, true, [&](Rows& rows, int64_t stamp) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = rows.index[keys[i]];
      float* row = rows.row(j);
      const float* d = deltas + i * dim_;
      const AccumAction action = accum_action(rows.present[j], exists[i]);
      if (action == AccumAction::kIgnore) continue;
      if (action == AccumAction::kInsert) {
        init_slots(row, dim_, optimizer_.get());
        std::memcpy(row, d, sizeof(float) * dim_);
        rows.present[j] = 1;
        rows.count[j] = 0;
      } else {
        add_values(DE_VALUE_FLOAT32, row, d, dim_);
      }
      rows.dirty[j] = 1;
      rows.last_update[j] = stamp;
      bump_count(rows.count[j]);
    }
  });
  return 0;
}

void RedisTable::erase(const int64_t* keys, int64_t n) {
  write_batch(keys, n, false, [&](Rows& rows, int64_t) {
    std::fill(rows.erased.begin(), rows.erased.end(), 1);
  });
}

void RedisTable::clear() {
  write_batch(nullptr, 0, false, [&](Rows& rows, int64_t) { rows.clear_all = true; });
  std::lock_guard<std::mutex> lock(mu_);
  export_keys_.clear();
}

int64_t RedisTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return with_redirects([&] {
    std::vector<std::pair<size_t, RedisCommand>> cmds;
    for (size_t b = 0; b < buckets_.size(); ++b) cmds.emplace_back(b, RedisCommand{"HLEN", buckets_[b]});
    const Snapshot snap = snapshot(cmds);
    int64_t total = 0;
    for (const redisReply* r : snap.replies) total += as_int(r, 0);
    return total;
  });
}

void RedisTable::reserve(int64_t n) {
  if (n < 0) throw std::invalid_argument("reserve needs n >= 0, got " + std::to_string(n));
  // Redis allocates as rows arrive; there is nothing to set aside.
}

int64_t RedisTable::apply_gradients(const int64_t* keys, int64_t n, const float* grads, float lr,
                                    int64_t step) {
  write_batch(keys, n, true, [&](Rows& rows, int64_t stamp) {
    if (!optimizer_)
      throw std::invalid_argument("apply_gradients: this table has no optimizer attached");
    const StepArgs args = optimizer_->prepare(lr, step);
    // Gradients of duplicate keys summed in batch order (semantics/duplicates.h).
    std::vector<float> sum(rows.keys.size() * dim_);
    sum_gradients_by_group(
        n, grads, dim_, [&](int64_t i) { return rows.index[keys[i]]; },
        static_cast<int64_t>(rows.keys.size()), sum.data());
    for (size_t j = 0; j < rows.keys.size(); ++j) {
      float* row = rows.row(j);
      if (!rows.present[j]) {
        new_values_.fill(static_cast<uint64_t>(rows.keys[j]), row);
        init_slots(row, dim_, optimizer_.get());
        rows.present[j] = 1;
        rows.count[j] = 0;
      }
      optimizer_->apply(row, row + dim_, sum.data() + j * dim_, dim_, args);
      rows.stepped[j] = 1;  // also for an all-zero gradient (Table::apply_gradients)
      rows.dirty[j] = 1;
      rows.last_update[j] = stamp;
      bump_count(rows.count[j]);
    }
  });
  return 0;
}

int64_t RedisTable::import_rows(const int64_t* keys, int64_t n, const void* values_in,
                                const void* slots_in, int slots_given, const int64_t* last_update,
                                const int64_t* update_count, const uint8_t* stepped) {
  const float* values = static_cast<const float*>(values_in);
  const float* slots = static_cast<const float*>(slots_in);
  write_batch(keys, n, true, [&](Rows& rows, int64_t stamp) {
    const int ns = num_slots_locked();
    check_slot_count(slots_given, ns);
    // The stepped rule of Table::import_rows: without flags, given slots that differ from the
    // initial slots mark a row stepped; a row given no slots keeps its mark.
    std::vector<float> initial;
    if (!stepped && slots && ns) {
      initial.resize(dim_ * (1 + ns));
      init_slots(initial.data(), dim_, optimizer_.get());
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = rows.index[keys[i]];
      float* row = rows.row(j);
      if (!rows.present[j]) {
        init_slots(row, dim_, optimizer_.get());
        rows.present[j] = 1;
      }
      std::memcpy(row, values + i * dim_, sizeof(float) * dim_);
      if (slots && ns) std::memcpy(row + dim_, slots + i * ns * dim_, sizeof(float) * ns * dim_);
      rows.last_update[j] = last_update ? last_update[i] : stamp;
      rows.count[j] = update_count ? imported_count(update_count[i]) : 0;
      if (stepped)
        rows.stepped[j] = stepped[i] != 0 && ns > 0;
      else if (!initial.empty())
        rows.stepped[j] = std::memcmp(row + dim_, initial.data() + dim_,
                                      sizeof(float) * ns * dim_) != 0;
      rows.dirty[j] = 1;
    }
    if (last_update) rows.new_clock = clock_after_import(rows.new_clock, last_update, n);
  });
  return 0;
}

std::vector<int64_t> RedisTable::bucket_keys(int b) const {
  std::set<int64_t> keys;  // HSCAN may return a field twice; a set counts it once
  std::string cursor = "0";
  do {
    auto rep = run_slice(b, {{"HSCAN", buckets_[b], cursor, "COUNT", "1000"}});
    const redisReply* r = rep[0].get();
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2)
      throw RedisError("redis: HSCAN " + buckets_[b] + " failed: " + reply_text(r));
    cursor = reply_text(r->element[0]);
    const redisReply* items = r->element[1];
    for (size_t i = 0; i + 1 < items->elements; i += 2)
      keys.insert(key_of(items->element[i]->str, items->element[i]->len, "redis key " + buckets_[b]));
  } while (cursor != "0");
  return std::vector<int64_t>(keys.begin(), keys.end());
}

int64_t RedisTable::export_rows(int64_t offset, int64_t limit, int64_t* keys, void* values_out,
                                void* slots_out, int slots_given, int64_t* last_update,
                                int64_t* update_count, uint8_t* stepped) const {
  float* values = static_cast<float*>(values_out);
  float* slots = static_cast<float*>(slots_out);
  std::lock_guard<std::mutex> lock(mu_);
  return with_redirects([&]() -> int64_t {
    // Order: buckets in turn, keys ascending within a bucket; stable while the table is not
    // modified. A page is read in one transaction checked against the clock of the key lists.
    for (int attempt = 0; attempt < kMaxConflicts; ++attempt) {
      std::vector<std::pair<size_t, RedisCommand>> cmds;
      for (size_t b = 0; b < buckets_.size(); ++b)
        cmds.emplace_back(b, RedisCommand{"HLEN", buckets_[b]});
      const Snapshot head = snapshot(cmds);
      refresh_meta(head.meta->element[0], head.meta->element[1], head.meta->element[2]);
      const int ns = num_slots_locked();
      check_slot_count(slots_given, ns);
      if (export_clock_ != meta_.clock) {
        export_keys_.clear();
        export_clock_ = meta_.clock;
      }
      std::vector<std::pair<int, std::vector<int64_t>>> page;  // bucket, keys
      int64_t base = 0, taken = 0;
      bool stale = false;
      for (size_t b = 0; b < buckets_.size() && taken < limit; ++b) {
        const int64_t len = as_int(head.replies[b], 0);
        if (offset >= base + len) {
          base += len;
          continue;
        }
        auto it = export_keys_.find(static_cast<int>(b));
        if (it == export_keys_.end())
          it = export_keys_.emplace(static_cast<int>(b), bucket_keys(static_cast<int>(b))).first;
        if (static_cast<int64_t>(it->second.size()) != len) {
          stale = true;  // changed between HLEN and HSCAN
          break;
        }
        const int64_t from = std::max<int64_t>(0, offset - base);
        const int64_t to = std::min<int64_t>(len, from + (limit - taken));
        page.emplace_back(static_cast<int>(b), std::vector<int64_t>(it->second.begin() + from,
                                                                    it->second.begin() + to));
        taken += to - from;
        base += len;
      }
      if (stale) {
        export_clock_ = -1;
        continue;
      }
      std::vector<std::pair<size_t, RedisCommand>> reads;
      std::vector<std::pair<size_t, size_t>> spans;  // (page index, start)
      for (size_t p = 0; p < page.size(); ++p) {
        for (size_t s = 0; s < page[p].second.size(); s += keys_sending_size_) {
          const size_t e = std::min(page[p].second.size(), s + keys_sending_size_);
          RedisCommand c = {"HMGET", buckets_[page[p].first]};
          for (size_t i = s; i < e; ++i) c.push_back(field_of(page[p].second[i]));
          spans.emplace_back(p, s);
          reads.emplace_back(page[p].first, std::move(c));
        }
      }
      const Snapshot got = snapshot(reads);
      if (as_int(got.meta->element[0], 0) != export_clock_) {
        export_clock_ = -1;  // written meanwhile: list the keys again
        continue;
      }
      int64_t w = 0;
      std::vector<float> row(dim_ * (1 + ns));
      for (size_t c = 0; c < spans.size(); ++c) {
        const redisReply* r = got.replies[c];
        const auto& ks = page[spans[c].first].second;
        for (size_t i = 0; i < r->elements; ++i) {
          const redisReply* v = r->element[i];
          if (v->type != REDIS_REPLY_STRING)
            throw RedisError("redis: a key listed for export vanished although the clock did "
                             "not change (was the table written without dualemb?)");
          int64_t lu;
          uint32_t cnt;
          uint8_t was_stepped;
          decode_row(v, dim_, ns, meta_.opt_gen, optimizer_.get(), row.data(), &lu, &cnt,
                     "redis key " + buckets_[page[spans[c].first].first], &was_stepped);
          if (keys) keys[w] = ks[spans[c].second + i];
          if (values) std::memcpy(values + w * dim_, row.data(), sizeof(float) * dim_);
          if (slots && ns)
            std::memcpy(slots + w * ns * dim_, row.data() + dim_, sizeof(float) * ns * dim_);
          if (last_update) last_update[w] = lu;
          if (update_count) update_count[w] = cnt;
          if (stepped) stepped[w] = was_stepped;
          ++w;
        }
      }
      return w;
    }
    throw RedisError("redis table " + prefix_ + " kept changing during export");
  });
}

int64_t RedisTable::restrict(int64_t num_reserved, RestrictBy by, const int64_t* keys,
                             const float* scores, int64_t n) {
  if (by == RestrictBy::kCustom) check_restrict_scores(keys, scores, n);
  const RestrictScorer scorer(by, keys, scores, n);
  int64_t removed = 0;
  write_batch(nullptr, 0, false, [&](Rows& rows, int64_t) {
    // Under the WATCH of write_batch: list every row's rank, erase those the cut does not keep
    // (semantics/restrict_ranking.h).
    std::vector<Ranked> all;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      std::string cursor = "0";
      std::set<int64_t> seen;
      do {
        auto rep = run_slice(b, {{"HSCAN", buckets_[b], cursor, "COUNT", "1000"}});
        const redisReply* r = rep[0].get();
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2)
          throw RedisError("redis: HSCAN " + buckets_[b] + " failed: " + reply_text(r));
        cursor = reply_text(r->element[0]);
        const redisReply* items = r->element[1];
        for (size_t i = 0; i + 1 < items->elements; i += 2) {
          const int64_t k = key_of(items->element[i]->str, items->element[i]->len, buckets_[b]);
          if (!seen.insert(k).second) continue;
          const redisReply* v = items->element[i + 1];
          if (v->len < kHeader) throw RedisError("redis key " + buckets_[b] + " holds a short row");
          uint32_t cnt;
          int64_t lu;
          std::memcpy(&cnt, v->str + 4, 4);
          std::memcpy(&lu, v->str + 8, 8);
          all.push_back(scorer.rank(k, lu, cnt));
        }
      } while (cursor != "0");
    }
    if (static_cast<int64_t>(all.size()) <= num_reserved) return;
    const RestrictCut cut(all, num_reserved);
    for (const Ranked& r : all) {
      if (cut.keeps(r)) continue;
      const int64_t j = rows.add(r.key);  // may grow rows' vectors: index them after
      rows.erased[j] = 1;
    }
    removed = static_cast<int64_t>(all.size()) - num_reserved;
  });
  return removed;
}

int64_t RedisTable::clock() const {
  std::lock_guard<std::mutex> lock(mu_);
  return with_redirects([&] {
    auto rep = run({meta_read()});
    refresh_meta(rep[0]->element[0], rep[0]->element[1], rep[0]->element[2]);
    return meta_.clock;
  });
}

void RedisTable::set_clock(int64_t c) {
  std::lock_guard<std::mutex> lock(mu_);
  with_redirects([&] {
    auto rep = run({{"HSET", meta_key_, "clock", std::to_string(c)}});
    if (rep[0]->type == REDIS_REPLY_ERROR) throw RedisError("redis: " + reply_text(rep[0].get()));
    return 0;
  });
}

size_t RedisTable::memory_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return with_redirects([&] {
    std::vector<std::pair<int, RedisCommand>> cmds;
    for (size_t b = 0; b < buckets_.size(); ++b)
      cmds.emplace_back(slice_slot_[b], RedisCommand{"MEMORY", "USAGE", buckets_[b]});
    auto rep = router_->run_routed(cmds);
    size_t total = 0;
    for (const auto& r : rep)
      if (r->type == REDIS_REPLY_INTEGER) total += static_cast<size_t>(r->integer);
    return total;
  });
}

}  // namespace dualemb
#endif  // DUALEMB_HAVE_HIREDIS
