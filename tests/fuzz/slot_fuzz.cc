// fuzz_slot_table: the one decoder of bytes a same-host peer controls
// without a frame — the slot table of mapped segments (docs/wire-format.md,
// "Slot table"), which every same-host peer may write. The input is written
// over the slot of a real published region of a real table in this process;
// then an initiator opens the table, looks keys up, maps what it finds and
// translates ranges. Whatever the slot holds, every range it is given lies
// inside what it mapped (its first and last byte are read here: outside any
// mapping that faults), and nothing hangs.
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "common/shared_mapping.h"
#include "fuzz_targets.h"
#include "transport/shm/mapped_segments.h"

namespace ferry::fuzz {
namespace {

namespace shm = ferry::internal::shm;
using ferry::internal::PeerMapping;
using ferry::internal::Region;
using ferry::internal::SharedMemory;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

uint64_t Load64(std::string_view in, size_t at) {
  uint64_t v = 0;
  if (at + 8 <= in.size()) std::memcpy(&v, in.data() + at, 8);
  return v;
}

// One table with one published region, made once (never destroyed: the
// table's holder thread lives as long as the process).
struct World {
  std::unique_ptr<shm::SlotTable> table;
  SharedMemory mem;
  Region region;
  uint64_t key = 0;
  std::string endpoint;
  std::unique_ptr<PeerMapping> view;  // the table, as a peer writes it
  unsigned char* slot = nullptr;      // the region's slot in `view`
  unsigned char good[sizeof(shm::MapSlot)] = {};
};

World& TheWorld() {
  static World* w = [] {
    auto* w = new World;
    auto table = shm::SlotTable::Create(16, std::chrono::milliseconds(1));
    Check(table.ok());
    w->table = *std::move(table);
    auto mem = SharedMemory::Create(1 << 16, "fuzz-region");
    Check(mem.ok());
    w->mem = *std::move(mem);
    w->region.addr = reinterpret_cast<uint64_t>(w->mem.data());
    w->region.length = 1 << 16;
    auto backing = ferry::internal::VerifySharedMapping(w->mem.data(), 1 << 16, w->mem.fd(), 0);
    Check(backing.ok());
    w->region.shared = *backing;
    auto key = w->table->Publish(w->region);
    Check(key.has_value());
    w->key = *key;
    w->endpoint = w->table->Endpoint();
    int pid = 0, fd = -1;
    unsigned long long dev = 0, ino = 0;
    unsigned int slots = 0;
    Check(std::sscanf(w->endpoint.c_str(), "%d:%d:%llu:%llu:%u", &pid, &fd, &dev, &ino, &slots) ==
          5);
    auto view = PeerMapping::Open(fd, 0, uint64_t{slots} * sizeof(shm::MapSlot), dev, ino, "table");
    Check(view.ok());
    w->view = *std::move(view);
    w->slot = reinterpret_cast<unsigned char*>(w->view->data()) +
              sizeof(shm::MapSlot) * static_cast<uint32_t>(w->key);
    std::memcpy(w->good, w->slot, sizeof(shm::MapSlot));
    return w;
  }();
  return *w;
}

}  // namespace

// Input: up to 64 bytes written over the region's slot, then a key to look
// up (8 bytes; the region's own key is looked up too), then (address offset,
// length) pairs of 8 bytes each to translate.
void FuzzSlotTable(std::string_view in) {
  World& w = TheWorld();
  std::memcpy(w.slot, w.good, sizeof(shm::MapSlot));
  std::memcpy(w.slot, in.data(), std::min(in.size(), sizeof(shm::MapSlot)));
  auto maps = shm::PeerMaps::Open(w.endpoint, ::getpid(), "fuzz peer");
  Check(maps.ok());
  Check((*maps)->PeerRuns());  // the header is untouched: the table is alive
  const uint64_t other = in.size() >= 72 ? Load64(in, 64) : w.key;
  for (uint64_t key : {other, w.key}) {
    std::shared_ptr<const shm::MappedRegion> m = (*maps)->Find(key);
    if (m == nullptr || !m->Begin()) continue;
    for (size_t at = 72; at + 16 <= in.size(); at += 16) {
      const uint64_t addr = w.region.addr + Load64(in, at);
      const uint64_t len = Load64(in, at + 8);
      if (len == 0) continue;
      if (const char* p = m->Translate(addr, len)) {
        volatile char first = p[0], last = p[len - 1];  // faults if outside the mapping
        (void)first;
        (void)last;
      }
    }
    m->End();
  }
  std::memcpy(w.slot, w.good, sizeof(shm::MapSlot));  // what the next input starts from
}

}  // namespace ferry::fuzz
