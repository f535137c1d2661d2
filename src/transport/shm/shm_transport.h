// The same-host transport ("shm"): for a peer engine in another process of
// this host. Requests travel as frames over unix-domain streams, as on tcp,
// but carry the initiator's addresses instead of the bytes: the target
// validates (and pins) its ranges, then moves the bytes straight between the
// two processes' memory with process_vm_readv / process_vm_writev (cross
// memory attach). One copy in all, done by the kernel, instead of tcp's two
// copies and its protocol stack; no socket buffers, no page cache.
//
// Reaching another process's memory takes ptrace access to it (the same user
// with Yama ptrace_scope 0, or CAP_SYS_PTRACE). Each stream proves it at
// connect time: the target reads a probe out of the initiator's memory, and
// a stream that cannot do so is refused with the reason, so `auto` falls back
// to tcp (see Engine) and a forced "shm" fails with that reason.
// Files: shm_transport.cc (endpoint, connect), copy_service.* (the data
// path on both sides), copy_frames.* (its frame bodies), mapped_segments.*
// (shared memory copied through mappings: the target's slot table, the
// initiator's mappings; mapped_link.cc: the initiator's MappedLink), same_host_probe.h (whether
// this machine allows it at all).
#pragma once

#include <memory>
#include <string>

#include "base/transport.h"
#include "transport/context.h"

namespace ferry::internal {

TransportCaps ShmCaps();
// "" if same-host copies work on this machine, else why not.
std::string ShmAvailability();
// Listens on an abstract unix socket named after the engine's instance and
// serves it from the engine's loops.
StatusOr<std::unique_ptr<Transport>> MakeShmTransport(const TransportContext& ctx);

}  // namespace ferry::internal
