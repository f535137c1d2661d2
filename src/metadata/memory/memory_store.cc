// "memory://CLUSTER": engines of one process share a store by cluster name.
// Publishing replaces the entry under the engine's name and tells every
// other engine of the cluster that watches. The process is its scope, as for
// the local transport's directory: the clusters table is the one other
// process-wide table Ferry keeps.
#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "ferry/metadata.h"
#include "metadata/metadata.h"
#include "metadata/registry.h"

namespace ferry::internal {
namespace {

// One watcher; outlives its store while a callback may still run.
struct Watcher {
  std::mutex mu;
  bool alive = true;  // guarded by mu
  MetadataStore::ChangeCallback callback;
};

struct Cluster {
  std::mutex mu;
  std::map<std::string, wire::PeerDescriptor, std::less<>> entries;  // guarded by mu
  std::vector<std::weak_ptr<Watcher>> watchers;                      // guarded by mu

  void Notify(const std::string& name) {
    std::vector<std::shared_ptr<Watcher>> live;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& w : watchers) {
        if (auto s = w.lock()) live.push_back(std::move(s));
      }
    }
    for (const auto& w : live) {  // outside the cluster's lock
      std::lock_guard<std::mutex> lock(w->mu);
      if (w->alive) w->callback(name);
    }
  }
};

std::shared_ptr<Cluster> ClusterNamed(std::string_view name) {
  static std::mutex* mu = new std::mutex;  // never destroyed: engines may outlive statics
  static auto* clusters = new std::map<std::string, std::weak_ptr<Cluster>, std::less<>>;
  std::lock_guard<std::mutex> lock(*mu);
  auto& slot = (*clusters)[std::string(name)];
  auto c = slot.lock();
  if (!c) {
    c = std::make_shared<Cluster>();
    slot = c;
  }
  return c;
}

class MemoryStore : public MetadataStore {
 public:
  explicit MemoryStore(std::string cluster)
      : name_(std::move(cluster)), cluster_(ClusterNamed(name_)) {}
  ~MemoryStore() override {
    if (watcher_) {
      std::lock_guard<std::mutex> lock(watcher_->mu);
      watcher_->alive = false;
    }
  }

  Status Publish(const wire::PeerDescriptor& self) override {
    {
      std::lock_guard<std::mutex> lock(cluster_->mu);
      auto it = cluster_->entries.find(self.engine_name);
      if (it != cluster_->entries.end() && it->second.instance_id != self.instance_id &&
          published_.count(self.engine_name) == 0) {
        return AlreadyExistsError("segment name '" + self.engine_name + "' is held by engine " +
                                  it->second.peer_id + " (instance " +
                                  std::to_string(it->second.instance_id) +
                                  ") in metadata cluster memory://" + name_);
      }
      cluster_->entries[self.engine_name] = self;
      published_[self.engine_name] = true;
    }
    cluster_->Notify(self.engine_name);
    return OkStatus();
  }

  StatusOr<wire::PeerDescriptor> Fetch(std::string_view name, const wire::PeerDescriptor&,
                                       Clock::time_point) override {
    std::lock_guard<std::mutex> lock(cluster_->mu);
    auto it = cluster_->entries.find(name);
    if (it == cluster_->entries.end()) {
      return UnavailableError("no segment '" + std::string(name) +
                              "' in metadata cluster memory://" + name_);
    }
    return it->second;
  }

  Status Remove(std::string_view name) override {
    {
      std::lock_guard<std::mutex> lock(cluster_->mu);
      if (published_.erase(std::string(name)) == 0) {
        return NotFoundError("this engine published no segment '" + std::string(name) + "'");
      }
      cluster_->entries.erase(std::string(name));
    }
    cluster_->Notify(std::string(name));
    return OkStatus();
  }

  Status Watch(ChangeCallback on_change) override {
    auto w = std::make_shared<Watcher>();
    w->callback = std::move(on_change);
    std::lock_guard<std::mutex> lock(cluster_->mu);
    cluster_->watchers.push_back(w);
    watcher_ = std::move(w);
    return OkStatus();
  }

 private:
  const std::string name_;
  const std::shared_ptr<Cluster> cluster_;
  std::map<std::string, bool> published_;  // names this store published; guarded by cluster_->mu
  std::shared_ptr<Watcher> watcher_;
};

constexpr std::string_view kScheme = "memory://";

bool TakesMemoryUrl(std::string_view url) { return HasScheme(url, kScheme); }

}  // namespace

StatusOr<std::unique_ptr<MetadataStore>> MakeMemoryStore(std::string_view url,
                                                         const MetadataContext&) {
  const std::string_view cluster = url.substr(std::min(url.size(), kScheme.size()));
  if (!TakesMemoryUrl(url) || cluster.empty()) {
    return InvalidArgumentError("metadata '" + RedactMetadataUrl(std::string(url)) +
                                "' names no cluster (memory://NAME)");
  }
  return std::unique_ptr<MetadataStore>(std::make_unique<MemoryStore>(std::string(cluster)));
}

MetadataBackend MemoryBackend() {
  return {"memory",
          "memory://CLUSTER",
          "engines of one process share a store (tests, single-process use)",
          TakesMemoryUrl,
          /*keyed=*/true,
          NothingLacking,
          MakeMemoryStore};
}

}  // namespace ferry::internal
