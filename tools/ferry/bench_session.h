// What a measurement of `ferry bench` needs, however the processes met: an
// engine, the target's opened segment, a local buffer and, when the target
// can be reached, its control channel.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "bench_options.h"
#include "bench_util.h"
#include "control.h"
#include "ferry/ferry.h"

namespace ferry::bench {

struct Session {
  // --transport local: the target lives here too (destroyed last).
  std::unique_ptr<Buffer> target_buffer;
  std::unique_ptr<ControlServer> target_control;
  std::unique_ptr<Engine> target_engine;

  std::unique_ptr<Engine> engine;
  SegmentHandle segment;
  SegmentInfo info;
  uint64_t remote_base = 0;
  uint64_t remote_length = 0;
  std::unique_ptr<Buffer> local;

  bool have_control = false;
  std::string control_host;
  uint16_t control_port = 0;
  std::unique_ptr<ControlClient> control;  // the main thread's
  bool target_in_process = false;          // its CPU time is ours
  bool hugepages = false;

  ~Session();
};

// Starts the initiator's engine, opens the target `target` (a peer id, or a
// name with a metadata service), registers a local buffer of `local_bytes`
// and connects to the target's control port: `control_addr`, or else the one
// the target advertises in its segment name (P2P). Throws cli::RunError.
void OpenSession(Session& s, const BenchOptions& o, const std::string& target,
                 const std::string& control_addr, uint64_t local_bytes);

}  // namespace ferry::bench
