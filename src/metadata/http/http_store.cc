// "http://HOST[:PORT][/PATH]" (PATH default /metadata): descriptors in a REST
// key-value service such as `ferry metadata-server`, under the keys of
// metadata/entries.h (<cluster>/segments/<engine name>):
//
//   GET    PATH?key=K   200 + value | 404
//   PUT    PATH?key=K   stores the body; the server may answer with
//                       X-Ferry-TTL-Ms: T (entries expire T ms after their
//                       last PUT)
//   DELETE PATH?key=K   200 | 404
//
// Publishing a name the first time checks that no live entry of another
// instance holds it (there is no compare-and-set in the protocol: two engines
// claiming one name in the same instant can both win). The refresher
// (metadata/poller.h) re-PUTs what this store published every T/3, so a
// crashed engine's entry expires and its name frees itself. Watches poll
// every name Fetch returned, one GET each.
// Values read from the service are untrusted: anything that does not decode
// is kDataLoss, never a crash.
#include <httplib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <set>
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

constexpr size_t kMaxValue = size_t{16} << 20;  // as `ferry metadata-server` accepts
constexpr milliseconds kPollInterval{500};
constexpr milliseconds kPollTimeout{1000};

struct Url {
  std::string text;  // as given
  std::string host;
  int port = 80;
  std::string path = "/metadata";
};

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

StatusOr<Url> ParseUrl(std::string_view text) {
  Url u;
  u.text = std::string(text);
  const auto bad = [&](const std::string& why) {
    return InvalidArgumentError(
        "metadata '" + u.text + "': " + why +
        " (expected http://HOST[:PORT][/PATH], e.g. http://10.0.0.1:8080/metadata)");
  };
  if (text.substr(0, 8) == "https://") return bad("https is not supported; use http://");
  if (text.substr(0, 7) != "http://") return bad("not an http:// URL");
  std::string_view rest = text.substr(7);
  if (rest.find_first_of("?#") != std::string_view::npos)
    return bad("a query or fragment is not allowed");
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) u.path = std::string(rest.substr(slash));
  if (u.path.empty()) u.path = "/metadata";
  if (authority.find('@') != std::string_view::npos)
    return bad("user information is not supported");
  std::string_view port;
  bool has_port = false;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("unterminated [IPv6 address]");
    u.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("junk after ]");
      port = after.substr(1);
      has_port = true;
    }
  } else {
    const size_t colon = authority.rfind(':');
    u.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      has_port = true;
    }
  }
  if (u.host.empty()) return bad("no host");
  if (has_port) {
    if (!AllDigits(port) || port.size() > 5 || std::atoi(std::string(port).c_str()) < 1 ||
        std::atoi(std::string(port).c_str()) > 65535) {
      return bad("bad port '" + std::string(port) + "'");
    }
    u.port = std::atoi(std::string(port).c_str());
  }
  return u;
}

std::string QueryEscape(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '.' || c == '_' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// One answer of the service, or why there was none.
struct Reply {
  std::string error;        // non-empty: no answer (unreachable, timed out, too large)
  bool out_of_fds = false;  // with error: this process had no descriptor left
  int status = 0;
  std::string body;
  std::string ttl;  // X-Ferry-TTL-Ms, if any
};

class HttpStore : public MetadataStore {
 public:
  HttpStore(Url url, const MetadataContext& ctx)
      : url_(std::move(url)),
        where_("the metadata service at " + url_.text),
        cluster_(ctx.cluster),
        write_timeout_(ctx.timeout),
        poller_({[this] { return PublishedNames(); },
                 [this](const std::string& name, milliseconds timeout) { Refresh(name, timeout); },
                 [this](const std::vector<std::string>& names) { return Read(names); }},
                kPollInterval) {}

  ~HttpStore() override { poller_.Stop(); }

  Status Publish(const wire::PeerDescriptor& self) override {
    std::string bytes;
    wire::EncodeDescriptor(self, &bytes, wire::LowestFormatFor(self));
    const std::string key = Key(self.engine_name);
    std::lock_guard<std::mutex> write(write_mu_);
    bool claimed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      claimed = claimed_.count(self.engine_name) > 0;
    }
    if (!claimed) {
      Reply r = Call("GET", key, "", write_timeout_);
      if (!r.error.empty()) return Unreachable("GET", key, r);
      if (r.status == 200) {
        FERRY_RETURN_IF_ERROR(CheckClaim(self, key, r.body, where_));
      } else if (r.status != 404) {
        return Answered("GET", key, r);
      }
    }
    Reply r = Call("PUT", key, bytes, write_timeout_);
    if (!r.error.empty()) return Unreachable("PUT", key, r);
    if (r.status != 200) return Answered("PUT", key, r);
    milliseconds ttl{0};
    if (AllDigits(r.ttl) && r.ttl.size() < 12)
      ttl = milliseconds(std::strtoull(r.ttl.c_str(), nullptr, 10));
    {
      std::lock_guard<std::mutex> lock(mu_);
      claimed_.insert(self.engine_name);
      published_[self.engine_name] = std::move(bytes);
    }
    poller_.SetTtl(ttl);
    return OkStatus();
  }

  StatusOr<wire::PeerDescriptor> Fetch(std::string_view name, const wire::PeerDescriptor&,
                                       Clock::time_point deadline) override {
    const std::string key = Key(name);
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return UnavailableError("no time left to ask the metadata service at " + url_.text +
                              " for segment '" + std::string(name) + "'");
    }
    Reply r = Call("GET", key, "", left);
    if (!r.error.empty()) return NoAnswer("for segment '" + std::string(name) + "'", r);
    if (r.status == 404) {
      return UnavailableError("no segment '" + std::string(name) + "' in the metadata service at " +
                              url_.text);
    }
    if (r.status != 200) return Answered("GET", key, r);
    FERRY_ASSIGN_OR_RETURN(wire::PeerDescriptor desc, DecodeEntry(name, key, r.body, where_));
    poller_.Seen(std::string(name), std::move(r.body));
    return desc;
  }

  Status Remove(std::string_view name) override {
    const std::string key = Key(name);
    std::lock_guard<std::mutex> write(write_mu_);  // no refresh PUT overtakes the DELETE
    {
      std::lock_guard<std::mutex> lock(mu_);
      claimed_.erase(std::string(name));
      if (published_.erase(std::string(name)) == 0) {
        return NotFoundError("this engine published no segment '" + std::string(name) + "'");
      }
    }
    Reply r = Call("DELETE", key, "", write_timeout_);
    if (!r.error.empty()) return Unreachable("DELETE", key, r);
    if (r.status != 200 && r.status != 404) return Answered("DELETE", key, r);
    return OkStatus();
  }

  Status Watch(ChangeCallback on_change) override { return poller_.Watch(std::move(on_change)); }

 private:
  std::string Key(std::string_view name) const { return SegmentKey(cluster_, name); }

  Status Unreachable(const char* method, const std::string& key, const Reply& r) const {
    return NoAnswer("(" + std::string(method) + " " + key + ")", r);
  }
  // A request `what` the service did not answer (r.error): out of
  // descriptors, or why not.
  Status NoAnswer(const std::string& what, const Reply& r) const {
    const std::string cannot = "cannot reach the metadata service at " + url_.text + " " + what;
    if (r.out_of_fds) return DescriptorError(StatusCode::kUnavailable, cannot, EMFILE);
    return UnavailableError(cannot + ": " + r.error);
  }
  Status Answered(const char* method, const std::string& key, const Reply& r) const {
    std::string body = r.body.substr(0, 200);
    while (!body.empty() && (body.back() == '\n' || body.back() == '\r')) body.pop_back();
    return UnavailableError("the metadata service at " + url_.text + " answered " + method + " " +
                            key + " with status " + std::to_string(r.status) +
                            (body.empty() ? "" : ": " + body));
  }

  // One request on a connection of its own (the store's threads never share
  // a client), every wait bounded by `timeout`.
  Reply Call(const std::string& method, const std::string& key, const std::string& body,
             milliseconds timeout) const {
    Reply out;
    try {
      httplib::Client client(url_.host, url_.port);
      const auto ms = std::max<int64_t>(timeout.count(), 1);
      const time_t sec = static_cast<time_t>(ms / 1000);
      const time_t usec = static_cast<time_t>((ms % 1000) * 1000);
      client.set_connection_timeout(sec, usec);
      client.set_read_timeout(sec, usec);
      client.set_write_timeout(sec, usec);
      client.set_keep_alive(false);
      const std::string target = url_.path + "?key=" + QueryEscape(key);
      httplib::Result res{nullptr, httplib::Error::Unknown};
      bool too_large = false;
      if (method == "GET") {
        res = client.Get(target, httplib::Headers{}, [&](const char* data, size_t n) {
          if (out.body.size() + n > kMaxValue) {
            too_large = true;
            return false;
          }
          out.body.append(data, n);
          return true;
        });
      } else if (method == "PUT") {
        res = client.Put(target, body, "application/octet-stream");
      } else {
        res = client.Delete(target);
      }
      if (too_large) {
        out.error = "the value under key '" + key + "' is larger than 16 MiB";
        return out;
      }
      if (!res) {
        switch (res.error()) {
          case httplib::Error::Connection:
            out.error = "cannot connect (refused or unreachable)";
            out.out_of_fds = OutOfDescriptors();
            break;
          case httplib::Error::ConnectionTimeout:
            out.error = "connect timed out";
            break;
          case httplib::Error::Read:
            out.error = "no answer in time (read failed or timed out)";
            break;
          default:
            out.error = "HTTP error " + httplib::to_string(res.error());
            break;
        }
        return out;
      }
      out.status = res->status;
      if (method != "GET") out.body = res->body;
      out.ttl = res->get_header_value("X-Ferry-TTL-Ms");
    } catch (const std::exception& e) {
      out.error = e.what();
    }
    if (out.error.empty() && out.status == 0) out.error = "no answer";
    return out;
  }

  std::vector<std::string> PublishedNames() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> names;
    for (const auto& [name, bytes] : published_) names.push_back(name);
    return names;
  }

  // The refresher's PUT of one entry; a failure is logged when refreshes
  // start failing.
  void Refresh(const std::string& name, milliseconds timeout) {
    std::lock_guard<std::mutex> write(write_mu_);
    std::string bytes;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = published_.find(name);
      if (it == published_.end()) return;  // removed meanwhile
      bytes = it->second;
    }
    Reply r = Call("PUT", Key(name), bytes, timeout);
    const bool ok = r.error.empty() && r.status == 200;
    if (!ok && !refresh_failing_) {
      FERRY_LOG(kWarning, "cannot refresh segment "
                              << name << " in the metadata service at " << url_.text << ": "
                              << (r.error.empty() ? "status " + std::to_string(r.status) : r.error)
                              << "; it expires unless a refresh gets through");
    }
    refresh_failing_ = !ok;
  }

  // The watcher's poll: one GET per name; an unreachable service or an
  // unexpected status says nothing about the name.
  std::vector<StorePoller::Reading> Read(const std::vector<std::string>& names) {
    std::vector<StorePoller::Reading> out;
    for (const std::string& name : names) {
      if (poller_.stopping()) break;
      Reply r = Call("GET", Key(name), "", kPollTimeout);
      StorePoller::Reading& now = out.emplace_back();
      if (!r.error.empty() || (r.status != 200 && r.status != 404)) continue;
      now.known = true;
      if (r.status == 200) now.value = std::move(r.body);
    }
    return out;
  }

  const Url url_;
  const std::string where_;
  const std::string cluster_;
  const milliseconds write_timeout_;  // Publish, Remove: no deadline is given
  std::mutex write_mu_;  // one PUT or DELETE of this store's entries at a time; taken before mu_
  std::mutex mu_;
  std::set<std::string> claimed_;                 // names checked free once; guarded by mu_
  std::map<std::string, std::string> published_;  // name -> bytes to refresh; guarded by mu_
  bool refresh_failing_ = false;                  // the last refresh failed; refresher thread only
  StorePoller poller_;                            // last: its threads use the members above
};

}  // namespace

StatusOr<std::unique_ptr<MetadataStore>> MakeHttpStore(std::string_view url,
                                                       const MetadataContext& ctx) {
  FERRY_ASSIGN_OR_RETURN(Url u, ParseUrl(url));
  return std::unique_ptr<MetadataStore>(std::make_unique<HttpStore>(std::move(u), ctx));
}

std::string_view HttpStoreLacks() { return ""; }

}  // namespace ferry::internal
