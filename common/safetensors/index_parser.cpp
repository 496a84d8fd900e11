#include "common/safetensors/index_parser.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/safetensors/strict_json.hpp"

namespace thaw::safetensors {

const std::string* ShardIndex::shard_of(std::string_view tensor) const {
  const auto it = std::lower_bound(
      weight_map.begin(), weight_map.end(), tensor,
      [](const std::pair<std::string, std::string>& e, std::string_view t) { return e.first < t; });
  if (it == weight_map.end() || it->first != tensor) return nullptr;
  return &it->second;
}

namespace core {

std::optional<std::string_view> shard_name_problem(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name.find('/') != std::string_view::npos || name.find('\\') != std::string_view::npos) {
    return "is not a plain file name (it has a path separator)";
  }
  if (name.find('\0') != std::string_view::npos) return "has a NUL character";
  if (name.starts_with(".")) return "starts with '.'";
  if (!name.ends_with(".safetensors")) return "is not a .safetensors file";
  return std::nullopt;
}

std::optional<Error> parse_index(std::string_view text, std::string_view file, ShardIndex& out) {
  nlohmann::json doc;
  if (auto e = parse_strict_json(text, file, doc)) return e;
  if (!doc.is_object()) {
    return Error{errc::invalid_index,
                 fmt::format("{}: is a JSON {}, not an object", file, doc.type_name())};
  }

  ShardIndex index;
  if (const auto m = doc.find("metadata"); m != doc.end()) {
    if (!m->is_object()) {
      return Error{errc::invalid_index, fmt::format("{}: \"metadata\" is a JSON {}, not an object",
                                                    file, m->type_name())};
    }
    if (const auto t = m->find("total_size"); t != m->end()) {
      if (t->is_number_unsigned()) {
        index.total_size = t->get<std::uint64_t>();
      } else if (t->is_number_integer() && t->get<std::int64_t>() == 0) {
        index.total_size = 0;
      } else if (t->is_number_float() && t->get<double>() >= 0 && t->get<double>() < 0x1p64 &&
                 std::floor(t->get<double>()) == t->get<double>()) {
        // Python writers that summed sizes as floats ("total_size": 16060522496.0).
        index.total_size = static_cast<std::uint64_t>(t->get<double>());
      } else {
        return Error{errc::invalid_index,
                     fmt::format("{}: \"metadata\".\"total_size\" is {}, not a non-negative "
                                 "integer",
                                 file, t->dump())};
      }
    }
  }

  const auto w = doc.find("weight_map");
  if (w == doc.end()) {
    return Error{errc::invalid_index, fmt::format("{}: no \"weight_map\"", file)};
  }
  if (!w->is_object()) {
    return Error{errc::invalid_index, fmt::format("{}: \"weight_map\" is a JSON {}, not an object",
                                                  file, w->type_name())};
  }
  if (w->empty()) {
    return Error{errc::invalid_index, fmt::format("{}: \"weight_map\" lists no tensors", file)};
  }
  index.weight_map.reserve(w->size());
  for (const auto& [tensor, shard] : w->items()) {
    if (!shard.is_string()) {
      return Error{errc::invalid_index,
                   fmt::format("{}: \"weight_map\" maps tensor {} to a JSON {}, not a file name",
                               file, quote_name(tensor), shard.type_name())};
    }
    const auto& name = shard.get_ref<const std::string&>();
    if (const auto why = shard_name_problem(name)) {
      return Error{errc::invalid_index,
                   fmt::format("{}: \"weight_map\" maps tensor {} to shard {}, which {}", file,
                               quote_name(tensor), quote_name(name), *why)};
    }
    index.weight_map.emplace_back(tensor, name);
  }
  // nlohmann's object is a std::map: items() come sorted by key already.
  std::sort(index.weight_map.begin(), index.weight_map.end());
  for (const auto& [tensor, shard] : index.weight_map) index.files.push_back(shard);
  std::sort(index.files.begin(), index.files.end());
  index.files.erase(std::unique(index.files.begin(), index.files.end()), index.files.end());
  out = std::move(index);
  return std::nullopt;
}

}  // namespace core

}  // namespace thaw::safetensors
