// Counts open(2) calls on one watched path, by interposing open/open64 in the test binary (the
// checkpoint library, linked statically, resolves them here first). This file deliberately does
// not include <fcntl.h>, so no fortified inline open gets in the way of the definitions.
#include <dlfcn.h>

#include <atomic>
#include <cstdarg>
#include <cstring>
#include <mutex>
#include <string>

#include "open_counter.hpp"

namespace {
std::mutex g_mu;
std::string g_watched;
std::atomic<int> g_count{0};

constexpr int kOCreat = 0100;         // O_CREAT on Linux
constexpr int kOTmpfile = 020200000;  // O_TMPFILE on Linux

void note(const char* path) {
  std::lock_guard lock(g_mu);
  if (!g_watched.empty() && path != nullptr && g_watched == path) ++g_count;
}

template <typename Fn>
int forward(const char* name, const char* path, int flags, unsigned mode) {
  static Fn real = nullptr;
  if (real == nullptr) real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
  note(path);
  return real(path, flags, mode);
}
}  // namespace

using OpenFn = int (*)(const char*, int, ...);

extern "C" int open(const char* path, int flags, ...) {
  unsigned mode = 0;
  if ((flags & kOCreat) != 0 || (flags & kOTmpfile) == kOTmpfile) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, unsigned);
    va_end(ap);
  }
  return forward<OpenFn>("open", path, flags, mode);
}

extern "C" int open64(const char* path, int flags, ...) {
  unsigned mode = 0;
  if ((flags & kOCreat) != 0 || (flags & kOTmpfile) == kOTmpfile) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, unsigned);
    va_end(ap);
  }
  return forward<OpenFn>("open64", path, flags, mode);
}

void watch_opens(const std::string& path) {
  std::lock_guard lock(g_mu);
  g_watched = path;
  g_count = 0;
}

int watched_opens() {
  return g_count.load();
}
