// What a parsed safetensors header says: the tensors (name, dtype, shape, where their bytes
// are in the file) and the "__metadata__" strings. Built only by the parser, so a Header is
// always one that passed every rule of the format.
//
// File layout: [8-byte little-endian N][N bytes of JSON header][data section]. Tensor offsets
// here are absolute file offsets: data_offsets [b, e) of the JSON become [8 + N + b, 8 + N + e).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/safetensors/dtype.hpp"

namespace thaw::safetensors {

inline constexpr std::uint64_t kLengthPrefixBytes = 8;
// The official parser's limit (MAX_HEADER_SIZE in safetensors/src/tensor.rs).
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::U8;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;  // absolute file offset of the first byte
  std::uint64_t end = 0;    // absolute file offset one past the last byte

  std::uint64_t bytes() const { return end - begin; }
  // product(shape); the parser checked it does not overflow.
  std::uint64_t elements() const;
};

class Header {
 public:
  Header() = default;
  // `tensors` in file order with absolute offsets; the parser guarantees they tile
  // [8 + header_size, file_size) exactly.
  Header(std::string file, std::uint64_t header_size, std::uint64_t file_size,
         std::vector<TensorInfo> tensors, std::map<std::string, std::string, std::less<>> metadata);

  // The name the file was parsed under (used in every message about it).
  const std::string& file() const { return file_; }
  // N: the JSON header's length, including the official writer's space padding.
  std::uint64_t header_size() const { return header_size_; }
  // 8 + N: where the data section starts; [0, data_begin()) is what a reader parses first.
  std::uint64_t data_begin() const { return kLengthPrefixBytes + header_size_; }
  std::uint64_t file_size() const { return file_size_; }
  std::uint64_t data_size() const { return file_size_ - data_begin(); }

  // In file order (by offset).
  std::span<const TensorInfo> tensors() const { return tensors_; }
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }
  // nullptr when the file has no tensor of that name.
  const TensorInfo* find(std::string_view name) const;

 private:
  std::string file_;
  std::uint64_t header_size_ = 0;
  std::uint64_t file_size_ = kLengthPrefixBytes;
  std::vector<TensorInfo> tensors_;
  std::vector<std::uint32_t> by_name_;  // indices into tensors_, sorted by name
  std::map<std::string, std::string, std::less<>> metadata_;
};

}  // namespace thaw::safetensors
