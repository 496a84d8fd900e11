#include "preload/files/file_mappings.hpp"

#include <mutex>

namespace thaw::preload {

void FileMappings::add(const void* address, std::size_t length, const std::string& model,
                       const std::string& file, std::uint64_t file_offset) {
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  std::unique_lock lock(mutex_);
  by_start_[begin] = Mapping{begin + length, model, file, file_offset};
  count_.store(by_start_.size(), std::memory_order_release);
}

void FileMappings::forget(const void* address, std::size_t length) {
  if (count_.load(std::memory_order_acquire) == 0) return;
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  std::unique_lock lock(mutex_);
  by_start_.erase(by_start_.lower_bound(begin), by_start_.lower_bound(begin + length));
  count_.store(by_start_.size(), std::memory_order_release);
}

std::optional<FileSource> FileMappings::source(const void* ptr, std::size_t bytes) const {
  if (count_.load(std::memory_order_acquire) == 0) return std::nullopt;
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  std::shared_lock lock(mutex_);
  auto it = by_start_.upper_bound(p);
  if (it == by_start_.begin()) return std::nullopt;
  --it;
  if (p + bytes > it->second.end) return std::nullopt;
  return FileSource{it->second.model, it->second.file, it->second.file_offset + (p - it->first)};
}

}  // namespace thaw::preload
