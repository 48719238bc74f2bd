// redis_connection.h — one hiredis connection to the Redis node that holds a table: connect and
// command timeouts, AUTH/SELECT, Sentinel master lookup, Cluster MOVED redirection, pipelines.
//
// A connection that fails (refused, timed out, reset) is dropped; the next call reconnects, so a
// table works again once its server is back. Every failure throws RedisError naming the server
// and the cause; nothing here retries a command that may have reached the server.
#ifndef DUALEMB_STORAGE_REDIS_CONNECTION_H_
#define DUALEMB_STORAGE_REDIS_CONNECTION_H_
#ifdef DUALEMB_HAVE_HIREDIS

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <hiredis.h>

namespace dualemb {

class RedisError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct RedisOptions {
  enum Mode { kStandalone, kCluster, kSentinel };
  Mode mode = kStandalone;
  std::vector<std::pair<std::string, int>> addresses;  // nodes, or sentinels (kSentinel)
  std::string master_name;                              // kSentinel
  std::string user, password;
  int64_t db = 0;
  int64_t connect_timeout_ms = 1000, command_timeout_ms = 1000;
};

// A command: its arguments as binary-safe strings.
using RedisCommand = std::vector<std::string>;

// A reply's string payload (binary-safe), or "" for a null reply or one without a string.
inline std::string reply_text(const redisReply* r) {
  return r && r->str ? std::string(r->str, r->len) : std::string();
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using RedisReply = std::unique_ptr<redisReply, ReplyDeleter>;

class RedisConnection {
 public:
  explicit RedisConnection(RedisOptions options) : options_(std::move(options)) {}
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends all commands in one pipeline (redisAppendCommandArgv), then reads one reply each
  // (redisGetReply). Error replies are returned, not thrown. Throws RedisError when the server
  // cannot be reached or does not answer within the command timeout (the connection is dropped).
  std::vector<RedisReply> pipeline(const std::vector<RedisCommand>& commands);
  // Points the connection at another node (a Cluster MOVED answer: "host:port").
  void redirect(const std::string& address);
  // The node in use (or to be used), "host:port".
  std::string where() const;
  const RedisOptions& options() const { return options_; }

 private:
  void connect();
  redisContext* open(const std::string& host, int port, bool with_auth);
  void drop();
  [[noreturn]] void fail(const std::string& doing);

  RedisOptions options_;
  redisContext* ctx_ = nullptr;
  std::string host_;  // current node; empty: pick from options_ at the next connect
  int port_ = 0;
};

}  // namespace dualemb

#endif  // DUALEMB_HAVE_HIREDIS
#endif  // DUALEMB_STORAGE_REDIS_CONNECTION_H_
