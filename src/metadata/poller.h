// The background work of a store whose service cannot push changes (http,
// redis): keeping this engine's entries from expiring, and polling the
// entries of the peers the engine fetched. The store keeps its whole data
// path (what a refresh writes, how a poll reads); the poller owns the
// threads, their timing, the change detection and the shutdown.
//
//  - Refreshing: after SetTtl with a TTL above zero, a refresher thread
//    wakes every third of the TTL (at least kMinRefreshInterval apart) and
//    calls `refresh` for each name `published` lists, giving it a third of
//    the TTL clamped to [kMinRefreshTimeout, kMaxRefreshTimeout] as its
//    time limit. A TTL of zero ends the thread at its next wake-up (a later
//    TTL does not start another). A new TTL takes effect from the next
//    wake-up.
//  - Watching: after Watch, a watcher thread wakes every poll interval and,
//    when Seen reported any names, calls `read` with all of them; a name
//    whose value differs from the one last seen (changed, or gone) is
//    recorded and the callback called with it — unless Seen reported newer
//    bytes while `read` ran (the engine fetched the name again meanwhile).
//
// Thread contract: at most two threads, each started once and lazily (the
// refresher by SetTtl, the watcher by Watch), both ended and joined by Stop.
// The hooks run on those threads only — `published` and `refresh` on the
// refresher, `read` and the callback on the watcher — and never with the
// poller's lock held, so they may call Seen, stopping and WaitFor (the
// poller's lock is a leaf: a store may hold its own locks around any call
// here). Hooks and the callback must not call Stop or destroy the store.
// Every other method may be called from any thread, concurrently.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ferry/status.h"
#include "metadata/metadata.h"

namespace ferry::internal {

class StorePoller {
 public:
  static constexpr std::chrono::milliseconds kMinRefreshInterval{10};
  static constexpr std::chrono::milliseconds kMinRefreshTimeout{100};
  static constexpr std::chrono::milliseconds kMaxRefreshTimeout{2000};

  // What one poll learned of one name.
  struct Reading {
    bool known = false;  // false: no answer for it (unreachable, an error): nothing changes
    std::optional<std::string> value;  // the bytes now; nullopt: no entry holds the name
  };

  struct Hooks {
    // The names of the entries this store keeps alive.
    std::function<std::vector<std::string>()> published;
    // Writes `name`'s entry again, within `timeout`; reports its own failures.
    std::function<void(const std::string& name, std::chrono::milliseconds timeout)> refresh;
    // What the service holds under each of `names` now: one Reading each, in
    // order (fewer: the rest are unknown).
    std::function<std::vector<Reading>(const std::vector<std::string>& names)> read;
  };

  StorePoller(Hooks hooks, std::chrono::milliseconds poll_interval);
  ~StorePoller() { Stop(); }
  StorePoller(const StorePoller&) = delete;
  StorePoller& operator=(const StorePoller&) = delete;

  // The TTL of this store's entries; starts the refresher the first time it
  // is above zero.
  void SetTtl(std::chrono::milliseconds ttl);

  // Starts the watcher, which calls `on_change` as described above.
  // kFailedPrecondition when already watching.
  Status Watch(MetadataStore::ChangeCallback on_change);
  // `name` holds `value` now (Fetch read it; nullopt: nothing): the watcher
  // polls it from here on and reports when that changes.
  void Seen(const std::string& name, std::optional<std::string> value);

  // Whether Stop has begun.
  bool stopping() const;
  // Waits `timeout` or until Stop begins: false when stopping.
  bool WaitFor(std::chrono::milliseconds timeout);

  // Ends both threads after the hook or callback they are in returns.
  // Idempotent.
  void Stop();

 private:
  void RefreshLoop();
  void WatchLoop();
  // Compares a poll's readings with what was seen and records the changes;
  // the names that changed.
  std::vector<std::string> Changes(
      const std::vector<std::pair<std::string, std::optional<std::string>>>& before,
      std::vector<Reading> now);

  const Hooks hooks_;
  const std::chrono::milliseconds poll_interval_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;                                      // guarded by mu_
  std::chrono::milliseconds ttl_{0};                           // guarded by mu_
  std::map<std::string, std::optional<std::string>> watched_;  // name -> bytes seen; guarded by mu_
  MetadataStore::ChangeCallback callback_;                     // set before watcher_ starts
  std::thread refresher_, watcher_;                            // started under mu_, joined by Stop
};

}  // namespace ferry::internal
