// Test parameters that name a transport, and for the fabric transport a
// provider: "tcp", "shm", "local", "fabric_tcp" (the fabric transport on
// libfabric's tcp;ofi_rxm), "fabric_shm"; "shm_mapped" is shm with the
// target's memory shared (registered with its memfd: the initiator maps it,
// docs/architecture.md "Mapped segments"); "shm_socket" is shm with its
// frames on the unix sockets (shm_rings off; "shm" uses the request rings,
// docs/architecture.md "Request rings"); "<transport>_file" has the
// target's buffers in file regions. Shared by the conformance suite
// and the multi-process tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "ferry/ferry.h"
#include "tests/testing/same_host.h"

namespace ferry::test {

// Whether the target's buffers are file regions ("tcp_file", "shm_file",
// "local_file": registered with Engine::RegisterFile).
inline bool TargetsFiles(const std::string& param) { return param.ends_with("_file"); }
// Whether the initiator's buffers are file regions of its own, staged over
// the transport ("tcp_local_files", "shm_local_files",
// "fabric_tcp_local_files").
inline bool InitiatorFiles(const std::string& param) { return param.ends_with("_local_files"); }
// `param` without the suffix that says where the buffers are ("_file",
// "_local_files").
inline std::string BaseParam(const std::string& param) {
  if (TargetsFiles(param)) return param.substr(0, param.size() - 5);
  if (InitiatorFiles(param)) return param.substr(0, param.size() - 12);
  return param;
}
// A test parameter's transport ("fabric_tcp" -> "fabric", "tcp_file" ->
// "tcp") and fabric provider ("tcp"; "" for the others).
inline std::string TransportOf(const std::string& param) {
  if (param == "shm_mapped" || param == "shm_socket") return "shm";
  const std::string base = BaseParam(param);
  return base.starts_with("fabric_") ? "fabric" : base;
}
// Whether the target's buffers are shared memory (the initiator maps them).
inline bool SharesTargetMemory(const std::string& param) { return param == "shm_mapped"; }
inline std::string FabricProviderOf(const std::string& param) {
  const std::string base = BaseParam(param);
  return base.starts_with("fabric_") ? base.substr(7) : "";
}

// Why `param` cannot run on this machine ("" if it can): shm without
// same-host copies, a fabric provider libfabric does not list here.
inline std::string TransportRefusal(const std::string& param) {
  if (TransportOf(param) == "shm") return SameHostCopyRefusal();
  if (TransportOf(param) == "fabric") {
    const FabricInfo f = DescribeFabric(FabricProviderOf(param), "127.0.0.1");
    if (f.chosen.empty()) return "fabric provider " + FabricProviderOf(param) + ": " + f.why_none;
  }
  return "";
}
#define FERRY_SKIP_UNLESS_TRANSPORT_WORKS(param)                                      \
  do {                                                                                \
    const std::string why_not = ::ferry::test::TransportRefusal(param);               \
    if (!why_not.empty()) GTEST_SKIP() << (param) << " cannot run here: " << why_not; \
  } while (0)

// Engine options for `param`: its transport and fabric provider.
inline void SetTransportOptions(const std::string& param, EngineOptions* o) {
  o->transport = TransportOf(param);
  o->fabric_provider = FabricProviderOf(param);
  if (param == "shm_socket") o->shm_rings = false;
}

}  // namespace ferry::test
