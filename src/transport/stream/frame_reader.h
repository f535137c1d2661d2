// FrameReader: turns the bytes of one stream into frames — header, body, and
// the payload, which goes straight to the destinations the receiver names
// while it handles the frame (registered memory, or a scratch buffer for
// bytes to discard). It knows no socket: a Connection feeds it what recv
// returns (and readv's long payloads straight into PayloadIov()), and the
// unit tests and the fuzzer feed it bytes directly.
//
// Checks, whatever the sink does: the header decodes (wire::DecodeHeader:
// magic, type, limits), and the payload a frame announces is exactly what the
// sink placed for it (none placed: the frame must announce none).
// Not thread-safe: one reader per stream, used by one thread at a time.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "wire/frame.h"

namespace ferry::internal::stream {

class FrameReader {
 public:
  // What the reader reports, in this order per frame. A non-OK status stops
  // the reader where it is (the stream is then closed with that status).
  class Sink {
   public:
    virtual ~Sink() = default;
    // A header arrived: is its type (and version) acceptable here?
    virtual Status OnHeader(const wire::FrameHeader& h) = 0;
    // Header and body arrived. To receive the frame's payload, call
    // ExpectPayload() and then place every byte of it (AddDestination,
    // AddDiscard) before returning.
    virtual Status OnFrame(const wire::FrameHeader& h, std::string_view body) = 0;
    // The payload expected in OnFrame has arrived (at once if it was empty).
    virtual Status OnPayload(const wire::FrameHeader& h) = 0;
    // Asked after each whole frame that more bytes follow in the same
    // Consume: true stops there, and the reader keeps those bytes (Pending)
    // until ConsumePending. (A served stream that holds too much.)
    virtual bool Hold() const { return false; }
  };

  explicit FrameReader(Sink* sink) : sink_(sink) {}

  // Feeds bytes of the stream; dispatches every part that completes (up to
  // a frame after which the sink holds: the rest waits in the reader).
  Status Consume(const char* p, size_t n);
  // Bytes a holding sink left (at most one Consume's worth).
  bool HasPending() const { return !pending_.empty(); }
  // Consumes them (the sink may hold again: what is left stays).
  Status ConsumePending();

  // While a payload is being received: the bytes still expected, and where
  // they go. A caller may readv into PayloadIov() (at most PayloadIovCount()
  // vectors) and report what arrived with Advance.
  bool InPayload() const { return phase_ == Phase::kPayload; }
  size_t PayloadLeft() const { return payload_left_; }
  iovec* PayloadIov() { return recv_iov_.data() + recv_index_; }
  size_t PayloadIovCount() const { return recv_iov_.size() - recv_index_; }
  Status Advance(size_t n);

  // From Sink::OnFrame only.
  void ExpectPayload();
  // The next `length` payload bytes go to `addr` (adjacent destinations
  // share one iovec).
  void AddDestination(char* addr, size_t length);
  // The next `length` payload bytes are read and dropped.
  void AddDiscard(size_t length);
  // While a payload is being received: drop the rest of it instead of
  // storing it where it was placed (its request was cancelled).
  void DiscardRest();

 private:
  enum class Phase { kHeader, kBody, kPayload };
  Status OnHeaderBytes();
  Status OnBodyBytes();
  Status FinishPayload();

  Sink* const sink_;
  Phase phase_ = Phase::kHeader;
  uint8_t header_buf_[wire::kFrameHeaderSize];
  size_t got_ = 0;
  wire::FrameHeader header_;
  std::string body_;
  bool expecting_ = false;  // ExpectPayload called for the current frame
  std::vector<iovec> recv_iov_;
  size_t recv_index_ = 0;
  size_t payload_left_ = 0;          // bytes of recv_iov_ not yet filled
  std::unique_ptr<char[]> scratch_;  // discard target, allocated on first use
  std::string pending_;              // see Sink::Hold
};

}  // namespace ferry::internal::stream
