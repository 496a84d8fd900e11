// The reference engine's own minimal safetensors reader (issue 4). It must not use thaw's.
//
// Parsing follows huggingface/safetensors' validation rules: an 8-byte little-endian header
// length N (at most 100 MB), N bytes of UTF-8 JSON object, then the data section. Each entry is
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data section), an
// optional "__metadata__" maps strings to strings; sorted by offset the tensors must tile the
// data section exactly (no gap, no overlap, last end == file size - 8 - N), and each tensor's
// byte size must be product(shape) * dtype size.
//
// Loading follows safetensors + PyTorch (vLLM's default loader): the Rust side opens the file
// and maps it (MAP_PRIVATE, read-only) to read the header; PyTorch opens it a second time and
// maps it privately again (UntypedStorage.from_file); tensors are views of that second mapping.
// MappedCheckpointFile does both opens and both mappings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <expected>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace refengine {

enum class DType {
  BOOL,
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  F64,
  I64,
  U64
};

std::optional<DType> parse_dtype(std::string_view name);
std::string_view dtype_name(DType dtype);
std::size_t dtype_size(DType dtype);

// One tensor entry. begin/end are byte offsets into the data section (after 8 + N).
struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::uint64_t header_size = 0;    // N
  std::uint64_t data_size = 0;      // file size - 8 - N
  std::vector<TensorInfo> tensors;  // sorted by begin offset
  std::map<std::string, std::string> metadata;
  const TensorInfo* find(std::string_view name) const;
};

inline constexpr std::uint64_t kMaxHeaderSize = 100'000'000;

// Parses and validates a whole safetensors file image. `label` names the file in errors.
std::expected<SafetensorsHeader, std::string> parse_safetensors(std::span<const std::byte> file,
                                                                std::string_view label);

// Parses the JSON header alone, given the total file size (8 + N + data).
std::expected<SafetensorsHeader, std::string> parse_safetensors_header(std::string_view json,
                                                                       std::uint64_t file_size,
                                                                       std::string_view label);

// A safetensors file loaded the safetensors + PyTorch way. Owns the private mapping of the
// whole file (the tensors' bytes); the header mapping and both fds are gone by the time
// open() returns, unless keep_header_mapping is set (then both mappings live as long as the
// object, as while vLLM iterates a safe_open handle).
class MappedCheckpointFile {
 public:
  static std::expected<MappedCheckpointFile, std::string> open(const std::string& path,
                                                               bool keep_header_mapping = true);
  MappedCheckpointFile(MappedCheckpointFile&& other) noexcept;
  MappedCheckpointFile& operator=(MappedCheckpointFile&& other) noexcept;
  MappedCheckpointFile(const MappedCheckpointFile&) = delete;
  MappedCheckpointFile& operator=(const MappedCheckpointFile&) = delete;
  ~MappedCheckpointFile();

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  // The tensor's bytes inside the private mapping.
  std::span<const std::byte> data(const TensorInfo& tensor) const;
  const void* mapping_base() const { return data_map_; }
  std::size_t mapping_size() const { return data_size_; }

 private:
  MappedCheckpointFile() = default;
  void release();

  std::string path_;
  SafetensorsHeader header_;
  void* header_map_ = nullptr;  // the "Rust side" mapping
  std::size_t header_map_size_ = 0;
  void* data_map_ = nullptr;  // the "PyTorch" private mapping
  std::size_t data_size_ = 0;
};

}  // namespace refengine
