// Admission: how many connections one source may hold open on an engine's
// listeners, and how many of them may still be in their hello (not yet
// authenticated or opened as a stream). A flood of connections from one
// source — bogus clients, half-open handshakes — then costs that source its
// own connections only; other sources' peers are still accepted.
// A source is an IP address (any port) for TCP, "uid N" for the same-host
// unix socket (a process of another user cannot crowd out this user's).
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace ferry::internal::stream {

class Admission : public std::enable_shared_from_this<Admission> {
 public:
  Admission(uint32_t max_pending, uint32_t max_open)
      : max_pending_(max_pending), max_open_(max_open) {}

  // One admitted connection; gives its places back when destroyed.
  class Ticket {
   public:
    Ticket(std::shared_ptr<Admission> owner, std::string source)
        : owner_(std::move(owner)), source_(std::move(source)) {}
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    // The hello succeeded: the connection no longer counts as pending.
    void Opened();

   private:
    std::shared_ptr<Admission> owner_;
    std::string source_;
    bool pending_ = true;
  };

  // A ticket, or null if `source` already holds max_open connections or
  // max_pending unfinished hellos. The first refusal of a source (until it
  // is under its limits again) is logged as a warning naming `listener`.
  std::unique_ptr<Ticket> Admit(const std::string& source, const std::string& listener);

 private:
  struct Counts {
    uint32_t pending = 0;
    uint32_t open = 0;
  };
  void Release(const std::string& source, bool pending);
  void Opened(const std::string& source);

  const uint32_t max_pending_;
  const uint32_t max_open_;
  std::mutex mu_;
  std::unordered_map<std::string, Counts> by_source_;  // guarded by mu_
  std::unordered_set<std::string> refused_;            // logged, not yet under the limits again
};

}  // namespace ferry::internal::stream
