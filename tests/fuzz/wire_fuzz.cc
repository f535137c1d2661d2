// The decoders of a peer's bytes and of a store's values, one function per
// family (fuzz_targets.h). Built into every fuzz_<name> libFuzzer binary
// (FERRY_FUZZ=ON, clang) and into wire_fuzz_replay, the bounded
// deterministic run that ctest and the ASan pass of scripts/run-tests.sh run.
//
// Properties checked: no decoder crashes or reads out of bounds (ASan/UBSan
// under libFuzzer), whatever decodes re-encodes to the same bytes (or, where
// the encoding is not unique, to bytes that decode to the same value), and
// errors about a store's value name its key.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/net.h"
#include "fuzz_targets.h"
#include "metadata/entries.h"
#include "transport/fabric/fabric_messages.h"
#include "transport/shm/copy_frames.h"
#include "transport/stream/frame_reader.h"
#include "wire/descriptor.h"
#include "wire/exchange.h"
#include "wire/frame.h"

namespace ferry::fuzz {
namespace {

using namespace ferry::wire;

void Check(bool ok) {
  if (!ok) std::abort();
}

// Splits an input into the decoder it picks and that decoder's bytes.
struct Pick {
  int which = -1;  // -1: empty input
  std::string_view rest;
};
Pick PickOf(std::string_view in, int count) {
  if (in.empty()) return {};
  return {static_cast<uint8_t>(in[0]) % count, in.substr(1)};
}

// Takes every frame the socket-free reader produces; places each payload in
// a buffer of its announced size, alternating destinations and discards, so
// the reader's payload bookkeeping sees hostile lengths.
class FuzzSink : public ferry::internal::stream::FrameReader::Sink {
 public:
  ferry::internal::stream::FrameReader* reader = nullptr;
  ferry::Status OnHeader(const FrameHeader& h) override {
    return h.flags == 0xffff ? ferry::DataLossError("refused") : ferry::OkStatus();
  }
  ferry::Status OnFrame(const FrameHeader& h, std::string_view) override {
    if (h.payload_len == 0 && (h.seq & 1)) {  // expects nothing: the frame is whole
      frames.push_back(h.seq);
      last_seq_ = h.seq;
      return ferry::OkStatus();
    }
    reader->ExpectPayload();
    buf_.assign(h.payload_len, '\0');
    size_t off = 0;
    for (size_t piece = 1; off < buf_.size(); piece = piece * 3 + 1) {
      const size_t n = std::min(piece, buf_.size() - off);
      if (piece & 2) {
        reader->AddDiscard(n);
      } else {
        reader->AddDestination(buf_.data() + off, n);
      }
      off += n;
    }
    return ferry::OkStatus();
  }
  ferry::Status OnPayload(const FrameHeader& h) override {
    frames.push_back(h.seq);
    last_seq_ = h.seq;
    return ferry::OkStatus();
  }
  // With `holding`: holds after each frame whose seq has bit 1 set.
  bool Hold() const override { return holding && (last_seq_ & 2) != 0; }
  bool holding = false;
  std::vector<uint64_t> frames;  // seq of each whole frame, in order

 private:
  std::vector<char> buf_;
  uint64_t last_seq_ = 0;
};

// One blocking request/response (wire::ExchangeFrame, as handshakes and
// hellos use it) whose peer answers with `answer` and then closes.
void FuzzExchange(std::string_view in) {
  if (in.empty()) return;
  static constexpr FrameType kReplies[] = {FrameType::kHandshakeResponse,
                                           FrameType::kStreamHelloAck, FrameType::kAuthChallenge};
  const FrameType reply_type = kReplies[static_cast<uint8_t>(in[0]) % 3];
  std::string_view answer = in.substr(1);
  int fds[2];
  Check(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  ferry::internal::UniqueFd mine(fds[0]), peer(fds[1]);
  // Inputs are far below the socket buffer, so this never blocks.
  size_t off = 0;
  while (off < answer.size()) {
    const ssize_t n = ::send(peer.get(), answer.data() + off, answer.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
  ::shutdown(peer.get(), SHUT_WR);  // then EOF: a short answer fails at once, never waits
  FrameHeader h;
  h.type = FrameType::kHandshakeRequest;
  h.seq = 1;
  auto reply = ExchangeFrame(mine.get(), BuildFrame(h, "request"), reply_type,
                             std::chrono::steady_clock::now() + std::chrono::seconds(5));
  if (reply.ok()) {
    // What came back is the body the answer's header announced.
    Check(answer.size() >= kFrameHeaderSize + reply->size());
    Check(*reply == answer.substr(kFrameHeaderSize, reply->size()));
  }
}

}  // namespace

void FuzzFrames(std::string_view input) {
  const Pick p = PickOf(input, 8);
  const std::string_view in = p.rest;
  switch (p.which) {
    case 0: {
      if (in.size() < kFrameHeaderSize) return;
      auto h = DecodeHeader(reinterpret_cast<const uint8_t*>(in.data()));
      if (h.ok()) {
        uint8_t out[kFrameHeaderSize];
        EncodeHeader(*h, out);
        Check(std::string_view(reinterpret_cast<char*>(out), kFrameHeaderSize) ==
              in.substr(0, kFrameHeaderSize));
      }
      break;
    }
    case 1: {
      auto e = DecodeEntries(in);
      if (e.ok()) {
        std::string out;
        EncodeEntries(e->data(), e->size(), &out);
        Check(out == in);
      }
      break;
    }
    case 2: {
      // Unknown status codes read as UNKNOWN: compare what was decoded.
      auto r = DecodeReply(in);
      if (r.ok()) {
        std::string out;
        EncodeReply(*r, &out);
        auto again = DecodeReply(out);
        Check(again.ok() && again->failures.size() == r->failures.size() &&
              again->status.code() == r->status.code());
        for (size_t i = 0; i < r->failures.size(); ++i) {
          Check(again->failures[i].index == r->failures[i].index &&
                again->failures[i].code == r->failures[i].code);
          if (i > 0) Check(r->failures[i].index > r->failures[i - 1].index);  // strictly increasing
        }
      }
      // The same bytes as a lend ack (a reply, then the staged entries).
      auto a = DecodeLendAck(in);
      if (a.ok()) {
        std::string out;
        EncodeLendAck(*a, &out);
        auto again = DecodeLendAck(out);
        Check(again.ok() && again->staged.size() == a->staged.size() &&
              again->reply.failures.size() == a->reply.failures.size());
        for (size_t i = 0; i < a->staged.size(); ++i) {
          Check(again->staged[i].index == a->staged[i].index &&
                again->staged[i].addr == a->staged[i].addr);
          if (i > 0) Check(a->staged[i].index > a->staged[i - 1].index);
          for (const auto& f : a->reply.failures) Check(f.index != a->staged[i].index);
        }
      }
      break;
    }
    case 3: {
      auto n = DecodeNotify(in);
      if (n.ok()) {
        std::string out;
        EncodeNotify(*n, &out);
        Check(out == in);
      }
      break;
    }
    case 4: {
      auto h = DecodeStreamHello(in);
      if (h.ok()) {
        std::string out;
        EncodeStreamHello(*h, &out);
        Check(out == in);
      }
      break;
    }
    case 5: {
      ferry::Status s;
      if (DecodeStatus(in, &s).ok()) {
        std::string out;
        EncodeStatus(s, &out);
        ferry::Status again;
        Check(DecodeStatus(out, &again).ok() && again.code() == s.code());
      }
      break;
    }
    case 6: {
      // The stream's frame reader, fed in uneven pieces (as recv returns
      // them); and a second one whose sink holds after some frames (a served
      // stream over its bounds), drained before each piece as Connection
      // does: both see the same frames, and fail alike.
      FuzzSink sink, held;
      held.holding = true;
      ferry::internal::stream::FrameReader reader(&sink), holding(&held);
      sink.reader = &reader;
      held.reader = &holding;
      bool failed = false, held_failed = false;
      size_t off = 0;
      for (size_t piece = 1; off < in.size(); piece = piece * 2 + 1) {
        const size_t n = std::min(piece, in.size() - off);
        if (!failed) failed = !reader.Consume(in.data() + off, n).ok();
        while (!held_failed && holding.HasPending()) held_failed = !holding.ConsumePending().ok();
        if (!held_failed) held_failed = !holding.Consume(in.data() + off, n).ok();
        off += n;
      }
      while (!held_failed && holding.HasPending()) held_failed = !holding.ConsumePending().ok();
      Check(failed == held_failed);
      Check(sink.frames == held.frames);
      break;
    }
    case 7:
      FuzzExchange(in);
      break;
  }
}

void FuzzDescriptor(std::string_view input) {
  const Pick p = PickOf(input, 4);
  const std::string_view in = p.rest;
  switch (p.which) {
    case 0: {
      auto d = DecodeDescriptor(in);
      if (d.ok()) {
        Check(d->format >= kDescriptorFormatMin && d->format <= kDescriptorFormatMax);
        std::string out;
        EncodeDescriptor(*d, &out, d->format);  // format 1 or 2, as read
        Check(out == in);
      }
      // The same bytes as exported metadata (magic + version + descriptor).
      auto m = DecodeExportedMetadata(in);
      if (m.ok()) {
        std::string out;
        EncodeExportedMetadata(*m, &out, m->format);
        Check(out == in);
      }
      break;
    }
    case 1: {
      auto r = DecodeHandshakeResponse(in);
      if (r.ok()) {
        std::string out;
        EncodeHandshakeResponse(r->first, r->second, &out, r->second.format);
        auto again = DecodeHandshakeResponse(out);
        Check(again.ok() && again->first.code() == r->first.code() &&
              again->second.format == r->second.format);
        std::string d1, d2;
        EncodeDescriptor(r->second, &d1, r->second.format);
        EncodeDescriptor(again->second, &d2, again->second.format);
        Check(d1 == d2);
      }
      break;
    }
    case 2: {
      // A handshake request's descriptor: the version and format answered.
      auto remote = DecodeDescriptor(in);
      if (!remote.ok()) return;
      PeerDescriptor local;
      local.peer_id = "127.0.0.1:1";
      local.wire_min = 1;
      local.wire_max = 1;
      auto v = NegotiateWireVersion(local, *remote);
      if (v.ok()) {
        Check(*v >= local.wire_min && *v <= local.wire_max && *v >= remote->wire_min &&
              *v <= remote->wire_max);
      } else {
        Check(v.status().message().find("no common wire protocol version") != std::string::npos);
      }
      const uint16_t f = AnswerFormat(*remote);
      Check(f >= kDescriptorFormatMin && f <= kDescriptorFormatMax);
      Check(AnswerFormat(*remote, 1) == 1);
      (void)ferry::internal::ParsePeerId(remote->peer_id);
      for (const auto& t : remote->transports) (void)ferry::internal::ParsePeerId(t.endpoint);
      break;
    }
    case 3: {
      // A peer id as descriptors, hellos and notifications carry it:
      // parse, format and parse again give the same host and port (a host
      // with a bracket inside, "[[x]:1", is refused:
      // regressions/fuzz_descriptor/README.md).
      auto hp = ferry::internal::ParsePeerId(in);
      if (hp.ok()) {
        Check(hp->host.find_first_of("[]") == std::string::npos);
        auto again =
            ferry::internal::ParsePeerId(ferry::internal::FormatPeerId(hp->host, hp->port));
        Check(again.ok() && again->host == hp->host && again->port == hp->port);
      } else if (!hp.ok()) {
        Check(hp.status().code() == ferry::StatusCode::kInvalidArgument);
      }
      break;
    }
  }
}

void FuzzAuth(std::string_view input) {
  const Pick p = PickOf(input, 3);
  const std::string_view in = p.rest;
  switch (p.which) {
    case 0: {
      auto h = DecodeAuthHello(in);
      if (h.ok()) {
        std::string out;
        EncodeAuthHello(*h, &out);
        Check(out == in);
      }
      break;
    }
    case 1: {
      // The status may re-encode differently (unknown codes read as UNKNOWN).
      auto c = DecodeAuthChallenge(in);
      if (c.ok()) {
        std::string out;
        EncodeAuthChallenge(*c, &out);
        auto again = DecodeAuthChallenge(out);
        Check(again.ok() && again->nonce == c->nonce && again->mac == c->mac &&
              again->mode == c->mode && again->status.code() == c->status.code());
      }
      break;
    }
    case 2: {
      auto pr = DecodeAuthProof(in);
      if (pr.ok()) {
        std::string out;
        EncodeAuthProof(*pr, &out);
        Check(out == in);
      }
      break;
    }
  }
}

void FuzzCopyFrames(std::string_view input) {
  const Pick p = PickOf(input, 3);
  const std::string_view in = p.rest;
  switch (p.which) {
    case 0: {
      auto e = ferry::internal::shm::DecodeCopyEntries(in);
      if (e.ok()) {
        std::string out;
        ferry::internal::shm::EncodeCopyEntries(e->data(), e->size(), &out);
        Check(out == in);
      }
      break;
    }
    case 1: {
      auto h = ferry::internal::shm::DecodeCopyHello(in);
      if (h.ok()) {
        std::string out;
        ferry::internal::shm::EncodeCopyHello(*h, &out);
        Check(out == in);
      }
      break;
    }
    case 2: {
      auto seq = ferry::internal::shm::DecodeCopyReturn(in);
      if (seq.ok()) {
        std::string out;
        ferry::internal::shm::EncodeCopyReturn(*seq, &out);
        Check(out == in);
      }
      // The same bytes as a lent read: u64 returned, then an entry list.
      auto lend = ferry::internal::shm::DecodeCopyLend(in);
      if (lend.ok()) {
        std::string out(in.substr(0, 8));
        ferry::internal::shm::EncodeCopyEntries(lend->entries.data(), lend->entries.size(), &out);
        Check(out == in);
      }
      // The same bytes as the fabric transport's messages (notification,
      // acknowledgement).
      {
        namespace fabric = ferry::internal::fabric;
        auto m = fabric::DecodeMessage(in);
        if (m.ok()) {
          std::string out;
          fabric::EncodeMessage(*m, &out);
          if (m->type == fabric::MessageType::kNotify) {
            Check(out == in);
          } else {
            auto again = fabric::DecodeMessage(out);  // unknown codes read as UNKNOWN
            Check(again.ok() && again->seq == m->seq && again->status.code() == m->status.code());
          }
        } else {
          Check(!m.status().message().empty());
        }
        // And as a descriptor's fabric endpoint string: what decodes
        // encodes to a string that decodes to the same.
        auto e = fabric::DecodeEndpoint(in);
        if (e.ok()) {
          Check(!e->rails.empty() && e->rails.size() <= fabric::kMaxRails);
          auto again = fabric::DecodeEndpoint(fabric::EncodeEndpoint(*e));
          Check(again.ok() && again->provider == e->provider && again->format == e->format &&
                again->rails == e->rails);
        } else {
          Check(!e.status().message().empty());
        }
      }
      break;
    }
  }
}

void FuzzStoreEntries(std::string_view input) {
  namespace fi = ferry::internal;
  const Pick p = PickOf(input, 3);
  const std::string_view in = p.rest;
  switch (p.which) {
    case 0: {
      // A value read from a metadata service: raw (Redis, HTTP) and as
      // etcd's base64. Whatever it is: an error naming the key, or a
      // descriptor of the segment asked for.
      const std::string key = "ferry/segments/e";
      for (const std::string& value : {std::string(in), fi::Unbase64(in).value_or("")}) {
        auto d = fi::DecodeEntry("e", key, value, "fuzz");
        if (d.ok()) {
          Check(d->engine_name == "e");
          Check(fi::InstanceOfEntry(value) == d->instance_id);
        } else {
          Check(d.status().code() == ferry::StatusCode::kDataLoss);
          Check(d.status().message().find(key) != std::string::npos);
        }
        // Publishing over it: the same instance may, anyone else is told who holds it.
        wire::PeerDescriptor self;
        self.engine_name = "e";
        self.instance_id = 3;
        ferry::Status claim = fi::CheckClaim(self, key, value, "fuzz", " (hint)");
        auto holder = wire::DecodeDescriptor(value);
        Check(claim.ok() == (holder.ok() && holder->instance_id == 3));
        if (!claim.ok()) {
          Check(claim.code() == ferry::StatusCode::kAlreadyExists);
          Check(claim.message().find("(hint)") != std::string::npos);
        }
      }
      break;
    }
    case 1: {
      // Base64 as etcd's JSON carries keys and values: strict, round-trips.
      if (auto raw = fi::Unbase64(in)) Check(fi::Base64(*raw) == in);
      Check(fi::Unbase64(fi::Base64(in)) == std::string(in));
      break;
    }
    case 2: {
      // A key a watch reports: the engine name under the cluster's prefix.
      const std::string prefix = fi::SegmentKeyPrefix("ferry");
      auto name = fi::NameOfKey(prefix, in);
      if (name) {
        Check(!name->empty() && fi::SegmentKey("ferry", *name) == in);
      } else {
        Check(in.size() <= prefix.size() || in.substr(0, prefix.size()) != prefix);
      }
      break;
    }
  }
}

const std::vector<Target>& Targets() {
  static const std::vector<Target> targets = {
      {"fuzz_frames", FuzzFrames, 1000},
      {"fuzz_descriptor", FuzzDescriptor, 1000},
      {"fuzz_auth", FuzzAuth, 1000},
      {"fuzz_copy_frames", FuzzCopyFrames, 1000},
      {"fuzz_store_entries", FuzzStoreEntries, 1000},
      {"fuzz_slot_table", FuzzSlotTable, 100},
      {"fuzz_request_ring", FuzzRequestRing, 300},
#ifdef FERRY_FUZZ_STORES
      {"fuzz_etcd_json", FuzzEtcdJson, 2},
      {"fuzz_http_store", FuzzHttpStore, 2},
#endif
  };
  return targets;
}

}  // namespace ferry::fuzz
