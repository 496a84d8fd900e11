// Fatbin containers (what `nvcc -fatbin` writes and what nvcc embeds in host objects), and
// parse_module_image, the one entry point cuModuleLoad* / cuLibraryLoad* call.
//
// The format as nvcc 13.0 writes it (verified with -fatbin, -gencode for ELF, PTX and LTO-IR
// entries, --no-compress, -Xfatbin -compress-all, -compress-mode=speed, -G):
//
// Container header, 16 bytes:
//   0x00 u32 magic 0xBA55ED50   0x04 u16 version (1)   0x06 u16 header size (16)
//   0x08 u64 size of the entries that follow the header
// Entries, back to back, each a header followed by its payload:
//   0x00 u16 kind: 1 PTX, 2 ELF (cubin), 8 LTO-IR (nvcc -gencode code=lto_XX)
//   0x02 u16 0x0101
//   0x04 u32 header size (0x40 for ELF, 0x50 for PTX and for -G ELF, 0x78 for LTO-IR; the
//            bytes past 0x40 hold the options string / source file name)
//   0x08 u64 payload size (padded to 8 bytes)
//   0x10 u32 compressed payload size (0 when not compressed)
//   0x14 u32 offset of the options/name area in the header (0 when none)
//   0x18 u16 minor, 0x1a u16 major (ELF 8.1; PTX ISA 9.0)
//   0x1c u32 arch (90 for sm_90 and sm_90a / compute_90)
//   0x20 u32 offset, 0x24 u32 length of the object name (the .cu file name under -G)
//   0x28 u64 flags: 0x1 64-bit, 0x2 debug (-G), 0x10 Linux host, 0x2000 compressed (LZ4,
//            -compress-mode=speed; older nvcc: 0x1000 too), 0x8000 compressed (zstd, the
//            default mode), 0x100000 arch-specific (sm_90a)
//   0x30 u64 (0, except for LTO-IR)
//   0x38 u64 uncompressed payload size (0 when not compressed)
// nvcc 13.0 compresses PTX and LTO-IR entries by default and leaves ELF entries alone unless
// -Xfatbin -compress-all is given.
//
// The wrapper nvcc emits into host objects (cuda/include/fatbinary_section.h):
//   struct __fatBinC_Wrapper_t { int magic (0x466243B1); int version (1, or 2 for
//   -rdc prelinked); const unsigned long long* data (the container); void* filename_or_fatbins; }
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cubin.hpp"

namespace emu {

inline constexpr std::uint32_t kFatbinMagic = 0xBA55ED50u;
inline constexpr std::uint32_t kFatbinWrapperMagic = 0x466243B1u;

struct FatbinEntry {
  enum class Kind { kPtx, kElf, kOther } kind = Kind::kOther;
  int sm = 0;                             // the entry's arch field
  bool compressed = false;                // flags 0x1000 / 0x2000 / 0x8000
  const std::uint8_t* payload = nullptr;  // into the container
  std::size_t payload_size = 0;  // compressed entries: the compressed size; else the padded size
};

struct FatbinOptions {
  // Accept a __fatBinC_Wrapper_t and read the container its data pointer names. That pointer
  // cannot be bounds-checked: only for images from the calling process itself (the driver);
  // the fuzz target turns it off.
  bool follow_wrapper = true;
};

// Parses a fatbin container, or (follow_wrapper) a __fatBinC_Wrapper_t naming one. Only the
// first container is read: bytes after it are ignored. CUDA_ERROR_INVALID_IMAGE if malformed
// or truncated.
ImageResult<std::vector<FatbinEntry>> parse_fatbin(const std::uint8_t* data, std::size_t size,
                                                   const FatbinOptions& options = {});

// The extent of a fatbin container from its 16-byte header (header size + entry bytes), or
// nullopt if `data` is not one or the extent would pass `limit`. A wrapper is not a container:
// nullopt.
std::optional<std::size_t> fatbin_extent(const std::uint8_t* data, std::size_t limit);

struct ModuleImageOptions {
  bool follow_wrapper = true;         // as in FatbinOptions
  std::string* diagnostic = nullptr;  // if set, receives why an image was refused
};

// The module loader's entry point: what cuModuleLoadData and friends were given.
//   ELF cubin      -> parse_cubin; a cubin whose SM does not run on `device_sm` (see
//                     cubin_runs_on: sm_90 and sm_90a on sm_90) -> CUDA_ERROR_NO_BINARY_FOR_GPU.
//   fatbin / wrapper -> the first uncompressed ELF entry that runs on `device_sm`, parsed.
//                     The emulator has no PTX JIT and no fatbin decompressor, so a fatbin that
//                     offers only PTX, LTO-IR, compressed cubins or cubins for other SMs ->
//                     CUDA_ERROR_NO_BINARY_FOR_GPU (the diagnostic says which; rebuild with
//                     -gencode arch=compute_90,code=sm_90 and without -Xfatbin -compress-all).
//   PTX text (first directive .version/.target/.address_size, after blanks and comments)
//                  -> CUDA_ERROR_NO_BINARY_FOR_GPU (no JIT).
//   anything else  -> CUDA_ERROR_INVALID_IMAGE, as is size 0; data == nullptr with a size
//                     -> CUDA_ERROR_INVALID_VALUE.
ImageResult<CubinInfo> parse_module_image(const std::uint8_t* data, std::size_t size, int device_sm,
                                          const ModuleImageOptions& options = {});

// How many bytes parse_module_image should be given for an image passed without a size
// (cuModuleLoadData, cuModuleLoadFatBinary, cuLibraryLoadData): elf_extent for an ELF image,
// fatbin_extent for a container, sizeof(__fatBinC_Wrapper_t) for a wrapper, and for text the
// length up to and including its terminating NUL (the text is then scanned, never beyond
// `limit`). nullopt when none of these fits within `limit`.
std::optional<std::size_t> module_image_extent(const std::uint8_t* data, std::size_t limit);

}  // namespace emu
