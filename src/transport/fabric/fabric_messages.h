// The fabric transport's own messages (fi_send / fi_recv between two
// endpoints): a notification and its acknowledgement. Layout in
// docs/wire-format.md ("Fabric messages"); the decoder is fuzzed
// (tests/fuzz, target fabric-message).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"
#include "wire/frame.h"

namespace ferry::internal::fabric {

inline constexpr uint32_t kMessageMagic = 0x42414646;  // "FFAB" little-endian
inline constexpr uint16_t kMessageVersion = 1;
inline constexpr size_t kMessageHeader = 24;
// Longest endpoint address a message carries (libfabric's are at most a few
// dozen bytes; FI_ADDR_STR names a little more).
inline constexpr size_t kMaxAddress = 256;
// Largest message: header, address, the longest notification body.
inline constexpr size_t kMaxMessage = kMessageHeader + kMaxAddress + wire::kMaxNotifyBody;

enum class MessageType : uint8_t { kNotify = 1, kAck = 2 };

struct Message {
  MessageType type = MessageType::kNotify;
  uint64_t seq = 0;         // the initiator's number for this notification
  std::string reply_to;     // kNotify: the sender's endpoint address (raw)
  wire::NotifyBody notify;  // kNotify
  Status status;            // kAck: what the target's inbox said
};

void EncodeMessage(const Message& m, std::string* out);
// kInvalidArgument (kDataLoss for a wrong magic) naming what is wrong.
StatusOr<Message> DecodeMessage(std::string_view bytes);

// A descriptor's "fabric" entry: "PROVIDER/ADDR_FORMAT/HEX[,HEX...]", one
// address per rail (NIC), rail 0 first, lower-case hex (docs/wire-format.md).
// Fuzzed with the messages.
struct FabricEndpoint {
  std::string provider;
  uint32_t format = 0;
  std::vector<std::string> rails;  // fi_getname bytes
};
// More rails than any host has NICs: an endpoint naming more is refused.
inline constexpr size_t kMaxRails = 16;

std::string EncodeEndpoint(const FabricEndpoint& e);
// kInvalidArgument naming what is wrong.
StatusOr<FabricEndpoint> DecodeEndpoint(std::string_view s);

}  // namespace ferry::internal::fabric
