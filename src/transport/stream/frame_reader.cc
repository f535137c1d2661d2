#include "transport/stream/frame_reader.h"

#include <algorithm>
#include <cstring>

#include "transport/stream/request.h"

namespace ferry::internal::stream {
namespace {
constexpr size_t kScratchSize = 64 * 1024;
}  // namespace

Status FrameReader::Consume(const char* p, size_t n) {
  while (n > 0) {
    Status s;
    if (phase_ == Phase::kHeader) {
      const size_t k = std::min(n, wire::kFrameHeaderSize - got_);
      std::memcpy(header_buf_ + got_, p, k);
      got_ += k, p += k, n -= k;
      if (got_ == wire::kFrameHeaderSize) s = OnHeaderBytes();
    } else if (phase_ == Phase::kBody) {
      const size_t k = std::min(n, body_.size() - got_);
      std::memcpy(body_.data() + got_, p, k);
      got_ += k, p += k, n -= k;
      if (got_ == body_.size()) s = OnBodyBytes();
    } else {
      size_t taken = 0;
      for (size_t i = recv_index_; i < recv_iov_.size() && taken < n; ++i) {
        const size_t k = std::min(n - taken, recv_iov_[i].iov_len);
        std::memcpy(recv_iov_[i].iov_base, p + taken, k);
        taken += k;
      }
      if (taken == 0) return InternalError("payload phase with no room left");
      p += taken, n -= taken;
      s = Advance(taken);
    }
    if (!s.ok()) return s;
    if (n > 0 && phase_ == Phase::kHeader && got_ == 0 && sink_->Hold()) {
      pending_.assign(p, n);
      return OkStatus();
    }
  }
  return OkStatus();
}

Status FrameReader::ConsumePending() {
  std::string bytes;
  bytes.swap(pending_);
  return Consume(bytes.data(), bytes.size());
}

Status FrameReader::Advance(size_t n) {
  if (phase_ != Phase::kPayload)
    return InternalError("payload advanced while none is being received");
  if (n > payload_left_) return InternalError("payload advanced past its end");
  payload_left_ -= n;
  while (n > 0) {
    iovec& v = recv_iov_[recv_index_];
    if (n >= v.iov_len) {
      n -= v.iov_len;
      ++recv_index_;
    } else {
      v.iov_base = static_cast<char*>(v.iov_base) + n;
      v.iov_len -= n;
      n = 0;
    }
  }
  return recv_index_ == recv_iov_.size() ? FinishPayload() : OkStatus();
}

void FrameReader::ExpectPayload() {
  expecting_ = true;
  recv_iov_.clear();
  recv_index_ = 0;
}

void FrameReader::AddDestination(char* addr, size_t length) {
  if (length == 0) return;  // an empty iovec would never fill
  // Never extends a discard range (scratch_ is reused by each of them).
  if (!recv_iov_.empty() && recv_iov_.back().iov_base == scratch_.get()) {
    recv_iov_.push_back({addr, length});
  } else {
    AppendRange(&recv_iov_, addr, length);
  }
}

void FrameReader::AddDiscard(size_t length) {
  if (!scratch_) scratch_ = std::make_unique<char[]>(kScratchSize);
  while (length > 0) {
    size_t n = std::min(length, kScratchSize);
    recv_iov_.push_back({scratch_.get(), n});
    length -= n;
  }
}

void FrameReader::DiscardRest() {
  if (phase_ != Phase::kPayload) return;
  recv_iov_.clear();
  recv_index_ = 0;
  AddDiscard(payload_left_);
}

Status FrameReader::OnHeaderBytes() {
  FERRY_ASSIGN_OR_RETURN(header_, wire::DecodeHeader(header_buf_));
  FERRY_RETURN_IF_ERROR(sink_->OnHeader(header_));
  body_.assign(header_.body_len, '\0');
  got_ = 0;
  phase_ = Phase::kBody;
  if (header_.body_len == 0) return OnBodyBytes();
  return OkStatus();
}

Status FrameReader::OnBodyBytes() {
  got_ = 0;
  phase_ = Phase::kHeader;
  expecting_ = false;
  FERRY_RETURN_IF_ERROR(sink_->OnFrame(header_, body_));
  if (!expecting_) {
    if (header_.payload_len != 0) {
      return DataLossError("frame of type " + std::to_string(static_cast<int>(header_.type)) +
                           " carries " + std::to_string(header_.payload_len) +
                           " payload bytes that nothing expects");
    }
    return OkStatus();
  }
  payload_left_ = 0;
  for (const iovec& v : recv_iov_) payload_left_ += v.iov_len;
  if (payload_left_ != header_.payload_len) {
    return DataLossError("frame of type " + std::to_string(static_cast<int>(header_.type)) +
                         " announces " + std::to_string(header_.payload_len) + " payload bytes, " +
                         std::to_string(payload_left_) + " expected");
  }
  recv_index_ = 0;
  if (recv_iov_.empty()) return FinishPayload();
  phase_ = Phase::kPayload;
  return OkStatus();
}

Status FrameReader::FinishPayload() {
  phase_ = Phase::kHeader;
  expecting_ = false;
  recv_iov_.clear();
  recv_index_ = 0;
  return sink_->OnPayload(header_);
}

}  // namespace ferry::internal::stream
