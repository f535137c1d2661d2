// What the bench moves: for each initiator thread, one batch of entries
// (local offset, remote offset, length, direction), repeated.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/types.h"

namespace ferry::bench {

enum class Operation { kWrite, kRead, kMixed };
std::string_view OperationName(Operation op);

struct Entry {
  uint64_t local_off = 0;   // into the initiator's buffer
  uint64_t remote_off = 0;  // into the target's buffer
  uint64_t length = 0;
  Opcode opcode = Opcode::kWrite;
};

struct KvPreset {
  std::string model;             // "llama3-8b", ...
  uint64_t layer_buffers = 0;    // 2 x layers (MHA: K and V) or layers (MLA)
  uint64_t bytes_per_token = 0;  // per layer buffer
  uint64_t tokens = 4096;
  uint64_t page = 16;            // tokens per page
  std::string Describe() const;  // "kv:llama3-8b:tokens=4096:page=16"
};

// Parses "kv:MODEL[:tokens=N][:page=P]". Throws cli::UsageError.
KvPreset ParseKvPreset(std::string_view text);
// "llama3-8b, llama3-70b-tp8, deepseek-v3"
std::string KvModels();

// One side's slots of a thread's buffer, in index order: slot k is
// (offsets[k], lengths[k]). What `ferry bench --prepared` turns into the rows
// of a prepared descriptor list.
struct Slots {
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> lengths;
};

// The slot layout of one thread's batch: entry i of the batch is local slot
// local_index[i] paired with remote slot remote_index[i] (same bytes as the
// entry's offsets and length).
struct Layout {
  Slots local, remote;
  std::vector<uint32_t> local_index, remote_index;
};

// Rows of a descriptor list (addresses: base + offset) for `slots`, runs of
// equal length and equal spacing folded into one strided row. Expanding the
// rows gives the slots back in order, so slot indices are entry indices.
std::vector<DescRow> SlotRows(const Slots& slots, uint64_t base);

struct Workload {
  std::string description;                  // "1 MiB blocks x 32" or the preset
  std::vector<std::vector<Entry>> batches;  // one batch per thread
  std::vector<Layout> layouts;              // one per thread, as batches
  uint64_t local_bytes = 0;                 // buffer size the initiator needs
  uint64_t remote_bytes = 0;                // buffer size the target needs
  uint64_t batch_bytes(size_t thread) const;
};

// Plain blocks: thread t's batch is `batch` consecutive blocks in its own
// slice of both buffers (same offsets on both sides). Mixed: even entries
// write, odd entries read.
Workload MakeBlockWorkload(Operation op, uint64_t block, uint64_t batch, int threads);

// KV cache: per thread, `layer_buffers` buffers of ceil(tokens/page) page
// slots; each (layer buffer, page) is one entry. Pages are placed by a fixed
// random permutation on each side (different ones), so neighbouring entries
// are contiguous on neither side.
Workload MakeKvWorkload(Operation op, const KvPreset& preset, int threads);

}  // namespace ferry::bench
