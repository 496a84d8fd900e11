// Builds safetensors files byte by byte for the tests, independently of the parser under test
// (its own dtype size table, its own JSON writing), so that a wrong rule in the parser cannot
// be mirrored by the builder.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace thaw::safetensors::testing {

// Bits per element as the safetensors spec gives them.
inline std::uint64_t spec_bits(std::string_view dtype) {
  static const std::map<std::string_view, std::uint64_t> kBits = {
      {"BOOL", 8},        {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8},
      {"I8", 8},          {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8},
      {"F8_E5M2FNUZ", 8}, {"I16", 16},    {"U16", 16},    {"F16", 16},    {"BF16", 16},
      {"I32", 32},        {"U32", 32},    {"F32", 32},    {"C64", 64},    {"F64", 64},
      {"I64", 64},        {"U64", 64},
  };
  const auto it = kBits.find(dtype);
  return it == kBits.end() ? 32 : it->second;
}

inline std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// [8-byte length][header][data_bytes bytes of data].
inline std::string file_with_header(std::string_view header, std::uint64_t data_bytes) {
  std::string out = le64(header.size());
  out += header;
  for (std::uint64_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<char>(i * 7 + 1));
  return out;
}

class FileBuilder {
 public:
  // A tensor placed right after the previous one, sized shape x dtype.
  FileBuilder& tensor(std::string name, std::string dtype, std::vector<std::uint64_t> shape) {
    std::uint64_t bits = spec_bits(dtype);
    for (const std::uint64_t d : shape) bits *= d;
    const std::uint64_t begin = next_;
    return tensor_at(std::move(name), std::move(dtype), std::move(shape), begin, begin + bits / 8);
  }
  // A tensor with explicit data_offsets (which may break the rules).
  FileBuilder& tensor_at(std::string name, std::string dtype, std::vector<std::uint64_t> shape,
                         std::uint64_t begin, std::uint64_t end) {
    entries_.push_back({std::move(name), std::move(dtype), std::move(shape), begin, end});
    next_ = std::max(next_, end);
    return *this;
  }
  FileBuilder& metadata(std::string key, std::string value) {
    metadata_.emplace_back(std::move(key), std::move(value));
    return *this;
  }
  // Bytes of data after the header; by default the furthest tensor end.
  FileBuilder& data_bytes(std::uint64_t n) {
    data_bytes_ = n;
    return *this;
  }
  // Header JSON as the official writer lays it out: compact, "__metadata__" first, padded
  // with spaces to a multiple of 8.
  std::string header() const {
    std::string h = "{";
    bool first = true;
    const auto sep = [&] {
      if (!first) h += ',';
      first = false;
    };
    if (!metadata_.empty()) {
      sep();
      h += "\"__metadata__\":{";
      for (std::size_t i = 0; i < metadata_.size(); ++i) {
        if (i) h += ',';
        h += '"' + metadata_[i].first + "\":\"" + metadata_[i].second + '"';
      }
      h += '}';
    }
    for (const Entry& e : entries_) {
      sep();
      h += '"' + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":[";
      for (std::size_t i = 0; i < e.shape.size(); ++i) {
        if (i) h += ',';
        h += std::to_string(e.shape[i]);
      }
      h += "],\"data_offsets\":[" + std::to_string(e.begin) + ',' + std::to_string(e.end) + "]}";
    }
    h += '}';
    while (h.size() % 8 != 0) h += ' ';
    return h;
  }
  std::string build() const { return file_with_header(header(), data_bytes_.value_or(next_)); }

 private:
  struct Entry {
    std::string name, dtype;
    std::vector<std::uint64_t> shape;
    std::uint64_t begin, end;
  };
  std::vector<Entry> entries_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  std::uint64_t next_ = 0;
  std::optional<std::uint64_t> data_bytes_;
};

}  // namespace thaw::safetensors::testing
