// redis_router.h — which Redis node serves which key: Cluster hash slots (CRC16 of the hash tag),
// the slot -> master map from CLUSTER SLOTS, one connection per node, and hash tags chosen to land
// on a given slot, so a table's slices can be spread over the masters (docs/redis.md).
//
// Outside Cluster mode every slot is served by the one connection (standalone or Sentinel's
// master). A MOVED answer refreshes the map and throws RedisMoved: the caller redoes its call.
#ifndef DUALEMB_STORAGE_REDIS_ROUTER_H_
#define DUALEMB_STORAGE_REDIS_ROUTER_H_
#ifdef DUALEMB_HAVE_HIREDIS

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "redis_connection.h"

namespace dualemb {

constexpr int kClusterSlots = 16384;

// Thrown when Cluster answered MOVED: the slot map was refreshed, redo the call.
struct RedisMoved {};

// The Cluster hash slot of a Redis key: CRC16 (XMODEM) of its hash tag ({...}) or of the key.
int redis_key_slot(const std::string& key);

// The shortest decimal number whose CRC16 lands on `slot`: "{<it>}" as a hash tag puts a key on
// that slot.
const std::string& redis_tag_for_slot(int slot);

class RedisRouter {
 public:
  explicit RedisRouter(const RedisOptions& options);

  bool cluster() const { return options_.mode == RedisOptions::kCluster; }
  // Sends `cmds` in one pipeline to the node serving `slot`. Error replies are returned; MOVED
  // refreshes the map and throws RedisMoved; ASK throws RedisError.
  std::vector<RedisReply> run(int slot, const std::vector<RedisCommand>& cmds);
  // Sends each command to the node serving its slot (one pipeline per node, nodes in turn);
  // replies in the order of `cmds`. With `errors`, a node that fails does not stop the others:
  // its commands get a null reply and (*errors)[i] says why; without, the first failure throws.
  std::vector<RedisReply> run_routed(const std::vector<std::pair<int, RedisCommand>>& cmds,
                                     std::vector<std::string>* errors = nullptr);
  // "host:port" of the node serving `slot` (the seed addresses before the first call).
  std::string where(int slot);
  // Slots of each master, masters ordered by their lowest slot (Cluster only).
  std::vector<std::vector<int>> master_slots();

 private:
  RedisConnection& at(int slot);
  void load_map();
  void check_redirects(const std::vector<RedisReply>& replies);

  RedisOptions options_;
  std::unique_ptr<RedisConnection> seed_;  // standalone / Sentinel; Cluster: before the map
  std::vector<int> slot_node_;             // slot -> index into nodes_, -1 = unserved
  std::vector<std::string> nodes_;         // "host:port" of each master
  std::map<std::string, std::unique_ptr<RedisConnection>> conns_;
};

}  // namespace dualemb

#endif  // DUALEMB_HAVE_HIREDIS
#endif  // DUALEMB_STORAGE_REDIS_ROUTER_H_
