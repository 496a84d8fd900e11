#include "common/safetensors/strict_json.hpp"

#include <fmt/format.h>

#include <set>
#include <string>
#include <vector>

namespace thaw::safetensors::core {

std::optional<std::size_t> first_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // Lead byte: how many continuation bytes follow and the range of the first one (the
    // narrowed ranges exclude overlong forms, surrogates and code points above U+10FFFF).
    std::size_t more = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      more = 1;
    } else if (c == 0xe0) {
      more = 2, lo = 0xa0;
    } else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) {
      more = 2;
    } else if (c == 0xed) {
      more = 2, hi = 0x9f;
    } else if (c == 0xf0) {
      more = 3, lo = 0x90;
    } else if (c >= 0xf1 && c <= 0xf3) {
      more = 3;
    } else if (c == 0xf4) {
      more = 3, hi = 0x8f;
    } else {
      return i;
    }
    if (n - i - 1 < more) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (std::size_t k = 2; k <= more; ++k) {
      if (s[i + k] < 0x80 || s[i + k] > 0xbf) return i;
    }
    i += 1 + more;
  }
  return std::nullopt;
}

std::optional<Error> check_json_text(std::string_view text, std::string_view what) {
  if (const auto bad = first_invalid_utf8(text)) {
    return Error{errc::invalid_utf8,
                 fmt::format("{}: not UTF-8: byte {} (0x{:02x}) does not start or continue a "
                             "well-formed character",
                             what, *bad, static_cast<unsigned char>(text[*bad]))};
  }
  if (text.starts_with("\xef\xbb\xbf")) {
    return Error{errc::invalid_json,
                 fmt::format("{}: starts with a UTF-8 byte order mark, which JSON readers of the "
                             "format (serde_json) refuse",
                             what)};
  }
  if (const auto nul = text.find('\0'); nul != std::string_view::npos) {
    return Error{errc::invalid_json,
                 fmt::format("{}: NUL byte at offset {} (JSON allows none; padding must be "
                             "spaces)",
                             what, nul)};
  }
  return std::nullopt;
}

std::string json_error_text(const std::exception& e) {
  std::string_view s = e.what();
  if (s.starts_with("[json.exception.")) {
    if (const auto close = s.find("] "); close != std::string_view::npos)
      s.remove_prefix(close + 2);
  }
  return std::string(s);
}

std::optional<Error> parse_strict_json(std::string_view text, std::string_view what,
                                       nlohmann::json& out) {
  if (auto e = check_json_text(text, what)) return e;

  // The parser callback sees every object open/close and key; one key set per open object.
  std::vector<std::set<std::string>> keys;
  int depth = 0;
  std::optional<Error> error;
  const auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event,
                            nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        if (++depth > kMaxJsonDepth && !error) {
          error = Error{errc::invalid_json,
                        fmt::format("{}: nested deeper than {} levels", what, kMaxJsonDepth)};
        }
        if (event == Event::object_start) keys.emplace_back();
        break;
      case Event::object_end:
      case Event::array_end:
        --depth;
        if (event == Event::object_end && !keys.empty()) keys.pop_back();
        break;
      case Event::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second && !error) {
          error =
              Error{errc::duplicate_key, fmt::format("{}: key {} appears twice in one object", what,
                                                     quote_name(parsed.get<std::string>()))};
        }
        break;
      case Event::value:
        break;
    }
    return true;
  };
  try {
    out = nlohmann::json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                                /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    return Error{errc::invalid_json,
                 fmt::format("{}: not valid JSON: {}", what, json_error_text(e))};
  }
  if (error) return error;
  return std::nullopt;
}

}  // namespace thaw::safetensors::core
