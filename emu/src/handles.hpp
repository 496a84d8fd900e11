// Opaque handles for driver objects (contexts, streams, events).
//
// Handles are ids dressed as pointers, never addresses of our objects: a stale or
// forged handle is looked up and rejected with the documented error instead of
// being dereferenced.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>

namespace emu {

enum class HandleTag : std::uint64_t {
  kContext = 0xC7,
  kStream = 0x57,
  kEvent = 0xE7,
  kModule = 0x3D,
  kFunction = 0xF7,
  kLibrary = 0x1B,
  kKernel = 0x4E,
  kGraph = 0x6A,
  kGraphNode = 0x6B,
  kGraphExec = 0x6C,
};

inline bool has_tag(std::uint64_t handle, HandleTag tag) {
  return (handle >> 48) == static_cast<std::uint64_t>(tag);
}

template <class T>
class HandleTable {
 public:
  explicit HandleTable(HandleTag tag) : tag_(static_cast<std::uint64_t>(tag)) {}

  std::uint64_t add(std::shared_ptr<T> obj) {
    std::uint64_t h = (tag_ << 48) | (next_++ << 4);
    items_.emplace(h, std::move(obj));
    return h;
  }
  std::shared_ptr<T> find(std::uint64_t h) const {
    auto it = items_.find(h);
    return it == items_.end() ? nullptr : it->second;
  }
  std::shared_ptr<T> remove(std::uint64_t h) {
    auto it = items_.find(h);
    if (it == items_.end()) return nullptr;
    auto obj = std::move(it->second);
    items_.erase(it);
    return obj;
  }
  std::size_t size() const { return items_.size(); }
  const std::unordered_map<std::uint64_t, std::shared_ptr<T>>& items() const { return items_; }

 private:
  std::uint64_t tag_;
  std::uint64_t next_ = 1;
  std::unordered_map<std::uint64_t, std::shared_ptr<T>> items_;
};

template <class H>
std::uint64_t handle_value(H h) {
  return reinterpret_cast<std::uint64_t>(h);
}
template <class H>
H to_handle(std::uint64_t v) {
  return reinterpret_cast<H>(v);
}

}  // namespace emu
