// Hooks of the calls an engine looks a model file up with before it opens it: the stat family
// (stat/lstat/fstatat/statx and their 64-bit names — in glibc >= 2.33 these are real exported
// symbols, which what is built on Debian 12 calls, Python's os.stat and libstdc++'s
// std::filesystem included; __xstat/__lxstat/__fxstatat for binaries built against older
// glibc), access/faccessat/euidaccess, and fopen (libstdc++'s ifstream opens through it, and
// stdio's own open and reads are glibc-internal, out of the shim's sight).
//
// Each is the libc call first. Only a failure with ENOENT for a path in a thaw cache goes on:
// while thawd's fetch of that model has not created the file, the call waits for it and is
// made again (pending_files.hpp), so the engine sees the file whole, at its final size, as
// soon as thawd has listed the model. fopen for reading also waits for all of a streamed
// file's bytes: stdio's reads cannot be held per range the way read() and mmap are.
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "preload/files/managed_files.hpp"
#include "preload/files/pending_files.hpp"
#include "preload/interpose/real_driver.hpp"
#include "preload/runtime/shim_config.hpp"
#include "preload/shim/shim_state.hpp"
#include "preload/thawd_client/thawd_client.hpp"

using namespace thaw::preload;

// glibc < 2.33's stat entry points: still exported (binaries built against an older glibc call
// them), no longer declared.
extern "C" {
int __xstat(int ver, const char* path, struct stat* buf);
int __xstat64(int ver, const char* path, struct stat64* buf);
int __lxstat(int ver, const char* path, struct stat* buf);
int __lxstat64(int ver, const char* path, struct stat64* buf);
int __fxstatat(int ver, int dirfd, const char* path, struct stat* buf, int flags);
int __fxstatat64(int ver, int dirfd, const char* path, struct stat64* buf, int flags);
}

namespace {

template <typename Fn>
Fn libc(const char* name) {
  return reinterpret_cast<Fn>(real_dlsym()(RTLD_NEXT, name));
}

#define THAW_LIBC(name) static const auto real_##name = libc<decltype(&::name)>(#name)

// `call` (returning 0 or -1 with errno) once more after thawd's fetch created the file it
// failed to find.
template <typename Call>
int again_when_created(int dirfd, const char* path, Call call) {
  const int rc = call();
  if (rc == 0) return rc;
  auto where = pending_candidate(dirfd, path, errno);
  if (!where || !wait_until_created(*where)) return rc;  // errno: the call's ENOENT
  return call();
}

bool reads_only(const char* mode) {
  return mode != nullptr && mode[0] == 'r' && std::strchr(mode, '+') == nullptr;
}

// stdio reads go around the read hook: a streamed model file is read through fopen only
// once all of it is in. false (errno EIO): its fetch failed or timed out.
bool whole_file_ready(const char* path) {
  if (ReentryGuard::inside() || config().disabled) return true;
  ReentryGuard guard;
  auto where = classify(AT_FDCWD, path);
  if (!where) return true;
  auto file =
      open_managed_file(*where, daemon_readiness_fd(where->model, where->relative, where->full));
  if (file == nullptr || file->complete) return true;
  debug("fopen of {} waits for the whole file ({} bytes)", file->path, file->size);
  return wait_readable(*file, 0, file->size);
}

template <typename Open>
FILE* fopen_model_file(const char* path, const char* mode, Open real) {
  FILE* f = real();
  if (!reads_only(mode)) return f;
  if (f == nullptr) {
    auto where = pending_candidate(AT_FDCWD, path, errno);
    if (!where || !wait_until_created(*where)) return nullptr;
    f = real();
    if (f == nullptr) return nullptr;
  }
  if (!whole_file_ready(path)) {
    ::fclose(f);
    errno = EIO;
    return nullptr;
  }
  return f;
}

}  // namespace

extern "C" {

int stat(const char* path, struct stat* buf) {
  THAW_LIBC(stat);
  return again_when_created(AT_FDCWD, path, [&] { return real_stat(path, buf); });
}
int stat64(const char* path, struct stat64* buf) {
  THAW_LIBC(stat64);
  return again_when_created(AT_FDCWD, path, [&] { return real_stat64(path, buf); });
}
int lstat(const char* path, struct stat* buf) {
  THAW_LIBC(lstat);
  return again_when_created(AT_FDCWD, path, [&] { return real_lstat(path, buf); });
}
int lstat64(const char* path, struct stat64* buf) {
  THAW_LIBC(lstat64);
  return again_when_created(AT_FDCWD, path, [&] { return real_lstat64(path, buf); });
}
int fstatat(int dirfd, const char* path, struct stat* buf, int flags) {
  THAW_LIBC(fstatat);
  return again_when_created(dirfd, path, [&] { return real_fstatat(dirfd, path, buf, flags); });
}
int fstatat64(int dirfd, const char* path, struct stat64* buf, int flags) {
  THAW_LIBC(fstatat64);
  return again_when_created(dirfd, path, [&] { return real_fstatat64(dirfd, path, buf, flags); });
}
int statx(int dirfd, const char* path, int flags, unsigned int mask, struct statx* buf) {
  THAW_LIBC(statx);
  return again_when_created(dirfd, path, [&] { return real_statx(dirfd, path, flags, mask, buf); });
}

int __xstat(int ver, const char* path, struct stat* buf) {
  THAW_LIBC(__xstat);
  return again_when_created(AT_FDCWD, path, [&] { return real___xstat(ver, path, buf); });
}
int __xstat64(int ver, const char* path, struct stat64* buf) {
  THAW_LIBC(__xstat64);
  return again_when_created(AT_FDCWD, path, [&] { return real___xstat64(ver, path, buf); });
}
int __lxstat(int ver, const char* path, struct stat* buf) {
  THAW_LIBC(__lxstat);
  return again_when_created(AT_FDCWD, path, [&] { return real___lxstat(ver, path, buf); });
}
int __lxstat64(int ver, const char* path, struct stat64* buf) {
  THAW_LIBC(__lxstat64);
  return again_when_created(AT_FDCWD, path, [&] { return real___lxstat64(ver, path, buf); });
}
int __fxstatat(int ver, int dirfd, const char* path, struct stat* buf, int flags) {
  THAW_LIBC(__fxstatat);
  return again_when_created(dirfd, path,
                            [&] { return real___fxstatat(ver, dirfd, path, buf, flags); });
}
int __fxstatat64(int ver, int dirfd, const char* path, struct stat64* buf, int flags) {
  THAW_LIBC(__fxstatat64);
  return again_when_created(dirfd, path,
                            [&] { return real___fxstatat64(ver, dirfd, path, buf, flags); });
}

int access(const char* path, int mode) {
  THAW_LIBC(access);
  return again_when_created(AT_FDCWD, path, [&] { return real_access(path, mode); });
}
int faccessat(int dirfd, const char* path, int mode, int flags) {
  THAW_LIBC(faccessat);
  return again_when_created(dirfd, path, [&] { return real_faccessat(dirfd, path, mode, flags); });
}
int euidaccess(const char* path, int mode) {
  THAW_LIBC(euidaccess);
  return again_when_created(AT_FDCWD, path, [&] { return real_euidaccess(path, mode); });
}
int eaccess(const char* path, int mode) {
  THAW_LIBC(eaccess);
  return again_when_created(AT_FDCWD, path, [&] { return real_eaccess(path, mode); });
}

FILE* fopen(const char* path, const char* mode) {
  THAW_LIBC(fopen);
  return fopen_model_file(path, mode, [&] { return real_fopen(path, mode); });
}
FILE* fopen64(const char* path, const char* mode) {
  THAW_LIBC(fopen64);
  return fopen_model_file(path, mode, [&] { return real_fopen64(path, mode); });
}

}  // extern "C"
