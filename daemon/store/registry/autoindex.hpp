// nginx `autoindex_format json;` listings:
//   [{"name":"sub", "type":"directory", "mtime":"…"},
//    {"name":"a.bin", "type":"file", "mtime":"…", "size":1000}]
#pragma once

#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/store/registry/registry_error.hpp"

namespace thaw::store {

struct AutoindexEntry {
  std::string name;  // one path segment, checked
  bool directory = false;
  std::optional<std::uint64_t> size;  // files only
};

// Entries of types other than "file" and "directory" (nginx says "other" for sockets and
// devices) are skipped. `origin` names the listing URL in errors.
std::expected<std::vector<AutoindexEntry>, RegistryError> parse_autoindex(std::string_view text,
                                                                          std::string_view origin);

}  // namespace thaw::store
