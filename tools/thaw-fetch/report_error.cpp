#include <fmt/format.h>

#include <algorithm>

#include "commands.hpp"

namespace thaw::fetch_cli {

int report_error(std::string message) {
  std::replace(message.begin(), message.end(), '\n', ' ');
  fmt::print(stderr, "{}: error: {}\n", kProgram, message);
  return 1;
}

}  // namespace thaw::fetch_cli
