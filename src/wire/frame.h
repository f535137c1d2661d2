// Frames of the stream protocol: the header, every frame type, and the
// bodies the stream layer and the tcp transport use. The same-host
// transport's own bodies (CopyHello, CopyEntryList) are encoded in
// src/transport/shm/copy_frames.h. The byte layout is specified in
// docs/wire-format.md; keep them in sync.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::wire {

inline constexpr uint32_t kFrameMagic = 0x59525246;  // bytes "FRRY"
inline constexpr size_t kFrameHeaderSize = 24;
// Bodies above these sizes are refused before any allocation.
inline constexpr uint32_t kMaxHandshakeBody = 16u << 20;
inline constexpr uint32_t kMaxDataBody = 1u << 20;
// A kNotify body: a message of up to 1 MiB (ferry::kMaxNotificationMessage)
// plus its sender, name (<= 4 KiB) and string lengths. Sent only to peers
// with the feature "notify-1m"; older builds take kMaxDataBody.
inline constexpr uint32_t kMaxNotifyBody = (1u << 20) + (16u << 10);
inline constexpr uint32_t kMaxPayload = 64u << 20;
inline constexpr uint32_t kMaxEntriesPerFrame = 16384;
inline constexpr size_t kMaxErrorMessage = 512;

enum class FrameType : uint8_t {
  kHandshakeRequest = 1,
  kHandshakeResponse = 2,
  kStreamHello = 3,
  kStreamHelloAck = 4,
  kCopyHello = 5,      // same-host stream hello (unix socket), answered by kStreamHelloAck
  kAuthHello = 6,      // initiator with a cluster secret: before its first frame
  kAuthChallenge = 7,  // answer to kAuthHello
  kAuthProof = 8,      // initiator: proves the secret; its first frame follows
  kWrite = 10,
  kRead = 11,
  kNotify = 12,
  kCopyWrite = 13,     // same-host: the target copies from the initiator's memory; kAck
  kCopyRead = 14,      // same-host: the target copies into the initiator's memory; kAck
  kCopyLendRead = 15,  // same-host: the target pins its ranges and answers (kAck); the
                       // initiator copies them out itself, then sends kCopyReturn
  kCopyReturn = 16,    // same-host: the ranges of a kCopyLendRead may be released; kAck
  // Reply (body: Reply) to kWrite, kNotify and the same-host frames
  // kCopyWrite, kCopyRead, kCopyLendRead and kCopyReturn. (The fabric
  // transport acknowledges notifications with its own message,
  // fabric_messages.h, not with this frame.)
  kAck = 20,
  kReadData = 21,  // reply to kRead
  // Target -> initiator on a served stream, no body, seq 0: the stream had no
  // request for the target's idle_link_timeout; the initiator closes it once
  // nothing of its own is in flight on the link and opens a new link for
  // later requests. Frames sent meanwhile are still served. Sent only to
  // initiators whose hello carried kHelloFlagGoAway.
  kGoAway = 22,
  // Reply (body: LendAck) to a kCopyLendRead some of whose entries the
  // target staged in its own memory (file regions): the initiator copies
  // those from where the LendAck says. Sent only to initiators whose hello
  // carried kHelloFlagLendStaged.
  kLendAck = 23,
};

// Flags of a stream's hello frame (kStreamHello, kCopyHello; other frames
// send 0, and a receiver ignores flags it does not know).
// The initiator handles kGoAway on this stream.
inline constexpr uint16_t kHelloFlagGoAway = 0x1;
// The initiator takes kLendAck answers to its kCopyLendRead frames (a
// same-host stream that may read the target's file regions).
inline constexpr uint16_t kHelloFlagLendStaged = 0x2;

struct FrameHeader {
  uint8_t version = 0;  // 0 for handshake/hello frames, else the negotiated wire version
  FrameType type = FrameType::kAck;
  uint16_t flags = 0;
  uint32_t body_len = 0;     // bytes of the body that follows the header
  uint32_t payload_len = 0;  // raw data bytes that follow the body
  uint64_t seq = 0;          // request sequence number; replies echo it
};

void EncodeHeader(const FrameHeader& h, uint8_t out[kFrameHeaderSize]);
// kDataLoss on a bad magic, unknown type or oversized lengths.
StatusOr<FrameHeader> DecodeHeader(const uint8_t in[kFrameHeaderSize]);

// One remote range inside a kWrite or kRead body.
struct Entry {
  uint64_t addr = 0;
  uint32_t length = 0;
};

// kWrite / kRead body: u32 count, then count × {u64 addr, u32 length}.
void EncodeEntries(const Entry* entries, size_t count, std::string* out);
StatusOr<std::vector<Entry>> DecodeEntries(std::string_view body);
// Size of an encoded entry list.
inline size_t EntriesSize(size_t count) { return 4 + count * 12; }

// A per-entry failure reported by the target.
struct EntryFailure {
  uint32_t index = 0;
  StatusCode code = StatusCode::kInternal;
  std::string message;
};

// kAck / kReadData body: u8 code, str message (whole-frame status), u32
// count, then count × {u32 index, u8 code, str message}. The failures must
// name entries in strictly increasing order (the target walks its entries in
// order): DecodeReply refuses anything else, so a misordered or forged reply
// can never mark a failed entry completed.
struct Reply {
  Status status;
  std::vector<EntryFailure> failures;
};
void EncodeReply(const Reply& r, std::string* out);
StatusOr<Reply> DecodeReply(std::string_view body);

// kLendAck body: u32 reply_len, a Reply of reply_len bytes, u32 count, then
// count × {u32 index, u64 addr}: the entries of the answered kCopyLendRead
// whose bytes the target staged at `addr` in its own memory (the initiator
// copies them from there instead of from the entry's address). Indices
// strictly increasing and distinct from the reply's failures: DecodeLendAck
// refuses anything else.
struct StagedLend {
  uint32_t index = 0;
  uint64_t addr = 0;
};
struct LendAck {
  Reply reply;
  std::vector<StagedLend> staged;
};
void EncodeLendAck(const LendAck& a, std::string* out);
StatusOr<LendAck> DecodeLendAck(std::string_view body);

// kNotify body: str sender, str name, str message.
struct NotifyBody {
  std::string sender;
  std::string name;
  std::string message;
};
void EncodeNotify(const NotifyBody& n, std::string* out);
StatusOr<NotifyBody> DecodeNotify(std::string_view body);

// kStreamHello body.
struct StreamHello {
  uint64_t initiator_instance = 0;
  uint64_t target_instance = 0;  // the instance the initiator expects to reach
  uint16_t wire_version = 0;     // negotiated during the handshake
  uint16_t stream_index = 0;
  std::string initiator_peer_id;
};
void EncodeStreamHello(const StreamHello& h, std::string* out);
StatusOr<StreamHello> DecodeStreamHello(std::string_view body);

// kStreamHelloAck / status-only bodies: u8 code, str message.
void EncodeStatus(const Status& s, std::string* out);
// Decodes into *out; the returned Status says whether decoding worked.
Status DecodeStatus(std::string_view body, Status* out);

// Authentication (docs/wire-format.md, "Authentication"): bodies of fixed
// layout; the cryptography is in src/common/auth.h.
inline constexpr uint8_t kAuthModeHmacSha256 = 1;
inline constexpr size_t kAuthBytes = 32;  // nonces and MACs
using AuthBytes = std::array<uint8_t, kAuthBytes>;

// kAuthHello body: u8 mode, 32 bytes nonce, str peer_id (claimed, for logs).
struct AuthHello {
  uint8_t mode = kAuthModeHmacSha256;
  AuthBytes nonce{};
  std::string peer_id;
};
void EncodeAuthHello(const AuthHello& h, std::string* out);
StatusOr<AuthHello> DecodeAuthHello(std::string_view body);

// kAuthChallenge body: Status, u8 mode, 32 bytes nonce, 32 bytes mac (both
// zero when the status is not OK).
struct AuthChallenge {
  Status status;
  uint8_t mode = kAuthModeHmacSha256;
  AuthBytes nonce{};
  AuthBytes mac{};
};
void EncodeAuthChallenge(const AuthChallenge& c, std::string* out);
StatusOr<AuthChallenge> DecodeAuthChallenge(std::string_view body);

// kAuthProof body: 32 bytes mac.
struct AuthProof {
  AuthBytes mac{};
};
void EncodeAuthProof(const AuthProof& p, std::string* out);
StatusOr<AuthProof> DecodeAuthProof(std::string_view body);

// Builds header + body into one buffer.
std::string BuildFrame(FrameHeader h, std::string_view body);

}  // namespace ferry::wire
