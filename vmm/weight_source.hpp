// WeightSource: where a prewarm reads a model's bytes from. The daemon's source is the host
// cache (waiting on each chunk's readiness as the store fetches it); MappedFileSource reads
// plain files, for tools and tests. vmm/ depends on neither the store nor the daemon.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "vmm/vmm_error.hpp"

namespace thaw::vmm {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Blocks until [offset, offset + length) of `file` is available and returns its first
  // byte, valid for as long as the source lives (copies read it asynchronously).
  virtual VmmResult<const std::byte*> wait_bytes(std::string_view file, std::uint64_t offset,
                                                 std::uint64_t length) = 0;
};

// Files of a model directory, each mapped read-only on first use.
class MappedFileSource final : public WeightSource {
 public:
  explicit MappedFileSource(std::filesystem::path dir) : dir_(std::move(dir)) {}
  ~MappedFileSource() override;
  MappedFileSource(const MappedFileSource&) = delete;
  MappedFileSource& operator=(const MappedFileSource&) = delete;

  VmmResult<const std::byte*> wait_bytes(std::string_view file, std::uint64_t offset,
                                         std::uint64_t length) override;

 private:
  struct Mapping {
    void* addr = nullptr;
    std::size_t size = 0;
  };
  std::filesystem::path dir_;
  std::mutex mutex_;
  std::map<std::string, Mapping, std::less<>> files_;
};

}  // namespace thaw::vmm
