#include "transport/stream/host.h"

namespace ferry::internal::stream {

StatusOr<std::unique_ptr<StreamHost>> StreamHost::Create(const StreamHostOptions& options) {
  auto host = std::make_unique<StreamHost>();
  host->options_ = options;
  FERRY_ASSIGN_OR_RETURN(auto bound, Listen(options.listen_host, options.listen_port));
  host->rpc_fd_ = std::move(bound.first);
  host->peer_id_ = FormatPeerId(options.listen_host, bound.second);
  FERRY_ASSIGN_OR_RETURN(host->loops_, LoopPool::Start(options.io_threads, options.spin));
  host->SetSecret(nullptr);
  host->admission_ = std::make_shared<Admission>(options.max_handshakes_per_source,
                                                 options.max_connections_per_source);
  return host;
}

void StreamHost::SetSecret(std::shared_ptr<const ClusterSecret> secret) {
  auth_ = std::make_shared<const AuthServer>(std::move(secret), peer_id_);
  rpc_openers_->SetAuth(auth_);
}

Status StreamHost::Serve() {
  if (!rpc_fd_.valid()) return FailedPreconditionError("the rpc port is already served");
  ListenerConfig cfg;
  cfg.name = "rpc port " + peer_id_;
  cfg.openers = rpc_openers_;
  cfg.hello_timeout = options_.hello_timeout;
  cfg.on_accept = rpc_on_accept_;
  cfg.admission = admission_;
  FERRY_ASSIGN_OR_RETURN(rpc_listener_,
                         Listener::Serve(std::move(rpc_fd_), std::move(cfg), *loops_));
  return OkStatus();
}

void StreamHost::Stop() {
  if (loops_) loops_->Stop();
}

}  // namespace ferry::internal::stream
