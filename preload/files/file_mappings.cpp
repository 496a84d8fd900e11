#include "preload/files/file_mappings.hpp"

#include <atomic>
#include <map>
#include <mutex>
#include <shared_mutex>

namespace thaw::preload {

namespace {

struct Mapping {
  std::uintptr_t end;
  std::string model;
  std::string file;
  std::uint64_t file_offset;
};

std::shared_mutex& mutex() {
  static auto* m = new std::shared_mutex();  // never destroyed: hooks run during exit
  return *m;
}
std::map<std::uintptr_t, Mapping>& mappings() {  // by start address
  static auto* m = new std::map<std::uintptr_t, Mapping>();
  return *m;
}
// Every H2D copy asks; most processes never map a model file.
std::atomic<std::size_t> g_count{0};

}  // namespace

void register_file_mapping(const void* address, std::size_t length, const std::string& model,
                           const std::string& file, std::uint64_t file_offset) {
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  std::unique_lock lock(mutex());
  mappings()[begin] = Mapping{begin + length, model, file, file_offset};
  g_count.store(mappings().size(), std::memory_order_release);
}

void forget_file_mappings(const void* address, std::size_t length) {
  if (g_count.load(std::memory_order_acquire) == 0) return;
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  std::unique_lock lock(mutex());
  auto& m = mappings();
  m.erase(m.lower_bound(begin), m.lower_bound(begin + length));
  g_count.store(m.size(), std::memory_order_release);
}

std::optional<FileSource> file_source(const void* ptr, std::size_t bytes) {
  if (g_count.load(std::memory_order_acquire) == 0) return std::nullopt;
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  std::shared_lock lock(mutex());
  auto it = mappings().upper_bound(p);
  if (it == mappings().begin()) return std::nullopt;
  --it;
  if (p + bytes > it->second.end) return std::nullopt;
  return FileSource{it->second.model, it->second.file, it->second.file_offset + (p - it->first)};
}

}  // namespace thaw::preload
