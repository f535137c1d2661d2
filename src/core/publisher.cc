#include "core/publisher.h"

#include <unistd.h>

#include <algorithm>

#include "ferry/version.h"

namespace ferry::internal {
namespace {

std::string Hostname() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

const std::vector<std::string>& Features() {
  static const std::vector<std::string> f = {
      "read", "write", "notify", "batch", "p2p-handshake",
      // shm targets answer kCopyLendRead (the initiator copies)
      "shm-lend-reads",
      // same-host hellos may name request rings (shm/request_ring.h)
      "shm-rings",
      // takes notifications of up to kMaxNotificationMessage bytes
      "notify-1m"};
  return f;
}

}  // namespace

std::vector<std::string> Publisher::AdvertisedFeatures() const {
  std::vector<std::string> f = Features();
  const auto& omit = options_.testing.omit_features;
  std::erase_if(f, [&](const std::string& x) {
    return std::find(omit.begin(), omit.end(), x) != omit.end();
  });
  return f;
}

wire::PeerDescriptor Publisher::Describe() const {
  wire::PeerDescriptor d;
  d.engine_name = options_.local_name;
  d.peer_id = identity_.peer_id;
  d.instance_id = identity_.instance_id;
  d.process_token = ProcessToken();
  d.hostname = Hostname();
  d.pid = static_cast<uint32_t>(::getpid());
  d.version = std::string(Version());
  d.wire_min = identity_.wire_min;
  d.wire_max = identity_.wire_max;
  transports_.Describe(&d);
  d.features = AdvertisedFeatures();
  d.features.push_back(
      wire::DescriptorFormatsFeature(wire::kDescriptorFormatMin, identity_.descriptor_format_max));
  d.regions = target_.registry().Snapshot(/*exported_only=*/true);
  if (identity_.descriptor_format_max < 2) {
    for (auto& r : d.regions) r = {r.addr, r.length, r.location, "cpu", {}};
  }
  return d;
}

Status Publisher::Publish(MetadataStore& store) {
  std::lock_guard<std::mutex> lock(mu_);
  return store.Publish(Describe()).WithPrefix("publishing this engine's descriptor");
}

}  // namespace ferry::internal
