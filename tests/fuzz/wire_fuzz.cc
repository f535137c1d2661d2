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

#include "wire/descriptor.h"
#include "wire/frame.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ferry::wire;
  if (size == 0) return 0;
  // The first byte picks the decoder, the rest is its input.
  const uint8_t which = data[0] % 9;
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
        EncodeDescriptor(*d, &out);
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
      auto e = DecodeCopyEntries(in);
      if (e.ok()) {
        std::string out;
        EncodeCopyEntries(e->data(), e->size(), &out);
        Check(out == in);
      }
      break;
    }
    case 8: {
      auto h = DecodeCopyHello(in);
      if (h.ok()) {
        std::string out;
        EncodeCopyHello(*h, &out);
        Check(out == in);
      }
      break;
    }
  }
  return 0;
}
