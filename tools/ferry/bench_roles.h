// How the processes of `ferry bench` meet, kept apart from what is measured:
// the target role (an engine and a control port that serve until a signal),
// and the launcher's target child (the same program, started with --role
// target, whose first lines say where it is).
//
// The target prints, flushed, before it serves: with a metadata service
// (--metadata), "name NAME" (the name it published: what an initiator takes
// as --target); then "peer_id HOST:PORT" (its engine's peer id: the --target
// of an initiator without a metadata service) and "control HOST:PORT" (its
// control port), one per line.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "bench_options.h"
#include "ferry/status.h"
#include "net.h"

namespace ferry::bench {

// --role target: serves until SIGINT or SIGTERM; returns the exit status.
// Throws cli::RunError.
int RunTarget(const BenchOptions& o);

// The launcher's target: `ferry bench --role target` as a child process with
// a `buffer_size` buffer, its stdout read until it said where it is. The
// child gets SIGTERM when this process dies.
class TargetChild {
 public:
  // Throws cli::RunError when the child cannot start or does not report its
  // addresses within 30 s.
  TargetChild(const BenchOptions& o, uint64_t buffer_size);
  ~TargetChild();
  TargetChild(const TargetChild&) = delete;
  TargetChild& operator=(const TargetChild&) = delete;

  const std::string& peer_id() const { return peer_id_; }
  const std::string& control() const { return control_; }

  // SIGTERM, then waits (10 s) for a clean exit.
  Status Stop();

 private:
  void Start(const BenchOptions& o, uint64_t buffer_size);
  void ReadAddresses();

  pid_t pid_ = -1;
  Fd out_;
  std::string peer_id_, control_;
};

}  // namespace ferry::bench
