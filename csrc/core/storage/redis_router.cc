#ifdef DUALEMB_HAVE_HIREDIS
#include "redis_router.h"

#include <algorithm>
#include <array>

namespace dualemb {
namespace {

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the checksum Redis Cluster's key
// slots are defined with (the Redis Cluster specification, "Keys distribution model").
uint16_t crc16(const char* p, size_t n) {
  static const std::array<uint16_t, 256> table = [] {
    std::array<uint16_t, 256> t{};
    for (int i = 0; i < 256; ++i) {
      uint16_t c = static_cast<uint16_t>(i << 8);
      for (int b = 0; b < 8; ++b)
        c = static_cast<uint16_t>((c & 0x8000) ? (c << 1) ^ 0x1021 : c << 1);
      t[i] = c;
    }
    return t;
  }();
  uint16_t crc = 0;
  for (size_t i = 0; i < n; ++i)
    crc =
        static_cast<uint16_t>((crc << 8) ^ table[((crc >> 8) ^ static_cast<uint8_t>(p[i])) & 0xff]);
  return crc;
}

std::string text(const redisReply* r) {
  return r && r->str ? std::string(r->str, r->len) : std::string();
}

}  // namespace

int redis_key_slot(const std::string& key) {
  // The hash tag: the bytes between the first '{' and the next '}', if not empty.
  const size_t open = key.find('{');
  if (open != std::string::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string::npos && close > open + 1)
      return crc16(key.data() + open + 1, close - open - 1) & (kClusterSlots - 1);
  }
  return crc16(key.data(), key.size()) & (kClusterSlots - 1);
}

const std::string& redis_tag_for_slot(int slot) {
  // Filled once: counting up from 0, every slot's first number (about 170,000 CRCs, a few ms).
  static const std::vector<std::string> tags = [] {
    std::vector<std::string> t(kClusterSlots);
    int missing = kClusterSlots;
    for (uint64_t n = 0; missing > 0; ++n) {
      std::string s = std::to_string(n);
      const int sl = crc16(s.data(), s.size()) & (kClusterSlots - 1);
      if (t[sl].empty()) {
        t[sl] = std::move(s);
        --missing;
      }
    }
    return t;
  }();
  return tags.at(static_cast<size_t>(slot));
}

RedisRouter::RedisRouter(const RedisOptions& options)
    : options_(options), seed_(new RedisConnection(options)) {}

void RedisRouter::load_map() {
  // Asked of a fresh connection, which tries every configured address in turn: the node that
  // answered before may be the one that is gone.
  RedisConnection probe(options_);
  auto rep = probe.pipeline({{"CLUSTER", "SLOTS"}});
  const redisReply* r = rep[0].get();
  if (!r || r->type != REDIS_REPLY_ARRAY)
    throw RedisError("redis at " + probe.where() + ": CLUSTER SLOTS failed: " + text(r) +
                     " (is it a cluster node? mode 'cluster' needs one)");
  const std::string asked = probe.where();
  std::vector<int> map(kClusterSlots, -1);
  std::vector<std::string> nodes;
  for (size_t i = 0; i < r->elements; ++i) {
    const redisReply* e = r->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
        e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2)
      throw RedisError("redis at " + asked +
                       ": CLUSTER SLOTS gave an entry this client cannot read");
    const int from = static_cast<int>(e->element[0]->integer);
    const int to = static_cast<int>(e->element[1]->integer);
    std::string host = text(e->element[2]->element[0]);
    if (host.empty() || host == "?") host = asked.substr(0, asked.rfind(':'));
    const std::string addr = host + ":" + std::to_string(e->element[2]->element[1]->integer);
    auto it = std::find(nodes.begin(), nodes.end(), addr);
    const int idx = static_cast<int>(it - nodes.begin());
    if (it == nodes.end()) nodes.push_back(addr);
    for (int s = std::max(from, 0); s <= to && s < kClusterSlots; ++s) map[s] = idx;
  }
  slot_node_ = std::move(map);
  nodes_ = std::move(nodes);
}

RedisConnection& RedisRouter::at(int slot) {
  if (!cluster()) return *seed_;
  if (slot_node_.empty()) load_map();
  const int idx = slot_node_.at(static_cast<size_t>(slot));
  if (idx < 0)
    throw RedisError("redis cluster: no master serves hash slot " + std::to_string(slot) +
                     " (CLUSTER SLOTS); is the cluster complete?");
  const std::string& addr = nodes_[idx];
  auto& conn = conns_[addr];
  if (!conn) {
    RedisOptions o = options_;
    o.mode = RedisOptions::kStandalone;  // this node only: its slots come from the map
    const size_t colon = addr.rfind(':');
    o.addresses = {{addr.substr(0, colon), std::atoi(addr.c_str() + colon + 1)}};
    conn.reset(new RedisConnection(std::move(o)));
  }
  return *conn;
}

std::string RedisRouter::where(int slot) {
  if (!cluster() || slot_node_.empty()) return seed_->where();
  const int idx = slot_node_.at(static_cast<size_t>(slot));
  return idx < 0 ? std::string("(no node)") : nodes_[idx];
}

void RedisRouter::check_redirects(const std::vector<RedisReply>& replies) {
  for (const auto& rep : replies) {
    if (!rep || rep->type != REDIS_REPLY_ERROR) continue;
    const std::string e = text(rep.get());
    if (e.rfind("MOVED ", 0) == 0) {
      slot_node_.clear();  // reloaded at the next call
      throw RedisMoved();
    }
    if (e.rfind("ASK ", 0) == 0)
      throw RedisError("redis cluster: a slot of the table is being migrated (" + e +
                       "); retry when the migration is done");
  }
}

std::vector<RedisReply> RedisRouter::run(int slot, const std::vector<RedisCommand>& cmds) {
  std::vector<RedisReply> replies = at(slot).pipeline(cmds);
  check_redirects(replies);
  return replies;
}

std::vector<RedisReply> RedisRouter::run_routed(
    const std::vector<std::pair<int, RedisCommand>>& cmds, std::vector<std::string>* errors) {
  std::vector<RedisReply> out(cmds.size());
  if (errors) errors->assign(cmds.size(), std::string());
  // Group by connection, keeping each group in the callers' order.
  std::vector<std::pair<RedisConnection*, std::vector<size_t>>> groups;
  for (size_t i = 0; i < cmds.size(); ++i) {
    RedisConnection* c = nullptr;
    try {
      c = &at(cmds[i].first);
    } catch (const RedisError& e) {
      if (!errors) throw;
      (*errors)[i] = e.what();
      continue;
    }
    auto g =
        std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == c; });
    if (g == groups.end()) {
      groups.push_back({c, {}});
      g = groups.end() - 1;
    }
    g->second.push_back(i);
  }
  for (auto& g : groups) {
    std::vector<RedisCommand> batch;
    batch.reserve(g.second.size());
    for (size_t i : g.second) batch.push_back(cmds[i].second);
    try {
      auto rep = g.first->pipeline(batch);
      for (size_t k = 0; k < rep.size(); ++k) out[g.second[k]] = std::move(rep[k]);
    } catch (const RedisError& e) {
      if (!errors) throw;
      for (size_t i : g.second) (*errors)[i] = e.what();
    }
  }
  if (!errors) check_redirects(out);
  return out;
}

std::vector<std::vector<int>> RedisRouter::master_slots() {
  if (slot_node_.empty()) load_map();
  std::vector<std::vector<int>> per(nodes_.size());
  for (int s = 0; s < kClusterSlots; ++s)
    if (slot_node_[s] >= 0) per[slot_node_[s]].push_back(s);
  per.erase(std::remove_if(per.begin(), per.end(), [](const auto& v) { return v.empty(); }),
            per.end());
  std::sort(per.begin(), per.end(), [](const auto& a, const auto& b) { return a[0] < b[0]; });
  return per;
}

}  // namespace dualemb
#endif  // DUALEMB_HAVE_HIREDIS
