// "redis://[USER:PASSWORD@]HOST[:PORT][/DB]": descriptors as Redis string
// keys (metadata/entries.h layout: <cluster>/segments/<engine name>, value =
// the encoded descriptor) that expire `metadata_ttl` after their last write.
//
//  - Connection string: PORT defaults to 6379, DB (a decimal index) to 0,
//    "redis://:PASSWORD@H:P" authenticates with a password only (AUTH pw),
//    "redis://USER:PASSWORD@H:P" as an ACL user (AUTH user pw); user and
//    password are %-decoded; IPv6 hosts in brackets. rediss:// (TLS) is
//    kUnimplemented. Messages never show the password (redis://u:***@h:p).
//  - Claim: one Lua script does SET key value NX PX ttl and, when the key
//    exists, returns its type, value and PTTL in the same atomic step; a
//    value of this engine's instance (a republish, or an earlier write whose
//    reply was lost) is overwritten. Another holder's entry that expires
//    before connect_timeout runs out (less 300 ms) is waited for, as the etcd
//    store does (an engine restarted right after its predecessor died takes
//    the name over); anything else is kAlreadyExists naming the holder and
//    when its entry expires.
//  - Republish, refresh (every ttl/3, from the refresher of
//    metadata/poller.h) and removal are
//    compare-and-set scripts: they write (or DEL) only if the key still holds
//    the bytes this store last wrote, or (writes) holds nothing. So after a
//    Redis restart (empty) the entries come back within ttl/3, and a name
//    another engine took over meanwhile is never stolen back while that
//    engine's entry lives (logged once, as an error).
//  - Watch: polling. Every 500 ms one MGET reads every name Fetch returned;
//    a changed or vanished value calls the callback. Keyspace notifications
//    were not used: they need `notify-keyspace-events` configured on the
//    server (CONFIG SET is often forbidden on managed Redis and by ACLs), a
//    dedicated subscriber connection, and they are lost while disconnected,
//    so polling would be needed as the fallback anyway; one round trip per
//    500 ms for the handful of peers an engine opens is cheap. Values that
//    vanish in the first TTL after the poller had to reconnect are not
//    reported: that is a restarted, empty server, and the owners' refreshes
//    bring the entries back.
//  - Every call is bounded: connects by redisConnectWithTimeout, commands by
//    redisSetTimeout, both with what is left of the caller's deadline
//    (Fetch), of connect_timeout (Publish, Remove, creation) or of a third
//    of the TTL (refresh, at most 2 s); polls by 500 ms. Each call takes a
//    connection of its own from a small pool (the poller keeps its own); a
//    connection that fails is dropped, and a call on a connection that had
//    worked reconnects once (the server restarted or closed it idle).
//  - Values are untrusted: anything that is not a descriptor of the name
//    asked for is kDataLoss naming the key, never a crash. A value is read
//    whole (the server's proto-max-bulk-len, 512 MB by default, bounds it).
//  - A wrong password or user is kUnauthenticated, an ACL user that may not
//    run a command kFailedPrecondition.
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "common/fd_limit.h"
#include "common/log.h"
#include "metadata/entries.h"
#include "metadata/metadata.h"
#include "metadata/poller.h"
#include "metadata/registry.h"

namespace ferry::internal {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kPollInterval{500};
constexpr milliseconds kPollTimeout{500};
constexpr milliseconds kClaimReserve{
    300};  // a claim stops waiting for a dying holder this long before its deadline
constexpr milliseconds kClaimRetry{200};  // and looks again this often
constexpr size_t kIdleConnections = 4;
constexpr int kDefaultPort = 6379;
constexpr char kExample[] =
    "expected redis://[USER:PASSWORD@]HOST[:PORT][/DB], e.g. redis://10.0.0.1:6379/0 or "
    "redis://:secret@10.0.0.1:6379";

// KEYS[1] key, ARGV[1] value, ARGV[2] ttl ms. 1 if it took the free key, else
// {type, value or nil, pttl} of what holds it.
constexpr char kClaimScript[] = R"lua(
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
local t = redis.call('TYPE', KEYS[1]).ok
local v = false
if t == 'string' then v = redis.call('GET', KEYS[1]) end
return {t, v, redis.call('PTTL', KEYS[1])}
)lua";

// KEYS[1] key, ARGV[1] expected value, ARGV[2] new value, ARGV[3] ttl ms.
// Writes if the key is absent or holds the expected value: 1; else as above.
constexpr char kPutScript[] = R"lua(
local t = redis.call('TYPE', KEYS[1]).ok
local v = false
if t == 'string' then v = redis.call('GET', KEYS[1]) end
if t == 'none' or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return {t, v, redis.call('PTTL', KEYS[1])}
)lua";

// KEYS[1] key, ARGV[1] expected value. Deletes it if it holds that value: 1;
// else the string it holds, or 0.
constexpr char kRemoveScript[] = R"lua(
if redis.call('TYPE', KEYS[1]).ok ~= 'string' then return 0 end
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return v
)lua";

// ---- the connection string ------------------------------------------------------

struct Url {
  std::string masked;  // as given, the password replaced by ***
  std::string host;
  int port = kDefaultPort;
  int db = 0;
  bool has_password = false;
  std::string user;  // empty: AUTH with the password only
  std::string password;
};

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// `text` with anything that may be a password replaced by ***: the part of
// the user information after its first ':' (all of it without one).
std::string Mask(std::string_view text) {
  const size_t scheme = text.find("://");
  if (scheme == std::string_view::npos) return std::string(text);
  const std::string_view rest = text.substr(scheme + 3);
  const size_t at = rest.rfind('@');
  if (at == std::string_view::npos) return std::string(text);
  const std::string_view userinfo = rest.substr(0, at);
  const size_t colon = userinfo.find(':');
  const std::string shown =
      colon == std::string_view::npos ? "***" : std::string(userinfo.substr(0, colon)) + ":***";
  return std::string(text.substr(0, scheme + 3)) + shown + std::string(rest.substr(at));
}

std::optional<std::string> PercentDecode(std::string_view s) {
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) return std::nullopt;
    const int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

StatusOr<Url> ParseUrl(std::string_view text) {
  Url u;
  u.masked = Mask(text);
  const auto bad = [&](const std::string& why) {
    return InvalidArgumentError("metadata '" + u.masked + "': " + why + " (" + kExample + ")");
  };
  if (StartsWith(text, "rediss://")) {
    return UnimplementedError(
        "metadata '" + u.masked +
        "': TLS (rediss://) is not supported by Ferry's Redis client; use redis:// "
        "(on a trusted network, or through a TLS tunnel such as stunnel)");
  }
  if (!StartsWith(text, "redis://")) return bad("not a redis:// URL");
  if (std::any_of(text.begin(), text.end(),
                  [](char c) { return static_cast<unsigned char>(c) <= ' ' || c == 0x7f; })) {
    return bad("a space or control character (%-encode it in the user or password)");
  }
  std::string_view rest = text.substr(std::string_view("redis://").size());
  const size_t at = rest.rfind('@');
  if (at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = userinfo.find(':');
    if (colon == std::string_view::npos) {
      return bad(
          "the part before '@' must be USER:PASSWORD or :PASSWORD (a password alone needs the "
          "':')");
    }
    auto user = PercentDecode(userinfo.substr(0, colon));
    auto password = PercentDecode(userinfo.substr(colon + 1));
    if (!user || !password)
      return bad("a malformed %-escape in the user or password (%XX, two hex digits)");
    if (password->empty()) return bad("an empty password");
    u.user = std::move(*user);
    u.password = std::move(*password);
    u.has_password = true;
  }
  if (rest.find_first_of("?#") != std::string_view::npos)
    return bad("a query or fragment is not allowed");
  const size_t slash = rest.find('/');
  const std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) {
      if (!AllDigits(db) || db.size() > 9) {
        return bad("the database must be a decimal index such as /0, not '/" + std::string(db) +
                   "'");
      }
      u.db = std::atoi(std::string(db).c_str());
    }
  }
  std::string_view port;
  bool has_port = false;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("an unterminated [IPv6 address]");
    u.host = std::string(authority.substr(1, close - 1));
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("junk after ']'");
      port = after.substr(1);
      has_port = true;
    }
  } else {
    if (std::count(authority.begin(), authority.end(), ':') > 1) {
      return bad("an IPv6 address must be in brackets, e.g. redis://[::1]:6379");
    }
    const size_t colon = authority.find(':');
    u.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      has_port = true;
    }
  }
  if (u.host.empty()) return bad("no host");
  if (has_port) {
    const int value =
        AllDigits(port) && port.size() <= 5 ? std::atoi(std::string(port).c_str()) : 0;
    if (value < 1 || value > 65535)
      return bad("a bad port '" + std::string(port) + "' (1 to 65535)");
    u.port = value;
  }
  return u;
}

// ---- one connection --------------------------------------------------------------

// A reply, copied out of hiredis's.
struct Value {
  int type = 0;     // REDIS_REPLY_*
  std::string str;  // STRING, STATUS, ERROR
  long long integer = 0;
  std::vector<Value> elements;

  bool is_error() const { return type == REDIS_REPLY_ERROR; }
  bool is_nil() const { return type == REDIS_REPLY_NIL; }
};

Value Copy(const redisReply* r) {
  Value v;
  v.type = r->type;
  if (r->str != nullptr) v.str.assign(r->str, r->len);
  v.integer = r->integer;
  for (size_t i = 0; i < r->elements; ++i) v.elements.push_back(Copy(r->element[i]));
  return v;
}

timeval ToTimeval(milliseconds ms) {
  ms = std::max(ms, milliseconds(1));  // 0 would mean "no timeout"
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

milliseconds Left(Clock::time_point deadline) {
  return std::chrono::ceil<milliseconds>(deadline - Clock::now());
}

// hiredis writes with write(2): a server that closed the connection would
// raise SIGPIPE and kill the process. Blocks it on this thread for the
// scope and swallows one that this scope raised.
class NoSigpipe {
 public:
  NoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~NoSigpipe() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  NoSigpipe(const NoSigpipe&) = delete;
  NoSigpipe& operator=(const NoSigpipe&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

// Whether a refusal is about the credentials.
bool IsAuthError(const std::string& e) {
  return StartsWith(e, "NOAUTH") || StartsWith(e, "WRONGPASS") ||
         e.find("invalid password") != std::string::npos ||
         e.find("invalid username-password") != std::string::npos ||
         e.find("without any password configured") != std::string::npos;
}

// Credentials the server refused, or none where it needs some. The fix is
// in the connection string; status.h has no code for authentication yet.
Status AuthError(std::string message) { return UnauthenticatedError(std::move(message)); }

// What a client should do about an error reply to `what` (a command name).
Status MapErrorReply(const std::string& error, const std::string& what, const std::string& masked) {
  const std::string where = "the Redis server at " + masked;
  if (StartsWith(error, "NOAUTH")) {
    return AuthError(
        where +
        " requires a password: give it in the connection string "
        "(redis://:PASSWORD@HOST:PORT, or redis://USER:PASSWORD@HOST:PORT for an ACL user) (" +
        error + ")");
  }
  if (IsAuthError(error)) {
    return AuthError(where + " refused the credentials in the connection string (" + error + ")");
  }
  if (StartsWith(error, "NOPERM")) {
    return FailedPreconditionError(
        where + " does not let this user run " + what +
        " (grant it +get +set +del +mget +type +pttl +eval and the key pattern; " + error + ")");
  }
  if (StartsWith(error, "LOADING") || StartsWith(error, "BUSY") || StartsWith(error, "TRYAGAIN") ||
      StartsWith(error, "MASTERDOWN") || StartsWith(error, "CLUSTERDOWN") ||
      StartsWith(error, "READONLY")) {
    return UnavailableError(where + " cannot serve " + what + " now: " + error);
  }
  if (StartsWith(error, "OOM"))
    return ResourceExhaustedError(where + " is out of memory for " + what + ": " + error);
  if (StartsWith(error, "MOVED") || StartsWith(error, "ASK ")) {
    return FailedPreconditionError(where + " is a Redis Cluster node, which is not supported (" +
                                   error + ")");
  }
  return FailedPreconditionError(where + " refused " + what + ": " + error);
}

class Connection {
 public:
  explicit Connection(const Url& url) : url_(url) {}
  ~Connection() { Drop(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // One command, bounded by `deadline`: the reply (perhaps an error reply)
  // or, when none came, kUnavailable saying why (or the connect's error).
  StatusOr<Value> Run(const std::vector<std::string>& args, Clock::time_point deadline) {
    for (int attempt = 0;; ++attempt) {
      bool fresh = false;
      if (c_ == nullptr) {
        FERRY_RETURN_IF_ERROR(Connect(deadline));
        fresh = true;
      }
      std::string why;
      auto reply = Send(args, deadline, &why);
      if (reply.has_value()) return std::move(*reply);
      Drop();
      // A connection that had worked may have been closed (server restart,
      // idle timeout): one more try on a new one, if time is left.
      if (fresh || attempt > 0 || Left(deadline).count() <= 0) {
        return UnavailableError("cannot reach the Redis server at " + url_.masked + ": " + why);
      }
    }
  }

  bool connected() const { return c_ != nullptr; }
  // How many times it connected (a poller tells reconnections by this).
  uint64_t connects() const { return connects_; }

 private:
  Status Connect(Clock::time_point deadline) {
    const milliseconds left = Left(deadline);
    const std::string unreachable = "cannot reach the Redis server at " + url_.masked + ": ";
    if (left.count() <= 0) return UnavailableError(unreachable + "no time left to connect");
    c_ = redisConnectWithTimeout(url_.host.c_str(), url_.port, ToTimeval(left));
    if (c_ == nullptr) return UnavailableError(unreachable + "out of memory");
    if (c_->err != 0) {
      if (OutOfDescriptors()) {
        Drop();
        return DescriptorError(StatusCode::kUnavailable,
                               "cannot connect to the Redis server at " + url_.masked, EMFILE);
      }
      std::string why = c_->errstr;
      if (why.find("Resource temporarily unavailable") != std::string::npos ||
          why.find("timed out") != std::string::npos) {
        why = "connect timed out after " + std::to_string(left.count()) + " ms";
      }
      Drop();
      return UnavailableError(unreachable + why);
    }
    // Prove the connection (and the credentials, and the database) now.
    std::vector<std::vector<std::string>> setup;
    if (url_.has_password) {
      setup.push_back(url_.user.empty()
                          ? std::vector<std::string>{"AUTH", url_.password}
                          : std::vector<std::string>{"AUTH", url_.user, url_.password});
    }
    if (url_.db != 0) setup.push_back({"SELECT", std::to_string(url_.db)});
    if (setup.empty()) setup.push_back({"PING"});
    for (const auto& command : setup) {
      std::string why;
      auto reply = Send(command, deadline, &why);
      if (!reply.has_value()) {
        Drop();
        return UnavailableError(unreachable + why);
      }
      if (reply->is_error()) {
        Drop();
        if (command[0] == "SELECT" && !IsAuthError(reply->str)) {
          return InvalidArgumentError("metadata '" + url_.masked +
                                      "': the Redis server has no database " +
                                      std::to_string(url_.db) + " (" + reply->str + ")");
        }
        return MapErrorReply(reply->str, command[0], url_.masked);
      }
    }
    ++connects_;
    return OkStatus();
  }

  std::optional<Value> Send(const std::vector<std::string>& args, Clock::time_point deadline,
                            std::string* why) {
    const milliseconds left = Left(deadline);
    if (left.count() <= 0) {
      *why = "no time left for " + args[0];
      return std::nullopt;
    }
    if (redisSetTimeout(c_, ToTimeval(left)) != REDIS_OK) {
      *why = "cannot set a socket timeout";
      return std::nullopt;
    }
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    redisReply* r;
    {
      NoSigpipe guard;
      r = static_cast<redisReply*>(
          redisCommandArgv(c_, static_cast<int>(argv.size()), argv.data(), lens.data()));
    }
    if (r == nullptr) {
      *why = c_->errstr[0] != '\0' ? c_->errstr : "no reply";
      if (why->find("Resource temporarily unavailable") != std::string::npos) {
        *why = "no answer to " + args[0] + " within " + std::to_string(left.count()) + " ms";
      }
      return std::nullopt;
    }
    Value v = Copy(r);
    freeReplyObject(r);
    return v;
  }

  void Drop() {
    if (c_ != nullptr) redisFree(c_);
    c_ = nullptr;
  }

  const Url& url_;
  redisContext* c_ = nullptr;
  uint64_t connects_ = 0;
};

// ---- the store --------------------------------------------------------------------

// An entry this store wrote and keeps refreshed.
struct Published {
  std::string bytes;
  uint64_t instance_id = 0;
  bool lost = false;     // another engine holds the name now (logged once)
  bool failing = false;  // the last refresh did not get through (logged once)
};

class RedisStore : public MetadataStore {
 public:
  RedisStore(Url url, const MetadataContext& ctx)
      : url_(std::move(url)),
        where_("the Redis server at " + url_.masked),
        cluster_(ctx.cluster),
        ttl_(std::max(ctx.ttl, milliseconds(1))),
        write_timeout_(std::max(ctx.timeout, milliseconds(1))),
        format_(ctx.descriptor_format_max),
        poll_conn_(url_),
        poller_({[this] { return PublishedNames(); },
                 [this](const std::string& name, milliseconds timeout) { Refresh(name, timeout); },
                 [this](const std::vector<std::string>& names) { return Read(names); }},
                kPollInterval) {}

  ~RedisStore() override { poller_.Stop(); }

  // Connects once, so that a wrong address, password or database fails the
  // engine's creation.
  Status Start() {
    auto conn = Acquire();
    FERRY_ASSIGN_OR_RETURN(Value v, conn->Run({"PING"}, Clock::now() + write_timeout_));
    if (v.is_error()) return MapErrorReply(v.str, "PING", url_.masked);
    Release(std::move(conn));
    return OkStatus();
  }

  Status Publish(const wire::PeerDescriptor& self) override {
    std::string bytes;
    wire::EncodeDescriptor(self, &bytes, std::min(format_, wire::LowestFormatFor(self)));
    const std::string key = Key(self.engine_name);
    const auto deadline = Clock::now() + write_timeout_;
    std::lock_guard<std::mutex> write(write_mu_);
    std::optional<std::string> expected;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = published_.find(self.engine_name);
      if (it != published_.end()) expected = it->second.bytes;
    }
    FERRY_RETURN_IF_ERROR(
        Write(self.engine_name, self.instance_id, key, expected, bytes, deadline));
    {
      std::lock_guard<std::mutex> lock(mu_);
      Published& p = published_[self.engine_name];
      p.bytes = std::move(bytes);
      p.instance_id = self.instance_id;
      p.lost = p.failing = false;
    }
    poller_.SetTtl(ttl_);
    return OkStatus();
  }

  StatusOr<wire::PeerDescriptor> Fetch(std::string_view name, const wire::PeerDescriptor&,
                                       Clock::time_point deadline) override {
    const std::string key = Key(name);
    const std::string segment = "segment '" + std::string(name) + "'";
    if (Left(deadline).count() <= 0) {
      return UnavailableError("no time left to ask the Redis server at " + url_.masked + " for " +
                              segment);
    }
    auto conn = Acquire();
    auto reply = conn->Run({"GET", key}, deadline);
    if (!reply.ok()) return reply.status().WithPrefix("looking up " + segment);
    Release(std::move(conn));
    if (reply->is_error()) {
      if (StartsWith(reply->str, "WRONGTYPE")) {
        return DataLossError("the key '" + key + "' in " + where_ +
                             " does not hold a descriptor (" + reply->str + ")");
      }
      return MapErrorReply(reply->str, "GET", url_.masked).WithPrefix("looking up " + segment);
    }
    if (reply->is_nil())
      return UnavailableError("no " + segment + " in the Redis server at " + url_.masked);
    if (reply->type != REDIS_REPLY_STRING) {
      return DataLossError("the Redis server at " + url_.masked + " answered GET " + key +
                           " with a reply of type " + std::to_string(reply->type));
    }
    FERRY_ASSIGN_OR_RETURN(wire::PeerDescriptor desc, DecodeEntry(name, key, reply->str, where_));
    poller_.Seen(std::string(name), std::move(reply->str));
    return desc;
  }

  Status Remove(std::string_view name) override {
    const std::string key = Key(name);
    const auto deadline = Clock::now() + write_timeout_;
    std::lock_guard<std::mutex> write(write_mu_);  // no refresh overtakes the removal
    Published p;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = published_.find(std::string(name));
      if (it == published_.end()) {
        return NotFoundError("this engine published no segment '" + std::string(name) + "'");
      }
      p = std::move(it->second);
      published_.erase(it);
    }
    std::string expected = p.bytes;
    for (int round = 0; round < 2; ++round) {
      FERRY_ASSIGN_OR_RETURN(
          Value v, Call({"EVAL", kRemoveScript, "1", key, expected}, deadline, "EVAL (remove)"));
      if (v.type != REDIS_REPLY_STRING) return OkStatus();  // deleted, or nothing of ours was there
      // Bytes of this instance that a write whose reply was lost left there.
      if (InstanceOfEntry(v.str) != p.instance_id)
        return OkStatus();  // another engine's: not ours to delete
      expected = std::move(v.str);
    }
    return OkStatus();
  }

  Status Watch(ChangeCallback on_change) override { return poller_.Watch(std::move(on_change)); }

 private:
  std::string Key(std::string_view name) const { return SegmentKey(cluster_, name); }

  std::unique_ptr<Connection> Acquire() {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (idle_.empty()) return std::make_unique<Connection>(url_);
    auto conn = std::move(idle_.back());
    idle_.pop_back();
    return conn;
  }

  void Release(std::unique_ptr<Connection> conn) {
    if (!conn->connected()) return;
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (idle_.size() < kIdleConnections) idle_.push_back(std::move(conn));
  }

  // A command on a pooled connection; error replies become statuses.
  StatusOr<Value> Call(const std::vector<std::string>& args, Clock::time_point deadline,
                       const std::string& what) {
    auto conn = Acquire();
    FERRY_ASSIGN_OR_RETURN(Value v, conn->Run(args, deadline));
    Release(std::move(conn));
    if (v.is_error()) return MapErrorReply(v.str, what, url_.masked);
    return v;
  }

  static std::string ExpiryHint(long long pttl_ms) {
    if (pttl_ms > 0) {
      return "; if that engine is gone, its entry expires within " +
             std::to_string((pttl_ms + 999) / 1000) + " s";
    }
    if (pttl_ms == -1)
      return "; the key has no expiry (not written by a Ferry engine?): delete it to free the name";
    return "";
  }

  // Writes `bytes` under `key` for engine `name` of instance `instance`:
  // claims the key when `expected` is empty, else replaces `expected` (or
  // nothing). A value of this very instance is replaced too; anything else
  // is kAlreadyExists naming its holder. A claim (and only a claim) waits
  // for another holder's entry that expires before `deadline`: an engine
  // restarted right after its predecessor died takes the name over.
  Status Write(const std::string& name, uint64_t instance, const std::string& key,
               std::optional<std::string> expected, const std::string& bytes,
               Clock::time_point deadline) {
    const std::string ttl = std::to_string(ttl_.count());
    const bool claim = !expected.has_value();
    for (int round = 0; round < 1000; ++round) {
      StatusOr<Value> v =
          expected ? Call({"EVAL", kPutScript, "1", key, *expected, bytes, ttl}, deadline,
                          "EVAL (compare-and-set)")
                   : Call({"EVAL", kClaimScript, "1", key, bytes, ttl}, deadline, "EVAL (claim)");
      if (!v.ok()) return v.status().WithPrefix("writing key '" + key + "'");
      if (v->type == REDIS_REPLY_INTEGER && v->integer == 1) return OkStatus();
      if (v->type != REDIS_REPLY_ARRAY || v->elements.size() != 3) {
        return UnavailableError(
            "the Redis server at " + url_.masked + " answered a write of key '" + key +
            "' with an unexpected reply (type " + std::to_string(v->type) + ")");
      }
      const std::string& type = v->elements[0].str;
      const Value& held = v->elements[1];
      const long long pttl = v->elements[2].integer;
      Status mine;
      if (type != "string" || held.type != REDIS_REPLY_STRING) {
        mine =
            AlreadyExistsError("segment name '" + name + "' is taken in " + where_ +
                               " by a key of type " + type + " ('" + key + "')" + ExpiryHint(pttl));
      } else {
        wire::PeerDescriptor self;
        self.engine_name = name;
        self.instance_id = instance;
        mine = CheckClaim(self, key, held.str, where_, ExpiryHint(pttl));
      }
      if (mine.ok()) {
        expected = held.str;  // this instance's own entry: replace it
        continue;
      }
      // Another holder. One whose entry runs out within the time left (its
      // engine died moments ago) is waited for; a live one is refused.
      const milliseconds time_left = Left(deadline) - kClaimReserve;
      if (!claim || pttl <= 0 || milliseconds(pttl) >= time_left) return mine;
      if (!poller_.WaitFor(std::min(milliseconds(pttl) + milliseconds(1), kClaimRetry))) {
        return CancelledError("the store is shutting down");
      }
    }
    return UnavailableError("the value under key '" + key + "' in " + where_ +
                            " kept changing while this engine wrote it");
  }

  std::vector<std::string> PublishedNames() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> names;
    for (const auto& [name, p] : published_) names.push_back(name);
    return names;
  }

  // The refresher's compare-and-set of one entry.
  void Refresh(const std::string& name, milliseconds timeout) {
    std::lock_guard<std::mutex> write(write_mu_);
    Published p;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = published_.find(name);
      if (it == published_.end()) return;  // removed meanwhile
      p = it->second;
    }
    const Status s =
        Write(name, p.instance_id, Key(name), p.bytes, p.bytes, Clock::now() + timeout);
    Report(name, s);
  }

  // Logs a refresh's outcome once per change of state.
  void Report(const std::string& name, const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = published_.find(name);
    if (it == published_.end()) return;
    Published& p = it->second;
    if (s.ok()) {
      if (p.lost || p.failing) {
        FERRY_LOG(kWarning, "segment " << name << " is refreshed in " << where_ << " again");
      }
      p.lost = p.failing = false;
    } else if (s.code() == StatusCode::kAlreadyExists) {
      if (!p.lost) {
        FERRY_LOG(kError,
                  "segment " << name << " was taken over in " << where_ << ": " << s.message()
                             << ". This engine does not take the name back while that entry lives; "
                                "peers opening '"
                             << name << "' now reach the other engine");
      }
      p.lost = true;
    } else {
      if (!p.failing) {
        FERRY_LOG(kWarning, "cannot refresh segment "
                                << name << " in " << where_ << ": " << s.message()
                                << "; it expires unless a refresh gets through");
      }
      p.failing = true;
    }
  }

  // The watcher's poll: one MGET of every name on the watcher's own
  // connection; no reply says nothing about any name.
  std::vector<StorePoller::Reading> Read(const std::vector<std::string>& names) {
    std::vector<std::string> args{"MGET"};
    for (const std::string& name : names) args.push_back(Key(name));
    auto reply = poll_conn_.Run(args, Clock::now() + kPollTimeout);
    if (!reply.ok() || reply->type != REDIS_REPLY_ARRAY || reply->elements.size() != names.size())
      return {};
    if (poll_conn_.connects() != seen_connects_) {
      // Reconnected: the server may have restarted empty. Its entries come
      // back with their owners' next refreshes; vanished values are not
      // news until a TTL has passed.
      if (seen_connects_ != 0) grace_until_ = Clock::now() + ttl_ + kPollInterval;
      seen_connects_ = poll_conn_.connects();
    }
    const bool grace = Clock::now() < grace_until_;
    std::vector<StorePoller::Reading> out(names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      const Value& e = reply->elements[i];
      if (e.type == REDIS_REPLY_STRING)
        out[i].value = e.str;  // MGET answers nil for other types too
      out[i].known = out[i].value.has_value() || !grace;
    }
    return out;
  }

  const Url url_;
  const std::string where_;
  const std::string cluster_;
  const milliseconds ttl_;
  const milliseconds write_timeout_;  // Publish, Remove, creation: no deadline is given
  const uint16_t format_;
  std::mutex pool_mu_;
  std::vector<std::unique_ptr<Connection>> idle_;  // guarded by pool_mu_
  std::mutex write_mu_;  // one write of this store's entries at a time; taken before mu_
  std::mutex mu_;
  std::map<std::string, Published> published_;  // guarded by mu_
  // The watcher's (StorePoller::Hooks::read) own connection, how many times
  // it had connected at the last poll, and until when vanished values are
  // not news (after a reconnect). Used on the watcher thread only.
  Connection poll_conn_;
  uint64_t seen_connects_ = 0;
  Clock::time_point grace_until_{};
  StorePoller poller_;  // last: its threads use the members above
};

}  // namespace

StatusOr<std::unique_ptr<MetadataStore>> MakeRedisStore(std::string_view url,
                                                        const MetadataContext& ctx) {
  FERRY_ASSIGN_OR_RETURN(Url u, ParseUrl(url));
  auto store = std::make_unique<RedisStore>(std::move(u), ctx);
  FERRY_RETURN_IF_ERROR(store->Start());
  return std::unique_ptr<MetadataStore>(std::move(store));
}

std::string_view RedisStoreLacks() { return ""; }

}  // namespace ferry::internal
