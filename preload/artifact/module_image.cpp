#include "preload/artifact/module_image.hpp"

#include <elf.h>

// The low-level SHA-256 calls are deprecated in OpenSSL 3 in favour of EVP, but EVP_Digest
// pulls OpenSSL's provider machinery (4 MiB) into the statically linked shim, and so into every
// engine process; SHA256_Init/Update/Final are the same implementation (SHA-NI where present),
// 30 KiB of code.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace thaw::preload {

namespace {

constexpr std::uint32_t kFatbinMagic = 0xBA55ED50u;
constexpr std::uint32_t kFatbinWrapperMagic = 0x466243B1u;
constexpr std::size_t kFatbinHeaderBytes = 16;

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

bool is_elf64(const std::byte* p) {
  return std::memcmp(p, ELFMAG, SELFMAG) == 0 && load<unsigned char>(p + EI_CLASS) == ELFCLASS64;
}

// The end of the last thing an ELF image's headers place in the file.
std::optional<std::uint64_t> elf_extent(const std::byte* p) {
  const auto eh = load<Elf64_Ehdr>(p);
  std::uint64_t end = sizeof(Elf64_Ehdr);
  auto grow = [&](std::uint64_t offset, std::uint64_t size) {
    if (offset > kMaxImageBytes || size > kMaxImageBytes) return false;
    end = std::max(end, offset + size);
    return end <= kMaxImageBytes;
  };
  if (eh.e_phoff != 0 && eh.e_phnum != 0) {
    if (eh.e_phentsize < sizeof(Elf64_Phdr)) return std::nullopt;
    if (!grow(eh.e_phoff, std::uint64_t{eh.e_phnum} * eh.e_phentsize)) return std::nullopt;
    for (std::uint64_t i = 0; i < eh.e_phnum; ++i) {
      const auto ph = load<Elf64_Phdr>(p + eh.e_phoff + i * eh.e_phentsize);
      if (!grow(ph.p_offset, ph.p_filesz)) return std::nullopt;
    }
  }
  if (eh.e_shoff != 0) {
    if (eh.e_shentsize < sizeof(Elf64_Shdr)) return std::nullopt;
    std::uint64_t count = eh.e_shnum;
    // More sections than e_shnum holds: the count is section 0's sh_size.
    if (count == 0) count = load<Elf64_Shdr>(p + eh.e_shoff).sh_size;
    if (count > kMaxImageBytes / sizeof(Elf64_Shdr)) return std::nullopt;
    if (!grow(eh.e_shoff, count * eh.e_shentsize)) return std::nullopt;
    for (std::uint64_t i = 0; i < count; ++i) {
      const auto sh = load<Elf64_Shdr>(p + eh.e_shoff + i * eh.e_shentsize);
      if (sh.sh_type == SHT_NOBITS || sh.sh_type == SHT_NULL) continue;
      if (!grow(sh.sh_offset, sh.sh_size)) return std::nullopt;
    }
  }
  return end;
}

std::optional<std::uint64_t> fatbin_extent(const std::byte* p) {
  const auto header = load<std::uint16_t>(p + 6);
  const auto entries = load<std::uint64_t>(p + 8);
  if (header < kFatbinHeaderBytes || entries > kMaxImageBytes) return std::nullopt;
  return header + entries;
}

bool is_text(const std::byte* p) {
  const auto c = static_cast<unsigned char>(*p);
  return c == '\t' || c == '\n' || c == '\r' || (c >= 0x20 && c < 0x7f);
}

}  // namespace

std::optional<ImageBytes> image_in_memory(const void* image) {
  if (image == nullptr) return std::nullopt;
  const auto* p = static_cast<const std::byte*>(image);
  const auto magic = load<std::uint32_t>(p);
  if (magic == kFatbinWrapperMagic) {
    // struct __fatBinC_Wrapper_t { int magic; int version; const unsigned long long* data; ... }
    const auto* data = load<const std::byte*>(p + 8);
    if (data == nullptr || load<std::uint32_t>(data) != kFatbinMagic) return std::nullopt;
    p = data;
  }
  if (load<std::uint32_t>(p) == kFatbinMagic) {
    auto n = fatbin_extent(p);
    if (!n) return std::nullopt;
    return ImageBytes{graphs::ImageKind::fatbin, {p, static_cast<std::size_t>(*n)}};
  }
  if (is_elf64(p)) {
    auto n = elf_extent(p);
    if (!n) return std::nullopt;
    return ImageBytes{graphs::ImageKind::cubin, {p, static_cast<std::size_t>(*n)}};
  }
  if (is_text(p)) {
    const std::size_t n = ::strnlen(reinterpret_cast<const char*>(p), kMaxImageBytes);
    if (n == kMaxImageBytes) return std::nullopt;
    return ImageBytes{graphs::ImageKind::ptx, {p, n}};
  }
  return std::nullopt;
}

graphs::ImageKind image_kind(std::span<const std::byte> bytes) {
  if (bytes.size() >= kFatbinHeaderBytes && load<std::uint32_t>(bytes.data()) == kFatbinMagic) {
    return graphs::ImageKind::fatbin;
  }
  if (bytes.size() >= sizeof(Elf64_Ehdr) && is_elf64(bytes.data())) return graphs::ImageKind::cubin;
  if (!bytes.empty() && is_text(bytes.data())) return graphs::ImageKind::ptx;
  return graphs::ImageKind::unknown;
}

std::string sha256_hex(std::span<const std::byte> bytes) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256_CTX ctx;
  SHA256_Init(&ctx);
  SHA256_Update(&ctx, bytes.data(), bytes.size());
  SHA256_Final(digest, &ctx);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(2 * SHA256_DIGEST_LENGTH, '0');
  for (std::size_t i = 0; i < SHA256_DIGEST_LENGTH; ++i) {
    out[2 * i] = kHex[digest[i] >> 4];
    out[2 * i + 1] = kHex[digest[i] & 0xf];
  }
  return out;
}

std::optional<graphs::RecordedModule> file_module(const char* path) {
  if (path == nullptr) return std::nullopt;
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  std::vector<std::byte> bytes;
  bool ok = ::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) <= kMaxImageBytes;
  if (ok) {
    bytes.resize(static_cast<std::size_t>(st.st_size));
    std::size_t done = 0;
    while (ok && done < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      ok = n > 0;
      if (ok) done += static_cast<std::size_t>(n);
    }
  }
  ::close(fd);
  if (!ok) return std::nullopt;
  return recorded_module({image_kind(bytes), bytes});
}

graphs::RecordedModule recorded_module(const ImageBytes& image) {
  return {sha256_hex(image.bytes), image.bytes.size(), image.kind};
}

}  // namespace thaw::preload
