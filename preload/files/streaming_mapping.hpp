// Private mappings of managed files served as their bytes arrive, with userfaultfd.
//
// map_streaming() maps anonymous private memory in place of the file and registers it
// with the shim's userfaultfd. A handler thread takes each missing-page fault, waits until
// the readiness chunk holding that page is verified, reads the chunk's bytes from the file
// and installs them with UFFDIO_COPY — so the faulting thread (the engine's loader, or the
// driver copying a tensor to the GPU) blocks exactly as long as its bytes take, and the
// bytes it gets are the file's. A mapping is a private copy, as MAP_PRIVATE is; its pages
// are anonymous memory rather than shared page cache.
//
// If the file's fetch fails, the faulting thread gets SIGBUS, as it would reading a
// truncated file: never bytes that were not fetched. Without userfaultfd (kernel, policy),
// map_streaming() returns nullptr and the caller waits for the whole range instead.
//
// Limits: a child forked while a streamed mapping is still partly unfilled sees the
// unfilled pages as zeros (the registration does not follow fork); the child opens a
// userfaultfd of its own for the mappings it makes.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <memory>

#include "preload/files/managed_files.hpp"

namespace thaw::preload {

void* map_streaming(std::shared_ptr<ManagedFile> file, int fd, void* addr, std::size_t length,
                    int prot, int flags, off_t offset);

// munmap of (part of) a streamed mapping: forget it (whole mappings only; the kernel drops
// the registration with the pages).
void forget_streaming(void* addr, std::size_t length);

// The runtime's fork steps (preload/runtime/shim_runtime_fork.cpp): the registry's locks
// are held across fork(); the child drops the parent's userfaultfd (see Userfaults).
void streaming_before_fork();
void streaming_after_fork_in_parent();
void streaming_after_fork_in_child();

}  // namespace thaw::preload
