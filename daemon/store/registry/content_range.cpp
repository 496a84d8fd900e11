#include "daemon/store/registry/content_range.hpp"

#include <charconv>

namespace thaw::store {

namespace {

std::optional<std::uint64_t> take_number(std::string_view& text) {
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) return std::nullopt;
  text.remove_prefix(static_cast<std::size_t>(end - text.data()));
  return value;
}

void skip_spaces(std::string_view& text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
}

}  // namespace

std::optional<ContentRange> parse_content_range(std::string_view text) {
  skip_spaces(text);
  constexpr std::string_view kUnit = "bytes";
  if (!text.starts_with(kUnit)) return std::nullopt;
  text.remove_prefix(kUnit.size());
  if (text.empty() || (text.front() != ' ' && text.front() != '\t')) return std::nullopt;
  skip_spaces(text);
  ContentRange range;
  auto first = take_number(text);
  if (!first || text.empty() || text.front() != '-') return std::nullopt;
  text.remove_prefix(1);
  auto last = take_number(text);
  if (!last || text.empty() || text.front() != '/') return std::nullopt;
  text.remove_prefix(1);
  range.first = *first;
  range.last = *last;
  if (text.starts_with('*')) {
    text.remove_prefix(1);
  } else {
    auto total = take_number(text);
    if (!total) return std::nullopt;
    range.total = *total;
  }
  skip_spaces(text);
  while (!text.empty() && (text.back() == '\r' || text.back() == '\n' || text.back() == ' ')) {
    text.remove_suffix(1);
  }
  if (!text.empty()) return std::nullopt;
  if (range.last < range.first) return std::nullopt;
  if (range.total && range.last >= *range.total) return std::nullopt;
  return range;
}

}  // namespace thaw::store
