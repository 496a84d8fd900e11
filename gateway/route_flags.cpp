#include "gateway/route_flags.hpp"

#include <fmt/format.h>

#include <charconv>
#include <chrono>

namespace thaw::gateway {
namespace {

std::expected<void, std::string> check_url(const std::string& url) {
  constexpr std::string_view scheme = "http://";
  if (!url.starts_with(scheme)) {
    return std::unexpected(fmt::format("{}: a worker URL is http://HOST:PORT", url));
  }
  const std::string_view rest = std::string_view(url).substr(scheme.size());
  const auto colon = rest.rfind(':');
  if (rest.empty() || colon == std::string_view::npos || colon == 0) {
    return std::unexpected(fmt::format("{}: give the worker's port (http://HOST:PORT)", url));
  }
  const std::string_view port = rest.substr(colon + 1);
  int value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size() || value < 1 || value > 65535) {
    return std::unexpected(
        fmt::format("{}: the port must be 1 to 65535, with no path after it", url));
  }
  for (char c : rest.substr(0, colon)) {
    if (c == '/' || c == ' ' || c == '@' || c == '?' || c == '#') {
      return std::unexpected(fmt::format("{}: the host may not contain '{}'", url, c));
    }
  }
  return {};
}

}  // namespace

std::expected<RouteMap, std::string> parse_route_flags(const std::vector<std::string>& flags) {
  RouteMap routes;
  for (const std::string& flag : flags) {
    const auto eq = flag.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == flag.size()) {
      return std::unexpected(
          fmt::format("--route {}: expected MODEL=URL (e.g. gpt2=http://127.0.0.1:8000)", flag));
    }
    const std::string model = flag.substr(0, eq), url = flag.substr(eq + 1);
    for (unsigned char c : model) {
      if (c < 0x21 || c == 0x7f) {
        return std::unexpected(
            fmt::format("--route {}: the model name has a space or a "
                        "control character",
                        flag));
      }
    }
    if (auto ok = check_url(url); !ok) return std::unexpected("--route " + ok.error());
    routes[model].push_back(WorkerRoute{url, WorkerState::serving, "static", 0, ""});
  }
  return routes;
}

std::expected<std::chrono::milliseconds, std::string> parse_duration(const std::string& text) {
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || value < 0) {
    return std::unexpected(fmt::format("{}: expected a duration like 250ms, 30s or 2m", text));
  }
  const std::string_view unit(end, text.data() + text.size() - end);
  double ms;
  if (unit == "ms") {
    ms = value;
  } else if (unit == "s" || unit.empty()) {
    ms = value * 1000;
  } else if (unit == "m") {
    ms = value * 60'000;
  } else {
    return std::unexpected(fmt::format("{}: unknown unit (ms, s or m)", text));
  }
  return std::chrono::milliseconds(static_cast<long long>(ms));
}

std::expected<std::size_t, std::string> parse_bytes(const std::string& text) {
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc()) {
    return std::unexpected(fmt::format("{}: expected a size like 1048576, 64KiB or 1MiB", text));
  }
  const std::string_view unit(end, text.data() + text.size() - end);
  std::uint64_t scale;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else if (unit == "KiB") {
    scale = 1ull << 10;
  } else if (unit == "MiB") {
    scale = 1ull << 20;
  } else if (unit == "GiB") {
    scale = 1ull << 30;
  } else {
    return std::unexpected(fmt::format("{}: unknown unit (B, KiB, MiB or GiB)", text));
  }
  if (value > (std::uint64_t{1} << 40) / scale) {
    return std::unexpected(fmt::format("{}: too large", text));
  }
  return static_cast<std::size_t>(value * scale);
}

}  // namespace thaw::gateway
