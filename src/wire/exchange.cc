#include "wire/exchange.h"

#include "common/net.h"

namespace ferry::wire {

StatusOr<std::string> Exchange(int fd, FrameType type, std::string_view body, FrameType reply_type,
                               std::chrono::steady_clock::time_point deadline,
                               std::string_view prefix, uint16_t flags) {
  FrameHeader h;
  h.type = type;
  h.flags = flags;
  h.seq = 1;
  std::string frame(prefix);
  frame += BuildFrame(h, body);
  return ExchangeFrame(fd, frame, reply_type, deadline);
}

StatusOr<std::string> ExchangeFrame(int fd, std::string_view frame, FrameType reply_type,
                                    std::chrono::steady_clock::time_point deadline) {
  FERRY_RETURN_IF_ERROR(internal::SendAll(fd, frame.data(), frame.size(), deadline));
  uint8_t hdr[kFrameHeaderSize];
  FERRY_RETURN_IF_ERROR(internal::RecvAll(fd, hdr, sizeof(hdr), deadline));
  FERRY_ASSIGN_OR_RETURN(FrameHeader rh, DecodeHeader(hdr));
  if (rh.type != reply_type) {
    return DataLossError("peer answered with frame type " +
                         std::to_string(static_cast<int>(rh.type)) + ", expected " +
                         std::to_string(static_cast<int>(reply_type)));
  }
  std::string reply(rh.body_len, '\0');
  FERRY_RETURN_IF_ERROR(internal::RecvAll(fd, reply.data(), reply.size(), deadline));
  return reply;
}

}  // namespace ferry::wire
