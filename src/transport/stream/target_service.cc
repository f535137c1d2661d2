#include "transport/stream/target_service.h"

namespace ferry::internal::stream {

Status TargetService::PinEntry(uint64_t addr, uint32_t length, uint32_t index, const Region** last,
                               std::vector<RegionPin>* pins,
                               std::vector<wire::EntryFailure>* failures, bool allow_staged) const {
  Status s;
  const Region* r = *last;
  if (length == 0) {
    s = InvalidArgumentError("zero-length entry");
  } else if (r != nullptr && addr >= r->addr && length <= r->length &&
             addr - r->addr <= r->length - length) {
    return OkStatus();  // inside the region pinned for an earlier entry
  } else {
    auto pin = target_->registry().PinExported(addr, length, "remote range");
    const bool reachable =
        pin.ok() && (pin->region()->kind.cpu_accessible() ||
                     (allow_staged && pin->region()->kind.type() == MemoryKind::Type::kCuda &&
                      target_->cuda_driver() != nullptr) ||
                     (allow_staged && pin->region()->kind.type() == MemoryKind::Type::kFile &&
                      pin->region()->file != nullptr));
    if (pin.ok() && !reachable) {
      s = InvalidArgumentError("remote range " + FormatRange(addr, length) + " is in " +
                               pin->region()->kind.Name() + " memory, which transport " +
                               transport_ + " cannot reach");
    } else if (pin.ok()) {
      *last = pin->region();
      pins->push_back(std::move(*pin));
      return OkStatus();
    } else {
      s = pin.status();
    }
    s = s.WithPrefix("peer " + target_->peer_id() + " refused");
  }
  failures->push_back({index, s.code(), std::string(s.message())});
  return s;
}

Status TargetService::ServeNotify(Connection& stream, const wire::FrameHeader& h,
                                  std::string_view body) const {
  FERRY_ASSIGN_OR_RETURN(wire::NotifyBody n, wire::DecodeNotify(body));
  Status delivered =
      target_->Deliver({std::move(n.sender), std::move(n.name), std::move(n.message)});
  std::string reply;
  wire::EncodeReply({delivered.WithPrefix("peer " + target_->peer_id() + " refused"), {}}, &reply);
  stream.QueueReply(wire::FrameType::kAck, h.seq, std::move(reply));
  return OkStatus();
}

}  // namespace ferry::internal::stream
