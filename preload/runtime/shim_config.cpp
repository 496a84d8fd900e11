#include "preload/runtime/shim_config.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace thaw::preload {

namespace {

// A variable that is set to something; unset and empty read the same.
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

bool is(const char* v, const char* text) {
  return std::strcmp(v, text) == 0;
}

}  // namespace

ShimConfig read_shim_config() {
  ShimConfig c;
  if (const char* v = env("THAW_PRELOAD_DISABLE")) c.disabled = !is(v, "0");
  if (const char* v = env("THAW_PRELOAD_DETERMINISTIC")) c.deterministic = !is(v, "0");
  if (const char* v = env("THAW_PRELOAD_VA_BASE")) {
    char* end = nullptr;
    const unsigned long long base = std::strtoull(v, &end, 0);
    if (end != nullptr && *end == '\0' && base != 0) c.va_base = base;
  }
  if (const char* v = env("THAW_PRELOAD_LOG")) {
    c.verbose = !is(v, "0");
    if (c.verbose && !is(v, "1") && !is(v, "stderr")) {
      // Write-only: the shim's own open hook lets it through without asking for the config.
      const int fd = ::open(v, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) c.log_fd = fd;
    }
  }
  if (const char* v = env("THAW_PRELOAD_ATTACH")) c.attach = is(v, "1");
  if (const char* v = env("THAW_PRELOAD_LEASE")) c.lease = !is(v, "0");
  if (const char* v = env("THAW_PRELOAD_TRANSPARENT_GRAPHS")) c.transparent_graphs = !is(v, "0");
  if (const char* v = env("THAW_PRELOAD_READ_TIMEOUT")) {
    if (const long s = std::atol(v); s > 0) c.read_timeout = std::chrono::seconds(s);
  }
  if (const char* v = env("THAW_ENGINE_ID")) c.engine_id = v;
  if (const char* v = env("THAW_SOCKET")) c.socket_path = v;
  return c;
}

}  // namespace thaw::preload
