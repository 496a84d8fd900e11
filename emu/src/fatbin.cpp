// Fatbin container parser and the module image entry point; formats in fatbin.hpp.
#include "fatbin.hpp"

#include <cstring>
#include <limits>
#include <string_view>

namespace emu {
namespace {

constexpr std::size_t kContainerHeaderSize = 16;
constexpr std::size_t kEntryHeaderMin = 0x40;
constexpr std::size_t kWrapperSize = 8 + 2 * sizeof(void*);  // __fatBinC_Wrapper_t

constexpr std::uint16_t kKindPtx = 1;
constexpr std::uint16_t kKindElf = 2;
constexpr std::uint64_t kFlagCompressed = 0x1000 | 0x2000 | 0x8000;  // LZ (two), zstd

template <class T>
T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

bool in_bounds(std::uint64_t off, std::uint64_t len, std::uint64_t size) {
  return off <= size && len <= size - off;
}

ImageError fail(CUresult e, const ModuleImageOptions& o, std::string_view why) {
  if (o.diagnostic != nullptr) *o.diagnostic = std::string(why);
  return ImageError(e);
}

bool is_wrapper(const std::uint8_t* d, std::size_t size) {
  return size >= kWrapperSize && load<std::uint32_t>(d) == kFatbinWrapperMagic;
}

// The container a wrapper names, and its extent. The wrapper's pointer is trusted.
std::optional<std::pair<const std::uint8_t*, std::size_t>> unwrap(const std::uint8_t* d) {
  const auto version = load<std::uint32_t>(d + 4);
  if (version != 1 && version != 2) return std::nullopt;
  const std::uint8_t* inner = nullptr;
  std::memcpy(&inner, d + 8, sizeof inner);
  if (inner == nullptr) return std::nullopt;
  auto extent = fatbin_extent(inner, std::numeric_limits<std::size_t>::max());
  if (!extent) return std::nullopt;
  return std::make_pair(inner, *extent);
}

bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

// PTX source: the first thing after blanks and comments is one of the directives a PTX module
// starts with (it must begin with .version; nvcc-written files start with // comments).
bool looks_like_ptx(const std::uint8_t* d, std::size_t size) {
  std::string_view t(reinterpret_cast<const char*>(d), size);
  if (auto nul = t.find('\0'); nul != std::string_view::npos) t = t.substr(0, nul);
  std::size_t i = 0;
  while (i < t.size()) {
    if (is_blank(t[i])) {
      ++i;
    } else if (t.substr(i, 2) == "//") {
      const auto eol = t.find('\n', i);
      if (eol == std::string_view::npos) return false;
      i = eol + 1;
    } else if (t.substr(i, 2) == "/*") {
      const auto end = t.find("*/", i + 2);
      if (end == std::string_view::npos) return false;
      i = end + 2;
    } else {
      break;
    }
  }
  const std::string_view rest = t.substr(i);
  for (std::string_view directive : {".version", ".target", ".address_size"}) {
    if (rest.starts_with(directive) && rest.size() > directive.size() &&
        is_blank(rest[directive.size()])) {
      return true;
    }
  }
  return false;
}

ImageResult<std::vector<FatbinEntry>> parse_container(const std::uint8_t* d, std::size_t size) {
  const auto extent = fatbin_extent(d, size);
  if (!extent) return ImageError(CUDA_ERROR_INVALID_IMAGE);
  if (load<std::uint16_t>(d + 4) != 1) return ImageError(CUDA_ERROR_INVALID_IMAGE);  // version
  const std::size_t end = *extent;
  std::size_t off = load<std::uint16_t>(d + 6);
  std::vector<FatbinEntry> entries;
  while (off < end) {
    if (!in_bounds(off, kEntryHeaderMin, end)) return ImageError(CUDA_ERROR_INVALID_IMAGE);
    const std::uint8_t* e = d + off;
    const auto kind = load<std::uint16_t>(e + 0);
    const auto header_size = load<std::uint32_t>(e + 4);
    const auto payload_size = load<std::uint64_t>(e + 8);
    const auto compressed_size = load<std::uint32_t>(e + 0x10);
    const auto arch = load<std::uint32_t>(e + 0x1c);
    const auto flags = load<std::uint64_t>(e + 0x28);
    if (header_size < kEntryHeaderMin || !in_bounds(off, header_size, end) ||
        !in_bounds(off + header_size, payload_size, end)) {
      return ImageError(CUDA_ERROR_INVALID_IMAGE);
    }
    FatbinEntry entry;
    entry.kind = kind == kKindPtx   ? FatbinEntry::Kind::kPtx
                 : kind == kKindElf ? FatbinEntry::Kind::kElf
                                    : FatbinEntry::Kind::kOther;
    entry.sm = arch > 0xffff ? 0 : static_cast<int>(arch);
    entry.compressed = (flags & kFlagCompressed) != 0;
    entry.payload = e + header_size;
    entry.payload_size = static_cast<std::size_t>(payload_size);
    if (entry.compressed && compressed_size != 0 && compressed_size <= payload_size) {
      entry.payload_size = compressed_size;
    }
    entries.push_back(entry);
    off += header_size + static_cast<std::size_t>(payload_size);
  }
  return entries;
}

}  // namespace

std::optional<std::size_t> fatbin_extent(const std::uint8_t* data, std::size_t limit) {
  if (data == nullptr || limit < kContainerHeaderSize) return std::nullopt;
  if (load<std::uint32_t>(data) != kFatbinMagic) return std::nullopt;
  const std::uint64_t header_size = load<std::uint16_t>(data + 6);
  const auto body = load<std::uint64_t>(data + 8);
  if (header_size < kContainerHeaderSize || !in_bounds(header_size, body, limit)) {
    return std::nullopt;
  }
  return static_cast<std::size_t>(header_size + body);
}

ImageResult<std::vector<FatbinEntry>> parse_fatbin(const std::uint8_t* data, std::size_t size,
                                                   const FatbinOptions& options) {
  if (data == nullptr) return ImageError(CUDA_ERROR_INVALID_IMAGE);
  if (is_wrapper(data, size)) {
    if (!options.follow_wrapper) return ImageError(CUDA_ERROR_INVALID_IMAGE);
    const auto inner = unwrap(data);
    if (!inner) return ImageError(CUDA_ERROR_INVALID_IMAGE);
    return parse_container(inner->first, inner->second);
  }
  return parse_container(data, size);
}

namespace {

bool is_elf(const std::uint8_t* d, std::size_t size) {
  return size >= 4 && std::memcmp(d,
                                  "\x7f"
                                  "ELF",
                                  4) == 0;
}

ImageResult<CubinInfo> load_cubin(const std::uint8_t* data, std::size_t size, int device_sm,
                                  const ModuleImageOptions& options) {
  const auto arch = cubin_arch(data, size);
  if (!arch) return fail(CUDA_ERROR_INVALID_IMAGE, options, "not a 64-bit CUDA ELF image");
  // The header's SM decides first, so that an image for another GPU is refused even where
  // this parser would not know its layout. The sm_XXa marker of nvcc 13 images is in
  // .nv.compat, which parse_cubin reads.
  if (!cubin_runs_on(arch->sm, false, device_sm)) {
    return fail(CUDA_ERROR_NO_BINARY_FOR_GPU, options,
                "cubin is for sm_" + std::to_string(arch->sm) + ", the device is sm_" +
                    std::to_string(device_sm));
  }
  auto info = parse_cubin(data, size);
  if (!info) return fail(info.error(), options, "malformed or truncated cubin");
  if (!cubin_runs_on(info->sm, info->arch_specific, device_sm)) {
    return fail(CUDA_ERROR_NO_BINARY_FOR_GPU, options,
                "cubin is for sm_" + std::to_string(info->sm) + "a, the device is sm_" +
                    std::to_string(device_sm));
  }
  return info;
}

}  // namespace

ImageResult<CubinInfo> parse_module_image(const std::uint8_t* data, std::size_t size, int device_sm,
                                          const ModuleImageOptions& options) {
  if (size == 0) return fail(CUDA_ERROR_INVALID_IMAGE, options, "empty image");
  if (data == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, options, "no image");
  if (is_elf(data, size)) return load_cubin(data, size, device_sm, options);

  const bool container = size >= 4 && load<std::uint32_t>(data) == kFatbinMagic;
  const bool wrapper = is_wrapper(data, size);
  if (container || wrapper) {
    if (wrapper && !options.follow_wrapper) {
      return fail(CUDA_ERROR_INVALID_IMAGE, options, "fatbin wrapper not accepted here");
    }
    auto entries = parse_fatbin(data, size, {.follow_wrapper = options.follow_wrapper});
    if (!entries) return fail(entries.error(), options, "malformed or truncated fatbin");
    // The emulator has no PTX JIT and no decompressor (nvcc's LZ and zstd fatbin compression):
    // only an uncompressed cubin that runs on the device can be loaded; of several, the one
    // for the highest SM (an sm_86 device prefers sm_86 to sm_80), else the first.
    bool compressed_match = false, ptx = false;
    const FatbinEntry* best = nullptr;
    for (const FatbinEntry& e : *entries) {
      if (e.kind == FatbinEntry::Kind::kPtx) ptx = true;
      if (e.kind != FatbinEntry::Kind::kElf || !cubin_runs_on(e.sm, false, device_sm)) continue;
      if (e.compressed) {
        compressed_match = true;
      } else if (best == nullptr || e.sm > best->sm) {
        best = &e;
      }
    }
    if (best != nullptr) {
      if (!is_elf(best->payload, best->payload_size)) {
        return fail(CUDA_ERROR_INVALID_IMAGE, options, "fatbin ELF entry is not an ELF image");
      }
      return load_cubin(best->payload, best->payload_size, device_sm, options);
    }
    const std::string sm = "sm_" + std::to_string(device_sm);
    if (compressed_match) {
      return fail(CUDA_ERROR_NO_BINARY_FOR_GPU, options,
                  "the fatbin's " + sm +
                      " cubin is compressed and the emulator has no decompressor (build it "
                      "with nvcc --no-compress or -compress-mode=none)");
    }
    return fail(CUDA_ERROR_NO_BINARY_FOR_GPU, options,
                ptx ? "the fatbin has PTX but no " + sm + " cubin, and the emulator has no JIT"
                    : "the fatbin has no " + sm + " cubin");
  }

  if (looks_like_ptx(data, size)) {
    return fail(
        CUDA_ERROR_NO_BINARY_FOR_GPU, options,
        "PTX text: the emulator has no JIT; load an sm_" + std::to_string(device_sm) + " cubin");
  }
  return fail(CUDA_ERROR_INVALID_IMAGE, options, "not a cubin, fatbin or PTX image");
}

std::optional<std::size_t> module_image_extent(const std::uint8_t* data, std::size_t limit) {
  if (data == nullptr || limit == 0) return std::nullopt;
  if (is_elf(data, limit)) return elf_extent(data, limit);
  if (limit >= 4 && load<std::uint32_t>(data) == kFatbinMagic) return fatbin_extent(data, limit);
  if (is_wrapper(data, limit)) return kWrapperSize;
  // Text (PTX): printable ASCII up to a NUL.
  const auto c = data[0];
  if (!(is_blank(static_cast<char>(c)) || (c >= 0x20 && c < 0x7f))) return std::nullopt;
  const void* nul = std::memchr(data, 0, limit);
  if (nul == nullptr) return std::nullopt;
  return static_cast<std::size_t>(static_cast<const std::uint8_t*>(nul) - data) + 1;
}

}  // namespace emu
