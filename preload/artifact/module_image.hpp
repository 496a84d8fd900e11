// ModuleImage: what a module load gave the driver — its kind, its bytes and their SHA-256 —
// so that a recorded kernel can name the image it came from (common/graphs: a kernel is
// identified by its module's digest and its mangled name), and a restore can find the image
// again among those a later run loads.
//
// cuModuleLoadData, cuModuleLoadFatBinary and cuLibraryLoadData get a pointer and no size:
// the size is read from the image's own headers, as the driver reads it —
//   ELF (cubin)      the end of the section header table, of the program header table and of
//                    every section with bytes in the file, whichever is last;
//   fatbin container header size + the entries' size, from its 16-byte header;
//   fatbin wrapper   (__fatBinC_Wrapper_t, what nvcc embeds in host objects) the container its
//                    data pointer names: that container is the image;
//   PTX              the text up to its terminating NUL (not included, so that the same PTX
//                    loaded from a file has the same digest).
// A file (cuModuleLoad, cuLibraryLoadFromFile) is its whole contents.
//
// Only called on images the driver has just accepted, so their headers are sound; the sizes
// are still bounded (kMaxImageBytes) so that a header the driver read differently cannot make
// the shim read far past it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "common/graphs/graph_record.hpp"

namespace thaw::preload {

inline constexpr std::uint64_t kMaxImageBytes = 4ull << 30;

struct ImageBytes {
  graphs::ImageKind kind = graphs::ImageKind::unknown;
  std::span<const std::byte> bytes;
};

// The kind and extent of an image passed without a size; nullopt when it is none of the
// kinds above (or its headers give an extent over kMaxImageBytes).
std::optional<ImageBytes> image_in_memory(const void* image);

// A file's contents (cuModuleLoad, cuLibraryLoadFromFile) as a recorded module; nullopt when
// it cannot be read (or is over kMaxImageBytes).
std::optional<graphs::RecordedModule> file_module(const char* path);

// The kind of an image of known size (a file's contents): ELF, fatbin container or text.
graphs::ImageKind image_kind(std::span<const std::byte> bytes);

// Lowercase hex SHA-256 (OpenSSL's, linked statically into the shim).
std::string sha256_hex(std::span<const std::byte> bytes);

// The recorded form of an image: digest, size, kind.
graphs::RecordedModule recorded_module(const ImageBytes& image);

}  // namespace thaw::preload
