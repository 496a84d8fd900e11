#include "safetensors.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace refengine {
namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  std::size_t size;
};

constexpr std::array<DTypeEntry, 15> kDTypes{{
    {DType::BOOL, "BOOL", 1},
    {DType::U8, "U8", 1},
    {DType::I8, "I8", 1},
    {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::I16, "I16", 2},
    {DType::U16, "U16", 2},
    {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},
    {DType::I32, "I32", 4},
    {DType::U32, "U32", 4},
    {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},
    {DType::I64, "I64", 8},
    {DType::U64, "U64", 8},
}};

std::string errno_text(int err) {
  return std::strerror(err);
}

// Closes an fd on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& e : kDTypes)
    if (e.name == name) return e.dtype;
  return std::nullopt;
}

std::string_view dtype_name(DType dtype) {
  for (const auto& e : kDTypes)
    if (e.dtype == dtype) return e.name;
  return "?";
}

std::size_t dtype_size(DType dtype) {
  for (const auto& e : kDTypes)
    if (e.dtype == dtype) return e.size;
  return 0;
}

const TensorInfo* SafetensorsHeader::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::expected<SafetensorsHeader, std::string> parse_safetensors_header(std::string_view text,
                                                                       std::uint64_t file_size,
                                                                       std::string_view label) {
  using nlohmann::json;
  auto fail = [&](std::string msg) {
    return std::unexpected(fmt::format("{}: invalid safetensors file: {}", label, msg));
  };
  const std::uint64_t n = text.size();
  if (n > kMaxHeaderSize)
    return fail(fmt::format("header length {} exceeds {}", n, kMaxHeaderSize));
  if (file_size < 8 || n > file_size - 8)
    return fail(
        fmt::format("header length {} runs past the end of the file ({} bytes)", n, file_size));
  if (text.empty() || text.front() != '{') return fail("header does not start with '{'");
  // nlohmann's lexer rejects invalid UTF-8 inside strings.
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return fail("header is not valid UTF-8 JSON");
  if (!doc.is_object()) return fail("header is not a JSON object");

  SafetensorsHeader h;
  h.header_size = n;
  h.data_size = file_size - 8 - n;
  for (const auto& [name, entry] : doc.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return fail("\"__metadata__\" is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          return fail(fmt::format("\"__metadata__\" value of '{}' is not a string", k));
        h.metadata.emplace(k, v.get<std::string>());
      }
      continue;
    }
    auto tfail = [&](std::string msg) { return fail(fmt::format("tensor '{}': {}", name, msg)); };
    if (!entry.is_object()) return tfail("entry is not an object");
    for (const auto& [k, v] : entry.items())
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        return tfail(fmt::format("unknown field '{}'", k));
    auto dt = entry.find("dtype");
    auto sh = entry.find("shape");
    auto off = entry.find("data_offsets");
    if (dt == entry.end() || sh == entry.end() || off == entry.end())
      return tfail("missing dtype, shape or data_offsets");
    if (!dt->is_string()) return tfail("dtype is not a string");
    TensorInfo t;
    t.name = name;
    auto dtype = parse_dtype(dt->get<std::string>());
    if (!dtype) return tfail(fmt::format("unknown dtype '{}'", dt->get<std::string>()));
    t.dtype = *dtype;
    if (!sh->is_array()) return tfail("shape is not an array");
    std::uint64_t elements = 1;
    bool overflow = false;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned())
        return tfail("shape holds a value that is not a non-negative integer");
      std::uint64_t v = d.get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(INT64_MAX)) return tfail("shape dimension too large");
      t.shape.push_back(static_cast<std::int64_t>(v));
      overflow |= __builtin_mul_overflow(elements, v, &elements);
    }
    std::uint64_t expected_bytes = 0;
    overflow |= __builtin_mul_overflow(elements, dtype_size(t.dtype), &expected_bytes);
    if (overflow) return tfail("shape's byte size overflows");
    if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      return tfail("data_offsets is not [begin, end] of non-negative integers");
    t.begin = (*off)[0].get<std::uint64_t>();
    t.end = (*off)[1].get<std::uint64_t>();
    if (t.end < t.begin)
      return tfail(fmt::format("data_offsets [{}, {}] end before they begin", t.begin, t.end));
    if (t.end - t.begin != expected_bytes)
      return tfail(fmt::format("data_offsets [{}, {}] hold {} bytes but shape and dtype {} need {}",
                               t.begin, t.end, t.end - t.begin, dtype_name(t.dtype),
                               expected_bytes));
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  std::uint64_t next = 0;
  for (const auto& t : h.tensors) {
    if (t.begin < next)
      return fail(
          fmt::format("tensor '{}': data_offsets [{}, {}] overlap the previous tensor ending at {}",
                      t.name, t.begin, t.end, next));
    if (t.begin > next)
      return fail(fmt::format("tensor '{}': data_offsets [{}, {}] leave a gap after offset {}",
                              t.name, t.begin, t.end, next));
    if (t.end > h.data_size)
      return fail(
          fmt::format("tensor '{}': data_offsets [{}, {}] run past the data section ({} bytes)",
                      t.name, t.begin, t.end, h.data_size));
    next = t.end;
  }
  if (next != h.data_size)
    return fail(fmt::format("the tensors cover {} bytes of a {}-byte data section (trailing bytes)",
                            next, h.data_size));
  return h;
}

std::expected<SafetensorsHeader, std::string> parse_safetensors(std::span<const std::byte> file,
                                                                std::string_view label) {
  if (file.size() < 8)
    return std::unexpected(fmt::format(
        "{}: invalid safetensors file: {} bytes is too short for the 8-byte header length", label,
        file.size()));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint8_t>(file[i]);
  if (n > kMaxHeaderSize)
    return std::unexpected(fmt::format("{}: invalid safetensors file: header length {} exceeds {}",
                                       label, n, kMaxHeaderSize));
  if (n > file.size() - 8)
    return std::unexpected(
        fmt::format("{}: invalid safetensors file: header length {} runs past the end of the "
                    "file ({} bytes)",
                    label, n, file.size()));
  std::string_view json(reinterpret_cast<const char*>(file.data()) + 8, n);
  return parse_safetensors_header(json, file.size(), label);
}

// ---- MappedCheckpointFile ----

std::expected<MappedCheckpointFile, std::string> MappedCheckpointFile::open(
    const std::string& path, bool keep_header_mapping) {
  MappedCheckpointFile f;
  f.path_ = path;
  auto sys_fail = [&](const char* what, int err) {
    return std::unexpected(fmt::format("{}: {}: {}", path, what, errno_text(err)));
  };
  // (1) The safetensors (Rust) side: open, map the file privately, read the header, close.
  {
    Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (fd.fd < 0) return sys_fail("open", errno);
    struct stat st {};
    if (::fstat(fd.fd, &st) != 0) return sys_fail("fstat", errno);
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size < 8)
      return std::unexpected(fmt::format(
          "{}: invalid safetensors file: {} bytes is too short for the 8-byte header length", path,
          size));
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
    if (m == MAP_FAILED) return sys_fail("mmap (header)", errno);
    f.header_map_ = m;
    f.header_map_size_ = size;
    auto header = parse_safetensors(
        std::span(static_cast<const std::byte*>(m), static_cast<std::size_t>(size)), path);
    if (!header) return std::unexpected(header.error());  // f's destructor unmaps
    f.header_ = std::move(*header);
  }
  // (2) The PyTorch side: open again, fstat, map the whole file privately; tensors are views.
  {
    Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (fd.fd < 0) return sys_fail("open", errno);
    struct stat st {};
    if (::fstat(fd.fd, &st) != 0) return sys_fail("fstat", errno);
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size != 8 + f.header_.header_size + f.header_.data_size)
      return std::unexpected(fmt::format("{}: file changed size while loading ({} -> {} bytes)",
                                         path, f.header_map_size_, size));
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
    if (m == MAP_FAILED) return sys_fail("mmap (data)", errno);
    f.data_map_ = m;
    f.data_size_ = size;
  }
  if (!keep_header_mapping) {
    ::munmap(f.header_map_, f.header_map_size_);
    f.header_map_ = nullptr;
    f.header_map_size_ = 0;
  }
  return f;
}

MappedCheckpointFile::MappedCheckpointFile(MappedCheckpointFile&& o) noexcept
    : path_(std::move(o.path_)),
      header_(std::move(o.header_)),
      header_map_(std::exchange(o.header_map_, nullptr)),
      header_map_size_(std::exchange(o.header_map_size_, 0)),
      data_map_(std::exchange(o.data_map_, nullptr)),
      data_size_(std::exchange(o.data_size_, 0)) {}

MappedCheckpointFile& MappedCheckpointFile::operator=(MappedCheckpointFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    header_ = std::move(o.header_);
    header_map_ = std::exchange(o.header_map_, nullptr);
    header_map_size_ = std::exchange(o.header_map_size_, 0);
    data_map_ = std::exchange(o.data_map_, nullptr);
    data_size_ = std::exchange(o.data_size_, 0);
  }
  return *this;
}

MappedCheckpointFile::~MappedCheckpointFile() {
  release();
}

void MappedCheckpointFile::release() {
  if (header_map_ != nullptr) ::munmap(header_map_, header_map_size_);
  if (data_map_ != nullptr) ::munmap(data_map_, data_size_);
  header_map_ = data_map_ = nullptr;
  header_map_size_ = data_size_ = 0;
}

std::span<const std::byte> MappedCheckpointFile::data(const TensorInfo& t) const {
  const auto* base = static_cast<const std::byte*>(data_map_) + 8 + header_.header_size;
  return {base + t.begin, static_cast<std::size_t>(t.bytes())};
}

}  // namespace refengine
