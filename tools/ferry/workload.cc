#include "workload.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "cli.h"

namespace ferry::bench {

std::string_view OperationName(Operation op) {
  switch (op) {
    case Operation::kWrite:
      return "write";
    case Operation::kRead:
      return "read";
    case Operation::kMixed:
      return "mixed";
  }
  return "?";
}

namespace {

struct Model {
  const char* name;
  uint64_t layer_buffers;
  uint64_t bytes_per_token;
};

// bf16 KV cache. MHA: K and V per layer; MLA (DeepSeek): one latent per layer.
constexpr Model kModels[] = {
    {"llama3-8b", 64, 2048},       // 32 layers x K/V, 8 KV heads x 128 x 2 B
    {"llama3-70b-tp8", 160, 256},  // 80 layers x K/V, 1 KV head per rank x 128 x 2 B
    {"deepseek-v3", 61, 1152},     // 61 layers, (512 + 64) x 2 B
};

Opcode OpFor(Operation op, size_t index) {
  switch (op) {
    case Operation::kWrite:
      return Opcode::kWrite;
    case Operation::kRead:
      return Opcode::kRead;
    case Operation::kMixed:
      return index % 2 == 0 ? Opcode::kWrite : Opcode::kRead;
  }
  return Opcode::kWrite;
}

}  // namespace

std::string KvModels() {
  std::string out;
  for (const Model& m : kModels) {
    if (!out.empty()) out += ", ";
    out += m.name;
  }
  return out;
}

std::string KvPreset::Describe() const {
  return "kv:" + model + ":tokens=" + std::to_string(tokens) + ":page=" + std::to_string(page);
}

KvPreset ParseKvPreset(std::string_view text) {
  const std::string flag = "--workload";
  if (!text.starts_with("kv:")) {
    throw cli::UsageError("bad value '" + std::string(text) +
                          "' for --workload: expected kv:MODEL[:tokens=N][:page=P]");
  }
  std::vector<std::string_view> parts;
  std::string_view rest = text.substr(3);
  while (true) {
    auto colon = rest.find(':');
    parts.push_back(rest.substr(0, colon));
    if (colon == std::string_view::npos) break;
    rest = rest.substr(colon + 1);
  }
  KvPreset p;
  const Model* model = nullptr;
  for (const Model& m : kModels) {
    if (parts[0] == m.name) model = &m;
  }
  if (model == nullptr) {
    throw cli::UsageError("bad value '" + std::string(text) + "' for --workload: unknown model '" +
                          std::string(parts[0]) + "' (known: " + KvModels() + ")");
  }
  p.model = model->name;
  p.layer_buffers = model->layer_buffers;
  p.bytes_per_token = model->bytes_per_token;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::string_view kv = parts[i];
    auto eq = kv.find('=');
    std::string_view key = kv.substr(0, eq);
    if (eq == std::string_view::npos || (key != "tokens" && key != "page")) {
      throw cli::UsageError("bad value '" + std::string(text) + "' for --workload: '" +
                            std::string(kv) + "' is not tokens=N or page=P");
    }
    uint64_t v = cli::ParseUint(flag + " " + std::string(key), kv.substr(eq + 1));
    if (v == 0) {
      throw cli::UsageError("bad value '" + std::string(text) +
                            "' for --workload: " + std::string(key) + " must be at least 1");
    }
    (key == "tokens" ? p.tokens : p.page) = v;
  }
  if (p.page > p.tokens) p.page = p.tokens;
  return p;
}

uint64_t Workload::batch_bytes(size_t thread) const {
  uint64_t total = 0;
  for (const Entry& e : batches[thread]) total += e.length;
  return total;
}

std::vector<DescRow> SlotRows(const Slots& slots, uint64_t base) {
  std::vector<DescRow> rows;
  const size_t n = slots.offsets.size();
  for (size_t k = 0; k < n;) {
    DescRow row{base + slots.offsets[k], slots.lengths[k], slots.lengths[k], 1};
    size_t j = k + 1;
    if (j < n && slots.lengths[j] == row.length && slots.offsets[j] > slots.offsets[k]) {
      const uint64_t stride = slots.offsets[j] - slots.offsets[k];
      while (j < n && slots.lengths[j] == row.length &&
             slots.offsets[j] == slots.offsets[j - 1] + stride) {
        ++j;
      }
      row.stride = stride;
      row.count = j - k;
    }
    rows.push_back(row);
    k = j;
  }
  return rows;
}

Workload MakeBlockWorkload(Operation op, uint64_t block, uint64_t batch, int threads) {
  Workload w;
  w.description = cli::FormatSize(block) + " blocks x " + std::to_string(batch) + " per batch";
  const uint64_t slice = block * batch;
  for (int t = 0; t < threads; ++t) {
    std::vector<Entry> entries;
    for (uint64_t i = 0; i < batch; ++i) {
      uint64_t off = slice * t + block * i;
      entries.push_back({off, off, block, OpFor(op, i)});
    }
    // Both sides: the thread's blocks in order; entry i is slot i.
    Layout layout;
    for (uint64_t i = 0; i < batch; ++i) {
      layout.local.offsets.push_back(slice * t + block * i);
      layout.local.lengths.push_back(block);
      layout.local_index.push_back(static_cast<uint32_t>(i));
    }
    layout.remote = layout.local;
    layout.remote_index = layout.local_index;
    w.batches.push_back(std::move(entries));
    w.layouts.push_back(std::move(layout));
  }
  w.local_bytes = w.remote_bytes = slice * threads;
  return w;
}

Workload MakeKvWorkload(Operation op, const KvPreset& preset, int threads) {
  Workload w;
  w.description = preset.Describe();
  const uint64_t pages = (preset.tokens + preset.page - 1) / preset.page;
  const uint64_t page_bytes = preset.page * preset.bytes_per_token;
  const uint64_t layer_bytes = pages * page_bytes;
  const uint64_t thread_bytes = layer_bytes * preset.layer_buffers;
  std::mt19937_64 rng(20240607);  // fixed: the same layout in every run
  for (int t = 0; t < threads; ++t) {
    std::vector<uint64_t> local_slot(pages), remote_slot(pages);
    std::iota(local_slot.begin(), local_slot.end(), 0);
    std::iota(remote_slot.begin(), remote_slot.end(), 0);
    std::shuffle(local_slot.begin(), local_slot.end(), rng);
    std::shuffle(remote_slot.begin(), remote_slot.end(), rng);
    std::vector<Entry> entries;
    entries.reserve(pages * preset.layer_buffers);
    // Slots: every page slot of every layer buffer, in buffer order (slot
    // l * pages + s); the one holding the last, partial page is shorter.
    Layout layout;
    const uint64_t last_tokens = preset.tokens - (pages - 1) * preset.page;
    for (Slots* side : {&layout.local, &layout.remote}) {
      const std::vector<uint64_t>& slot_of = side == &layout.local ? local_slot : remote_slot;
      side->offsets.resize(pages * preset.layer_buffers);
      side->lengths.assign(pages * preset.layer_buffers, page_bytes);
      for (uint64_t l = 0; l < preset.layer_buffers; ++l) {
        for (uint64_t s = 0; s < pages; ++s) {
          side->offsets[l * pages + s] = thread_bytes * t + layer_bytes * l + s * page_bytes;
        }
        side->lengths[l * pages + slot_of[pages - 1]] = last_tokens * preset.bytes_per_token;
      }
    }
    for (uint64_t l = 0; l < preset.layer_buffers; ++l) {
      for (uint64_t p = 0; p < pages; ++p) {
        uint64_t tokens_here = std::min(preset.page, preset.tokens - p * preset.page);
        uint64_t base = thread_bytes * t + layer_bytes * l;
        entries.push_back({base + local_slot[p] * page_bytes, base + remote_slot[p] * page_bytes,
                           tokens_here * preset.bytes_per_token, OpFor(op, entries.size())});
        layout.local_index.push_back(static_cast<uint32_t>(l * pages + local_slot[p]));
        layout.remote_index.push_back(static_cast<uint32_t>(l * pages + remote_slot[p]));
      }
    }
    w.batches.push_back(std::move(entries));
    w.layouts.push_back(std::move(layout));
  }
  w.local_bytes = w.remote_bytes = thread_bytes * threads;
  return w;
}

}  // namespace ferry::bench
