// Where the engine mapped managed model files: address ranges → (model, file, offset). The
// copy hooks ask it whether an H2D copy's source is model-file bytes (the record's copy
// map, and later weight injection, are about exactly those copies).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace thaw::preload {

struct FileSource {
  std::string model;  // model key
  std::string file;   // path relative to the model directory
  std::uint64_t file_offset = 0;
};

void register_file_mapping(const void* address, std::size_t length, const std::string& model,
                           const std::string& file, std::uint64_t file_offset);
// munmap of [address, address + length): mappings starting inside it are forgotten.
void forget_file_mappings(const void* address, std::size_t length);
// The file bytes [ptr, ptr + bytes) are, when the whole range lies in one mapping.
std::optional<FileSource> file_source(const void* ptr, std::size_t bytes);

}  // namespace thaw::preload
