// CacheWeightSource: the host cache as a vmm::WeightSource, so a prewarm copies each
// tensor the moment the store has fetched and verified its chunks — before the whole
// model has arrived, and never from a byte that was not verified.
//
// Files are looked up in one cached model (by its cache key), mapped read-only once, and
// every wait_bytes() blocks on the file's readiness map (a futex wait, no polling) until the
// range is verified, the fetch fails (the store's reason is returned), or `timeout` passes.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/readiness/mapped_region.hpp"
#include "daemon/store/cache/host_cache.hpp"
#include "vmm/weight_source.hpp"

namespace thaw::daemon {

class CacheWeightSource final : public vmm::WeightSource {
 public:
  CacheWeightSource(store::HostCache& cache, std::string model_key,
                    std::chrono::nanoseconds timeout = std::chrono::minutes(10));

  vmm::VmmResult<const std::byte*> wait_bytes(std::string_view file, std::uint64_t offset,
                                              std::uint64_t length) override;

 private:
  struct OpenFile {
    std::shared_ptr<store::CacheFile> file;
    store::MappedRegion view;
  };
  vmm::VmmResult<OpenFile*> open_locked(std::string_view file);

  store::HostCache& cache_;
  const std::string key_;
  const std::chrono::nanoseconds timeout_;
  std::mutex mutex_;
  std::map<std::string, OpenFile, std::less<>> files_;
};

}  // namespace thaw::daemon
