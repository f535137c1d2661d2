#include "transport/stream/admission.h"

#include "common/log.h"

namespace ferry::internal::stream {

Admission::Ticket::~Ticket() {
  if (owner_) owner_->Release(source_, pending_);
}

void Admission::Ticket::Opened() {
  if (!pending_) return;
  pending_ = false;
  owner_->Opened(source_);
}

std::unique_ptr<Admission::Ticket> Admission::Admit(const std::string& source,
                                                    const std::string& listener) {
  std::lock_guard<std::mutex> lock(mu_);
  Counts& c = by_source_[source];
  if (c.open >= max_open_ || c.pending >= max_pending_) {
    if (refused_.insert(source).second) {
      FERRY_LOG(kWarning,
                listener << ": refusing connections from " << source << ": it holds " << c.open
                         << " connections (limit max_connections_per_source = " << max_open_
                         << "), " << c.pending
                         << " of them still in their hello (limit max_handshakes_per_source = "
                         << max_pending_ << "); further refusals of this source are not logged");
    }
    if (c.open == 0) by_source_.erase(source);
    return nullptr;
  }
  ++c.open;
  ++c.pending;
  return std::make_unique<Ticket>(shared_from_this(), source);
}

void Admission::Opened(const std::string& source) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_source_.find(source);
  if (it != by_source_.end() && it->second.pending > 0) --it->second.pending;
  refused_.erase(source);
}

void Admission::Release(const std::string& source, bool pending) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_source_.find(source);
  if (it == by_source_.end()) return;
  if (pending && it->second.pending > 0) --it->second.pending;
  if (it->second.open > 0) --it->second.open;
  if (it->second.open == 0) {
    by_source_.erase(it);
    refused_.erase(source);
  }
}

}  // namespace ferry::internal::stream
