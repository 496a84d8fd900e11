#include "daemon/store/registry/autoindex.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "daemon/store/registry/relative_path.hpp"

namespace thaw::store {

std::expected<std::vector<AutoindexEntry>, RegistryError> parse_autoindex(std::string_view text,
                                                                          std::string_view origin) {
  auto bad = [&](std::string_view rule) {
    return std::unexpected(RegistryError{RegistryErrc::bad_listing,
                                         fmt::format("autoindex listing {}: {}", origin, rule)});
  };
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return bad("not valid JSON (is `autoindex_format json;` set?)");
  if (!doc.is_array()) return bad("top level is not an array");
  std::vector<AutoindexEntry> entries;
  for (std::size_t i = 0; i < doc.size(); ++i) {
    const auto& item = doc[i];
    if (!item.is_object()) return bad(fmt::format("entry {} is not an object", i));
    auto name = item.find("name");
    auto type = item.find("type");
    if (name == item.end() || !name->is_string() || type == item.end() || !type->is_string()) {
      return bad(fmt::format("entry {} lacks string \"name\" and \"type\"", i));
    }
    AutoindexEntry entry;
    entry.name = name->get<std::string>();
    if (entry.name.find('/') != std::string::npos) {
      return bad(fmt::format("entry name '{}' contains '/'", entry.name));
    }
    if (auto ok =
            check_relative_path(entry.name, fmt::format("autoindex listing {} entry", origin));
        !ok) {
      return std::unexpected(RegistryError{RegistryErrc::bad_listing, ok.error().message});
    }
    const std::string kind = type->get<std::string>();
    if (kind == "directory") {
      entry.directory = true;
    } else if (kind == "file") {
      if (auto size = item.find("size"); size != item.end()) {
        if (!size->is_number_unsigned()) {
          return bad(
              fmt::format("file '{}' has a size that is not a non-negative integer", entry.name));
        }
        entry.size = size->get<std::uint64_t>();
      }
    } else {
      continue;
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

}  // namespace thaw::store
