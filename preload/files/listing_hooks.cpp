// Hooks of the calls that open a directory listing: opendir and fdopendir (what Python's
// os.scandir / os.listdir / glob, libstdc++'s directory_iterator, ls and most programs call)
// and scandir/scandirat (glibc's scandir opens its stream with its internal __opendir, out
// of the opendir hook's sight; the 64-bit names are the same functions on LP64 but separate
// symbols).
//
// For a model directory in a thaw cache whose fetch may still create files, each waits until
// it has (pending_listing.hpp), then makes the real call: the stream reads the directory only
// at its first readdir, after the wait, so readdir/readdir64/rewinddir/closedir need no hook
// and every entry is the file system's own. Every other directory costs the cheap check.
// A listing through a descriptor (openat(O_DIRECTORY) + fdopendir: libstdc++'s
// directory_iterator) first opens the directory, which file_hooks.cpp waits for when thawd
// has not created it yet.
//
// Not covered: glob(3), nftw/ftw and fts_open (glibc-internal opendir; none of the engines
// thaw targets lists its model with them), and getdents64 on a plain open() (Go, io_uring).
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>

#include "preload/files/pending_files.hpp"
#include "preload/files/pending_listing.hpp"
#include "preload/interpose/real_driver.hpp"

using namespace thaw::preload;

namespace {

template <typename Fn>
Fn libc(const char* name) {
  return reinterpret_cast<Fn>(real_dlsym()(RTLD_NEXT, name));
}

#define THAW_LIBC(name) static const auto real_##name = libc<decltype(&::name)>(#name)

void wait_if_model_directory(int dirfd, const char* path) {
  if (auto where = listing_candidate(dirfd, path)) wait_until_listable(*where);
}

}  // namespace

extern "C" {

DIR* opendir(const char* name) {
  THAW_LIBC(opendir);
  wait_if_model_directory(AT_FDCWD, name);
  return real_opendir(name);
}

DIR* fdopendir(int fd) {
  THAW_LIBC(fdopendir);
  if (auto where = listing_candidate(fd)) wait_until_listable(*where);
  return real_fdopendir(fd);
}

int scandir(const char* dir, struct dirent*** list, int (*select)(const struct dirent*),
            int (*compare)(const struct dirent**, const struct dirent**)) {
  THAW_LIBC(scandir);
  wait_if_model_directory(AT_FDCWD, dir);
  return real_scandir(dir, list, select, compare);
}

int scandir64(const char* dir, struct dirent64*** list, int (*select)(const struct dirent64*),
              int (*compare)(const struct dirent64**, const struct dirent64**)) {
  THAW_LIBC(scandir64);
  wait_if_model_directory(AT_FDCWD, dir);
  return real_scandir64(dir, list, select, compare);
}

int scandirat(int dirfd, const char* dir, struct dirent*** list,
              int (*select)(const struct dirent*),
              int (*compare)(const struct dirent**, const struct dirent**)) {
  THAW_LIBC(scandirat);
  wait_if_model_directory(dirfd, dir);
  return real_scandirat(dirfd, dir, list, select, compare);
}

int scandirat64(int dirfd, const char* dir, struct dirent64*** list,
                int (*select)(const struct dirent64*),
                int (*compare)(const struct dirent64**, const struct dirent64**)) {
  THAW_LIBC(scandirat64);
  wait_if_model_directory(dirfd, dir);
  return real_scandirat64(dirfd, dir, list, select, compare);
}

}  // extern "C"
