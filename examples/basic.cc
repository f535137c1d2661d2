// The README's usage example: two engines, one registered buffer each, a
// batched write and a read back over the peer-to-peer handshake.
// Built and run as a test, so it cannot rot.
#include <cstdio>
#include <cstring>
#include <vector>

#include "ferry/ferry.h"

int main() {
  // Defaults: listen on 127.0.0.1 (free port), peer-to-peer handshake, the
  // transport picked automatically; FERRY_* environment variables may override.
  ferry::EngineOptions options = ferry::EngineOptions{}.WithEnvironment();
  auto target = ferry::Engine::Create(options);
  auto initiator = ferry::Engine::Create(options);
  if (!target.ok() || !initiator.ok()) return 1;

  std::vector<char> remote(1 << 20), local(1 << 20);
  if (!(*target)->RegisterMemory(remote.data(), remote.size()).ok()) return 1;
  if (!(*initiator)->RegisterMemory(local.data(), local.size()).ok()) return 1;
  std::memset(local.data(), 'x', local.size());

  // Peers name each other "host:port"; remote addresses are the peer's own.
  auto segment = (*initiator)->OpenSegment((*target)->PeerId());
  if (!segment.ok()) {
    std::fprintf(stderr, "%s\n", segment.status().ToString().c_str());
    return 1;
  }
  std::vector<ferry::TransferRequest> writes;
  for (int i = 0; i < 4; ++i) {
    writes.push_back({ferry::Opcode::kWrite, local.data() + i * 4096, *segment,
                      reinterpret_cast<uint64_t>(remote.data()) + i * 8192, 4096});
  }
  auto batch = (*initiator)->AllocateBatch(writes.size());
  if (!batch.ok()) return 1;
  ferry::Status s = (*initiator)->Submit(*batch, writes);
  if (s.ok()) s = (*initiator)->WaitBatch(*batch, std::chrono::seconds(30));
  if (!s.ok()) {
    std::fprintf(stderr, "write failed: %s\n", s.ToString().c_str());
    return 1;
  }
  (*initiator)->FreeBatch(*batch).IgnoreError();

  // A synchronous read of what was just written.
  s = (*initiator)
          ->TransferSync({ferry::Opcode::kRead, local.data() + 65536, *segment,
                          reinterpret_cast<uint64_t>(remote.data()) + 8192, 4096});
  if (!s.ok() || std::memcmp(local.data() + 65536, local.data(), 4096) != 0) return 1;
  auto info = (*initiator)->QuerySegment(*segment);
  std::printf("ok: wrote 4 x 4 KiB to %s over %s and read one back\n", (*target)->PeerId().c_str(),
              info.ok() ? info->transport.c_str() : "?");
  return 0;
}
