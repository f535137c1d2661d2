// Valid inputs of every fuzz target, made with the real encoders: the start
// of wire_fuzz_replay's mutations and, written out by make_corpus.cc, the
// seed corpus in corpus/<target>/.
#include <string>
#include <vector>

#include "fuzz_targets.h"
#include "metadata/entries.h"
#include "transport/fabric/fabric_messages.h"
#include "transport/shm/copy_frames.h"
#include "wire/descriptor.h"
#include "wire/frame.h"

namespace ferry::fuzz {
namespace {

using namespace ferry::wire;

std::string Pick(int which, const std::string& body) {
  return std::string(1, static_cast<char>(which)) + body;
}

PeerDescriptor Descriptor(const std::string& name, uint64_t instance) {
  PeerDescriptor d;
  d.engine_name = name;
  d.peer_id = "127.0.0.1:5";
  d.instance_id = instance;
  d.process_token = 77;
  d.hostname = "host";
  d.pid = 42;
  d.version = "0.1.0";
  d.wire_min = d.wire_max = 1;
  d.transports = {{"tcp", "127.0.0.1:5"}, {"local", "1234"}};
  d.features = {"read", "write",
                DescriptorFormatsFeature(kDescriptorFormatMin, kDescriptorFormatMax)};
  d.regions = {{0x1000, 4096, "*", "cpu", {}},
               {0x9000, 4096, "cpu:0", "test-opaque", {{"fabric", 77}}},
               {0x20000, 8192, "cuda:0", "cuda:0", {{"cuda-ipc", 0x40, std::string(64, '\x11')}}}};
  return d;
}

std::string Encoded(const PeerDescriptor& d, uint16_t format = kDescriptorFormatMax) {
  std::string s;
  EncodeDescriptor(d, &s, format);
  return s;
}

std::vector<std::string> FrameSeeds() {
  std::vector<std::string> seeds;
  FrameHeader h;
  h.version = 1;
  h.type = FrameType::kWrite;
  h.body_len = 28;
  h.payload_len = 4096;
  h.seq = 9;
  uint8_t hb[kFrameHeaderSize];
  EncodeHeader(h, hb);
  seeds.push_back(Pick(0, std::string(reinterpret_cast<char*>(hb), sizeof(hb))));
  std::string s;
  Entry es[2] = {{0x1000, 10}, {0x2000, 4096}};
  EncodeEntries(es, 2, &s);
  seeds.push_back(Pick(1, s));
  s.clear();
  EncodeReply({ferry::OkStatus(),
               {{1, ferry::StatusCode::kInvalidArgument, "bad range"},
                {4, ferry::StatusCode::kDataLoss, ""}}},
              &s);
  seeds.push_back(Pick(2, s));
  s.clear();
  EncodeLendAck({{ferry::OkStatus(), {{1, ferry::StatusCode::kDataLoss, "EIO"}}},
                 {{0, 0x7f0000001000}, {2, 0x7f0000003000}}},
                &s);
  seeds.push_back(Pick(2, s));
  s.clear();
  EncodeNotify({"127.0.0.1:1", "name", "message"}, &s);
  seeds.push_back(Pick(3, s));
  s.clear();
  EncodeStreamHello({1, 2, 1, 0, "127.0.0.1:5"}, &s);
  seeds.push_back(Pick(4, s));
  s.clear();
  EncodeStatus(ferry::InvalidArgumentError("no such region"), &s);
  seeds.push_back(Pick(5, s));
  // Two frames back to back for the frame reader: a write with payload, an
  // ack without.
  {
    std::string body;
    Entry we[1] = {{0x1000, 300}};
    EncodeEntries(we, 1, &body);
    FrameHeader w;
    w.version = 1;
    w.type = FrameType::kWrite;
    w.payload_len = 300;
    w.seq = 2;
    std::string stream = BuildFrame(w, body) + std::string(300, 'x');
    std::string rep;
    EncodeReply({ferry::OkStatus(), {}}, &rep);
    FrameHeader a;
    a.type = FrameType::kAck;
    a.seq = 3;
    stream += BuildFrame(a, rep);
    seeds.push_back(Pick(6, stream));
  }
  // A blocking exchange answered by a handshake response, a stream hello
  // ack, an authentication challenge.
  {
    std::string body;
    EncodeHandshakeResponse(ferry::OkStatus(), Descriptor("e", 3), &body);
    FrameHeader r;
    r.type = FrameType::kHandshakeResponse;
    r.seq = 1;
    seeds.push_back(Pick(7, std::string(1, '\0') + BuildFrame(r, body)));
    body.clear();
    EncodeStatus(ferry::OkStatus(), &body);
    r.type = FrameType::kStreamHelloAck;
    seeds.push_back(Pick(7, std::string(1, '\1') + BuildFrame(r, body)));
    AuthChallenge ac;
    ac.nonce.fill(0x22);
    ac.mac.fill(0x33);
    body.clear();
    EncodeAuthChallenge(ac, &body);
    r.type = FrameType::kAuthChallenge;
    seeds.push_back(Pick(7, std::string(1, '\2') + BuildFrame(r, body)));
  }
  return seeds;
}

std::vector<std::string> DescriptorSeeds() {
  std::vector<std::string> seeds;
  const PeerDescriptor d = Descriptor("e", 3);
  seeds.push_back(Pick(0, Encoded(d)));
  seeds.push_back(Pick(0, Encoded(d, 1)));
  std::string exported;
  EncodeExportedMetadata(d, &exported);  // the same case decodes exported metadata
  seeds.push_back(Pick(0, exported));
  std::string s;
  EncodeHandshakeResponse(ferry::OkStatus(), d, &s);
  seeds.push_back(Pick(1, s));
  s.clear();
  EncodeHandshakeResponse(ferry::FailedPreconditionError("no common wire protocol version"),
                          PeerDescriptor{}, &s, 1);
  seeds.push_back(Pick(1, s));
  PeerDescriptor newer = d;
  newer.wire_min = 2;
  newer.wire_max = 3;
  newer.features = {"descriptor-formats:1..7"};
  seeds.push_back(Pick(2, Encoded(newer)));
  seeds.push_back(Pick(2, Encoded(d, 1)));
  seeds.push_back(Pick(3, "127.0.0.1:5"));
  seeds.push_back(Pick(3, "[::1]:65535"));
  return seeds;
}

std::vector<std::string> AuthSeeds() {
  std::vector<std::string> seeds;
  AuthHello ah;
  ah.nonce.fill(0x11);
  ah.peer_id = "127.0.0.1:5";
  std::string s;
  EncodeAuthHello(ah, &s);
  seeds.push_back(Pick(0, s));
  AuthChallenge ac;
  ac.nonce.fill(0x22);
  ac.mac.fill(0x33);
  s.clear();
  EncodeAuthChallenge(ac, &s);
  seeds.push_back(Pick(1, s));
  ac.status = ferry::UnauthenticatedError("engine 127.0.0.1:5 has no cluster secret");
  s.clear();
  EncodeAuthChallenge(ac, &s);
  seeds.push_back(Pick(1, s));
  AuthProof ap;
  ap.mac.fill(0x44);
  s.clear();
  EncodeAuthProof(ap, &s);
  seeds.push_back(Pick(2, s));
  return seeds;
}

// A live slot (state 1, generation 0) whose fields a mutation changes, a
// key, and ranges inside and across the region's end.
std::vector<std::string> SlotTableSeeds() {
  std::vector<std::string> seeds;
  std::string slot(64, '\0');
  slot[0] = 1;
  seeds.push_back(slot);
  std::string s = slot;
  const uint64_t vals[] = {1, 0, 4096, 100, 65530, 10};
  for (uint64_t v : vals) s.append(reinterpret_cast<const char*>(&v), 8);
  seeds.push_back(s);
  return seeds;
}

// Scripts for the request rings: writes and reads on both sides that wrap
// the ring, and steps that move a position to the edge of what is valid.
std::vector<std::string> RequestRingSeeds() {
  std::vector<std::string> seeds;
  auto op = [](std::string* s, int kind, int side, int ring, int high = 0) {
    s->push_back(static_cast<char>((kind << 2) | (ring << 1) | side | (high << 7)));
  };
  auto len = [](std::string* s, uint16_t n) {
    s->push_back(static_cast<char>(n >> 8));
    s->push_back(static_cast<char>(n & 0xff));
  };
  std::string s;
  for (int i = 0; i < 6; ++i) {
    op(&s, 2, i % 2, 0);  // write 3000 bytes
    len(&s, 3000);
    op(&s, 3, 1 - i % 2, 0);  // the other side reads 2000
    len(&s, 2000);
    op(&s, 5, 1 - i % 2, 0);  // arm
  }
  seeds.push_back(s);
  std::string edge;
  op(&edge, 2, 0, 0);
  len(&edge, 100);
  op(&edge, 0, 0, 0, /*high: tail*/ 1);
  const uint64_t tail = 4096 + 1;  // one past what the ring holds
  edge.append(reinterpret_cast<const char*>(&tail), 8);
  op(&edge, 3, 1, 0);
  len(&edge, 200);
  seeds.push_back(edge);
  return seeds;
}

std::vector<std::string> CopyFrameSeeds() {
  namespace shm = ferry::internal::shm;
  std::vector<std::string> seeds;
  std::string s;
  shm::CopyEntry ce[2] = {{0x1000, 10, 0x7000}, {0x2000, 4096, 0x9000}};
  shm::EncodeCopyEntries(ce, 2, &s);
  seeds.push_back(Pick(0, s));
  s.clear();
  shm::EncodeCopyHello({{1, 2, 1, 0, "127.0.0.1:5"}, 0x7fff0000, "0123456789abcdef", std::nullopt},
                       &s);
  seeds.push_back(Pick(1, s));
  s.clear();
  shm::EncodeCopyHello(
      {{1, 2, 1, 0, "127.0.0.1:5"}, 0x7fff0000, "0123456789abcdef", shm::HelloRing{5, 6, 7, 65536}},
      &s);
  seeds.push_back(Pick(1, s));
  s.clear();
  shm::EncodeCopyReturn(7, &s);
  seeds.push_back(Pick(2, s));
  {
    namespace fabric = ferry::internal::fabric;
    fabric::Message n;
    n.type = fabric::MessageType::kNotify;
    n.seq = 5;
    n.reply_to = std::string("\x02\x00\x9c\x40\x7f\x00\x00\x01\0\0\0\0\0\0\0\0", 16);
    n.notify = {"127.0.0.1:1", "kv-done", "layer 3"};
    fabric::EncodeMessage(n, &s);
    seeds.push_back(Pick(2, s));
    fabric::Message a;
    a.type = fabric::MessageType::kAck;
    a.seq = 5;
    a.status = ferry::ResourceExhaustedError("inbox full");
    fabric::EncodeMessage(a, &s);
    seeds.push_back(Pick(2, s));
    seeds.push_back(
        Pick(2, fabric::EncodeEndpoint({"tcp;ofi_rxm",
                                        2,
                                        {std::string("\x02\x00\x9c\x40\x7f\x00\x00\x01", 8),
                                         std::string("\x02\x00\x9c\x41\x7f\x00\x00\x02", 8)}})));
  }
  return seeds;
}

std::vector<std::string> StoreEntrySeeds() {
  std::vector<std::string> seeds;
  const std::string mine = Encoded(Descriptor("e", 3));
  const std::string other = Encoded(Descriptor("e", 4), 1);
  seeds.push_back(Pick(0, mine));
  seeds.push_back(Pick(0, ferry::internal::Base64(other)));
  seeds.push_back(Pick(1, ferry::internal::Base64("ferry/segments/e")));
  seeds.push_back(Pick(2, "ferry/segments/prefill-0"));
  return seeds;
}

#ifdef FERRY_FUZZ_STORES
// A whole HTTP response, sent as it is.
std::string Raw(const std::string& status, const std::string& body,
                const std::string& headers = "") {
  return "HTTP/1.1 " + status + "\r\n" + headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Replies of a store's service, separated as store_fuzz.cc reads them.
std::string Replies(int op, const std::vector<std::string>& replies) {
  std::string s(1, static_cast<char>(op));
  for (size_t i = 0; i < replies.size(); ++i) s += (i ? "\n~~\n" : "") + replies[i];
  return s;
}

std::vector<std::string> EtcdSeeds() {
  using ferry::internal::Base64;
  const std::string key = Base64("ferry/segments/e");
  const auto kv = [&](const std::string& value, const std::string& lease) {
    return "{\"key\":\"" + key +
           "\",\"create_revision\":\"3\",\"mod_revision\":\"4\",\"version\":\"1\",\"value\":\"" +
           Base64(value) + "\",\"lease\":\"" + lease + "\"}";
  };
  const std::string header =
      "\"header\":{\"cluster_id\":\"1\",\"member_id\":\"2\",\"revision\":\"5\",\"raft_term\":"
      "\"2\"}";
  const std::string grant = "{" + header + ",\"ID\":\"7587\",\"TTL\":\"2\"}";
  const std::string created = "{" + header + ",\"succeeded\":true}";
  const auto taken = [&](const std::string& value) {
    return "{" + header + ",\"responses\":[{\"response_range\":{" + header + ",\"kvs\":[" +
           kv(value, "99") + "],\"count\":\"1\"}}]}";
  };
  const std::string mine = Encoded(Descriptor("e", 3));
  const std::string other = Encoded(Descriptor("e", 4));
  std::vector<std::string> seeds;
  // Fetch: found, absent, a refusal, a server error.
  seeds.push_back(
      Replies(0, {"{" + header + ",\"kvs\":[" + kv(other, "7") + "],\"count\":\"1\"}"}));
  seeds.push_back(Replies(0, {"{" + header + "}"}));
  seeds.push_back(
      Replies(0, {Raw("400 Bad Request", "{\"error\":\"bad\",\"code\":3,\"message\":\"x\"}")}));
  seeds.push_back(Replies(0, {"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"}));
  // Publish: created; held by this instance (replaced); held by another
  // (its lease's time to live asked); then removed.
  seeds.push_back(Replies(1, {grant, created, "{}"}));
  seeds.push_back(Replies(1, {grant, taken(mine), created, "{}"}));
  seeds.push_back(Replies(
      1,
      {grant, taken(other), "{" + header + ",\"ID\":\"99\",\"TTL\":\"1\",\"grantedTTL\":\"2\"}"}));
  seeds.push_back(Replies(2, {grant, created, created, "{}"}));
  // Watch: created, two events (a put and a delete), then a compaction.
  const std::string events = "{\"result\":{" + header + ",\"created\":true}}\n{\"result\":{" +
                             header + ",\"events\":[{\"kv\":" + kv(other, "7") +
                             "},{\"type\":\"DELETE\",\"kv\":{\"key\":\"" +
                             Base64("ferry/segments/p") + "\",\"mod_revision\":\"6\"}}]}}\n";
  seeds.push_back(Replies(3, {events}));
  seeds.push_back(
      Replies(3, {"{\"result\":{" + header + ",\"compact_revision\":\"3\",\"canceled\":true}}\n"}));
  return seeds;
}

std::vector<std::string> HttpSeeds() {
  const std::string none = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
  const std::string put = "HTTP/1.1 200 OK\r\nX-Ferry-TTL-Ms: 30\r\nContent-Length: 0\r\n\r\n";
  const std::string mine = Encoded(Descriptor("e", 3));
  const std::string other = Encoded(Descriptor("e", 4), 1);
  std::vector<std::string> seeds;
  seeds.push_back(Replies(0, {other}));
  seeds.push_back(Replies(0, {none}));
  seeds.push_back(Replies(0, {Raw("500 Internal Server Error", "oops\n")}));
  seeds.push_back(Replies(1, {none, put}));
  seeds.push_back(Replies(1, {mine, put}));
  seeds.push_back(Replies(1, {other}));
  seeds.push_back(Replies(2, {none, put, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"}));
  return seeds;
}
#endif

}  // namespace

std::vector<std::string> Seeds(std::string_view target) {
  if (target == "fuzz_frames") return FrameSeeds();
  if (target == "fuzz_descriptor") return DescriptorSeeds();
  if (target == "fuzz_auth") return AuthSeeds();
  if (target == "fuzz_copy_frames") return CopyFrameSeeds();
  if (target == "fuzz_store_entries") return StoreEntrySeeds();
  if (target == "fuzz_slot_table") return SlotTableSeeds();
  if (target == "fuzz_request_ring") return RequestRingSeeds();
#ifdef FERRY_FUZZ_STORES
  if (target == "fuzz_etcd_json") return EtcdSeeds();
  if (target == "fuzz_http_store") return HttpSeeds();
#endif
  return {};
}

}  // namespace ferry::fuzz
