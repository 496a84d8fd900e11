#include "common/safetensors/header_types.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

namespace thaw::safetensors {

std::uint64_t TensorInfo::elements() const {
  std::uint64_t n = 1;
  for (const std::uint64_t d : shape) n *= d;
  return n;
}

Header::Header(std::string file, std::uint64_t header_size, std::uint64_t file_size,
               std::vector<TensorInfo> tensors,
               std::map<std::string, std::string, std::less<>> metadata)
    : file_(std::move(file)),
      header_size_(header_size),
      file_size_(file_size),
      tensors_(std::move(tensors)),
      metadata_(std::move(metadata)) {
  by_name_.resize(tensors_.size());
  std::iota(by_name_.begin(), by_name_.end(), std::uint32_t{0});
  std::sort(by_name_.begin(), by_name_.end(), [this](std::uint32_t a, std::uint32_t b) {
    return tensors_[a].name < tensors_[b].name;
  });
}

const TensorInfo* Header::find(std::string_view name) const {
  const auto it = std::lower_bound(
      by_name_.begin(), by_name_.end(), name,
      [this](std::uint32_t i, std::string_view n) { return tensors_[i].name < n; });
  if (it == by_name_.end() || tensors_[*it].name != name) return nullptr;
  return &tensors_[*it];
}

}  // namespace thaw::safetensors
