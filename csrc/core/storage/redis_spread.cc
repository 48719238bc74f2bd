// redis_spread.cc — batches of a Redis table whose slices are spread over a Cluster's nodes
// (docs/redis.md "Batches over several nodes"). No Redis transaction spans nodes, so a batch is:
//
//  1. claim  (meta's node, MULTI/EXEC under the WATCH of the read phase): a new batch token T
//     (meta's txn + 1), `pending` = T with the slices it touches, and a lock key with a lease
//     (PX) saying that its writer is alive. Other writers and readers wait while the lock lives.
//  2. apply  (each slice's node, one Lua script per slice and chunk): unless the slice's state
//     key says T was already rolled back (or a later batch ran), write the rows the batch
//     replaces into the slice's undo hash, the keys it creates into its undo set, mark the
//     slice "U:T", then HSET/HDEL the rows. Undo record and rows change in one atomic step.
//  3. commit (meta's node): if `pending` is still T and nobody revoked it, delete `pending`
//     and the lock in one MULTI/EXEC. This is the moment the batch counts as done.
//  4. tidy   (best effort): drop the undo records of T.
//
// A batch that fails before its commit is rolled back (recover()): first `revoked` = T in meta
// (so its writer can no longer commit), then on every slice a script restores the undo record
// of T, or, where T never arrived, marks the slice "X:T", so that a late copy of T's script
// (a node that was paused, not dead) changes nothing; then `pending` is deleted. A clear is
// finished instead of undone (it keeps no copy of the table). When a node cannot be reached,
// `pending` stays: every call on the table raises, naming the node, until the first call after
// the node is back completes the rollback. States carry the token, and tokens only grow, so
// an old script never undoes a newer batch.
//
// Reads (snapshot()) read meta, the slices, then meta's clock again: equal clocks with nothing
// pending mean that no batch wrote in between.
#ifdef DUALEMB_HAVE_HIREDIS
#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "redis_table.h"

namespace dualemb {
namespace {

constexpr int kMaxRounds = 64;

// KEYS: rows, undo rows, undo created, state. ARGV: T, #old, old pairs, #created, created,
// #del, del, set pairs. 0: T was rolled back or a later batch ran (nothing done); 1: applied.
const char* kApplyScript = R"lua(
local T = tonumber(ARGV[1])
local s = redis.call('GET', KEYS[4])
local tk = s and tonumber(string.sub(s, 3)) or -1
if tk > T or (tk == T and string.sub(s, 1, 1) ~= 'U') then return 0 end
if tk < T then redis.call('DEL', KEYS[2], KEYS[3]) end
redis.call('SET', KEYS[4], 'U:' .. ARGV[1])
local i = 2
local function send(cmd, key, count)
  local last = i + count - 1
  while i <= last do
    local e = math.min(last, i + 3999)
    redis.call(cmd, key, unpack(ARGV, i, e))
    i = e + 1
  end
end
local n = tonumber(ARGV[i]); i = i + 1
send('HSET', KEYS[2], 2 * n)
n = tonumber(ARGV[i]); i = i + 1
send('SADD', KEYS[3], n)
n = tonumber(ARGV[i]); i = i + 1
send('HDEL', KEYS[1], n)
send('HSET', KEYS[1], #ARGV - i + 1)
return 1
)lua";

// Rolls T back on one slice. 1: restored (or marked "X:T" where T had not arrived); 0: already
// rolled back, or a later batch ran.
const char* kRestoreScript = R"lua(
local T = tonumber(ARGV[1])
local s = redis.call('GET', KEYS[4])
local tk = s and tonumber(string.sub(s, 3)) or -1
if tk > T or (tk == T and string.sub(s, 1, 1) ~= 'U') then return 0 end
if tk == T then
  local old = redis.call('HGETALL', KEYS[2])
  for i = 1, #old, 4000 do
    redis.call('HSET', KEYS[1], unpack(old, i, math.min(#old, i + 3999)))
  end
  local made = redis.call('SMEMBERS', KEYS[3])
  for i = 1, #made, 4000 do
    redis.call('HDEL', KEYS[1], unpack(made, i, math.min(#made, i + 3999)))
  end
end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('SET', KEYS[4], 'X:' .. ARGV[1])
return 1
)lua";

// Clears one slice for batch T (also to finish an interrupted clear): 0 when already done.
const char* kClearScript = R"lua(
local s = redis.call('GET', KEYS[4])
if s and tonumber(string.sub(s, 3)) >= tonumber(ARGV[1]) then return 0 end
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3])
redis.call('SET', KEYS[4], 'X:' .. ARGV[1])
return 1
)lua";

// After T's commit: its undo records are no longer needed.
const char* kDoneScript = R"lua(
if redis.call('GET', KEYS[4]) ~= 'U:' .. ARGV[1] then return 0 end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('SET', KEYS[4], 'C:' .. ARGV[1])
return 1
)lua";

// Deletes the lock only if it is still the caller's.
const char* kReleaseScript = R"lua(
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
)lua";

std::string join(const std::vector<size_t>& v) {
  std::string s;
  for (size_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

std::vector<size_t> split(const std::string& s) {
  std::vector<size_t> v;
  size_t at = 0;
  while (at < s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    v.push_back(static_cast<size_t>(std::stoull(s.substr(at, comma - at))));
    at = comma + 1;
  }
  return v;
}

std::string random_token() {
  static thread_local std::mt19937_64 gen(std::random_device{}());
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(gen()));
  return buf;
}

}  // namespace

RedisTable::Snapshot RedisTable::snapshot(
    const std::vector<std::pair<size_t, RedisCommand>>& cmds) const {
  Snapshot snap;
  if (!spread_) {  // one slot: one MULTI/EXEC
    std::vector<RedisCommand> all = {meta_read()};
    for (const auto& c : cmds) all.push_back(c.second);
    snap.owned = transaction(all);
    const redisReply* exec = snap.owned[0].get();
    snap.meta = exec->element[0];
    for (size_t i = 1; i < exec->elements; ++i) snap.replies.push_back(exec->element[i]);
    return snap;
  }
  // Spread: read meta, the slices, then meta's clock again. Every batch bumps the clock before
  // it touches a slice and keeps `pending` set until it is done, so an unchanged clock with
  // nothing pending means no batch wrote in between: the reads are one state of the table.
  std::vector<std::pair<int, RedisCommand>> routed;
  for (const auto& c : cmds) routed.emplace_back(slice_slot_[c.first], c.second);
  for (int attempt = 0; attempt < kMaxRounds; ++attempt) {
    auto head = run({meta_read()});
    if (head[0]->type != REDIS_REPLY_ARRAY)
      throw RedisError("redis at " + router_->where(meta_slot_) +
                       " refused a read: " + reply_text(head[0].get()));
    if (head[0]->element[5]->type != REDIS_REPLY_NIL) {
      settle();
      continue;
    }
    auto got = router_->run_routed(routed);
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i]->type == REDIS_REPLY_ERROR)
        throw RedisError("redis at " + router_->where(routed[i].first) +
                         " refused a read: " + reply_text(got[i].get()));
    auto tail = run({{"HMGET", meta_key_, "clock", "pending"}});
    if (tail[0]->type == REDIS_REPLY_ARRAY &&
        reply_text(tail[0]->element[0]) == reply_text(head[0]->element[0]) &&
        tail[0]->element[1]->type == REDIS_REPLY_NIL) {
      snap.owned.push_back(std::move(head[0]));
      snap.meta = snap.owned[0].get();
      for (auto& g : got) {
        snap.owned.push_back(std::move(g));
        snap.replies.push_back(snap.owned.back().get());
      }
      return snap;
    }
  }
  throw RedisError("redis table " + prefix_ + ": " + std::to_string(kMaxRounds) +
                   " writes in a row changed it while it was being read");
}

int64_t RedisTable::lease_ms() const {
  // Long enough for a batch's writer to finish every round trip it needs; see docs/redis.md.
  return std::max<int64_t>(10000, 10 * timeouts_ms_);
}

std::vector<RedisCommand> RedisTable::spread_script(const char* script, size_t slice,
                                                    const std::string& token) const {
  return {{"EVAL", script, "4", slice_key(slice, 'b'), slice_key(slice, 'u'), slice_key(slice, 'n'),
           slice_key(slice, 't'), token}};
}

bool RedisTable::commit_spread(std::vector<SliceChange>& changes, bool clear_all,
                               RedisCommand meta_update, int64_t txn) {
  const std::string token = std::to_string(txn + 1);
  std::vector<size_t> touched;
  for (size_t b = 0; b < changes.size(); ++b)
    if (clear_all || !changes[b].empty()) touched.push_back(b);
  const std::string name = "redis table " + prefix_;

  // 1. Claim.
  for (const char* f : {"txn", "pending"}) {
    meta_update.push_back(f);
    meta_update.push_back(token);
  }
  meta_update.insert(meta_update.end(), {"pending_kind", clear_all ? "clear" : "rows",
                                         "pending_slices", join(touched)});
  std::vector<RedisReply> claim;
  try {
    claim = run({{"MULTI"},
                 meta_update,
                 {"SET", lock_key_, token, "PX", std::to_string(lease_ms())},
                 {"EXEC"}});
  } catch (const RedisError& e) {
    throw RedisError(std::string(e.what()) +
                     "; nothing of this batch was written to the rows "
                     "(if its claim on the table arrived, the next call on the table releases "
                     "it once its lease of " +
                     std::to_string(lease_ms()) + " ms is over)");
  }
  const redisReply* exec = claim.back().get();
  if (exec->type == REDIS_REPLY_NIL) return false;  // a concurrent write won: redo
  if (exec->type != REDIS_REPLY_ARRAY)
    throw RedisError(name + ": redis at " + router_->where(meta_slot_) + " refused the batch: " +
                     reply_text(exec) + "; nothing of this batch was written");

  // 2. Apply, slice by slice (one pipeline per node), at most keys_sending_size rows a script.
  std::vector<std::pair<int, RedisCommand>> cmds;
  std::vector<size_t> cmd_slice;
  const size_t per = static_cast<size_t>(keys_sending_size_);
  for (size_t b : touched) {
    if (clear_all) {
      cmds.emplace_back(slice_slot_[b], spread_script(kClearScript, b, token)[0]);
      cmd_slice.push_back(b);
      continue;
    }
    const SliceChange& c = changes[b];
    const size_t rows =
        std::max({c.old.size() / 2, c.created.size(), c.del.size(), c.set.size() / 2});
    for (size_t from = 0; from < rows; from += per) {
      RedisCommand e = spread_script(kApplyScript, b, token)[0];
      auto add = [&](const std::vector<std::string>& v, size_t width, bool counted) {
        const size_t lo = std::min(v.size(), from * width),
                     hi = std::min(v.size(), (from + per) * width);
        if (counted) e.push_back(std::to_string((hi - lo) / width));
        e.insert(e.end(), v.begin() + lo, v.begin() + hi);
      };
      add(c.old, 2, true);
      add(c.created, 1, true);
      add(c.del, 1, true);
      add(c.set, 2, false);
      cmds.emplace_back(slice_slot_[b], std::move(e));
      cmd_slice.push_back(b);
    }
  }
  std::vector<std::string> errors;
  std::vector<RedisReply> got = router_->run_routed(cmds, &errors);
  std::vector<size_t> applied, failed;
  std::string why;
  bool fenced = false;
  for (size_t i = 0; i < cmds.size(); ++i) {
    const size_t b = cmd_slice[i];
    const redisReply* r = got[i].get();
    std::string err = errors[i];
    if (err.empty() && (!r || r->type != REDIS_REPLY_INTEGER))
      err = "redis at " + router_->where(slice_slot_[b]) + " refused it: " + reply_text(r);
    if (!err.empty()) {
      if (std::find(failed.begin(), failed.end(), b) == failed.end()) {
        failed.push_back(b);
        why += (why.empty() ? "" : "; ") + std::string("slice ") + std::to_string(b) + ": " + err;
      }
    } else if (r->integer == 0) {
      fenced = true;
    } else if (std::find(applied.begin(), applied.end(), b) == applied.end()) {
      applied.push_back(b);
    }
  }
  applied.erase(std::remove_if(applied.begin(), applied.end(),
                               [&](size_t b) {
                                 return std::find(failed.begin(), failed.end(), b) != failed.end();
                               }),
                applied.end());

  if (failed.empty() && !fenced) {
    // 3. Commit.
    for (int round = 0;; ++round) {
      std::vector<RedisReply> head;
      try {
        head = run({{"WATCH", meta_key_}, {"HMGET", meta_key_, "pending", "revoked"}});
        if (head[1]->type != REDIS_REPLY_ARRAY)
          throw RedisError("redis at " + router_->where(meta_slot_) + ": " +
                           reply_text(head[1].get()));
        if (reply_text(head[1]->element[0]) != token || reply_text(head[1]->element[1]) == token) {
          run({{"UNWATCH"}});
          throw RedisError(name +
                           ": this batch was applied to every slice but took longer "
                           "than its lease of " +
                           std::to_string(lease_ms()) +
                           " ms, and "
                           "another call rolled it back: the table is as it was before it");
        }
        auto done =
            run({{"MULTI"},
                 {"HDEL", meta_key_, "pending", "pending_kind", "pending_slices", "revoked"},
                 {"DEL", lock_key_},
                 {"EXEC"}});
        if (done.back()->type == REDIS_REPLY_ARRAY) break;
        if (round + 1 >= kMaxRounds) throw RedisError("meta kept changing");
      } catch (const RedisError& e) {
        if (std::string(e.what()).rfind(name, 0) == 0) throw;
        throw RedisError(name + ": this batch was applied to every slice (" + join(touched) +
                         ") but its commit failed: " + e.what() +
                         ". If the commit did not "
                         "arrive, the next call on this table rolls the batch back; which of "
                         "the two happened is unknown (read the keys back)");
      }
    }
    // 4. Tidy (best effort: a later batch replaces the undo records anyway).
    try {
      std::vector<std::pair<int, RedisCommand>> tidy;
      for (size_t b : touched)
        tidy.emplace_back(slice_slot_[b], spread_script(kDoneScript, b, token)[0]);
      std::vector<std::string> ignored;
      router_->run_routed(tidy, &ignored);
    } catch (...) {
    }
    return true;
  }

  // The batch failed on some slice: roll it back (or finish the clear) while holding the lock.
  Recovery r = recover(token, touched, clear_all);
  std::string msg = name + ": a batch over " + std::to_string(touched.size()) + " slices (" +
                    join(touched) + ") failed";
  if (!failed.empty()) msg += " on slice(s) " + join(failed) + " (" + why + ")";
  if (fenced) msg += "; another call had found its lease over and rolled it back";
  if (clear_all) {
    msg += r.done
               ? "; a clear is finished rather than undone, and it was: every slice is "
                 "cleared"
               : "; slice(s) " + join(applied) +
                     " were cleared; a clear is finished rather "
                     "than undone, and finishing it needs " +
                     r.failed +
                     ": every call on this "
                     "table raises until then, and the first call that reaches it clears the rest";
  } else {
    msg += "; it had been applied to slice(s) " +
           (applied.empty() ? std::string("none") : join(applied));
    msg += r.done ? ", which were rolled back: the table is as it was before the batch"
                  : "; rolling it back needs " + r.failed +
                        ": every call on this table raises "
                        "until then, and the first call that reaches it rolls the batch back (the "
                        "table as it was before the batch)";
  }
  if (!r.done) {
    try {
      run({{"EVAL", kReleaseScript, "1", lock_key_, token}});  // the next call may recover now
    } catch (...) {
    }
  }
  throw RedisError(msg);
}

RedisTable::Recovery RedisTable::recover(const std::string& token,
                                         const std::vector<size_t>& slices, bool clear) const {
  Recovery res;
  auto meta_failed = [&](const std::exception& e) {
    res.done = false;
    res.failed = "meta on node " + router_->where(meta_slot_) + " (" + e.what() + ")";
    return res;
  };
  // Revoke: from here on the batch's writer cannot commit it.
  try {
    for (int round = 0;; ++round) {
      auto head = run({{"WATCH", meta_key_}, {"HMGET", meta_key_, "pending", "revoked"}});
      if (head[1]->type != REDIS_REPLY_ARRAY) throw RedisError(reply_text(head[1].get()));
      if (reply_text(head[1]->element[0]) != token) {  // someone else finished it
        run({{"UNWATCH"}});
        return res;
      }
      if (reply_text(head[1]->element[1]) == token) {
        run({{"UNWATCH"}});
        break;
      }
      auto ex = run({{"MULTI"}, {"HSET", meta_key_, "revoked", token}, {"EXEC"}});
      if (ex.back()->type == REDIS_REPLY_ARRAY) break;
      if (round + 1 >= kMaxRounds) throw RedisError("meta kept changing");
    }
  } catch (const RedisError& e) {
    return meta_failed(e);
  }
  // Undo (or finish the clear) on every slice the batch named.
  std::vector<std::pair<int, RedisCommand>> cmds;
  for (size_t b : slices)
    cmds.emplace_back(slice_slot_[b],
                      spread_script(clear ? kClearScript : kRestoreScript, b, token)[0]);
  std::vector<std::string> errors;
  std::vector<RedisReply> got = router_->run_routed(cmds, &errors);
  for (size_t i = 0; i < cmds.size(); ++i) {
    std::string err = errors[i];
    if (err.empty() && (!got[i] || got[i]->type != REDIS_REPLY_INTEGER))
      err = "refused: " + reply_text(got[i].get());
    if (!err.empty()) {
      res.done = false;
      res.failed += (res.failed.empty() ? "" : "; ") + std::string("slice ") +
                    std::to_string(slices[i]) + " on node " + router_->where(cmds[i].first) + " (" +
                    err + ")";
    }
  }
  if (!res.done) return res;
  // Resolve: meta forgets the batch; the table is usable again.
  try {
    for (int round = 0;; ++round) {
      auto head = run({{"WATCH", meta_key_}, {"HGET", meta_key_, "pending"}});
      if (reply_text(head[1].get()) != token) {
        run({{"UNWATCH"}});
        return res;
      }
      auto ex = run({{"MULTI"},
                     {"HDEL", meta_key_, "pending", "pending_kind", "pending_slices", "revoked"},
                     {"DEL", lock_key_},
                     {"EXEC"}});
      if (ex.back()->type == REDIS_REPLY_ARRAY) return res;
      if (round + 1 >= kMaxRounds) throw RedisError("meta kept changing");
    }
  } catch (const RedisError& e) {
    return meta_failed(e);
  }
}

void RedisTable::settle() const {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(lease_ms() + timeouts_ms_);
  const std::string name = "redis table " + prefix_;
  for (int round = 0;; ++round) {
    auto rep = run(
        {{"HMGET", meta_key_, "pending", "pending_kind", "pending_slices"}, {"PTTL", lock_key_}});
    if (rep[0]->type != REDIS_REPLY_ARRAY || rep[1]->type != REDIS_REPLY_INTEGER)
      throw RedisError("redis at " + router_->where(meta_slot_) + ": " + reply_text(rep[0].get()) +
                       reply_text(rep[1].get()));
    if (rep[0]->element[0]->type == REDIS_REPLY_NIL) return;
    const std::string token = reply_text(rep[0]->element[0]);
    const bool clear = reply_text(rep[0]->element[1]) == "clear";
    if (rep[1]->integer != -2) {  // the lock lives: its writer (or a recovery) is at work
      if (Clock::now() > deadline)
        throw RedisError(name + ": a batch (txn " + token +
                         ") of another writer has held the "
                         "table for longer than its lease of " +
                         std::to_string(lease_ms()) + " ms");
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(1 << std::min(round, 6), 50)));
      continue;
    }
    // The writer is gone or gave up: take the lock and roll its batch back.
    const std::string me = "recovery-" + random_token();
    auto got = run({{"SET", lock_key_, me, "NX", "PX", std::to_string(lease_ms())}});
    if (got[0]->type != REDIS_REPLY_STATUS) continue;  // another call is recovering it
    Recovery r = recover(token, split(reply_text(rep[0]->element[2])), clear);
    if (!r.done) {
      try {
        run({{"EVAL", kReleaseScript, "1", lock_key_, me}});
      } catch (...) {
      }
      throw RedisError(name + ": a batch (txn " + token +
                       ") failed before it was committed, "
                       "after " +
                       (clear ? "clearing" : "changing") + " part of the table; " +
                       (clear ? "finishing the clear"
                              : "rolling it back (the table as before "
                                "that batch)") +
                       " needs " + r.failed +
                       ". Every call on this table raises this until "
                       "then; the first call that reaches every slice completes it");
    }
  }
}

}  // namespace dualemb
#endif  // DUALEMB_HAVE_HIREDIS
