// "etcd://H:P[,H:P...]" or a bare "H:P[,H:P...]": descriptors in etcd v3,
// through the JSON gateway every etcd (3.4 and later) serves on its client
// port (POST /v3/kv/range, /v3/kv/txn, /v3/lease/*, /v3/watch; keys and
// values base64). Why the gateway and not gRPC: it needs only an HTTP client
// (cpp-httplib, which the HTTP store uses already) and a JSON parser; gRPC
// would need etcd's .proto files compiled into Ferry and a gRPC stack for a
// handful of small, rare calls.
//
// Keys: metadata/entries.h (<cluster>/segments/<name>), each attached to one
// lease of this store. The lease is granted at the first Publish with the
// metadata_ttl (rounded up to whole seconds) and kept alive every third of
// the TTL by a thread; a crashed engine's keys vanish when its lease
// expires. When a keep-alive finds the lease gone (etcd was unreachable for
// longer than the TTL, or the cluster lost it) the store grants a new one
// and claims its names again.
//
// Claims are atomic: a transaction puts the key only if it does not exist
// (create_revision == 0); otherwise the holder's descriptor decides — the
// same instance may overwrite (compare-and-put on the revision it read),
// another is refused naming it, after waiting up to the call's timeout for
// an entry whose lease is about to run out (an engine restarted right after
// its predecessor died).
//
// A watch on the cluster's prefix (one streamed POST /v3/watch) tells the
// engine at once that a peer changed or left; after the stream breaks it
// resumes from the next revision on any endpoint, and reports every name it
// fetched as changed when it may have missed events (compaction).
//
// Endpoints: calls go to the last endpoint that answered; one that cannot be
// reached or answers 5xx hands the call to the next, within the deadline.
#include <httplib.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "common/fd_limit.h"
#include "common/log.h"
#include "metadata/entries.h"
#include "metadata/metadata.h"
#include "metadata/registry.h"

namespace ferry::internal {
namespace {

using Json = nlohmann::json;
using std::chrono::milliseconds;

constexpr size_t kMaxReply = size_t{64} << 20;  // etcd's own request limit is 1.5 MiB
constexpr milliseconds kMaxKeepAliveTimeout{2000};
constexpr milliseconds kWatchRetry{200};
constexpr milliseconds kClaimReserve{
    300};  // a claim stops waiting for a dying holder this long before its deadline
constexpr milliseconds kWatchIdleTimeout{60000};  // a silent stream is re-opened after this

// The key right after every key with `prefix` (etcd's range_end).
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<uint8_t>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

// etcd's int64 fields arrive as JSON strings ("123"); 0 when absent or bad.
int64_t Int(const Json& j, const char* field) {
  if (!j.is_object()) return 0;
  auto it = j.find(field);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string()) return 0;
  const std::string& s = it->get_ref<const std::string&>();
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  return end != s.c_str() && *end == '\0' ? v : 0;
}

std::string Str(const Json& j, const char* field) {
  if (!j.is_object()) return "";
  auto it = j.find(field);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// True only for a present JSON `true` (json::value would throw on another type,
// and the bytes come from the network).
bool Bool(const Json& j, const char* field) {
  if (!j.is_object()) return false;
  auto it = j.find(field);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

// ---- the connection string ---------------------------------------------------

struct Endpoint {
  std::string host;
  int port = 2379;
  std::string text;  // "host:port" as shown in messages
};

StatusOr<std::vector<Endpoint>> ParseEndpoints(std::string_view url) {
  const std::string whole(url);
  const auto bad = [&](const std::string& why) {
    return InvalidArgumentError("metadata '" + whole + "': " + why +
                                " (expected etcd://HOST:PORT[,HOST:PORT...] or HOST:PORT, e.g. "
                                "etcd://10.0.0.1:2379,10.0.0.2:2379)");
  };
  std::string_view rest = url;
  if (rest.substr(0, 7) == "etcd://") rest.remove_prefix(7);
  if (rest.empty()) return bad("no endpoint");
  std::vector<Endpoint> out;
  size_t start = 0;
  while (start <= rest.size()) {
    size_t comma = rest.find(',', start);
    if (comma == std::string_view::npos) comma = rest.size();
    std::string_view item = rest.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) return bad("an empty endpoint");
    if (item.find_first_of("/?#@ ") != std::string_view::npos)
      return bad("endpoint '" + std::string(item) + "' has a path, query, user or space");
    Endpoint e;
    std::string_view port;
    bool has_port = false;
    if (item.front() == '[') {
      const size_t close = item.find(']');
      if (close == std::string_view::npos)
        return bad("unterminated [IPv6 address] in '" + std::string(item) + "'");
      e.host = std::string(item.substr(1, close - 1));
      std::string_view after = item.substr(close + 1);
      if (!after.empty()) {
        if (after.front() != ':') return bad("junk after ] in '" + std::string(item) + "'");
        port = after.substr(1);
        has_port = true;
      }
    } else {
      const size_t colon = item.rfind(':');
      e.host = std::string(item.substr(0, colon));
      if (colon != std::string_view::npos) {
        port = item.substr(colon + 1);
        has_port = true;
      }
    }
    if (e.host.empty()) return bad("endpoint '" + std::string(item) + "' has no host");
    if (has_port) {
      const bool digits =
          !port.empty() && port.size() <= 5 &&
          std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
      const int p = digits ? std::atoi(std::string(port).c_str()) : 0;
      if (p < 1 || p > 65535) return bad("bad port '" + std::string(port) + "'");
      e.port = p;
    }
    e.text = (e.host.find(':') != std::string::npos ? "[" + e.host + "]" : e.host) + ":" +
             std::to_string(e.port);
    out.push_back(std::move(e));
    if (comma == rest.size()) break;
  }
  return out;
}

// ---- the store ----------------------------------------------------------------

// One answer: the parsed body, or why there was none.
struct Answer {
  Status status;  // not ok: no usable answer
  Json body;
};

class EtcdStore : public MetadataStore {
 public:
  EtcdStore(std::string url, std::vector<Endpoint> endpoints, const MetadataContext& ctx)
      : url_(std::move(url)),
        where_("the etcd cluster at " + url_),
        endpoints_(std::move(endpoints)),
        prefix_(SegmentKeyPrefix(ctx.cluster)),
        cluster_(ctx.cluster),
        ttl_seconds_(std::max<int64_t>(1, (ctx.ttl.count() + 999) / 1000)),
        timeout_(ctx.timeout) {}

  ~EtcdStore() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      if (watch_client_ != nullptr) watch_client_->stop();
    }
    cv_.notify_all();
    if (keeper_.joinable()) keeper_.join();
    if (watcher_.joinable()) watcher_.join();
    int64_t lease;
    {
      std::lock_guard<std::mutex> lock(mu_);
      lease = lease_;
    }
    // Entries still published (an engine that did not Remove) go now rather
    // than when the lease runs out; bounded, best effort.
    if (lease != 0)
      (void)Post("/v3/lease/revoke", Json{{"ID", std::to_string(lease)}}, Deadline(timeout_));
  }

  Status Publish(const wire::PeerDescriptor& self) override {
    std::string bytes;
    wire::EncodeDescriptor(self, &bytes, wire::LowestFormatFor(self));
    std::lock_guard<std::mutex> write(write_mu_);
    const Clock::time_point deadline = Deadline(timeout_);
    FERRY_ASSIGN_OR_RETURN(int64_t lease, EnsureLease(deadline));
    FERRY_RETURN_IF_ERROR(Claim(self, bytes, lease, deadline));
    std::lock_guard<std::mutex> lock(mu_);
    published_[self.engine_name] = Published{self, std::move(bytes)};
    if (!keeper_.joinable()) keeper_ = std::thread([this] { KeepAliveLoop(); });
    return OkStatus();
  }

  StatusOr<wire::PeerDescriptor> Fetch(std::string_view name, const wire::PeerDescriptor&,
                                       Clock::time_point deadline) override {
    const std::string key = SegmentKey(cluster_, name);
    FERRY_ASSIGN_OR_RETURN(Json body, Call("/v3/kv/range", Json{{"key", Base64(key)}}, deadline,
                                           "looking up segment '" + std::string(name) + "'"));
    {
      std::lock_guard<std::mutex> lock(mu_);
      fetched_.insert(std::string(name));
    }
    auto kv = FirstKv(body);
    if (!kv) return UnavailableError("no segment '" + std::string(name) + "' in " + where_);
    std::optional<std::string> value = Unbase64(Str(*kv, "value"));
    if (!value)
      return DataLossError("the value under key '" + key + "' in " + where_ +
                           " is not valid base64");
    return DecodeEntry(name, key, *value, where_);
  }

  Status Remove(std::string_view name) override {
    std::lock_guard<std::mutex> write(write_mu_);
    std::string bytes;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = published_.find(std::string(name));
      if (it == published_.end())
        return NotFoundError("this engine published no segment '" + std::string(name) + "'");
      bytes = std::move(it->second.bytes);
      published_.erase(it);
    }
    // Deletes the key only while it still holds this engine's value.
    const std::string key = Base64(SegmentKey(cluster_, name));
    Json txn{{"compare",
              Json::array({Json{{"target", "VALUE"}, {"key", key}, {"value", Base64(bytes)}}})},
             {"success", Json::array({Json{{"request_delete_range", Json{{"key", key}}}}})}};
    FERRY_ASSIGN_OR_RETURN(Json body, Call("/v3/kv/txn", txn, Deadline(timeout_),
                                           "removing segment '" + std::string(name) + "'"));
    (void)body;
    return OkStatus();
  }

  Status Watch(ChangeCallback on_change) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (watcher_.joinable()) return FailedPreconditionError("this store is already watched");
    callback_ = std::move(on_change);
    watcher_ = std::thread([this] { WatchLoop(); });
    return OkStatus();
  }

 private:
  struct Published {
    wire::PeerDescriptor self;
    std::string bytes;
  };

  static Clock::time_point Deadline(milliseconds timeout) { return Clock::now() + timeout; }

  static std::optional<Json> FirstKv(const Json& range) {
    if (!range.is_object()) return std::nullopt;
    auto kvs = range.find("kvs");
    if (kvs == range.end() || !kvs->is_array() || kvs->empty() || !(*kvs)[0].is_object())
      return std::nullopt;
    return (*kvs)[0];
  }

  // POSTs `body` to each endpoint in turn (from the last that answered) until
  // one answers, within `deadline`.
  Answer Post(const std::string& path, const Json& body, Clock::time_point deadline) {
    const std::string text = body.dump();
    std::string errors;
    const size_t n = endpoints_.size();
    const size_t first = current_.load(std::memory_order_relaxed);
    for (size_t attempt = 0; attempt < n; ++attempt) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        if (errors.empty()) errors = "no time left";
        break;
      }
      // Leave the endpoints not tried yet their share of the time.
      const milliseconds share =
          std::max(left / static_cast<int64_t>(n - attempt), milliseconds(50));
      const size_t index = (first + attempt) % n;
      const Endpoint& ep = endpoints_[index];
      std::string error;
      int status = 0;
      std::string reply;
      try {
        httplib::Client client(ep.host, ep.port);
        SetTimeouts(client, std::min(share, left));
        client.set_keep_alive(false);
        httplib::Result r = client.Post(path, text, "application/json");
        if (!r && r.error() == httplib::Error::Connection && OutOfDescriptors()) {
          return {DescriptorError(StatusCode::kUnavailable, "cannot reach " + where_, EMFILE), {}};
        }
        if (!r) {
          error = httplib::to_string(r.error());
        } else {
          status = r->status;
          reply = std::move(r->body);
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
      if (error.empty() && reply.size() > kMaxReply) error = "an answer larger than 64 MiB";
      if (error.empty() && status >= 500)
        error = "status " + std::to_string(status) + ": " + Brief(reply);
      if (!error.empty()) {
        errors += (errors.empty() ? "" : "; ") + ep.text + ": " + error;
        continue;
      }
      current_.store(index, std::memory_order_relaxed);
      Json parsed = Json::parse(reply, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded() || !parsed.is_object()) {
        return {DataLossError(ep.text + " answered " + path +
                              " with something that is not JSON: " + Brief(reply)),
                {}};
      }
      if (status != 200) {
        const std::string message = Str(parsed, "message");
        return {FailedPreconditionError(ep.text + " refused " + path + " (status " +
                                        std::to_string(status) +
                                        "): " + (message.empty() ? Brief(reply) : message)),
                {}};
      }
      return {OkStatus(), std::move(parsed)};
    }
    return {UnavailableError("cannot reach " + where_ + " (" + errors + ")"), {}};
  }

  // Post, with what was being done and where in the error.
  StatusOr<Json> Call(const std::string& path, const Json& body, Clock::time_point deadline,
                      const std::string& doing) {
    Answer a = Post(path, body, deadline);
    if (!a.status.ok()) return a.status.WithPrefix(doing);
    return std::move(a.body);
  }

  static void SetTimeouts(httplib::Client& client, milliseconds timeout) {
    const int64_t ms = std::max<int64_t>(timeout.count(), 1);
    const time_t sec = static_cast<time_t>(ms / 1000);
    const time_t usec = static_cast<time_t>((ms % 1000) * 1000);
    client.set_connection_timeout(sec, usec);
    client.set_read_timeout(sec, usec);
    client.set_write_timeout(sec, usec);
  }

  static std::string Brief(std::string s) {
    if (s.size() > 200) s.resize(200);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s;
  }

  // This store's lease, granted on first use. REQUIRES: write_mu_ held.
  StatusOr<int64_t> EnsureLease(Clock::time_point deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (lease_ != 0) return lease_;
    }
    FERRY_ASSIGN_OR_RETURN(Json body, Call("/v3/lease/grant", Json{{"TTL", ttl_seconds_}}, deadline,
                                           "granting this engine's lease"));
    const int64_t id = Int(body, "ID");
    const int64_t granted = Int(body, "TTL");
    if (id == 0 || granted <= 0) {
      return DataLossError(where_ + " granted no usable lease (" + Brief(body.dump()) + ")");
    }
    std::lock_guard<std::mutex> lock(mu_);
    lease_ = id;
    granted_ttl_ = std::chrono::seconds(granted);
    return id;
  }

  // Puts `bytes` under self's key with `lease` if the key is free or holds
  // self's own instance. REQUIRES: write_mu_ held.
  Status Claim(const wire::PeerDescriptor& self, const std::string& bytes, int64_t lease,
               Clock::time_point deadline) {
    const std::string raw_key = SegmentKey(cluster_, self.engine_name);
    const std::string key = Base64(raw_key);
    const Json put{
        {"request_put",
         Json{{"key", key}, {"value", Base64(bytes)}, {"lease", std::to_string(lease)}}}};
    const std::string doing = "claiming segment name '" + self.engine_name + "'";
    Json compare = Json{{"target", "CREATE"}, {"key", key}, {"create_revision", "0"}};
    for (int round = 0; round < 1000; ++round) {
      Json txn{{"compare", Json::array({compare})},
               {"success", Json::array({put})},
               {"failure", Json::array({Json{{"request_range", Json{{"key", key}}}}})}};
      FERRY_ASSIGN_OR_RETURN(Json body, Call("/v3/kv/txn", txn, deadline, doing));
      if (Bool(body, "succeeded")) return OkStatus();
      // Someone holds the key: whose is it?
      std::optional<Json> kv;
      if (auto r = body.find("responses"); r != body.end() && r->is_array() && !r->empty()) {
        const Json& first = (*r)[0];
        if (first.is_object() && first.contains("response_range"))
          kv = FirstKv(first["response_range"]);
      }
      if (!kv) {  // deleted in between: try to create it again
        compare = Json{{"target", "CREATE"}, {"key", key}, {"create_revision", "0"}};
        continue;
      }
      std::optional<std::string> existing = Unbase64(Str(*kv, "value"));
      const int64_t holder_lease = Int(*kv, "lease");
      Status mine =
          existing ? CheckClaim(self, raw_key, *existing, where_)
                   : AlreadyExistsError("segment name '" + self.engine_name + "' is taken in " +
                                        where_ + " by a value that is not valid base64");
      if (mine.ok()) {  // this instance's older value: replace exactly that revision
        compare = Json{{"target", "MOD"},
                       {"key", key},
                       {"mod_revision", std::to_string(Int(*kv, "mod_revision"))}};
        continue;
      }
      // Another holder. An entry whose lease runs out within the time left
      // (its engine died moments ago) is waited for; a live one is refused.
      // (-1: expired, its keys about to go; -2: unknown.)
      const int64_t left_s = LeaseSecondsLeft(holder_lease, deadline);
      const auto time_left =
          std::chrono::duration_cast<milliseconds>(deadline - Clock::now()) - kClaimReserve;
      const bool expiring =
          holder_lease != 0 && left_s >= -1 && std::chrono::seconds(left_s) < time_left;
      if (!expiring) {
        std::string hint;
        if (holder_lease == 0)
          hint = " (the entry has no lease: delete the key to free the name)";
        else if (left_s >= -1)
          hint = "; if that engine is gone, its entry expires within " +
                 std::to_string(std::max<int64_t>(left_s + 1, 1)) + " s";
        return existing ? CheckClaim(self, raw_key, *existing, where_, hint) : mine;
      }
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::min(milliseconds(200), time_left), [&] { return stopping_; });
        if (stopping_) return CancelledError("the store is shutting down");
      }
      // Our own lease must outlive the wait (the keep-alive thread starts
      // with the first claim).
      (void)Post("/v3/lease/keepalive", Json{{"ID", std::to_string(lease)}}, deadline);
      compare = Json{{"target", "CREATE"}, {"key", key}, {"create_revision", "0"}};
    }
    return InternalError("gave up " + doing + " in " + where_ + " after 1000 rounds");
  }

  // Seconds the lease has left; -1 when it expired (etcd deletes its keys
  // momentarily), -2 when unknown.
  int64_t LeaseSecondsLeft(int64_t lease, Clock::time_point deadline) {
    if (lease == 0) return -2;
    Answer a = Post("/v3/lease/timetolive", Json{{"ID", std::to_string(lease)}}, deadline);
    if (!a.status.ok()) return -2;
    // (JSON leaves out a TTL of 0: seconds from expiring.)
    return std::max<int64_t>(Int(a.body, "TTL"), -1);
  }

  void KeepAliveLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    bool failing = false;
    while (!stopping_) {
      const milliseconds interval =
          std::max(std::chrono::duration_cast<milliseconds>(granted_ttl_) / 3, milliseconds(100));
      cv_.wait_for(lock, interval, [&] { return stopping_; });
      if (stopping_) break;
      const int64_t lease = lease_;
      lock.unlock();
      const milliseconds timeout = std::clamp(interval, milliseconds(100), kMaxKeepAliveTimeout);
      Status s = KeepAlive(lease, Deadline(timeout));
      if (!s.ok() && !failing) {
        FERRY_LOG(kWarning, "cannot keep this engine's entries alive in "
                                << where_ << ": " << s.message()
                                << "; they expire unless a refresh gets through");
      } else if (s.ok() && failing) {
        FERRY_LOG(kInfo, "this engine's entries in " << where_ << " are kept alive again");
      }
      failing = !s.ok();
      lock.lock();
    }
  }

  // Refreshes `lease`; when etcd lost it, claims every published name again
  // under a new one.
  Status KeepAlive(int64_t lease, Clock::time_point deadline) {
    FERRY_ASSIGN_OR_RETURN(
        Json body, Call("/v3/lease/keepalive", Json{{"ID", std::to_string(lease)}}, deadline,
                        "refreshing the lease"));
    const Json& result = body.contains("result") ? body["result"] : body;
    if (Int(result, "TTL") > 0) return OkStatus();
    // The lease is gone, and with it this engine's keys.
    std::lock_guard<std::mutex> write(write_mu_);
    std::map<std::string, Published> names;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (lease_ != lease) return OkStatus();  // replaced meanwhile
      lease_ = 0;
      names = published_;
    }
    FERRY_LOG(kWarning, "the lease of this engine's entries in "
                            << where_ << " expired; publishing them again");
    const Clock::time_point claim_deadline = Deadline(timeout_);
    FERRY_ASSIGN_OR_RETURN(int64_t fresh, EnsureLease(claim_deadline));
    for (const auto& [name, p] : names) {
      Status s = Claim(p.self, p.bytes, fresh, claim_deadline);
      if (!s.ok())
        FERRY_LOG(kError,
                  "lost segment name '" << name << "' in " << where_ << ": " << s.message());
    }
    return OkStatus();
  }

  void WatchLoop() {
    int64_t next_revision = 0;  // 0: from now
    bool resync = false;        // events may have been missed: report every fetched name
    size_t endpoint = current_.load(std::memory_order_relaxed);
    while (!StopRequested()) {
      if (resync) {
        std::set<std::string> names;
        {
          std::lock_guard<std::mutex> lock(mu_);
          names = fetched_;
        }
        for (const auto& name : names) callback_(name);
        resync = false;
      }
      const Endpoint& ep = endpoints_[endpoint % endpoints_.size()];
      Json create{{"key", Base64(prefix_)}, {"range_end", Base64(PrefixEnd(prefix_))}};
      if (next_revision > 0) create["start_revision"] = std::to_string(next_revision);
      const std::string body = Json{{"create_request", create}}.dump();
      std::string pending;
      bool created = false;
      auto client = std::make_unique<httplib::Client>(ep.host, ep.port);
      SetTimeouts(*client, kWatchIdleTimeout);
      client->set_connection_timeout(std::chrono::seconds(2));
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) break;
        watch_client_ = client.get();
      }
      httplib::Request req;
      req.method = "POST";
      req.path = "/v3/watch";
      req.body = body;
      req.set_header("Content-Type", "application/json");
      req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        pending.append(data, n);
        size_t nl;
        while ((nl = pending.find('\n')) != std::string::npos) {
          const std::string line = pending.substr(0, nl);
          pending.erase(0, nl + 1);
          if (!OnWatchMessage(line, &next_revision, &created, &resync)) return false;
        }
        if (pending.size() > kMaxReply) return false;
        return !StopRequested();
      };
      httplib::Response res;
      httplib::Error error = httplib::Error::Success;
      client->send(req, res, error);
      {
        std::lock_guard<std::mutex> lock(mu_);
        watch_client_ = nullptr;
      }
      if (StopRequested()) break;
      // The stream ended: another endpoint next time, from where it stopped.
      if (!created) ++endpoint;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, kWatchRetry, [&] { return stopping_; });
    }
  }

  // One message of the watch stream. False: stop reading this stream.
  bool OnWatchMessage(const std::string& line, int64_t* next_revision, bool* created,
                      bool* resync) {
    Json msg = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (msg.is_discarded() || !msg.is_object()) return true;  // not ours to judge; keep reading
    const Json& result = msg.contains("result") ? msg["result"] : msg;
    if (!result.is_object()) return true;
    if (Int(result, "compact_revision") > 0 || Bool(result, "canceled")) {
      // etcd no longer has the events since next_revision: start afresh and
      // let the engine re-read every peer it knows.
      *next_revision = 0;
      *resync = true;
      return false;
    }
    if (Bool(result, "created")) {
      *created = true;
      const int64_t now = result.contains("header") ? Int(result["header"], "revision") : 0;
      if (*next_revision > now + 1) {
        // A cluster younger than what we saw (its data was lost): events
        // may be missing; re-read every peer and follow the new history.
        *resync = true;
        *next_revision = now + 1;
        return false;
      }
      // The first stream's starting point: a stream opened again later
      // resumes here, so changes made while no stream was open are seen.
      if (*next_revision == 0) *next_revision = now + 1;
    }
    auto events = result.find("events");
    if (events == result.end() || !events->is_array()) return true;
    for (const Json& ev : *events) {
      if (!ev.is_object() || !ev.contains("kv")) continue;
      std::optional<std::string> key = Unbase64(Str(ev["kv"], "key"));
      if (!key) continue;
      const int64_t mod = Int(ev["kv"], "mod_revision");
      if (mod + 1 > *next_revision) *next_revision = mod + 1;
      std::optional<std::string> name = NameOfKey(prefix_, *key);
      if (name) callback_(*name);
    }
    return true;
  }

  bool StopRequested() {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_;
  }

  const std::string url_;
  const std::string where_;
  const std::vector<Endpoint> endpoints_;
  const std::string prefix_;
  const std::string cluster_;
  const int64_t ttl_seconds_;
  const milliseconds timeout_;      // Publish, Remove: no deadline is given
  std::atomic<size_t> current_{0};  // the endpoint that answered last

  std::mutex write_mu_;  // one claim, refresh or removal at a time; taken before mu_
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;                       // guarded by mu_
  int64_t lease_ = 0;                           // guarded by mu_
  std::chrono::seconds granted_ttl_{1};         // guarded by mu_
  std::map<std::string, Published> published_;  // guarded by mu_
  std::set<std::string> fetched_;               // names Fetch asked for; guarded by mu_
  httplib::Client* watch_client_ = nullptr;     // the open watch stream's; guarded by mu_
  ChangeCallback callback_;                     // set before watcher_ starts
  std::thread keeper_, watcher_;
};

}  // namespace

StatusOr<std::unique_ptr<MetadataStore>> MakeEtcdStore(std::string_view url,
                                                       const MetadataContext& ctx) {
  FERRY_ASSIGN_OR_RETURN(std::vector<Endpoint> endpoints, ParseEndpoints(url));
  std::string shown(url);
  if (shown.substr(0, 7) != "etcd://") shown = "etcd://" + shown;
  return std::unique_ptr<MetadataStore>(
      std::make_unique<EtcdStore>(std::move(shown), std::move(endpoints), ctx));
}

std::string_view EtcdStoreLacks() { return ""; }

}  // namespace ferry::internal
