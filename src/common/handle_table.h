// HandleTable<T>: owns objects addressed by checked 64-bit handles.
//
// A handle packs a slot index (low 32 bits) and the slot's generation (high 32
// bits, never 0). Erasing bumps the generation, so a stale handle, or a value
// that was never issued, is rejected instead of reaching another object.
// Thread-safe; objects are held by shared_ptr so a Get() result stays valid
// while the caller holds it even if it is erased concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace ferry::internal {

template <typename T>
class HandleTable {
 public:
  // Returns a new handle (never 0).
  uint64_t Insert(std::shared_ptr<T> value) {
    std::lock_guard<std::mutex> lock(mu_);
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = static_cast<uint32_t>(slots_.size());
      slots_.push_back(Slot{});
    }
    Slot& s = slots_[index];
    s.value = std::move(value);
    ++live_;
    return (static_cast<uint64_t>(s.generation) << 32) | index;
  }

  // nullptr if the handle is stale or was never issued.
  std::shared_ptr<T> Get(uint64_t handle) const {
    std::lock_guard<std::mutex> lock(mu_);
    const Slot* s = Find(handle);
    return s ? s->value : nullptr;
  }

  // Removes and returns the object; nullptr if the handle is invalid.
  std::shared_ptr<T> Erase(uint64_t handle) {
    std::lock_guard<std::mutex> lock(mu_);
    Slot* s = const_cast<Slot*>(Find(handle));
    if (s == nullptr) return nullptr;
    std::shared_ptr<T> out = std::move(s->value);
    s->value.reset();
    if (++s->generation == 0) s->generation = 1;
    free_.push_back(static_cast<uint32_t>(handle & 0xffffffffu));
    --live_;
    return out;
  }

  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_;
  }

  // Calls fn(handle, T&) for every live object while holding the lock.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].value) {
        fn((static_cast<uint64_t>(slots_[i].generation) << 32) | i, *slots_[i].value);
      }
    }
  }

 private:
  struct Slot {
    uint32_t generation = 1;
    std::shared_ptr<T> value;
  };

  const Slot* Find(uint64_t handle) const {
    uint32_t index = static_cast<uint32_t>(handle & 0xffffffffu);
    uint32_t gen = static_cast<uint32_t>(handle >> 32);
    if (gen == 0 || index >= slots_.size()) return nullptr;
    const Slot& s = slots_[index];
    if (s.generation != gen || !s.value) return nullptr;
    return &s;
  }

  mutable std::mutex mu_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  size_t live_ = 0;
};

}  // namespace ferry::internal
