// `ferry metadata-server`: a small key-value service on one path, the HTTP
// metadata store's server (src/metadata/http/). Entries expire --ttl-ms after
// their last PUT; engines refresh theirs, so a crashed engine's name frees
// itself.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "commands.h"

#ifdef FERRY_HAVE_HTTP_METADATA
#include <httplib.h>
#endif

namespace ferry::cli {
namespace {

constexpr const char* kMetadataHelp =
    R"(Usage: ferry metadata-server --port N [--listen HOST] [--ttl-ms T]

A metadata service that lets many engines find each other by name: engines
with EngineOptions.metadata = "http://HOST:PORT/metadata" publish their
descriptors here (key ferry/segments/<name>) and fetch their peers'. One path,
/metadata:

  GET    /metadata?key=K   200 + the value, 404 if there is none
  PUT    /metadata?key=K   stores the body (at most 16 MiB); the answer
                           carries X-Ferry-TTL-Ms: T
  DELETE /metadata?key=K   200, or 404 if there was none

An entry expires T ms after its last PUT; engines refresh theirs every T/3,
so the name of an engine that died frees itself. Entries live in memory only.
Prints "metadata-server listening on HOST:PORT" when ready; serves until
SIGINT or SIGTERM, then exits 0.

  --port N      TCP port (0: any free port; the line above says which)
  --listen HOST address to listen on (default 127.0.0.1; 0.0.0.0: all)
  --ttl-ms T    entry lifetime in ms after its last PUT (default 10000;
                0: entries never expire)
)";

#ifdef FERRY_HAVE_HTTP_METADATA

constexpr size_t kMaxValue = size_t{16} << 20;
using SteadyClock = std::chrono::steady_clock;

class Table {
 public:
  explicit Table(uint64_t ttl_ms) : ttl_(ttl_ms) {}

  bool Get(const std::string& key, std::string* value) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return false;
    if (Expired(it->second, SteadyClock::now())) {
      entries_.erase(it);
      return false;
    }
    *value = it->second.value;
    return true;
  }
  void Put(const std::string& key, std::string value) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_[key] = {std::move(value), SteadyClock::now()};
  }
  bool Delete(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return false;
    const bool live = !Expired(it->second, SteadyClock::now());
    entries_.erase(it);
    return live;
  }
  // Drops every expired entry (the server's main thread, once a second).
  void Sweep() {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = SteadyClock::now();
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = Expired(it->second, now) ? entries_.erase(it) : std::next(it);
    }
  }

 private:
  struct Entry {
    std::string value;
    SteadyClock::time_point put_at;
  };
  bool Expired(const Entry& e, SteadyClock::time_point now) const {
    return ttl_.count() > 0 && now - e.put_at >= ttl_;
  }

  const std::chrono::milliseconds ttl_;
  std::mutex mu_;
  std::map<std::string, Entry> entries_;  // guarded by mu_
};

void Text(httplib::Response& res, int status, const std::string& text) {
  res.status = status;
  res.set_content(text + "\n", "text/plain");
}

// The request's key, or an answer of 400 (false).
bool KeyOf(const httplib::Request& req, httplib::Response& res, std::string* key) {
  if (!req.has_param("key") || req.get_param_value("key").empty()) {
    Text(res, 400, "missing key: use /metadata?key=K");
    return false;
  }
  *key = req.get_param_value("key");
  return true;
}

// The table's routes on /metadata, and text answers for what httplib
// refuses itself.
void AddRoutes(httplib::Server& server, Table& table, const std::string& ttl_header) {
  server.Get("/metadata", [&table](const httplib::Request& req, httplib::Response& res) {
    std::string key, value;
    if (!KeyOf(req, res, &key)) return;
    if (!table.Get(key, &value)) return Text(res, 404, "no entry for key '" + key + "'");
    res.status = 200;
    res.set_content(std::move(value), "application/octet-stream");
  });
  server.Put("/metadata",
             [&table, ttl_header](const httplib::Request& req, httplib::Response& res) {
               std::string key;
               if (!KeyOf(req, res, &key)) return;
               if (req.body.size() > kMaxValue)
                 return Text(res, 413, "value too large (at most 16 MiB)");
               table.Put(key, req.body);
               res.set_header("X-Ferry-TTL-Ms", ttl_header);
               Text(res, 200, "stored");
             });
  server.Delete("/metadata", [&table](const httplib::Request& req, httplib::Response& res) {
    std::string key;
    if (!KeyOf(req, res, &key)) return;
    if (!table.Delete(key)) return Text(res, 404, "no entry for key '" + key + "'");
    Text(res, 200, "deleted");
  });
  const auto not_allowed = [](const httplib::Request& req, httplib::Response& res) {
    res.set_header("Allow", "GET, PUT, DELETE");
    Text(res, 405, "method " + req.method + " not allowed on /metadata (GET, PUT, DELETE)");
  };
  server.Post("/metadata", not_allowed);
  server.Patch("/metadata", not_allowed);
  server.Options("/metadata", not_allowed);
  // Answers httplib makes itself (unknown path, body over the limit, bad
  // request line) get a text body too.
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) return Text(res, 413, "value too large (at most 16 MiB)");
    if (res.status == 404) {
      return Text(res, 404, "no such path '" + req.path + "': the service is on /metadata");
    }
    Text(res, res.status,
         "bad request (status " + std::to_string(res.status) +
             "): malformed or unsupported request; use GET, PUT or DELETE /metadata?key=K");
  });
}

// Binds `listen`:`port` (0: any free port); returns the port. Throws
// RunError.
int Bind(httplib::Server& server, const std::string& listen, uint64_t port) {
  int bound = -1;
  if (port == 0) {
    bound = server.bind_to_any_port(listen);
  } else if (server.bind_to_port(listen, static_cast<int>(port))) {
    bound = static_cast<int>(port);
  }
  if (bound <= 0) {
    throw RunError("cannot listen on " + listen + ":" + std::to_string(port) +
                   " (address in use, or not an address of this host)");
  }
  return bound;
}

// Serves `table` on `listen`:`port` until SIGINT or SIGTERM (blocked in
// `stop_signals`), sweeping expired entries once a second.
void Serve(Table& table, uint64_t ttl_ms, const std::string& listen, uint64_t port,
           const sigset_t& stop_signals) {
  httplib::Server server;
  server.set_payload_max_length(kMaxValue);
  server.set_keep_alive_timeout(1);  // bounds how long stop() waits for idle connections
  server.set_read_timeout(5);
  server.set_write_timeout(5);
  AddRoutes(server, table, std::to_string(ttl_ms));
  const int bound = Bind(server, listen, port);
  std::thread serving([&] { server.listen_after_bind(); });
  // stop() only stops a server that is running: wait (bounded) until it is.
  for (int i = 0; i < 5000 && !server.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const bool v6 = listen.find(':') != std::string::npos;
  std::cout << "metadata-server listening on " << (v6 ? "[" + listen + "]" : listen) << ":" << bound
            << std::endl;  // flushed: a parent waits for this line

  timespec tick{1, 0};
  for (;;) {
    const int sig = sigtimedwait(&stop_signals, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) break;
    table.Sweep();
  }
  server.stop();
  serving.join();
}

#endif  // FERRY_HAVE_HTTP_METADATA

struct ServerFlags {
  std::string listen = "127.0.0.1";
  uint64_t port = 0, ttl_ms = 10000;
};

// Parses the command line; nullopt when --help was printed. Throws
// UsageError.
std::optional<ServerFlags> ParseServerFlags(const std::vector<std::string>& args) {
  ServerFlags f;
  bool port_given = false;
  CLI::App app("ferry metadata-server");
  PrepareApp(app);
  app.add_option_function<std::string>("--port", [&](const std::string& v) {
    f.port = ParseUint("--port", v);
    port_given = true;
  });
  app.add_option_function<std::string>("--listen", [&](const std::string& v) { f.listen = v; });
  app.add_option_function<std::string>(
      "--ttl-ms", [&](const std::string& v) { f.ttl_ms = ParseUint("--ttl-ms", v); });
  if (ParseFlags(app, args)) {
    std::cout << kMetadataHelp;
    return std::nullopt;
  }
  if (!port_given) throw UsageError("--port is required (0: any free port)");
  if (f.port > 65535) {
    throw UsageError("bad value '" + std::to_string(f.port) + "' for --port: at most 65535");
  }
  if (f.listen.empty()) throw UsageError("--listen needs a host");
  return f;
}

}  // namespace

int MetadataServerMain(const std::vector<std::string>& args) {
  const std::optional<ServerFlags> flags = ParseServerFlags(args);
  if (!flags) return 0;
#ifndef FERRY_HAVE_HTTP_METADATA
  throw RunError("this build has no HTTP metadata server (install libcpp-httplib-dev and rebuild)");
#else
  // SIGINT and SIGTERM are taken by this thread (sigtimedwait in Serve);
  // every thread started from here on inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Table table(flags->ttl_ms);
  Serve(table, flags->ttl_ms, flags->listen, flags->port, stop_signals);
  return 0;
#endif
}

}  // namespace ferry::cli
