#include <fmt/format.h>

#include <algorithm>

#include "render.hpp"

namespace thaw::demo {

namespace {

std::string seconds(const std::optional<double>& v) {
  return v ? fmt::format("{:.2f}", *v) : "—";
}

// Width on a terminal: code points, not bytes ("—" is three bytes of UTF-8).
size_t width(const std::string& s) {
  return std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; });
}

std::string pad(const std::string& s, size_t w, bool left) {
  std::string fill(w > width(s) ? w - width(s) : 0, ' ');
  return left ? s + fill : fill + s;
}

}  // namespace

std::string table(const std::vector<Run>& runs) {
  const std::vector<std::string> cols{"run",        "fetch",       "engine init", "weights",
                                      "profile/KV", "graphs",      "first token", "total",
                                      "speed-up",   "tokens = (a)"};
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : runs) {
    std::vector<std::string> row{fmt::format("({}) {}", r.id, r.label), seconds(r.fetch_s)};
    for (double p : r.phase_s) row.push_back(seconds(p));
    row.push_back(seconds(r.total_s));
    row.push_back(r.speedup && *r.speedup != 0 ? fmt::format("{:.2f}x", *r.speedup) : "—");
    row.push_back(r.tokens_equal_first ? "yes" : "NO");
    rows.push_back(std::move(row));
  }
  std::vector<size_t> widths;
  for (size_t i = 0; i < cols.size(); ++i) {
    size_t w = width(cols[i]);
    for (const auto& row : rows) w = std::max(w, width(row[i]));
    widths.push_back(w);
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t i = 0; i < cells.size(); ++i) {
      if (i) out += "  ";
      out += pad(cells[i], widths[i], i == 0);
    }
    return out;
  };
  std::string out = line(cols) + "\n";
  for (size_t i = 0; i < widths.size(); ++i) out += (i ? "  " : "") + std::string(widths[i], '-');
  for (const auto& row : rows) out += "\n" + line(row);
  return out;
}

}  // namespace thaw::demo
