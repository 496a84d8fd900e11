#include "faults.hpp"

#include <fmt/format.h>

#include <sstream>

#include "errors.hpp"

namespace emu {

Faults& faults() {
  static Faults f;
  return f;
}

std::expected<void, std::string> Faults::configure(const std::string& spec) {
  std::vector<Rule> rules;
  std::stringstream ss(spec);
  std::string item;
  auto bad = [&](const std::string& why) {
    return std::unexpected(fmt::format(
        "THAW_EMU_FAULTS='{}': '{}' {} (expected e.g. cuMemCreate:3=CUDA_ERROR_OUT_OF_MEMORY or "
        "cuMemMap:2+=1)",
        spec, item, why));
  };
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    auto colon = item.find(':');
    auto eq = item.find('=');
    if (colon == std::string::npos || eq == std::string::npos || eq < colon) {
      return bad("is not NAME:N=ERROR");
    }
    Rule r;
    r.name = item.substr(0, colon);
    std::string count = item.substr(colon + 1, eq - colon - 1);
    r.and_later = !count.empty() && count.back() == '+';
    if (r.and_later) count.pop_back();
    if (count.empty() || count.size() > 9 ||
        count.find_first_not_of("0123456789") != std::string::npos || std::stoul(count) == 0) {
      return bad("has a call number that is not 1 or more");
    }
    r.nth = std::stoul(count);
    auto err = parse_error(item.substr(eq + 1));
    if (!err) return bad("names an error that is not a CUresult");
    r.error = *err;
    // A misspelt name would silently never fire: only names the driver has are accepted.
    if (!is_driver_function(r.name)) return bad("names no driver function the emulator provides");
    rules.push_back(std::move(r));
  }
  std::lock_guard lock(mu_);
  rules_ = std::move(rules);
  calls_.clear();
  return {};
}

std::optional<CUresult> Faults::check(const char* name) {
  if (rules_.empty()) return std::nullopt;
  std::lock_guard lock(mu_);
  unsigned long n = ++calls_[name];
  for (const auto& r : rules_) {
    if (r.name == name && (n == r.nth || (r.and_later && n > r.nth))) return r.error;
  }
  return std::nullopt;
}

}  // namespace emu
