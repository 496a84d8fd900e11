#include "daemon/prewarm/cache_weight_source.hpp"

#include <fmt/format.h>

namespace thaw::daemon {

CacheWeightSource::CacheWeightSource(store::HostCache& cache, std::string model_key,
                                     std::chrono::nanoseconds timeout)
    : cache_(cache), key_(std::move(model_key)), timeout_(timeout) {}

vmm::VmmResult<CacheWeightSource::OpenFile*> CacheWeightSource::open_locked(std::string_view file) {
  if (auto it = files_.find(file); it != files_.end()) return &it->second;
  auto cached = cache_.find_file(key_, file);
  if (!cached) {
    return vmm::vmm_failure(vmm::VmmErrc::source,
                            fmt::format("{}/{} is not in the host cache ({}); fetch the model "
                                        "first",
                                        key_, file, cached.error().message));
  }
  auto view = store::MappedRegion::map((*cached)->data_fd(), (*cached)->size(), false,
                                       (*cached)->data_path().string());
  if (!view) {
    return vmm::vmm_failure(vmm::VmmErrc::source,
                            fmt::format("{}/{}: {}", key_, file, view.error().message));
  }
  auto [it, inserted] = files_.emplace(std::string(file), OpenFile{*cached, std::move(*view)});
  return &it->second;
}

vmm::VmmResult<const std::byte*> CacheWeightSource::wait_bytes(std::string_view file,
                                                               std::uint64_t offset,
                                                               std::uint64_t length) {
  OpenFile* open = nullptr;
  {
    std::lock_guard lock(mutex_);
    auto opened = open_locked(file);
    if (!opened) return std::unexpected(opened.error());
    open = *opened;
  }
  const store::WaitResult r = open->file->readiness().wait_ready(offset, length, timeout_);
  switch (r.status) {
    case store::WaitStatus::ready:
      return open->view.data() + offset;
    case store::WaitStatus::failed:
      return vmm::vmm_failure(vmm::VmmErrc::source,
                              fmt::format("{}/{} bytes {}+{}: the fetch failed: {}", key_, file,
                                          offset, length, r.failure_reason));
    case store::WaitStatus::out_of_range:
      return vmm::vmm_failure(vmm::VmmErrc::source,
                              fmt::format("{}/{} bytes {}+{} lie past the file's end ({} bytes)",
                                          key_, file, offset, length, open->file->size()));
    case store::WaitStatus::timed_out:
    default:
      return vmm::vmm_failure(
          vmm::VmmErrc::source,
          fmt::format("{}/{} bytes {}+{} were not fetched within {} s; is the fetch running?", key_,
                      file, offset, length,
                      std::chrono::duration_cast<std::chrono::seconds>(timeout_).count()));
  }
}

}  // namespace thaw::daemon
