// Runs the wire fuzz target over valid seed messages and a bounded number of
// deterministic random mutations of them (no libFuzzer needed), so every CI
// run exercises the decoders with hostile input. Prints "N passed, 0 failed".
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "transport/shm/copy_frames.h"
#include "metadata/entries.h"
#include "wire/descriptor.h"
#include "wire/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::string> Seeds() {
  using namespace ferry::wire;
  std::vector<std::string> seeds;
  auto add = [&](uint8_t which, const std::string& body) { seeds.push_back(std::string(1, char(which)) + body); };
  FrameHeader h;
  h.version = 1;
  h.type = FrameType::kWrite;
  h.body_len = 28;
  h.payload_len = 4096;
  h.seq = 9;
  uint8_t hb[kFrameHeaderSize];
  EncodeHeader(h, hb);
  add(0, std::string(reinterpret_cast<char*>(hb), sizeof(hb)));
  std::string s;
  Entry es[2] = {{0x1000, 10}, {0x2000, 4096}};
  EncodeEntries(es, 2, &s);
  add(1, s);
  s.clear();
  EncodeReply({ferry::OkStatus(), {{1, ferry::StatusCode::kInvalidArgument, "bad range"}}}, &s);
  add(2, s);
  s.clear();
  EncodeNotify({"127.0.0.1:1", "name", "message"}, &s);
  add(3, s);
  s.clear();
  EncodeStreamHello({1, 2, 1, 0, "127.0.0.1:5"}, &s);
  add(4, s);
  PeerDescriptor d;
  d.engine_name = "e";
  d.peer_id = "127.0.0.1:5";
  d.instance_id = 3;
  d.wire_min = d.wire_max = 1;
  d.transports = {{"tcp", "127.0.0.1:5"}};
  d.features = {"read", "write"};
  d.regions = {{0x1000, 4096, "*", "cpu", {}}, {0x9000, 4096, "cpu:0", "test-opaque", {{"fabric", 77}}}};
  s.clear();
  EncodeDescriptor(d, &s);  // format 2
  add(5, s);
  s.clear();
  EncodeDescriptor(d, &s, 1);
  add(5, s);
  s.clear();
  EncodeHandshakeResponse(ferry::OkStatus(), d, &s);
  add(6, s);
  s.clear();
  ferry::internal::shm::CopyEntry ce[2] = {{0x1000, 10, 0x7000}, {0x2000, 4096, 0x9000}};
  ferry::internal::shm::EncodeCopyEntries(ce, 2, &s);
  add(7, s);
  s.clear();
  ferry::internal::shm::EncodeCopyHello({{1, 2, 1, 0, "127.0.0.1:5"}, 0x7fff0000, "0123456789abcdef"}, &s);
  add(8, s);
  // Two frames back to back for the frame reader: a write with payload, an
  // ack without.
  {
    std::string stream;
    std::string body;
    Entry we[1] = {{0x1000, 300}};
    EncodeEntries(we, 1, &body);
    FrameHeader w;
    w.version = 1;
    w.type = FrameType::kWrite;
    w.payload_len = 300;
    w.seq = 2;
    stream = BuildFrame(w, body) + std::string(300, 'x');
    std::string rep;
    EncodeReply({ferry::OkStatus(), {}}, &rep);
    FrameHeader a;
    a.type = FrameType::kAck;
    a.seq = 3;
    stream += BuildFrame(a, rep);
    add(9, stream);
  }
  // A store's value: a descriptor of segment "e", raw and in base64.
  d.engine_name = "e";
  s.clear();
  EncodeDescriptor(d, &s);
  add(10, s);
  add(10, ferry::internal::Base64(s));
  // Authentication bodies: a hello, a challenge (accepted and refused), a proof.
  AuthHello ah;
  ah.nonce.fill(0x11);
  ah.peer_id = "127.0.0.1:5";
  s.clear();
  EncodeAuthHello(ah, &s);
  add(11, s);
  AuthChallenge ac;
  ac.nonce.fill(0x22);
  ac.mac.fill(0x33);
  s.clear();
  EncodeAuthChallenge(ac, &s);
  add(12, s);
  ac.status = ferry::UnauthenticatedError("engine 127.0.0.1:5 has no cluster secret");
  s.clear();
  EncodeAuthChallenge(ac, &s);
  add(12, s);
  AuthProof ap;
  ap.mac.fill(0x44);
  s.clear();
  EncodeAuthProof(ap, &s);
  add(13, s);
  return seeds;
}

}  // namespace

int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 200000;
  std::mt19937_64 rng(12345);
  auto seeds = Seeds();
  long runs = 0;
  for (const auto& s : seeds) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    ++runs;
  }
  for (long i = 0; i < iterations; ++i) {
    std::string m = seeds[rng() % seeds.size()];
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 4) {
        case 0:  // flip a byte (not the selector)
          if (m.size() > 1) m[1 + rng() % (m.size() - 1)] = static_cast<char>(rng());
          break;
        case 1:  // truncate
          if (m.size() > 1) m.resize(1 + rng() % (m.size() - 1));
          break;
        case 2:  // append junk
          m.append(rng() % 16, static_cast<char>(rng()));
          break;
        case 3:  // set a length-ish byte to a large value
          if (m.size() > 2) m[1 + rng() % (m.size() - 1)] = static_cast<char>(0xff);
          break;
      }
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(m.data()), m.size());
    ++runs;
  }
  std::printf("wire_fuzz_replay: %ld passed, 0 failed\n", runs);
  return 0;
}
