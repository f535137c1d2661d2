// cuda_ipc: GPU memory of another process on this host, reached through CUDA
// IPC. The target publishes, for each registered cuda region, the IPC handle
// of the allocation holding it and the region's offset in it (region key
// "cuda-ipc", descriptor format 3); the initiator opens each handle once per
// link (cuIpcOpenMemHandle, cached until the link retires) and copies with
// cuMemcpyAsync on a stream per device between its own memory (host or GPU)
// and the mapping, completing slices from events (copy_queue.h). Only routes
// whose remote memory is GPU memory take it; host memory of a same-host peer
// goes through shm. A handle the initiator cannot open (another container, a
// GPU it cannot see) fails Connect with kUnavailable, so `auto` falls back to
// the next transport for that peer and says so once.
#pragma once

#include <memory>
#include <string>

#include "base/transport.h"
#include "transport/context.h"

namespace ferry::internal {

TransportCaps CudaIpcCaps();
// "" when the process's CUDA driver can run the GPU data paths, else why not.
std::string CudaIpcAvailability();
StatusOr<std::unique_ptr<Transport>> MakeCudaIpcTransport(const TransportContext& ctx);

}  // namespace ferry::internal
