// TestingOptions: settings that only Ferry's own tests use (EngineOptions::testing).
// They play older builds, refuse paths or inject faults; none belongs in a
// deployment, so they are not rows of OptionTable(), have no FERRY_* variable
// and `ferry info` does not list them.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry {

struct TestingOptions {
  // Pretend to speak only these wire versions (0 = real range).
  uint16_t wire_version_min = 0;
  uint16_t wire_version_max = 0;
  // Refuse peers' same-host (shm) streams as if their memory could not be
  // reached, so they fall back to tcp.
  bool refuse_same_host_copy = false;
  // Accept registrations of the test memory kind (location "test-opaque":
  // pages the CPU must not touch, reached only through their own copy
  // functions; see docs/architecture.md, "Memory kinds").
  bool allow_test_memory_kind = false;
  // Load the CUDA driver from this library (a path) instead of
  // libcuda.so.1: the tests' fake driver on machines without a GPU.
  std::string cuda_driver;
  // A tcp target stages a peer's transfers of its GPU memory through
  // pageable heap memory instead of page-locked memory of the driver (as
  // builds before it did): the benchmark's before and after.
  bool pageable_gpu_staging = false;
  // Play a build that reads and writes descriptor formats up to this one
  // (0 = this build's newest).
  uint16_t descriptor_format_max = 0;
  // Play an older build: leave these features (e.g. "notify-1m") out of
  // what this engine advertises to its peers.
  std::vector<std::string> omit_features;
  // Faults injected below the engine into every link of every transport
  // (src/transport/fault/): each slice posted is, with these chances in
  // percent, failed at once (kUnavailable), dropped (its reply never comes:
  // kDeadlineExceeded at its deadline), answered late (`delay`), answered
  // out of order, or answered with a corrupted status (kDataLoss).
  // Deterministic: the same seed and the same posts give the same faults.
  // seed 0: off.
  //
  // late_read_percent: a read slice fails kDeadlineExceeded at once but is
  // still moved later — posted just before the link's next post, its bytes
  // landing after its failure was reported — as the fabric provider does
  // with a read past its deadline. under_staging: the faults sit below the
  // GPU and file stagers, so they reach the stagers' posts (from their
  // staging buffers) as well as the engine's direct ones.
  struct LinkFaults {
    uint32_t seed = 0;
    int fail_percent = 0;
    int drop_percent = 0;
    int delay_percent = 0;
    int reorder_percent = 0;
    int corrupt_percent = 0;
    int late_read_percent = 0;
    bool under_staging = false;
    std::chrono::milliseconds delay{5};
  } link_faults;
  // File regions (Engine::RegisterFile): a read or write of a file region
  // that covers one of these file offsets fails as if the device had
  // answered EIO (it still goes through the ring, as a no-op), like a
  // disk's bad sectors.
  std::vector<uint64_t> file_eio_offsets;
  // Play a build whose same-host streams do not take staged lends (their
  // hello leaves out the flag, docs/wire-format.md "LendAck"): a target
  // refuses such a stream's lent reads of its file regions.
  bool no_staged_lends = false;
};

}  // namespace ferry
