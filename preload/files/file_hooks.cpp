// Hooks of the calls engines read model files with: open/openat (plain, 64-bit and
// fortified), read/pread/readv, mmap/munmap, close. Only descriptors of managed files
// (managed_files.hpp) are touched: a read of one whose bytes are still arriving waits until
// its range is verified, then reads; a private mapping of one is served page by page as
// bytes arrive (streaming_mapping.hpp), or — without userfaultfd, or for shared mappings —
// mmap waits until the whole range is in. Mappings of managed files (complete or not) are
// registered (file_mappings.hpp) for the layout record's copy map. A read-only open that
// fails with ENOENT for a model file thawd's fetch has not created yet waits for it and is
// made again (pending_files.hpp). Every other call goes straight to libc.
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include "preload/files/managed_files.hpp"
#include "preload/files/pending_files.hpp"
#include "preload/files/streaming_mapping.hpp"
#include "preload/interpose/real_driver.hpp"
#include "preload/runtime/shim_runtime.hpp"
#include "preload/shim/shim_state.hpp"

using namespace thaw::preload;

namespace {

template <typename Fn>
Fn libc(const char* name) {
  return reinterpret_cast<Fn>(real_dlsym()(RTLD_NEXT, name));
}

#define THAW_LIBC(name) static const auto real_##name = libc<decltype(&::name)>(#name)

bool read_only(int flags) {
  return (flags & O_ACCMODE) == O_RDONLY && (flags & O_DIRECTORY) == 0;
}

// Write-only opens come back before the configuration is asked for: the runtime opens its
// log file (THAW_PRELOAD_LOG=PATH) while it reads the configuration.
int after_open(int fd, int dirfd, const char* path, int flags) {
  if (fd < 0 || !read_only(flags) || ReentryGuard::inside() || config().disabled) return fd;
  ReentryGuard guard;
  if (auto where = classify(dirfd, path)) runtime().on_model_file_opened(fd, *where);
  return fd;
}

// `real` (an open) once more when it failed to find a model file thawd's fetch has not
// created yet, once the fetch has. O_DIRECTORY opens too: the model directory is opened so
// before it is listed (libstdc++'s directory_iterator: openat + fdopendir; os.scandir(fd)),
// and the listing then waits in fdopendir (pending_listing.hpp).
template <typename Open>
int open_when_created(int dirfd, const char* path, int flags, Open real) {
  const int fd = real();
  if (fd >= 0 || (flags & O_ACCMODE) != O_RDONLY || (flags & O_CREAT) != 0) return fd;
  auto where = pending_candidate(dirfd, path, errno);
  if (!where || !wait_until_created(*where)) return fd;
  return real();
}

mode_t mode_arg(int flags, va_list ap) {
  return (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(ap, mode_t) : 0;
}

// The descriptor's managed file when a read of it may have to wait.
std::shared_ptr<ManagedFile> waiting_file(int fd) {
  if (ReentryGuard::inside()) return nullptr;
  return runtime().files().find(fd);
}

}  // namespace

extern "C" {

int open(const char* path, int flags, ...) {
  THAW_LIBC(open);
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return after_open(
      open_when_created(AT_FDCWD, path, flags, [&] { return real_open(path, flags, mode); }),
      AT_FDCWD, path, flags);
}

int open64(const char* path, int flags, ...) {
  THAW_LIBC(open64);
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return after_open(
      open_when_created(AT_FDCWD, path, flags, [&] { return real_open64(path, flags, mode); }),
      AT_FDCWD, path, flags);
}

int openat(int dirfd, const char* path, int flags, ...) {
  THAW_LIBC(openat);
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return after_open(
      open_when_created(dirfd, path, flags, [&] { return real_openat(dirfd, path, flags, mode); }),
      dirfd, path, flags);
}

int openat64(int dirfd, const char* path, int flags, ...) {
  THAW_LIBC(openat64);
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return after_open(open_when_created(dirfd, path, flags,
                                      [&] { return real_openat64(dirfd, path, flags, mode); }),
                    dirfd, path, flags);
}

// _FORTIFY_SOURCE variants.
int __open_2(const char* path, int flags) {
  static const auto real = libc<int (*)(const char*, int)>("__open_2");
  return after_open(open_when_created(AT_FDCWD, path, flags, [&] { return real(path, flags); }),
                    AT_FDCWD, path, flags);
}
int __open64_2(const char* path, int flags) {
  static const auto real = libc<int (*)(const char*, int)>("__open64_2");
  return after_open(open_when_created(AT_FDCWD, path, flags, [&] { return real(path, flags); }),
                    AT_FDCWD, path, flags);
}
int __openat_2(int dirfd, const char* path, int flags) {
  static const auto real = libc<int (*)(int, const char*, int)>("__openat_2");
  return after_open(open_when_created(dirfd, path, flags, [&] { return real(dirfd, path, flags); }),
                    dirfd, path, flags);
}
int __openat64_2(int dirfd, const char* path, int flags) {
  static const auto real = libc<int (*)(int, const char*, int)>("__openat64_2");
  return after_open(open_when_created(dirfd, path, flags, [&] { return real(dirfd, path, flags); }),
                    dirfd, path, flags);
}

int close(int fd) {
  THAW_LIBC(close);
  if (!ReentryGuard::inside() && runtime().files().find(fd) != nullptr)
    runtime().files().untrack(fd);
  return real_close(fd);
}

ssize_t read(int fd, void* buf, size_t count) {
  THAW_LIBC(read);
  if (auto file = waiting_file(fd)) {
    ReentryGuard guard;
    const off_t at = ::lseek(fd, 0, SEEK_CUR);
    if (at >= 0 && !wait_readable(*file, static_cast<std::uint64_t>(at), count)) return -1;
  }
  return real_read(fd, buf, count);
}

ssize_t pread(int fd, void* buf, size_t count, off_t offset) {
  THAW_LIBC(pread);
  if (auto file = waiting_file(fd)) {
    ReentryGuard guard;
    if (!wait_readable(*file, static_cast<std::uint64_t>(offset), count)) return -1;
  }
  return real_pread(fd, buf, count, offset);
}

ssize_t pread64(int fd, void* buf, size_t count, off64_t offset) {
  THAW_LIBC(pread64);
  if (auto file = waiting_file(fd)) {
    ReentryGuard guard;
    if (!wait_readable(*file, static_cast<std::uint64_t>(offset), count)) return -1;
  }
  return real_pread64(fd, buf, count, offset);
}

ssize_t readv(int fd, const struct iovec* iov, int iovcnt) {
  THAW_LIBC(readv);
  if (auto file = waiting_file(fd)) {
    ReentryGuard guard;
    std::uint64_t total = 0;
    for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
    const off_t at = ::lseek(fd, 0, SEEK_CUR);
    if (at >= 0 && !wait_readable(*file, static_cast<std::uint64_t>(at), total)) return -1;
  }
  return real_readv(fd, iov, iovcnt);
}

void* mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
  THAW_LIBC(mmap);
  if (fd < 0 || (flags & MAP_ANONYMOUS) != 0)
    return real_mmap(addr, length, prot, flags, fd, offset);
  auto file = waiting_file(fd);
  if (file == nullptr) return real_mmap(addr, length, prot, flags, fd, offset);
  ReentryGuard guard;
  void* mapped = MAP_FAILED;
  if (file->complete) {
    mapped = real_mmap(addr, length, prot, flags, fd, offset);
  } else {
    if ((flags & MAP_PRIVATE) != 0) {
      if (void* streamed = map_streaming(file, fd, addr, length, prot, flags, offset))
        mapped = streamed;
    }
    if (mapped == MAP_FAILED) {
      // Without userfaultfd (or for a shared mapping): the whole range first. Slower, never
      // wrong.
      debug("mmap of {} [{}, +{}) waits for the whole range", file->path, offset, length);
      if (!wait_readable(*file, static_cast<std::uint64_t>(offset), length)) return MAP_FAILED;
      mapped = real_mmap(addr, length, prot, flags, fd, offset);
    }
  }
  if (mapped != MAP_FAILED) {
    runtime().file_mappings().add(mapped, length, file->model, file->relative,
                                  static_cast<std::uint64_t>(offset));
  }
  return mapped;
}

void* mmap64(void* addr, size_t length, int prot, int flags, int fd, off64_t offset) {
  return mmap(addr, length, prot, flags, fd, static_cast<off_t>(offset));
}

int munmap(void* addr, size_t length) {
  THAW_LIBC(munmap);
  if (!ReentryGuard::inside()) {
    ReentryGuard guard;
    forget_streaming(addr, length);
    runtime().file_mappings().forget(addr, length);
  }
  return real_munmap(addr, length);
}

}  // extern "C"
