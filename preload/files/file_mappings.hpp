// Where the engine mapped managed model files: address ranges → (model, file, offset). The
// copy hooks ask it whether an H2D copy's source is model-file bytes (the record's copy
// map, and weight injection, are about exactly those copies). One per process, owned by the
// ShimRuntime.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <shared_mutex>
#include <string>

namespace thaw::preload {

struct FileSource {
  std::string model;  // model key
  std::string file;   // path relative to the model directory
  std::uint64_t file_offset = 0;
};

class FileMappings {
 public:
  void add(const void* address, std::size_t length, const std::string& model,
           const std::string& file, std::uint64_t file_offset);
  // munmap of [address, address + length): mappings starting inside it are forgotten.
  void forget(const void* address, std::size_t length);
  // The file bytes [ptr, ptr + bytes) are, when the whole range lies in one mapping. Every
  // H2D copy asks: lock-free while no model file is mapped.
  std::optional<FileSource> source(const void* ptr, std::size_t bytes) const;

  // Held across fork() by the runtime's fork steps (shim_runtime_fork.cpp).
  std::shared_mutex& fork_mutex() { return mutex_; }

 private:
  struct Mapping {
    std::uintptr_t end;
    std::string model;
    std::string file;
    std::uint64_t file_offset;
  };
  mutable std::shared_mutex mutex_;
  std::map<std::uintptr_t, Mapping> by_start_;
  std::atomic<std::size_t> count_{0};
};

}  // namespace thaw::preload
