#ifdef DUALEMB_HAVE_HIREDIS
#include "redis_connection.h"

#include <sys/time.h>

#include <cerrno>
#include <cstring>

namespace dualemb {
namespace {

timeval to_timeval(int64_t ms) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

// Runs one command on a fresh context (AUTH, SELECT, SENTINEL); throws with `what` on failure.
RedisReply command(redisContext* c, const RedisCommand& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  return RedisReply(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
}

// hiredis reports a socket timeout as an I/O error with errno's text (EAGAIN).
bool timed_out(const redisContext* c) {
  return c && c->err == REDIS_ERR_IO &&
         (std::strstr(c->errstr, "temporarily unavailable") || std::strstr(c->errstr, "timed out"));
}

}  // namespace

RedisConnection::~RedisConnection() { drop(); }

void RedisConnection::drop() {
  if (ctx_) redisFree(ctx_);
  ctx_ = nullptr;
}

std::string RedisConnection::where() const {
  if (!host_.empty()) return host_ + ":" + std::to_string(port_);
  std::string s;
  for (const auto& a : options_.addresses)
    s += (s.empty() ? "" : ",") + a.first + ":" + std::to_string(a.second);
  return s;
}

void RedisConnection::redirect(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos)
    throw RedisError("redis cluster redirected to a malformed address '" + address + "'");
  drop();
  host_ = address.substr(0, colon);
  port_ = std::atoi(address.c_str() + colon + 1);
}

redisContext* RedisConnection::open(const std::string& host, int port, bool with_auth) {
  const std::string at = host + ":" + std::to_string(port);
  redisContext* c = redisConnectWithTimeout(host.c_str(), port,
                                            to_timeval(options_.connect_timeout_ms));
  if (!c) throw RedisError("cannot connect to redis at " + at + ": out of memory");
  if (c->err) {
    std::string why = c->errstr;
    redisFree(c);
    throw RedisError("cannot connect to redis at " + at + " within " +
                     std::to_string(options_.connect_timeout_ms) + " ms: " + why);
  }
  redisSetTimeout(c, to_timeval(options_.command_timeout_ms));
  auto check = [&](RedisReply r, const std::string& doing) {
    if (!r || r->type == REDIS_REPLY_ERROR) {
      std::string why = r ? reply_text(r.get()) : std::string(c->errstr);
      if (!r && timed_out(c))
        why = "did not answer within " + std::to_string(options_.command_timeout_ms) +
              " ms (server down, paused or overloaded?)";
      redisFree(c);
      throw RedisError("redis at " + at + ": " + doing + " failed: " + why);
    }
    return r;
  };
  if (with_auth) {
    if (!options_.password.empty()) {
      RedisCommand auth = {"AUTH"};
      if (!options_.user.empty() && options_.user != "default") auth.push_back(options_.user);
      auth.push_back(options_.password);
      check(command(c, auth), "AUTH (user '" + (options_.user.empty() ? std::string("default")
                                                                          : options_.user) + "')");
    } else {
      check(command(c, {"PING"}), "PING");  // a server that needs a password says so here
    }
    if (options_.db != 0) check(command(c, {"SELECT", std::to_string(options_.db)}),
                                "SELECT " + std::to_string(options_.db));
  }
  return c;
}

void RedisConnection::connect() {
  if (ctx_) return;
  if (!host_.empty()) {
    ctx_ = open(host_, port_, true);
    return;
  }
  std::string errors;
  if (options_.mode == RedisOptions::kSentinel) {
    for (const auto& s : options_.addresses) {
      try {
        redisContext* c = open(s.first, s.second, false);
        RedisReply r = command(c, {"SENTINEL", "get-master-addr-by-name", options_.master_name});
        redisFree(c);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2)
          throw RedisError("sentinel at " + s.first + ":" + std::to_string(s.second) +
                           " knows no master named '" + options_.master_name + "'");
        host_ = reply_text(r->element[0]);
        port_ = std::atoi(reply_text(r->element[1]).c_str());
        ctx_ = open(host_, port_, true);
        return;
      } catch (const RedisError& e) {
        host_.clear();
        errors += std::string(errors.empty() ? "" : "; ") + e.what();
      }
    }
    throw RedisError("no redis sentinel gave the master '" + options_.master_name + "': " + errors);
  }
  for (const auto& a : options_.addresses) {
    try {
      ctx_ = open(a.first, a.second, true);
      host_ = a.first;
      port_ = a.second;
      return;
    } catch (const RedisError& e) {
      errors += std::string(errors.empty() ? "" : "; ") + e.what();
    }
  }
  throw RedisError(errors);
}

void RedisConnection::fail(const std::string& doing) {
  std::string why = ctx_ ? ctx_->errstr : "no connection";
  const bool late = timed_out(ctx_);
  const std::string at = where();
  drop();  // a broken context cannot be reused; the next call reconnects
  if (late)
    throw RedisError("redis at " + at + " did not answer within " +
                     std::to_string(options_.command_timeout_ms) + " ms while " + doing +
                     " (server down, paused or overloaded?)");
  throw RedisError("redis at " + at + ": connection lost while " + doing + ": " + why);
}

std::vector<RedisReply> RedisConnection::pipeline(const std::vector<RedisCommand>& commands) {
  connect();
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const auto& cmd : commands) {
    argv.clear();
    lens.clear();
    for (const auto& a : cmd) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()) !=
        REDIS_OK)
      fail("queueing a command");
  }
  std::vector<RedisReply> replies;
  replies.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* r = nullptr;
    if (redisGetReply(ctx_, &r) != REDIS_OK || !r)
      fail(i == 0 ? "sending a batch" : "reading replies");
    replies.emplace_back(static_cast<redisReply*>(r));
  }
  return replies;
}

}  // namespace dualemb
#endif  // DUALEMB_HAVE_HIREDIS
