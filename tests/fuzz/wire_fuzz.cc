// Fuzz target for every decoder that reads bytes from a peer. Built with
// libFuzzer when FERRY_FUZZ=ON (clang), and always as `wire_fuzz_replay`, a
// bounded deterministic mutation run registered with ctest.
//
// Properties checked: no decoder crashes or reads out of bounds (ASan/UBSan
// under libFuzzer), and whatever decodes re-encodes to the same bytes.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <vector>

#include "metadata/entries.h"
#include "transport/shm/copy_frames.h"
#include "transport/stream/frame_reader.h"
#include "wire/descriptor.h"
#include "wire/frame.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

// Takes every frame the socket-free reader produces; places each payload in
// a buffer of its announced size, alternating destinations and discards, so
// the reader's payload bookkeeping sees hostile lengths.
class FuzzSink : public ferry::internal::stream::FrameReader::Sink {
 public:
  ferry::internal::stream::FrameReader* reader = nullptr;
  ferry::Status OnHeader(const ferry::wire::FrameHeader& h) override {
    return h.flags == 0xffff ? ferry::DataLossError("refused") : ferry::OkStatus();
  }
  ferry::Status OnFrame(const ferry::wire::FrameHeader& h, std::string_view) override {
    if (h.payload_len == 0 && (h.seq & 1)) return ferry::OkStatus();  // expects nothing
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
  ferry::Status OnPayload(const ferry::wire::FrameHeader&) override { return ferry::OkStatus(); }

 private:
  std::vector<char> buf_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ferry::wire;
  if (size == 0) return 0;
  // The first byte picks the decoder, the rest is its input.
  const uint8_t which = data[0] % 14;
  std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (which) {
    case 0: {
      if (in.size() < kFrameHeaderSize) return 0;
      auto h = DecodeHeader(reinterpret_cast<const uint8_t*>(in.data()));
      if (h.ok()) {
        uint8_t out[kFrameHeaderSize];
        EncodeHeader(*h, out);
        Check(std::string_view(reinterpret_cast<char*>(out), kFrameHeaderSize) == in.substr(0, kFrameHeaderSize));
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
      auto r = DecodeReply(in);
      if (r.ok()) {
        std::string out;
        EncodeReply(*r, &out);
        auto again = DecodeReply(out);
        Check(again.ok() && again->failures.size() == r->failures.size());
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
      auto d = DecodeDescriptor(in);
      if (d.ok()) {
        std::string out;
        EncodeDescriptor(*d, &out, d->format);  // format 1 or 2, as read
        Check(out == in);
      }
      break;
    }
    case 6: {
      auto r = DecodeHandshakeResponse(in);
      (void)r;
      break;
    }
    case 7: {
      auto e = ferry::internal::shm::DecodeCopyEntries(in);
      if (e.ok()) {
        std::string out;
        ferry::internal::shm::EncodeCopyEntries(e->data(), e->size(), &out);
        Check(out == in);
      }
      break;
    }
    case 8: {
      auto h = ferry::internal::shm::DecodeCopyHello(in);
      if (h.ok()) {
        std::string out;
        ferry::internal::shm::EncodeCopyHello(*h, &out);
        Check(out == in);
      }
      break;
    }
    case 9: {
      // The stream's frame reader, fed in uneven pieces (as recv returns them).
      FuzzSink sink;
      ferry::internal::stream::FrameReader reader(&sink);
      sink.reader = &reader;
      size_t off = 0;
      for (size_t piece = 1; off < in.size(); piece = piece * 2 + 1) {
        const size_t n = std::min(piece, in.size() - off);
        if (!reader.Consume(in.data() + off, n).ok()) break;
        off += n;
      }
      break;
    }
    case 10: {
      // A value read from a metadata service: raw (Redis, HTTP) and as
      // etcd's base64. Whatever it is: an error naming the key, or a
      // descriptor of the segment asked for; base64 round-trips.
      for (const std::string& value : {std::string(in), ferry::internal::Unbase64(in).value_or("")}) {
        auto d = ferry::internal::DecodeEntry("e", "ferry/segments/e", value, "fuzz");
        if (d.ok()) {
          Check(d->engine_name == "e");
        } else {
          Check(d.status().message().find("ferry/segments/e") != std::string::npos);
        }
      }
      if (auto raw = ferry::internal::Unbase64(in)) Check(ferry::internal::Base64(*raw) == in);
      Check(ferry::internal::Unbase64(ferry::internal::Base64(in)) == std::string(in));
      break;
    }
    case 11: {
      auto h = DecodeAuthHello(in);
      if (h.ok()) {
        std::string out;
        EncodeAuthHello(*h, &out);
        Check(out == in);
      }
      break;
    }
    case 12: {
      // The status may re-encode differently (unknown codes read as UNKNOWN).
      auto c = DecodeAuthChallenge(in);
      if (c.ok()) {
        std::string out;
        EncodeAuthChallenge(*c, &out);
        auto again = DecodeAuthChallenge(out);
        Check(again.ok() && again->nonce == c->nonce && again->mac == c->mac && again->mode == c->mode &&
              again->status.code() == c->status.code());
      }
      break;
    }
    case 13: {
      auto p = DecodeAuthProof(in);
      if (p.ok()) {
        std::string out;
        EncodeAuthProof(*p, &out);
        Check(out == in);
      }
      break;
    }
  }
  return 0;
}
