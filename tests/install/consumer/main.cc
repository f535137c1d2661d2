// A program outside Ferry's tree that uses only its installed files:
// tests/install/install_test.sh builds it against a temporary prefix, with
// find_package(Ferry) (CMakeLists.txt here) and with pkg-config, and runs it
// as two processes moving bytes over tcp on 127.0.0.1.
//
//   consumer target
//       registers `source` (a pattern) and `sink` (zeros), prints
//       "READY <peer id> <source address> <sink address> <length>", waits
//       for a line on stdin, then checks that `sink` holds the initiator's
//       pattern: prints "SINK OK" (exit 0) or the first wrong byte (exit 1).
//   consumer initiator PEER SOURCE SINK LENGTH
//       reads the target's `source` and checks it, writes its own pattern
//       into the target's `sink`, prints "INITIATOR OK".
//
// Both print "ferry <version>" first (ferry::Version(), from the library).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "ferry/ferry.h"

namespace {

// 4 MiB and a bit: several slices (EngineOptions::slice_size is 1 MiB).
constexpr uint64_t kLength = (uint64_t{4} << 20) + 123;
constexpr uint8_t kSourceSeed = 7;
constexpr uint8_t kSinkSeed = 29;

uint8_t PatternByte(uint64_t i, uint8_t seed) {
  return static_cast<uint8_t>((i * 131 + seed + (i >> 12)) & 0xff);
}

std::vector<uint8_t> Pattern(uint64_t length, uint8_t seed) {
  std::vector<uint8_t> bytes(length);
  for (uint64_t i = 0; i < length; ++i) bytes[i] = PatternByte(i, seed);
  return bytes;
}

// 0 if `bytes` is the pattern, else prints the first difference and returns 1.
int CheckPattern(const std::vector<uint8_t>& bytes, uint8_t seed, const char* what) {
  for (uint64_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != PatternByte(i, seed)) {
      std::cout << what << ": byte " << i << " is " << int{bytes[i]} << ", expected "
                << int{PatternByte(i, seed)} << std::endl;
      return 1;
    }
  }
  return 0;
}

std::unique_ptr<ferry::Engine> StartEngine() {
  ferry::EngineOptions options;
  options.listen_host = "127.0.0.1";
  options.transport = "tcp";
  auto engine = ferry::Engine::Create(options);
  if (!engine.ok()) {
    std::cout << "Engine::Create: " << engine.status() << std::endl;
    return nullptr;
  }
  return std::move(engine).value();
}

int Target() {
  auto engine = StartEngine();
  if (!engine) return 1;
  std::vector<uint8_t> source = Pattern(kLength, kSourceSeed);
  std::vector<uint8_t> sink(kLength, 0);
  for (auto* buffer : {&source, &sink}) {
    if (ferry::Status s = engine->RegisterMemory(buffer->data(), buffer->size(), "cpu"); !s.ok()) {
      std::cout << "RegisterMemory: " << s << std::endl;
      return 1;
    }
  }
  std::cout << "READY " << engine->PeerId() << " " << reinterpret_cast<uintptr_t>(source.data())
            << " " << reinterpret_cast<uintptr_t>(sink.data()) << " " << kLength << std::endl;
  std::string line;
  std::getline(std::cin, line);  // the initiator is done
  if (CheckPattern(sink, kSinkSeed, "sink") != 0) return 1;
  std::cout << "SINK OK" << std::endl;
  return 0;
}

int Initiator(const std::string& peer, uint64_t source_addr, uint64_t sink_addr, uint64_t length) {
  auto engine = StartEngine();
  if (!engine) return 1;
  std::vector<uint8_t> local(length, 0);
  if (ferry::Status s = engine->RegisterMemory(local.data(), local.size(), "cpu"); !s.ok()) {
    std::cout << "RegisterMemory: " << s << std::endl;
    return 1;
  }
  auto segment = engine->OpenSegment(peer);
  if (!segment.ok()) {
    std::cout << "OpenSegment(" << peer << "): " << segment.status() << std::endl;
    return 1;
  }
  ferry::TransferRequest request;
  request.opcode = ferry::Opcode::kRead;
  request.local = local.data();
  request.segment = *segment;
  request.remote_addr = source_addr;
  request.length = length;
  if (ferry::Status s = engine->TransferSync(request); !s.ok()) {
    std::cout << "read: " << s << std::endl;
    return 1;
  }
  if (CheckPattern(local, kSourceSeed, "read") != 0) return 1;
  const std::vector<uint8_t> pattern = Pattern(length, kSinkSeed);
  std::copy(pattern.begin(), pattern.end(), local.begin());  // into the registered buffer
  request.opcode = ferry::Opcode::kWrite;
  request.remote_addr = sink_addr;
  if (ferry::Status s = engine->TransferSync(request); !s.ok()) {
    std::cout << "write: " << s << std::endl;
    return 1;
  }
  std::cout << "INITIATOR OK (via " << engine->DescribeSegment(*segment)->transport << ")"
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::cout << "ferry " << ferry::Version() << std::endl;
  const std::string role = argc > 1 ? argv[1] : "";
  if (role == "target" && argc == 2) return Target();
  if (role == "initiator" && argc == 6) {
    return Initiator(argv[2], std::stoull(argv[3]), std::stoull(argv[4]), std::stoull(argv[5]));
  }
  std::cerr << "usage: " << argv[0] << " target | initiator PEER SOURCE SINK LENGTH\n";
  return 2;
}
